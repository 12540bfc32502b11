"""Gathers, the non-affine reads (`take`, `take_along_axis`, `gather_nd`: x read at a loaded
subscript), and numpy's basic indexing (`index`: slices, integers, None and one integer Tensor,
built on frontend/movement.py's `slice` and `take`). Like movement's remaps they are access
relations fused into whatever reads them, never a copy.
"""

from __future__ import annotations

import builtins
import math
import operator

from ..errors import AxisError, DTypeError, EmptyAxisError, ShapeError
from . import symbolic
from .movement import _axis, _x, slice
from .tensor import Tensor, iota, reshape, where


def refuse_empty_axis(op: str, x: Tensor, indices: Tensor, axis: int, sizes: dict[str, int] | None = None) -> None:
    """An EmptyAxisError when `x`'s `axis` has extent 0 and `indices` are not empty: a gather
    clamps an id to [0, n), and [0, 0) has no element (numpy's and torch's IndexError). Without
    `sizes`, only where both are static (`take`, `take_along_axis`, `gather_nd` when they are
    built); with `sizes`, at a symbolic program's bound sizes (dynamic.py `bind_sizes`, every call).

    >>> import panamera as pn
    >>> take(pn.placeholder((0, 8), name="emb"), pn.placeholder((3,), "int64", name="ids"))
    Traceback (most recent call last):
    ...
    panamera.errors.EmptyAxisError: take of 'emb' (0, 8): axis 0 has extent 0, so index 'ids' of shape (3,) has no id in range
    """
    n, shape = x.shape[axis], indices.shape
    if sizes is not None:
        (n,), shape = symbolic.evaluate((n,), sizes), symbolic.evaluate(shape, sizes)
    elif not isinstance(n, int) or not all(isinstance(e, int) for e in shape):
        return  # symbolic: checked when the sizes are bound
    if n == 0 and math.prod(shape) > 0:
        at = "" if sizes is None else f" at {sizes}"
        raise EmptyAxisError(
            f"{op} of {x.label!r} {x.shape}: axis {axis} has extent 0{at}, so index {indices.label!r} of shape "
            f"{indices.shape} has no id in range"
        )


def take(x: Tensor, indices: Tensor, axis: int = 0) -> Tensor:
    """numpy.take / ONNX Gather: x read at a *loaded* subscript along `axis` (negative indices
    count from the end; out-of-range ones are clamped, a GPU kernel cannot raise: numpy's
    `mode="clip"`, where np.take's default raises an IndexError; torch.compile checks the ids
    where they enter a compiled partition, torch_backend/bounds.py, and raises as eager); from an
    axis of extent 0 there is nothing to clamp to: a non-empty index is an EmptyAxisError
    (`refuse_empty_axis`). The read is non-affine: isl cannot know which element it touches, so
    the read is modeled as touching the whole axis, and x is never fused into the gathering
    statement (it is materialized first).

    >>> import panamera as pn
    >>> take(pn.placeholder((50, 8), name="emb"), pn.placeholder((2, 3), "int64", name="ids")).shape
    (2, 3, 8)
    """
    x, indices = _x(x, "take"), _x(indices, "take")
    if indices.dtype.is_float or indices.dtype.name == "bool":
        raise DTypeError(f"take of {x.label!r}: indices {indices.label!r} must be integers, got {indices.dtype}")
    a = _axis(axis, x.ndim, "take", x.label)
    refuse_empty_axis("take", x, indices, a)
    shape = x.shape[:a] + indices.shape + x.shape[a + 1 :]
    return Tensor("gather", (x, indices), shape, x.dtype, attrs=(("axis", a), ("elements", False)))


def take_along_axis(x: Tensor, indices: Tensor, axis: int) -> Tensor:
    """numpy.take_along_axis / ONNX GatherElements: out[..., i, ...] = x[..., indices[..., i,
    ...], ...] along `axis`; the other extents of `indices` may be smaller than x's."""
    x, indices = _x(x, "take_along_axis"), _x(indices, "take_along_axis")
    if indices.dtype.is_float or indices.dtype.name == "bool":
        raise DTypeError(f"take_along_axis of {x.label!r}: indices must be integers, got {indices.dtype}")
    a = _axis(axis, x.ndim, "take_along_axis", x.label)
    if indices.ndim != x.ndim or any(
        not (i == n) and i > n for k, (i, n) in enumerate(zip(indices.shape, x.shape)) if k != a
    ):  # (an equal symbolic extent needs no comparison)
        raise ShapeError(f"take_along_axis of {x.label!r}: indices of shape {indices.shape} do not fit {x.shape}")
    refuse_empty_axis("take_along_axis", x, indices, a)
    return Tensor("gather", (x, indices), indices.shape, x.dtype, attrs=(("axis", a), ("elements", True)))


def gather_nd(x: Tensor, indices: Tensor, batch_dims: int = 0) -> Tensor:
    """ONNX GatherND: the last axis of `indices` (depth k) addresses axes b..b+k-1 of x, batch
    by batch over the first `batch_dims` = b axes. The k loaded subscripts (negative ones count
    from the end) and the batch position fold into one flat subscript of x's leading b+k axes,
    an element-wise int64 expression of the index tensor and iotas; the read is then one `take`
    of x viewed as (prod(leading), rest...): a single non-affine read, like Gather.

    >>> import panamera as pn
    >>> gather_nd(pn.placeholder((2, 3, 4), name="d"), pn.placeholder((2, 5, 1), "int64", name="i"), 1).shape
    (2, 5, 4)
    """
    x, indices = _x(x, "gather_nd"), _x(indices, "gather_nd")
    if indices.dtype.is_float or indices.dtype.name == "bool":
        raise DTypeError(f"gather_nd of {x.label!r}: indices {indices.label!r} must be integers, got {indices.dtype}")
    b = operator.index(batch_dims)
    if indices.ndim < 1 or not 0 <= b < min(indices.ndim, x.ndim + 1):
        raise AxisError(f"gather_nd of {x.label!r}: batch_dims {b} out of range for indices of rank {indices.ndim}")
    k = indices.shape[-1]
    if indices.shape[:b] != x.shape[:b] or b + k > x.ndim:
        raise ShapeError(
            f"gather_nd of {x.label!r}: indices {indices.label!r} of shape {indices.shape} do not address "
            f"x of shape {x.shape} with batch_dims {b} (batch extents must match, depth <= rank - batch_dims)"
        )
    for j in range(b, b + k):
        refuse_empty_axis("gather_nd", x, indices, j)
    ishape, lead, rest = indices.shape[:-1], x.shape[: b + k], x.shape[b + k :]
    flat = None
    for j, st in enumerate(_c_strides(lead)):
        if j < b:
            sub = iota(ishape, j)
        else:
            n = x.shape[j]
            sub = reshape(slice(indices, (j - b,), (j - b + 1,), (indices.ndim - 1,)), ishape).astype("int64")
            sub = where(sub < 0, sub + n, sub)
        term = sub * st if st != 1 else sub
        flat = term if flat is None else flat + term
    if flat is None:  # depth 0, no batch: every index tuple reads all of x
        flat = iota(ishape, None) * 0
    return take(reshape(x, (math.prod(lead),) + rest), flat, axis=0)


def _c_strides(shape) -> list[int]:
    return [math.prod(shape[k + 1 :]) for k in range(len(shape))]


def index(x: Tensor, key) -> Tensor:
    """numpy's basic indexing `x[key]`: integers (the axis dropped; negative ones count from the
    end), slices (steps, negative steps), `None` (a new axis of extent 1) and one `...`; one
    integer Tensor among slices is `take` along its axis (numpy's single advanced index). Each
    is an access relation (slice, reshape, take), never a copy.

    >>> import panamera as pn
    >>> v = pn.placeholder((4, 6, 8), name="v")
    >>> v[1, ::-2, None].shape, v[..., 2:5].shape, v[:, None][0].shape
    ((3, 1, 8), (4, 6, 3), (1, 6, 8))
    >>> v[pn.placeholder((2, 5), "int32", name="ids")].shape
    (2, 5, 6, 8)
    """
    x = _x(x, "index")
    key = key if isinstance(key, tuple) else (key,)
    what = f"index of {x.label!r} {x.shape}"
    for k in key:
        if isinstance(k, bool) or not (
            k is None or k is Ellipsis or isinstance(k, (builtins.slice, Tensor)) or hasattr(k, "__index__")
        ):
            raise DTypeError(
                f"{what}: {k!r} is not an index (integers, slices, None, ... and one integer Tensor are; "
                "take, take_along_axis and where cover the rest)"
            )
    if sum(k is Ellipsis for k in key) > 1:
        raise AxisError(f"{what}: an index can only have a single ellipsis ('...')")
    tensors = [k for k in key if isinstance(k, Tensor)]
    if len(tensors) > 1 or (tensors and any(hasattr(k, "__index__") for k in key)):
        raise AxisError(f"{what}: one integer Tensor among slices is supported; index in two steps for more")
    consumed = sum(k is not None and k is not Ellipsis for k in key)
    if consumed > x.ndim:
        raise AxisError(f"{what}: too many indices ({consumed}) for rank {x.ndim}")
    at = next((n for n, k in enumerate(key) if k is Ellipsis), len(key))
    key = key[:at] + (builtins.slice(None),) * (x.ndim - consumed) + key[at + 1 :]
    starts, ends, steps, shape = [], [], [], []
    axis, taken = 0, None
    for k in key:
        if k is None:
            shape.append(1)
            continue
        n = x.shape[axis]
        if isinstance(k, Tensor):
            if k.dtype.is_float or k.dtype.name == "bool":
                raise DTypeError(f"{what}: index tensor {k.label!r} must hold integers, got {k.dtype}")
            taken = (axis, k)
            shape.extend(k.shape)
            start, stop, step = 0, n, 1
        elif isinstance(k, builtins.slice):
            if k.step is not None and operator.index(k.step) == 0:
                raise ShapeError(f"{what}: slice step cannot be zero (axis {axis})")
            start, stop, step = k.indices(n)
            shape.append(len(range(start, stop, step)))
            if not shape[-1]:  # empty; indices() may give start -1 (before element 0), not the last
                start, stop, step = 0, 0, 1
        else:
            i = operator.index(k)
            if not -n <= i < n:
                raise AxisError(f"{what}: index {i} is out of bounds for axis {axis} with size {n}")
            start, stop, step = i % n, i % n + 1, 1
        starts.append(start)
        ends.append(-(n + 1) if step < 0 and stop < 0 else stop)  # a negative step down to element 0
        steps.append(step)
        axis += 1
    y = x if all(s == 0 and e == n and st == 1 for s, e, st, n in zip(starts, ends, steps, x.shape)) else None
    y = y if y is not None else slice(x, starts, ends, steps=steps)
    if taken is not None:
        y = take(y, taken[1], axis=taken[0])
    return y if y.shape == tuple(shape) else reshape(y, tuple(shape))
