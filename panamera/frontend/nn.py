"""Normalization and softmax-family ops, built only from the primitives users have.

Nothing here is a hand-written kernel: each function composes reductions and element-wise ops,
and the compiler decides how to fuse them (poly/stitch.py, schedule/planner.py). 16-bit float
inputs are computed in float32 and the result is cast back, as frameworks do.

>>> import panamera as pn
>>> x = pn.placeholder((8, 16), "float32", name="x")
>>> len(pn.compile(pn.nn.softmax(x), target="emulator").plan.kernels)
1
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .. import dtypes
from ..enums import StrEnum
from ..errors import DTypeError, EmptyReductionError, OptionError, ShapeError
from . import ops
from .contract import einsum
from .reduce import check_ddof, mask_of, masked_var, normalize_axes, refuse_out
from .tensor import Tensor, alternatives, broadcast_shapes, iota, where
from .torch_names import torch_names

AXIS = {"input": "x", "dim": "axis", "keepdim": "keepdims"}  # torch.nn.functional's names
NORM = {"input": "x", "weight": "gamma", "bias": "beta"}

__all__ = [
    "SoftmaxMethod", "attention", "attention_chain", "batch_norm", "cross_entropy", "group_norm", "instance_norm", "l2_normalize",
    "layer_norm", "log_softmax", "logsumexp",
    "rms_norm", "softmax", "std", "var",
]  # fmt: skip


def _float_input(x: Tensor, op: str) -> tuple[Tensor, dtypes.DType]:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    if not x.dtype.is_float:
        raise DTypeError(f"{op} of tensor {x.label!r}: needs a floating-point input, got {x.dtype}")
    compute = dtypes.float32 if x.dtype.is_16bit_float else x.dtype
    return x.astype(compute), x.dtype


def _nonempty(x: Tensor, axes: tuple[int, ...], op: str) -> int:
    n = math.prod(x.shape[a] for a in axes)
    if n == 0:
        raise EmptyReductionError(f"{op} of tensor {x.label!r}: normalizing over a zero-size extent (axes {axes})")
    return n


def _param(p, shape: tuple[int, ...], name: str, op: str, compute: dtypes.DType) -> Tensor | None:
    if p is None:
        return None
    if not isinstance(p, Tensor):
        raise DTypeError(f"{op}: {name} must be a Tensor")
    if p.shape != shape:
        raise ShapeError(f"{op}: {name} {p.label!r} has shape {p.shape}, expected {shape}")
    return p.astype(compute)


@torch_names(**AXIS)
def var(
    x: Tensor, axis=None, dtype=None, out=None, ddof=0, keepdims: bool = False, *, where=True, correction=None
) -> Tensor:
    """numpy.var in one pass: Welford accumulators merged pairwise (Chan et al.) across threads,
    warps and blocks; numerically stable for data with a large mean. `dtype=` (a float dtype)
    is the dtype computed in and returned; `correction=` is numpy 2's name of `ddof`. With
    ddof >= the number of reduced elements the divisor is 0, as in numpy: inf, or nan where all
    the values are equal (a RuntimeWarning says so). `where=` masks elements (numpy's two-pass
    masked variance).

    >>> import panamera as pn
    >>> pn.var(pn.placeholder((4, 5), "float32"), axis=1, ddof=1).shape
    (4,)
    """
    if not isinstance(x, Tensor):
        raise DTypeError(f"var: expected a Tensor, got {type(x).__name__}")
    refuse_out(out, "var", x)
    ddof = check_ddof(ddof, correction, "var", x)
    if dtype is not None:
        d = dtypes.as_dtype(dtype, what=f"var of {x.label!r}: dtype=")
        if not d.is_float:
            raise DTypeError(f"var of {x.label!r}: dtype= must be a float dtype, got {d}")
        x = x.astype(d)
    axes = normalize_axes(axis, x.ndim, x.label)
    mask = mask_of(where, x, "var")
    if mask is not None:
        return masked_var(x, axes, keepdims, ddof, mask, x.dtype if x.dtype.is_float else dtypes.float64)
    if not x.symbolic and math.prod(x.shape[a] for a in axes) - ddof <= 0:
        warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=3)
    return ops.welford(x, axis=axes, keepdims=keepdims, field="var", ddof=ddof)


@torch_names(**AXIS)
def std(
    x: Tensor, axis=None, dtype=None, out=None, ddof=0, keepdims: bool = False, *, where=True, correction=None
) -> Tensor:
    """numpy.std: the square root of `var` (same keywords).

    >>> import panamera as pn
    >>> pn.std(pn.placeholder((4, 5), "float16"), axis=0).dtype.name
    'float16'
    """
    return ops.sqrt(var(x, axis, dtype, out, ddof, keepdims, where=where, correction=correction))


class SoftmaxMethod(StrEnum):
    """How softmax, log_softmax and cross_entropy compute their row statistics (max, sum of
    exp(x - max)); the plain strings are accepted too.

    >>> import panamera as pn
    >>> pn.nn.SoftmaxMethod("online") is pn.nn.SoftmaxMethod.ONLINE
    True
    """

    AUTO = "auto"  # every formulation, for the planner to choose with the model (schedule/formulation.py)
    ONLINE = "online"  # max and sum from one pass, rescaling
    MULTIPASS = "multipass"  # a max pass, then a sum pass


METHODS = (SoftmaxMethod.ONLINE, SoftmaxMethod.MULTIPASS)


def _stats(xc: Tensor, axis, method: SoftmaxMethod) -> tuple[Tensor, Tensor]:
    """(max, sum of exp(x - max)): one online pass, or a max pass then a sum pass."""
    if method == SoftmaxMethod.ONLINE:
        return ops.online_softmax_stats(xc, axis)
    m = ops.max(xc, axis=axis, keepdims=True)
    return m, ops.sum(ops.exp(xc - m), axis=axis, keepdims=True)


def _method(method, op: str) -> SoftmaxMethod:
    """`method` as a SoftmaxMethod; an OptionError naming the op and the option otherwise."""
    try:
        return SoftmaxMethod(method)
    except ValueError:
        names = ", ".join(m.value for m in SoftmaxMethod)
        raise OptionError(f"{op}: unknown method {method!r} (method= takes {names})") from None


def _formulate(build, method: SoftmaxMethod | str, op: str) -> Tensor:
    """The op built with `method`; with "auto", every formulation, for the planner to choose
    from with the performance model (schedule/formulation.py) when the graph is compiled."""
    method = _method(method, op)
    if method in METHODS:
        return build(method)
    return alternatives(op, tuple(m.value for m in METHODS), tuple(build(m) for m in METHODS))


def _cast(x, dtype, op: str):
    """torch's `dtype=` of softmax: the input is cast to it first."""
    if dtype is None or not isinstance(x, Tensor):
        return x
    return x.astype(dtypes.as_dtype(dtype, what=f"{op}: dtype="))


@torch_names(**AXIS)
def softmax(x: Tensor, axis: int = -1, method: SoftmaxMethod | str = SoftmaxMethod.AUTO, dtype=None) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along `axis`. method: "online" (max and sum from one pass,
    rescaling), "multipass" (a max pass, then a sum pass) or "auto" (the model chooses);
    `dtype=` casts the input first, as torch does.

    >>> import panamera as pn
    >>> pn.nn.softmax(pn.placeholder((2, 8)), dim=-1).shape
    (2, 8)
    """
    x = _cast(x, dtype, "softmax")
    xc, dt = _float_input(x, "softmax")
    _nonempty(x, normalize_axes(axis, x.ndim, x.label), "softmax")

    def build(method):
        m, s = _stats(xc, axis, method)
        return (ops.exp(xc - m) / s).astype(dt)

    return _formulate(build, method, "softmax")


@torch_names(**AXIS)
def logsumexp(x: Tensor, axis=-1, keepdims: bool = False) -> Tensor:
    """log(sum(exp(x))) computed as m + log(sum(exp(x - m))), m = max (0 where it is infinite)."""
    xc, dt = _float_input(x, "logsumexp")
    _nonempty(x, normalize_axes(axis, x.ndim, x.label), "logsumexp")
    m = ops.max(xc, axis=axis, keepdims=True)
    m = where(ops.abs(m) == math.inf, 0.0, m)
    out = ops.log(ops.sum(ops.exp(xc - m), axis=axis, keepdims=True)) + m
    if not keepdims:
        axes = normalize_axes(axis, x.ndim, x.label)
        out = out.reshape(tuple(s for k, s in enumerate(x.shape) if k not in axes))
    return out.astype(dt)


@torch_names(**AXIS)
def log_softmax(x: Tensor, axis: int = -1, method: SoftmaxMethod | str = SoftmaxMethod.AUTO, dtype=None) -> Tensor:
    """x - logsumexp(x) along `axis`; `method` and `dtype` as for softmax."""
    x = _cast(x, dtype, "log_softmax")
    xc, dt = _float_input(x, "log_softmax")
    _nonempty(x, normalize_axes(axis, x.ndim, x.label), "log_softmax")

    def build(method):
        m, s = _stats(xc, axis, method)
        return (xc - m - ops.log(s)).astype(dt)

    return _formulate(build, method, "log_softmax")


def _moments(xc: Tensor, axes, keepdims: bool = True) -> tuple[Tensor, Tensor]:
    """Mean and biased variance from one pass over xc (two Welford reductions, fused)."""
    return ops.welford(xc, axes, keepdims, "mean"), ops.welford(xc, axes, keepdims, "var")


def _normalize(xc: Tensor, axes, eps: float) -> Tensor:
    mean, v = _moments(xc, axes)
    return (xc - mean) * ops.rsqrt(v + eps)


def _normalized_axes(x, axis, normalized_shape, op: str):
    """torch's `normalized_shape` (the trailing extents normalized over) as numpy axes."""
    if normalized_shape is None:
        return axis
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not isinstance(x, Tensor) or tuple(x.shape[len(x.shape) - len(ns) :]) != ns or len(ns) > x.ndim:
        raise ShapeError(f"{op}: normalized_shape {ns} is not the trailing shape of {getattr(x, 'shape', x)}")
    return tuple(range(x.ndim - len(ns), x.ndim))


@torch_names(**NORM)
def layer_norm(x: Tensor, gamma=None, beta=None, axis=-1, eps: float = 1e-5, normalized_shape=None) -> Tensor:
    """(x - mean) / sqrt(var + eps) * gamma + beta over the trailing `axis` dims (or torch's
    `normalized_shape`).

    >>> import panamera as pn
    >>> x, w = pn.placeholder((2, 8)), pn.placeholder((8,))
    >>> pn.nn.layer_norm(input=x, normalized_shape=(8,), weight=w).shape
    (2, 8)
    """
    axis = _normalized_axes(x, axis, normalized_shape, "layer_norm")
    xc, dt = _float_input(x, "layer_norm")
    axes = normalize_axes(axis, x.ndim, x.label)
    _nonempty(x, axes, "layer_norm")
    shape = tuple(x.shape[a] for a in axes)
    y = _normalize(xc, axes, eps)
    g, b = _param(gamma, shape, "gamma", "layer_norm", xc.dtype), _param(beta, shape, "beta", "layer_norm", xc.dtype)
    y = y * g if g is not None else y
    y = y + b if b is not None else y
    return y.astype(dt)


@torch_names(**NORM)
def rms_norm(x: Tensor, gamma=None, axis=-1, eps: float | None = 1e-6, normalized_shape=None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * gamma; eps=None is torch's default, the dtype's epsilon."""
    axis = _normalized_axes(x, axis, normalized_shape, "rms_norm")
    xc, dt = _float_input(x, "rms_norm")
    eps = float(np.finfo(dt.np).eps) if eps is None else eps
    axes = normalize_axes(axis, x.ndim, x.label)
    _nonempty(x, axes, "rms_norm")
    y = xc * ops.rsqrt(ops.mean(xc * xc, axis=axes, keepdims=True) + eps)
    g = _param(gamma, tuple(x.shape[a] for a in axes), "gamma", "rms_norm", xc.dtype)
    return (y * g if g is not None else y).astype(dt)


@torch_names(input="x", dim="axis")
def l2_normalize(x: Tensor, axis=-1, eps: float = 1e-12, p: float = 2.0) -> Tensor:
    """x / sqrt(max(sum(x^2), eps)), as TensorFlow's l2_normalize (torch's F.normalize with p=2;
    note torch's default dim is 1)."""
    if p != 2:
        raise OptionError(f"l2_normalize: only p=2 is supported, got p={p!r}")
    xc, dt = _float_input(x, "l2_normalize")
    _nonempty(x, normalize_axes(axis, x.ndim, x.label), "l2_normalize")
    return (xc * ops.rsqrt(ops.maximum(ops.sum(xc * xc, axis=axis, keepdims=True), eps))).astype(dt)


def _channel(p, c: int, ndim: int, name: str, op: str, compute) -> Tensor | None:
    p = _param(p, (c,), name, op, compute)
    return None if p is None else p.reshape((c,) + (1,) * (ndim - 2))


@torch_names(**NORM)
def batch_norm(
    x: Tensor,
    gamma=None,
    beta=None,
    running_mean=None,
    running_var=None,
    training: bool = True,
    eps: float = 1e-5,
    momentum: float | None = None,
):
    """NCHW batch norm over N, H, W. Training returns (y, batch mean, biased batch variance);
    inference (training=False) normalizes with running_mean and running_var. Unlike torch's
    F.batch_norm (whose positional order differs: pass them by name) nothing is updated in
    place: `momentum` is accepted and unused, the batch statistics are returned instead."""
    xc, dt = _float_input(x, "batch_norm")
    if x.ndim < 2:
        raise ShapeError(f"batch_norm of {x.label!r}: needs a channel axis (rank >= 2), got shape {x.shape}")
    c = x.shape[1]
    axes = tuple(a for a in range(x.ndim) if a != 1)
    g = _channel(gamma, c, x.ndim, "gamma", "batch_norm", xc.dtype)
    b = _channel(beta, c, x.ndim, "beta", "batch_norm", xc.dtype)
    if training:
        _nonempty(x, axes, "batch_norm")
        mean, v = _moments(xc, axes)
        d = xc - mean
    else:
        mean = _channel(running_mean, c, x.ndim, "running_mean", "batch_norm", xc.dtype)
        v = _channel(running_var, c, x.ndim, "running_var", "batch_norm", xc.dtype)
        if mean is None or v is None:
            raise ShapeError("batch_norm(training=False) needs running_mean and running_var")
        d = xc - mean
    y = d * ops.rsqrt(v + eps)
    y = y * g if g is not None else y
    y = (y + b if b is not None else y).astype(dt)
    if not training:
        return y
    return y, mean.reshape((c,)).astype(dt), v.reshape((c,)).astype(dt)


@torch_names(**NORM)
def instance_norm(x: Tensor, gamma=None, beta=None, eps: float = 1e-5) -> Tensor:
    """NCHW: normalize over H, W for each (n, c)."""
    xc, dt = _float_input(x, "instance_norm")
    axes = tuple(range(2, x.ndim))
    _nonempty(x, axes, "instance_norm")
    y = _normalize(xc, axes, eps)
    g = _channel(gamma, x.shape[1], x.ndim, "gamma", "instance_norm", xc.dtype)
    b = _channel(beta, x.shape[1], x.ndim, "beta", "instance_norm", xc.dtype)
    y = y * g if g is not None else y
    return (y + b if b is not None else y).astype(dt)


@torch_names(num_groups="groups", **NORM)
def group_norm(x: Tensor, groups: int, gamma=None, beta=None, eps: float = 1e-5) -> Tensor:
    """NCHW: normalize over (C / groups, H, W) for each (n, group).

    Computed on the view (N, groups, C / groups, H*W), where the per-channel scale and shift are
    (1, groups, C / groups, 1): the statistics and the normalized output share one iteration
    space, so they stitch into one kernel, and the reshape back to NCHW is a view."""
    xc, dt = _float_input(x, "group_norm")
    if x.ndim < 2:
        raise ShapeError(f"group_norm of {x.label!r}: needs a channel axis (rank >= 2), got shape {x.shape}")
    n, c = x.shape[0], x.shape[1]
    if groups <= 0 or c % groups:
        raise ShapeError(f"group_norm of {x.label!r}: {c} channels do not split into {groups} groups")
    grouped = xc.reshape((n, groups, c // groups, math.prod(x.shape[2:])))
    _nonempty(grouped, (2, 3), "group_norm")
    y = _normalize(grouped, (2, 3), eps)
    per_channel = (1, groups, c // groups, 1)
    g = _param(gamma, (c,), "gamma", "group_norm", xc.dtype)
    b = _param(beta, (c,), "beta", "group_norm", xc.dtype)
    y = y * g.reshape(per_channel) if g is not None else y
    y = y + b.reshape(per_channel) if b is not None else y
    return y.astype(dt).reshape(x.shape)


@torch_names(input="logits", target="targets")
def cross_entropy(
    logits: Tensor, targets: Tensor, reduction: str = "mean", method: SoftmaxMethod | str = SoftmaxMethod.AUTO
) -> Tensor:
    """Softmax cross-entropy of (N, C) logits with integer class targets of shape (N,):
    logsumexp(logits[n]) - logits[n, targets[n]]; reduction "mean", "sum" or "none".
    A target outside [0, C) selects no logit (its loss is the logsumexp). `method`: the
    logsumexp's statistics, as for softmax ("online": max and sum in one pass, so a row split
    across blocks exchanges its partials once; "multipass"; "auto": the model chooses)."""
    xc, dt = _float_input(logits, "cross_entropy")
    if logits.ndim != 2:
        raise ShapeError(f"cross_entropy: logits {logits.label!r} must be (N, C), got shape {logits.shape}")
    if not isinstance(targets, Tensor) or targets.dtype.name not in ("int32", "int64"):
        raise DTypeError("cross_entropy: targets must be an int32 or int64 Tensor of class indices")
    n, c = logits.shape
    if targets.shape != (n,):
        raise ShapeError(f"cross_entropy: targets {targets.label!r} have shape {targets.shape}, expected ({n},)")
    if reduction not in ("mean", "sum", "none"):
        raise OptionError(f"cross_entropy: unknown reduction {reduction!r} (mean, sum or none)")
    _nonempty(logits, (1,), "cross_entropy")
    picked = ops.sum(where(iota((n, c), 1) == targets.reshape((n, 1)), xc, 0.0), axis=1)

    def build(method):
        m, s = _stats(xc, 1, method)
        return ops.log(s.reshape((n,))) + m.reshape((n,)) - picked

    loss = _formulate(build, method, "cross_entropy")
    if reduction == "mean":
        loss = ops.mean(loss)
    elif reduction == "sum":
        loss = ops.sum(loss)
    return loss.astype(dt)


# -- attention ----------------------------------------------------------------------------------
def _attention_operands(q, k, v, scale, mask) -> tuple[float, str]:
    """Checks torch's scaled_dot_product_attention conventions; returns (scale, mask kind)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise DTypeError(f"attention: {name} must be a Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ShapeError(
                f"attention: {name} {t.label!r} must be 4-D (batch, heads, length, head dim), got {t.shape}"
            )
        if not t.dtype.is_float or t.dtype.is_struct:
            raise DTypeError(f"attention: {name} {t.label!r} must be floating point, got {t.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise DTypeError(f"attention: q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    (b, hq, _, d), (bk, hkv, lk, dk) = q.shape, k.shape
    if v.shape != k.shape:
        raise ShapeError(f"attention: v {v.label!r} has shape {v.shape}, expected k's {k.shape}")
    if bk != b or dk != d:
        raise ShapeError(f"attention: k {k.shape} must match q {q.shape} in batch (axis 0) and head dim (axis 3)")
    if hkv == 0 or hq % hkv:
        raise ShapeError(f"attention: q's {hq} heads (axis 1) must be a multiple of k/v's {hkv} heads (grouped-query)")
    if lk == 0 or d == 0:
        raise EmptyReductionError(f"attention: k {k.label!r} has no keys or a zero head dim ({k.shape})")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if (
        isinstance(scale, bool)
        or not isinstance(scale, int | float | np.floating | np.integer)
        or not math.isfinite(scale)
    ):
        raise OptionError(f"attention: scale must be a finite number, got {scale!r}")
    if mask is None:
        return float(scale), "none"
    if not isinstance(mask, Tensor):
        raise DTypeError(f"attention: mask must be a Tensor, got {type(mask).__name__}")
    full = (b, hq, q.shape[2], lk)
    if mask.ndim > 4 or broadcast_shapes(mask.shape, full, what="attention mask and scores") != full:
        raise ShapeError(
            f"attention: mask {mask.label!r} of shape {mask.shape} does not broadcast to the scores {full}"
        )
    if mask.dtype.name == "bool":
        return float(scale), "boolean"
    if not mask.dtype.is_float or mask.dtype.is_struct:
        raise DTypeError(
            f"attention: mask {mask.label!r} must be bool (True = keep) or float (added), got {mask.dtype}"
        )
    return float(scale), "additive"


def attention_chain(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None = None) -> Tensor:
    """Attention as its chain of reductions, for any shapes: scores = q k^T * scale (a contraction
    over the head dim), + mask, softmax over the keys (online statistics), out = p v (a contraction
    over the keys); grouped-query heads as a view (batch, kv head, group, query, dim). The arguments
    are checked by `attention`, which offers this chain and the fused plan to the compiler."""
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    c = dtypes.float32 if q.dtype.is_16bit_float else q.dtype
    q5 = q.astype(c).reshape((b, hkv, hq // hkv, lq, d))
    s = (einsum("bhgqd,bhld->bhgql", q5, k.astype(c)) * scale).reshape((b, hq, lq, lk))
    if mask is not None and mask.dtype.name == "bool":
        s = where(mask, s, -math.inf)
    elif mask is not None:
        s = s + mask.astype(c)
    m, z = _stats(s, -1, "online")
    # A fully masked row (max -inf) gets p = exp(-inf - 0) / z = 0, so its output is 0, as torch's
    # scaled_dot_product_attention gives and the fused plan stores (algebra.ONLINE_SOFTMAX_VEC.finish).
    m = where(m == -math.inf, 0.0, m)
    p = (ops.exp(s - m) / z).reshape((b, hkv, hq // hkv, lq, lk))
    return einsum("bhgql,bhld->bhgqd", p, v.astype(c)).reshape((b, hq, lq, d)).astype(q.dtype)


def attention(q: Tensor, k: Tensor, v: Tensor, scale=None, mask=None) -> Tensor:
    """softmax(q k^T * scale + mask) v with torch's scaled_dot_product_attention conventions: q
    (B, Hq, Lq, D), k and v (B, Hkv, Lk, D) with Hq a multiple of Hkv (grouped-query attention:
    query head h reads kv head h // (Hq / Hkv)); `mask` broadcasts to (B, Hq, Lq, Lk), boolean
    (True = keep) or float (added to the scores); `scale` defaults to 1 / sqrt(D). A query row
    whose every key is masked (all False, or all -inf) gives 0, as torch 2.13's
    scaled_dot_product_attention does (not NaN). 16-bit inputs
    are computed in float32. The compiler chooses, with the model, between the fused plan (the
    key length split across blocks, partials (m, s, o[D]) merged with log-sum-exp rescaling:
    poly/attention.py) and the chain of reductions (`attention_chain`).

    >>> import panamera as pn
    >>> q = pn.placeholder((1, 8, 1, 64), "float16", name="q")
    >>> kv = pn.placeholder((1, 2, 256, 64), "float16", name="k")
    >>> pn.nn.attention(q, kv, kv).shape
    (1, 8, 1, 64)
    """
    scale, kind = _attention_operands(q, k, v, scale, mask)
    operands = (q, k, v) if mask is None else (q, k, v, mask)
    fused = Tensor("attention", operands, q.shape, q.dtype, (("scale", scale), ("mask", kind)))
    return alternatives("attention", ("fused", "chain"), (fused, attention_chain(q, k, v, scale, mask)))
