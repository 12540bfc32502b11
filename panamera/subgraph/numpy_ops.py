"""ONNX ops evaluated with numpy directly, where onnx's reference evaluator is wrong or slow.

Constant folding (model.py), the library nodes (library.py) and the verifier's reference
(verify.py) use these instead of onnx's reference implementation. The reason is a known bug:
onnx's reference `GatherElements` goes through `np.choose`, which takes at most 32 (numpy 1) or
64 (numpy 2) choices; past that it falls back to a loop that reads one element per row, so a
(1, 512) buffer gathered by a (1, 16) index fails with "cannot reshape array of size 1 into
shape (1,16)". That is the position_ids / token_type_ids pattern of every Hugging Face BERT
export. The index ops (Gather, GatherElements, GatherND) follow ONNX's semantics exactly
(negative indices count from the end, an index out of range is an error, GatherElements'
indices may be smaller than the data on the other axes); the cheap shape and arithmetic ops that
folding meets on the way (Shape, Slice, Concat, Reshape, Cast, Range, ...) are here too, so
folding a real model never builds an evaluator per node.

>>> import numpy as np
>>> buf = np.arange(512, dtype=np.int64).reshape(1, 512)
>>> evaluate("GatherElements", {"axis": 1}, [buf, np.int64([[3, -1]])])[0]
array([[  3, 511]])
>>> evaluate("Gather", {}, [np.float32([[1, 2], [3, 4]]), np.int64(-1)])[0]
array([3., 4.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import helper, numpy_helper
from onnx.reference.op_run import OpRun

Array = np.ndarray | None


class NotHere(NotImplementedError):
    """An attribute or dtype these numpy forms do not cover: the caller uses onnx's reference."""


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise IndexError(f"{what} {axis} is out of range for rank {rank}")
    return a


def _indices(idx: np.ndarray, dim: int) -> np.ndarray:
    """ONNX indices into an extent `dim`: negative ones count from the end; out of range is an error."""
    idx = np.asarray(idx).astype(np.int64)
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        bad = idx[(idx < -dim) | (idx >= dim)].flat[0]
        raise IndexError(f"index {int(bad)} is out of range [-{dim}, {dim})")
    return np.where(idx < 0, idx + dim, idx)


def gather(data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    """ONNX Gather: `np.take` with ONNX's negative indices.

    >>> gather(np.arange(6).reshape(2, 3), np.int64([[-1, 0]]), axis=1)
    array([[[2, 0]],
    <BLANKLINE>
           [[5, 3]]])
    """
    axis = _axis(axis, data.ndim)
    return np.take(data, _indices(indices, data.shape[axis]), axis=axis)


def gather_elements(data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    """ONNX GatherElements: `np.take_along_axis`; on the other axes the indices may be shorter.

    >>> gather_elements(np.arange(6).reshape(2, 3), np.int64([[2], [-3]]), axis=1)
    array([[2],
           [3]])
    """
    axis = _axis(axis, data.ndim)
    if indices.ndim != data.ndim:
        raise ValueError(f"indices have rank {indices.ndim}, data rank {data.ndim}")
    if any(i > d for k, (i, d) in enumerate(zip(indices.shape, data.shape)) if k != axis):
        raise ValueError(f"indices {indices.shape} are larger than data {data.shape} off axis {axis}")
    view = data[tuple(slice(None) if k == axis else slice(0, s) for k, s in enumerate(indices.shape))]
    return np.take_along_axis(view, _indices(indices, data.shape[axis]), axis=axis)


def gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int = 0) -> np.ndarray:
    """ONNX GatherND: the last axis of `indices` addresses the leading axes of each batch.

    >>> gather_nd(np.arange(4).reshape(2, 2), np.int64([[0, 1], [1, -2]]))
    array([1, 2])
    """
    b, r = batch_dims, indices.shape[-1]
    inner = data.shape[b : b + r]
    if len(inner) != r:
        raise ValueError(f"index depth {r} exceeds the data's rank {data.ndim} less {b} batch dims")
    out_shape = indices.shape[:-1] + data.shape[b + r :]
    d = data.reshape((-1,) + data.shape[b:])
    ix = indices.reshape((-1,) + indices.shape[b:])
    parts = []
    for k in range(d.shape[0]):
        coords = tuple(_indices(ix[k][..., j], inner[j]) for j in range(r))
        parts.append(d[k][coords])
    return np.stack(parts).reshape(out_shape) if parts else np.empty(out_shape, data.dtype)


def _ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _shape(attrs, x):
    dims = np.array(x.shape, np.int64)
    n = len(dims)
    start, end = attrs.get("start", 0), attrs.get("end", n)
    return [dims[slice(max(min(start + n if start < 0 else start, n), 0), max(min(end + n if end < 0 else end, n), 0))]]


def _slice(attrs, x, starts=None, ends=None, axes=None, steps=None):
    if "starts" in attrs:  # opset < 10: attributes
        starts, ends, axes = attrs["starts"], attrs["ends"], attrs.get("axes")
    starts, ends = _ints(starts), _ints(ends)
    axes = list(range(len(starts))) if axes is None else [_axis(a, x.ndim) for a in _ints(axes)]
    steps = [1] * len(starts) if steps is None else _ints(steps)
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise ValueError("Slice step 0")
        index[a] = slice(s, e, st)  # Python's slice clamps exactly as ONNX does
    return [x[tuple(index)]]


def _unsqueeze(attrs, x, axes=None):
    axes = _ints(attrs["axes"] if "axes" in attrs else axes)
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(_axis(a, rank) for a in axes)))]


def _squeeze(attrs, x, axes=None):
    axes = attrs.get("axes", axes)
    if axes is None:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(_axis(a, x.ndim) for a in _ints(axes)))]


def _reshape(attrs, x, shape=None):
    shape = _ints(attrs["shape"] if shape is None else shape)
    if not attrs.get("allowzero", 0):
        shape = [x.shape[k] if s == 0 else s for k, s in enumerate(shape)]
    return [x.reshape(shape)]


# Casts numpy does as ONNX does: not strings, not float8 (saturation) nor int4.
_CASTABLE = {"bool", "float16", "float32", "float64", "bfloat16"} | {
    f"{s}int{b}" for s in ("", "u") for b in (8, 16, 32, 64)
}


def _cast(attrs, x):
    dt = np.dtype(helper.tensor_dtype_to_np_dtype(attrs["to"]))
    if dt.name not in _CASTABLE or x.dtype.name not in _CASTABLE:
        raise NotHere(f"Cast from {x.dtype} to {dt}")
    return [x.astype(dt)]


def _range(attrs, start, limit, delta):
    n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    dt = np.asarray(start).dtype
    return [(start + np.arange(n, dtype=dt) * delta).astype(dt)]  # the spec: start + i * delta, in T


def _constant_of_shape(attrs, shape):
    v = attrs.get("value")
    value = numpy_helper.to_array(v).reshape(-1) if v is not None else np.zeros(1, np.float32)
    return [np.full(_ints(shape), value[0], value.dtype)]


def _div(a, b):
    if a.dtype.kind in "iu":  # C-style: truncate toward zero
        q = np.floor_divide(a, b)
        return q + ((np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0))).astype(q.dtype)
    return np.divide(a, b)


def _binary(f: Callable) -> Callable:
    def run(attrs, a, b):
        out = np.asarray(f(a, b))
        return [out if out.dtype == bool else out.astype(a.dtype, copy=False)]

    return run


def _variadic(f: Callable) -> Callable:
    def run(attrs, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = f(out, x)
        return [np.asarray(out).astype(xs[0].dtype, copy=False)]

    return run


def _transpose(attrs, x):
    return [np.transpose(x, attrs.get("perm"))]


def _flatten(attrs, x):
    axis = attrs.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return [x.reshape(int(np.prod(x.shape[:axis])), -1 if x.size else int(np.prod(x.shape[axis:])))]


# op_type -> f(attributes, *inputs) -> outputs. Inputs are numpy arrays, None for an omitted one.
NUMPY_OPS: dict[str, Callable[..., list[np.ndarray]]] = {
    "Gather": lambda attrs, x, i: [gather(x, i, attrs.get("axis", 0))],
    "GatherElements": lambda attrs, x, i: [gather_elements(x, i, attrs.get("axis", 0))],
    "GatherND": lambda attrs, x, i: [gather_nd(x, i, attrs.get("batch_dims", 0))],
    "Shape": _shape,
    "Size": lambda attrs, x: [np.array(x.size, np.int64)],
    "Slice": _slice,
    "Concat": lambda attrs, *xs: [np.concatenate(xs, axis=_axis(attrs["axis"], xs[0].ndim))],
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Identity": lambda attrs, x: [x],
    "Cast": _cast,
    "CastLike": lambda attrs, x, like: _cast({"to": helper.np_dtype_to_tensor_dtype(like.dtype)}, x),
    "Range": _range,
    "ConstantOfShape": _constant_of_shape,
    "Expand": lambda attrs, x, s: [np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(_ints(s)))).copy()],
    "Tile": lambda attrs, x, r: [np.tile(x, _ints(r))],
    "Where": lambda attrs, c, x, y: [np.where(c, x, y).astype(x.dtype, copy=False)],
    "Equal": _binary(np.equal),
    "Less": _binary(np.less),
    "LessOrEqual": _binary(np.less_equal),
    "Greater": _binary(np.greater),
    "GreaterOrEqual": _binary(np.greater_equal),
    "And": _binary(np.logical_and),
    "Or": _binary(np.logical_or),
    "Xor": _binary(np.logical_xor),
    "Not": lambda attrs, x: [np.logical_not(x)],
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _binary(_div),
    "Neg": lambda attrs, x: [np.negative(x)],
    "Abs": lambda attrs, x: [np.abs(x)],
    "Max": _variadic(np.maximum),
    "Min": _variadic(np.minimum),
}


def evaluate(op_type: str, attrs: dict, inputs: list[Array]) -> list[np.ndarray]:
    """The outputs of one default-domain node (`inputs` in order, None where omitted). Raises
    NotHere where these forms do not cover the node (the caller uses onnx's reference).

    >>> evaluate("Slice", {}, [np.arange(10), np.int64([-1]), np.int64([-100]), None, np.int64([-3])])[0]
    array([9, 6, 3, 0])
    """
    f = NUMPY_OPS.get(op_type)
    if f is None:
        raise NotHere(f"{op_type} has no numpy form")
    while inputs and inputs[-1] is None:
        inputs = inputs[:-1]
    if any(i is None for i in inputs[:1]):
        raise NotHere(f"{op_type} without its first input")
    if any(i is not None and np.asarray(i).dtype.kind in "OSUVc" for i in inputs):
        raise NotHere(f"{op_type} on a non-numeric tensor")
    with np.errstate(all="ignore"):  # ONNX arithmetic: inf and NaN, not warnings
        return [np.asarray(o) for o in f(attrs, *[None if i is None else np.asarray(i) for i in inputs])]


class GatherElements(OpRun):
    """onnx's reference GatherElements, corrected (see the module docstring): pass
    `new_ops=REFERENCE_FIXES` to a ReferenceEvaluator."""

    op_domain = ""

    def _run(self, data, indices, axis=None):
        return (gather_elements(data, indices, axis or 0),)


# OpRun classes that replace onnx's reference implementations known to be wrong.
REFERENCE_FIXES = [GatherElements]
