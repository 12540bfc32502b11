"""Separable interpolation (ONNX Resize in every mode) as weighted sums of gathered reads.

The source coordinate of output index o along an axis depends on o and that axis alone, so a
resize is described per axis by a *tap table*: for each output position, T input subscripts and
their weights (2 taps linear, 4 cubic, more with antialias; 1 tap of weight 1 for nearest).
The tables depend on shapes and attributes only, never on data: the ONNX converter computes them
on the host (subgraph/resize.py) and passes them in as constant tensors. On the device

    y[o] = sum over tap combinations (t_a) of  prod_a w_a[o_a, t_a] * x[.., i_a[o_a, t_a], ..]

Each read of x is one gather (a non-affine read of x's flat offset, frontend/gather.take), and
each term is element-wise: with at most `UNROLL` combinations the sum is unrolled into one
element-wise statement that fuses with producers and consumers like any element-wise op; past it
(antialiased downscales) the taps become reduction axes of an ordinary sum.

>>> import panamera as pn
>>> x = pn.placeholder((1, 1, 4, 4), name="x")
>>> i = pn.placeholder((8, 2), "int64", name="i")
>>> w = pn.placeholder((8, 2), name="w")
>>> interpolate(x, (1, 1, 8, 8), [Taps(2, i, w), Taps(3, i, w)]).shape
(1, 1, 8, 8)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import dtypes
from ..errors import AxisError, DTypeError, ShapeError
from . import ops
from .gather import take
from .movement import _x, slice
from .tensor import Tensor, _check_shape, constant, iota, reshape, where

UNROLL = 16  # at most this many tap combinations are summed element-wise, more are reduction axes


@dataclass(frozen=True)
class Taps:
    """The tap table of one axis: `index` (out, T) integer subscripts into x's axis (within
    [0, n)), `weight` (out, T) floats or None for a single tap of weight 1, and `outside` (out,)
    bool or None: output positions whose value is the interpolation's `fill` instead."""

    axis: int
    index: Tensor
    weight: Tensor | None = None
    outside: Tensor | None = None


def _placed(t: Tensor, rank: int, at: tuple[int, ...]) -> Tensor:
    """`t` (of rank len(at)) viewed at axes `at` of a rank-`rank` shape, extent 1 elsewhere
    (`at` increasing, so this is a reshape)."""
    shape = [1] * rank
    for a, n in zip(at, t.shape):
        shape[a] = n
    return reshape(t, tuple(shape))


def _check(x: Tensor, shape, taps: Sequence[Taps]) -> None:
    seen = set()
    for tp in taps:
        if not 0 <= tp.axis < x.ndim or tp.axis in seen:
            raise AxisError(f"interpolate of {x.label!r}: tap axis {tp.axis} is out of range or repeated")
        seen.add(tp.axis)
        n = shape[tp.axis]
        if tp.index.ndim != 2 or tp.index.shape[0] != n or tp.index.dtype.is_float:
            raise ShapeError(f"interpolate of {x.label!r}: axis {tp.axis} index table must be ({n}, T) integers")
        if tp.weight is not None and (tp.weight.shape != tp.index.shape or not tp.weight.dtype.is_float):
            raise ShapeError(f"interpolate of {x.label!r}: axis {tp.axis} weights must be floats like its index table")
        if tp.outside is not None and (tp.outside.shape != (n,) or tp.outside.dtype.name != "bool"):
            raise ShapeError(f"interpolate of {x.label!r}: axis {tp.axis} outside mask must be ({n},) bool")
    for a in range(x.ndim):
        if a not in seen and shape[a] != x.shape[a]:
            raise ShapeError(f"interpolate of {x.label!r}: axis {a} changes extent but has no tap table")


def compute_dtype(d: dtypes.DType) -> dtypes.DType:
    """What the weighted sum is computed in: float32 for 16-bit floats (as ONNX's reference does
    in float), float64 for float64 and for integers (rounded back as ONNX does), else float32."""
    if d.name == "float64" or not d.is_float:
        return dtypes.float64
    return dtypes.float32


def interpolate(x: Tensor, shape, taps: Sequence[Taps], fill: float = 0.0) -> Tensor:
    """The separable interpolation of x to `shape` through per-axis tap tables (module docstring).
    Axes without a table are kept (identity); integer results round half to even and saturate."""
    x = _x(x, "interpolate")
    shape = _check_shape(shape, f"interpolate of {x.label!r}")
    if len(shape) != x.ndim:
        raise ShapeError(f"interpolate of {x.label!r}: {len(shape)} extents for rank {x.ndim}")
    if x.dtype.name == "bool" or x.dtype.is_struct:
        raise DTypeError(f"interpolate of {x.label!r}: needs a numeric tensor, got {x.dtype}")
    _check(x, shape, taps)
    taps = sorted(taps, key=lambda tp: tp.axis)
    cd, r = compute_dtype(x.dtype), x.ndim
    wide = [tp for tp in taps if tp.index.shape[1] > 1]
    full = tuple(shape) + tuple(tp.index.shape[1] for tp in wide)  # output axes, then multi-tap axes
    tap_axis = {tp.axis: r + k for k, tp in enumerate(wide)}
    strides = [math.prod(x.shape[a + 1 :]) for a in range(r)]
    by_axis = {tp.axis: tp for tp in taps}
    flat, weight = None, None
    for a in range(r):
        tp = by_axis.get(a)
        if tp is None:
            sub = iota(full, a)
        else:
            at = (a, tap_axis[a]) if a in tap_axis else (a,)
            sub = _placed(tp.index if a in tap_axis else reshape(tp.index, shape[a : a + 1]), len(full), at)
            sub = sub.astype(dtypes.int64)
            if tp.weight is not None:
                w = _placed(tp.weight if a in tap_axis else reshape(tp.weight, shape[a : a + 1]), len(full), at)
                weight = w.astype(cd) if weight is None else weight * w.astype(cd)
        term = sub * strides[a] if strides[a] != 1 else sub
        flat = term if flat is None else flat + term
    val = take(reshape(x, (x.size,)), flat, axis=0).astype(cd)
    prod = val if weight is None else val * weight
    y = _sum_taps(prod, r, full[r:])
    outside = None
    for tp in taps:
        if tp.outside is not None:
            m = _placed(tp.outside, r, (tp.axis,))
            outside = m if outside is None else outside | m
    if outside is not None:
        y = where(outside, constant(float(fill), cd), y)
    return _back(y, x.dtype)


def _sum_taps(prod: Tensor, r: int, counts: tuple[int, ...]) -> Tensor:
    """The sum over the trailing tap axes: unrolled (element-wise) up to UNROLL terms."""
    if not counts:
        return prod
    if math.prod(counts) > UNROLL:
        return ops.sum(prod, axis=tuple(range(r, r + len(counts))))
    y = None
    for combo in itertools.product(*(range(c) for c in counts)):
        axes = tuple(range(r, r + len(counts)))
        term = slice(prod, combo, tuple(c + 1 for c in combo), axes)
        term = reshape(term, prod.shape[:r])
        y = term if y is None else y + term
    return y


def _back(y: Tensor, d: dtypes.DType) -> Tensor:
    """The computed value stored as `d`: floats cast, integers rounded half to even (numpy's
    round, as ONNX's reference) and saturated to d's range."""
    if d.is_float:
        return y.astype(d)
    r = ops.floor(y + 0.5)
    tie = (r - y) == 0.5
    odd = (r - ops.floor(r * 0.5) * 2.0) == 1.0
    r = where(tie & odd, r - 1.0, r)
    info = np.iinfo(d.np)
    r = ops.minimum(ops.maximum(r, constant(float(info.min), y.dtype)), constant(float(info.max), y.dtype))
    return r.astype(d)
