"""ATen ops as Panamera frontend ops: the vocabulary of the `torch.compile` backend.

`TABLE` maps each ATen overload Panamera computes to an `Entry`: its `OpKind` (an ANCHOR, a
reduction, normalization, softmax-family op or loss, is what makes a subgraph worth a Panamera
kernel; ELEMENTWISE and VIEW ops join the subgraph around it), the builder that makes Panamera
tensors of it, and an optional check that says why one call is not supported. Builders receive
the node, its arguments (graph values as Panamera tensors, everything else as it is) and return
a Panamera tensor or a tuple of them; `fit` casts the result to the dtype torch infers and checks
the shape, so torch's type promotion, not numpy's, decides every result dtype.

>>> import torch  # doctest: +SKIP
>>> TABLE[torch.ops.aten._softmax.default].kind  # doctest: +SKIP
<OpKind.ANCHOR: 'anchor'>
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import panamera as pn

from ..enums import StrEnum
from ..errors import PanameraError

try:  # a module of the optional torch integration: importing it needs torch
    import torch
except ImportError as e:  # pragma: no cover - without torch
    raise ImportError("panamera.torch_backend needs PyTorch (pip install torch)") from e

aten = torch.ops.aten


class OpKind(StrEnum):
    ANCHOR = "anchor"  # a reduction, normalization, softmax-family op or loss: a subgraph's reason to be
    ELEMENTWISE = "elementwise"
    VIEW = "view"  # reshape, permute, expand, cast-free copies: no arithmetic


class TranslationError(PanameraError):
    """An ATen node Panamera could not express; its subgraph runs in eager PyTorch."""


@dataclass(frozen=True)
class Entry:
    kind: OpKind
    build: Callable
    check: Callable | None = None  # node -> the reason it is not supported, or None


DTYPES = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int32: "int32", torch.int64: "int64", torch.bool: "bool",
}  # fmt: skip


def meta(node):
    """The FakeTensor (or tuple of them) torch inferred for a node."""
    return node.meta.get("val") if hasattr(node, "meta") else None


def shape(val) -> tuple:
    """A FakeTensor's shape as Panamera extents: ints, and dynamo's SymInts as symbolic `Dim`s."""
    from .symbolic import shape_of  # it imports this module

    return shape_of(val)


def out_dtype(node, k: int | None = None) -> str:
    v = meta(node)
    if isinstance(v, (tuple, list)):  # a multi-output op: output k (the first by default)
        v = v[k or 0]
    return DTYPES[v.dtype]


def fit(t, val, what: str):
    """`t` cast to the dtype of torch's result `val`, its shape checked against torch's."""
    if val is None:
        return t
    if isinstance(val, (tuple, list)):
        return tuple(None if x is None else fit(x, v, f"{what}[{k}]") for k, (x, v) in enumerate(zip(t, val)))
    if not isinstance(t, pn.Tensor):
        raise TranslationError(f"{what}: expected a tensor, got {type(t).__name__}")
    if t.shape != shape(val):
        raise TranslationError(f"{what}: Panamera's shape {t.shape} is not torch's {tuple(val.shape)}")
    return t.astype(DTYPES[val.dtype])


def promoted(node) -> str:
    """torch's result dtype of a binary op's two operands (its type promotion: a 0-dim tensor
    or a Python scalar is weak), from their dtypes and ranks alone."""

    def proxy(a):
        v = meta(a) if isinstance(a, torch.fx.Node) else a
        return torch.empty((1,) if v.ndim else (), dtype=v.dtype) if isinstance(v, torch.Tensor) else v

    return DTYPES[torch.result_type(*(proxy(a) for a in node.args[:2]))]


def _cast(x, dtype: str):
    return x.astype(dtype) if isinstance(x, pn.Tensor) else x


def _dims(dim, ndim: int) -> tuple[int, ...] | None:
    """torch's dim argument (None, an int, or a list; an empty list means every axis) as axes."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % max(ndim, 1) for d in dims)


# -- element-wise -----------------------------------------------------------------------------
def _arith(fn):
    """An arithmetic op computed in its result dtype (torch's promotion), operands cast first."""

    def build(node, a, b, *rest, alpha=1, **kw):
        d = out_dtype(node)
        a, b = _cast(a, d), _cast(b, d)
        if alpha != 1:
            b = b * alpha
        return fn(a, b)

    return build


def _compare(fn):
    """A comparison computed in the promoted dtype of its operands."""

    def build(node, a, b):
        d = promoted(node)
        return fn(_cast(a, d), _cast(b, d))

    return build


def _unary(fn):
    def build(node, x, *rest, **kw):
        return fn(_cast(x, out_dtype(node)))

    return build


def _sigmoid(x):
    return 1.0 / (1.0 + pn.exp(-x))


def _gelu(node, x, approximate="none"):
    x = _cast(x, out_dtype(node))
    if approximate == "tanh":
        return 0.5 * x * (1.0 + pn.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1.0 + pn.erf(x * (1 / math.sqrt(2))))


def _clamp(node, x, lo=None, hi=None):
    x = _cast(x, out_dtype(node)) if node is not None else x
    if lo is not None:
        x = pn.where(x < lo, _cast(lo, x.dtype.name) if isinstance(lo, pn.Tensor) else lo, x)
    if hi is not None:
        x = pn.where(x > hi, _cast(hi, x.dtype.name) if isinstance(hi, pn.Tensor) else hi, x)
    return x


def _where(node, c, a, b):
    d = out_dtype(node)
    a, b = _cast(a, d), _cast(b, d)
    if not isinstance(a, pn.Tensor) and not isinstance(b, pn.Tensor):
        a = pn.full(shape(node.meta["val"]), a, d)
    return pn.where(c, a, b)


def _masked_fill(node, x, mask, value):
    return _where(node, mask, value, x)


def _pow(node, a, b):
    d = out_dtype(node)
    a, b = _cast(a, d), _cast(b, d)
    if not isinstance(b, pn.Tensor) and isinstance(a, pn.Tensor) and a.dtype.is_float:
        if b in (1, 2, 3, 4):  # repeated products: exact, and no pow() (decompositions write rstd ** 3, x ** 1)
            r = a
            for _ in range(int(b) - 1):
                r = r * a
            return r
        if b == 0.5:
            return pn.sqrt(a)
        if b == -1:
            return 1.0 / a
        if b == -0.5:
            return pn.rsqrt(a)
    return pn.power(a, b)


def _same(node, x, *rest, **kw):
    return x


def _to_copy(node, x, dtype=None, **kw):
    return _cast(x, out_dtype(node))


def _to_copy_check(node):
    dev = node.kwargs.get("device")
    if dev is not None and torch.device(dev).type != meta(node.args[0]).device.type:
        return "a copy to another device"
    return None


def _full(node, size, value, **kw):
    return pn.full(shape(meta(node)), value, out_dtype(node))


def _scalar_tensor(node, value, **kw):
    return pn.full((), value, out_dtype(node))


# -- views ------------------------------------------------------------------------------------
def _reshape(node, x, *rest, **kw):
    return x.reshape(shape(meta(node)))


def _permute(node, x, dims):
    return pn.transpose(x, tuple(d % x.ndim for d in dims))


def _transpose(node, x, d0=0, d1=1):
    perm = list(range(x.ndim))
    if x.ndim:
        d0, d1 = d0 % x.ndim, d1 % x.ndim
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return pn.transpose(x, tuple(perm))


def _expand(node, x, size, **kw):
    return pn.broadcast_to(x, shape(meta(node)))


# -- reductions -------------------------------------------------------------------------------
def _reduce(fn, accumulates: bool = False):
    """sum/mean/prod(x, dim, keepdim, dtype=): computed in torch's result dtype."""

    def build(node, x, dim=None, keepdim=False, dtype=None):
        d = out_dtype(node)
        if accumulates or dtype is not None:
            x = _cast(x, d)
        return fn(x, axis=_dims(dim, x.ndim), keepdims=bool(keepdim))

    return build


def _sum(x, axis, keepdims):
    return pn.sum(x, axis=axis, keepdims=keepdims)


def _mean(x, axis, keepdims):
    return pn.mean(x, axis=axis, keepdims=keepdims)


def _prod(x, axis, keepdims):
    return pn.prod(x, axis=axis, keepdims=keepdims)


def _extreme(kind: str):
    def build(node, x, dim=None, keepdim=False):
        f = pn.max if kind == "max" else pn.min
        return f(x, axis=_dims(dim, x.ndim), keepdims=bool(keepdim))

    return build


def _extreme_dim(kind: str):
    """max.dim / min.dim: (values, indices)."""

    def build(node, x, dim, keepdim=False):
        f, arg = (pn.max, pn.argmax) if kind == "max" else (pn.min, pn.argmin)
        return f(x, axis=dim % max(x.ndim, 1), keepdims=keepdim), arg(x, axis=dim % max(x.ndim, 1), keepdims=keepdim)

    return build


def _arg(kind: str):
    def build(node, x, dim=None, keepdim=False):
        f = pn.argmax if kind == "max" else pn.argmin
        if dim is None:
            r = f(x)
            return r.reshape((1,) * x.ndim) if keepdim else r
        return f(x, axis=dim % max(x.ndim, 1), keepdims=keepdim)

    return build


def _arg_check(node):
    x = meta(node.args[0])
    return f"arg{'max' if 'max' in str(node.target) else 'min'} of {x.dtype}" if x.dtype.itemsize == 8 else None


def _var(std: bool):
    def build(node, x, dim=None, *, correction=None, keepdim=False):
        x = _cast(x, out_dtype(node))
        ddof = 1 if correction is None else correction
        f = pn.std if std else pn.var
        return f(x, axis=_dims(dim, x.ndim), ddof=ddof, keepdims=keepdim)

    return build


def _var_mean(node, x, dim=None, *, correction=None, keepdim=False):
    v = _var(False)(node, x, dim, correction=correction, keepdim=keepdim)
    return v, pn.mean(_cast(x, out_dtype(node, 1)), axis=_dims(dim, x.ndim), keepdims=keepdim)


def _logsumexp(node, x, dim, keepdim=False):
    x = _cast(x, out_dtype(node))
    axes = _dims(dim, x.ndim)
    return pn.nn.logsumexp(x, axis=axes if axes is not None else tuple(range(x.ndim)), keepdims=keepdim)


def _bool_reduce(kind: str):
    def build(node, x, dim=None, keepdim=False):
        x = x if x.dtype.name == "bool" else x != 0
        f = pn.any if kind == "any" else pn.all
        return f(x, axis=_dims(dim, x.ndim), keepdims=keepdim)

    return build


# -- normalizations, softmax, losses ----------------------------------------------------------
def _softmax(log: bool):
    def build(node, x, dim, half_to_float=False):
        x = _cast(x, out_dtype(node))
        return (pn.nn.log_softmax if log else pn.nn.softmax)(x, axis=dim % max(x.ndim, 1))

    return build


def _native_layer_norm(node, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    y = pn.nn.layer_norm(x, weight, bias, axis=axes, eps=eps)
    xc = x.astype("float32") if x.dtype.is_16bit_float else x
    mean, v = pn.mean(xc, axis=axes, keepdims=True), pn.var(xc, axis=axes, keepdims=True)
    return y, mean, pn.rsqrt(v + eps)


def _native_group_norm(node, x, weight, bias, n, c, hw, groups, eps):
    y = pn.nn.group_norm(x, groups, weight, bias, eps=eps)
    xc = (x.astype("float32") if x.dtype.is_16bit_float else x).reshape((n, groups, (c // groups) * hw))
    mean, v = pn.mean(xc, axis=2), pn.var(xc, axis=2)
    return y, mean, pn.rsqrt(v + eps)


def _batch_norm_eval(node, x, weight, bias, running_mean, running_var, momentum, eps):
    y = pn.nn.batch_norm(x, weight, bias, running_mean, running_var, training=False, eps=eps)
    return y, None, None


def _nll_loss(node, x, target, weight, reduction, ignore_index):
    """nll_loss_forward of (N, C) log-probabilities: (loss, total weight); torch's reductions
    0 none, 1 mean, 2 sum; targets equal to ignore_index count nothing."""
    n, c = x.shape
    picked = pn.sum(pn.where(pn.arange(c).reshape((1, c)) == target.reshape((n, 1)), x, 0.0), axis=1)
    valid = target != ignore_index
    loss = pn.where(valid, -picked, 0.0)
    count = pn.sum(valid.astype(x.dtype.name))
    if reduction == 0:
        return loss, count
    total = pn.sum(loss)
    return (total / count if reduction == 1 else total), count


def _nll_check(node):
    x, weight = meta(node.args[0]), node.args[2]
    if weight is not None:
        return "nll_loss with class weights"
    return None if x.ndim == 2 else f"nll_loss of a rank-{x.ndim} input"


def _build_table() -> dict:
    E, A, V = OpKind.ELEMENTWISE, OpKind.ANCHOR, OpKind.VIEW
    t: dict = {}

    def add(kind, build, *ops, check=None):
        for op in ops:
            t[op] = Entry(kind, build, check)

    add(E, _arith(lambda a, b: a + b), aten.add.Tensor, aten.add.Scalar)
    add(E, _arith(lambda a, b: a - b), aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Scalar)
    t[aten.rsub.Scalar] = Entry(E, _arith(lambda a, b: b - a))
    add(E, _arith(lambda a, b: a * b), aten.mul.Tensor, aten.mul.Scalar)
    add(E, _arith(lambda a, b: a / b), aten.div.Tensor, aten.div.Scalar)
    add(E, _arith(pn.maximum), aten.maximum.default)
    add(E, _arith(pn.minimum), aten.minimum.default)
    add(E, _pow, aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
    for name, fn in (("eq", lambda a, b: a == b), ("ne", lambda a, b: a != b), ("lt", lambda a, b: a < b),
                     ("le", lambda a, b: a <= b), ("gt", lambda a, b: a > b), ("ge", lambda a, b: a >= b)):  # fmt: skip
        add(E, _compare(fn), getattr(aten, name).Tensor, getattr(aten, name).Scalar)
    add(E, _compare(pn.logical_and), aten.logical_and.default)
    add(E, _compare(pn.logical_or), aten.logical_or.default)
    add(E, _compare(pn.logical_xor), aten.logical_xor.default)
    add(E, lambda node, x: pn.logical_not(x if x.dtype.name == "bool" else x != 0), aten.logical_not.default)
    add(E, lambda node, x: pn.logical_not(x), aten.bitwise_not.default, check=lambda n: _bool_only(n))
    add(E, _compare(pn.logical_and), aten.bitwise_and.Tensor, check=lambda n: _bool_only(n, both=True))
    add(E, _compare(pn.logical_or), aten.bitwise_or.Tensor, check=lambda n: _bool_only(n, both=True))
    add(E, _unary(lambda x: _clamp(None, x + 3.0, 0.0, 6.0) / 6.0), aten.hardsigmoid.default)
    add(E, _unary(lambda x: x * _clamp(None, x + 3.0, 0.0, 6.0) / 6.0), aten.hardswish.default)
    add(E, lambda node, x, lo=-1.0, hi=1.0: _clamp(node, x, lo, hi), aten.hardtanh.default)
    for name in ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "floor", "ceil", "abs"):
        add(E, _unary(getattr(pn, name)), getattr(aten, name).default)
    add(E, _unary(pn.negative), aten.neg.default)
    add(E, _unary(lambda x: 1.0 / x), aten.reciprocal.default)
    add(E, _unary(_sigmoid), aten.sigmoid.default)
    add(E, _unary(lambda x: x * _sigmoid(x)), aten.silu.default)
    add(E, _unary(lambda x: pn.maximum(x, 0)), aten.relu.default)
    add(E, _gelu, aten.gelu.default)
    add(E, _clamp, aten.clamp.default, aten.clamp.Tensor)
    add(E, lambda node, x, lo: _clamp(node, x, lo, None), aten.clamp_min.default)
    add(E, lambda node, x, hi: _clamp(node, x, None, hi), aten.clamp_max.default)
    add(E, _where, aten.where.self)
    add(E, _masked_fill, aten.masked_fill.Scalar, aten.masked_fill.Tensor)
    add(E, _to_copy, aten._to_copy.default, check=_to_copy_check)
    add(E, _full, aten.full.default)
    add(E, _scalar_tensor, aten.scalar_tensor.default)
    add(V, _same, aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default)
    add(V, _reshape, aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
        aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)  # fmt: skip
    add(V, _permute, aten.permute.default)
    add(V, _transpose, aten.transpose.int, aten.t.default)
    add(V, _expand, aten.expand.default)
    add(A, _reduce(_sum), aten.sum.dim_IntList, aten.sum.default)
    add(A, _reduce(_mean, accumulates=True), aten.mean.dim, aten.mean.default)
    add(A, _reduce(_prod), aten.prod.dim_int, aten.prod.default)
    add(A, _extreme("max"), aten.amax.default, aten.max.default)
    add(A, _extreme("min"), aten.amin.default, aten.min.default)
    add(A, _extreme_dim("max"), aten.max.dim, check=_arg_check)
    add(A, _extreme_dim("min"), aten.min.dim, check=_arg_check)
    add(A, _arg("max"), aten.argmax.default, check=_arg_check)
    add(A, _arg("min"), aten.argmin.default, check=_arg_check)
    add(A, _var(False), aten.var.correction)
    add(A, _var(True), aten.std.correction)
    add(A, _var_mean, aten.var_mean.correction)
    add(A, _logsumexp, aten.logsumexp.default)
    add(A, _bool_reduce("any"), aten.any.default, aten.any.dim, aten.any.dims)
    add(A, _bool_reduce("all"), aten.all.default, aten.all.dim, aten.all.dims)
    add(A, _softmax(False), aten._softmax.default)
    add(A, _softmax(True), aten._log_softmax.default)
    add(A, _native_layer_norm, aten.native_layer_norm.default)
    add(A, _native_group_norm, aten.native_group_norm.default)
    add(A, _batch_norm_eval, aten._native_batch_norm_legit_no_training.default)
    add(A, _nll_loss, aten.nll_loss_forward.default, check=_nll_check)
    from . import backward as bw  # its builders use this module's helpers, defined above

    add(E, bw.embedding, aten.embedding.default)
    add(E, bw.index, aten.index.Tensor, check=bw.index_check)
    add(E, bw.index_select, aten.index_select.default)
    add(E, bw.gather, aten.gather.default, check=bw.gather_check)
    add(E, bw.zeros, aten.zeros.default, aten.new_zeros.default, aten.zeros_like.default)
    add(A, bw.index_put, aten.index_put.default, check=bw.index_put_check)
    add(A, bw.index_add, aten.index_add.default, check=bw.index_add_check)
    add(A, bw.scatter_add, aten.scatter_add.default, check=bw.scatter_add_check)
    add(A, bw.scatter_reduce, aten.scatter_reduce.two, check=bw.scatter_reduce_check)
    add(E, bw.arange, aten.arange.default, check=bw.arange_check)
    add(A, bw.nll_loss_backward, aten.nll_loss_backward.default, check=bw.nll_loss_backward_check)
    add(A, bw.embedding_dense_backward, aten.embedding_dense_backward.default, check=bw.embedding_dense_backward_check)
    add(A, bw.embedding_bag_backward, aten._embedding_bag_backward.default, check=bw.embedding_bag_backward_check)
    from . import foreach as fe

    add(A, fe.vector_norm, aten.linalg_vector_norm.default, check=fe.norm_check)
    add(A, fe.total_norm, fe.TOTAL_NORM, check=fe.norm_check)
    return t


def _bool_only(node, both: bool = False):
    args = node.args[:2] if both else node.args[:1]
    if all(isinstance(a, torch.fx.Node) and meta(a).dtype == torch.bool for a in args):
        return None
    return f"{node.target} of integers (bitwise ops are bool-only here)"


TABLE = _build_table()
