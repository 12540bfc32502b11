"""Scatter-add of rows: `out[r] = sum of src[t] over every t with index[t] == r` (numpy's
`np.add.at(out, index, src)` on a zeroed `out`), the gradient of an embedding lookup or of a
gather along axis 0.

Two strategies, both planned by the polyhedral model, and the cost model chooses (a
formulation choice, schedule/formulation.py):

**Owner computes** (`scatter_add_owner`). Each output row reduces over every source row,
keeping those whose index names it::

    for r, d:  out[r, d] = sum_t (index[t] == r ? src[t, d] : 0)

This is a COLUMN reduction (reduce the outer extent t, the kept extent r·d contiguous):
repeated indices are terms of the same sum, no sort is needed, and the merge is the reduction's
own — one atomic per block per output element when the mapper splits t across blocks, partials
combined in a fixed order by the last block when compiled with `deterministic=True`
(bit-identical results run to run). The price is work: `rows × len(index) × row size` terms, so
it suits small tables (`MAX_TERMS` bounds it).

**Atomic indirect write** (`scatter_add_atomic`). One element-wise statement over the source
whose write goes through the index (poly/statement.py `scatter`)::

    for t, d:  atomicAdd(&out[index[t], d], src[t, d])     # out zeroed first, every call

`len(index) × row size` work for any table; repeated ids are atomics to one address, in any
order, so the last bits may differ run to run: deterministic compiles take owner computes, and
refuse a scatter too large for it.

>>> import panamera as pn
>>> ids = pn.placeholder((5,), "int64", name="ids")
>>> g = pn.placeholder((5, 3), "float32", name="g")
>>> scatter_add_rows(ids, g, rows=4).shape
(4, 3)
"""

from __future__ import annotations

import math

from ..errors import DTypeError, ShapeError, Unsupported
from .ops import arange, sum
from .tensor import Tensor, alternatives, full, where

MAX_TERMS = 1 << 26  # rows × len(index) × row size that the owner-computes form takes


def scatter_add_rows(index: Tensor, src: Tensor, rows: int, skip: int | None = None) -> Tensor:
    """`out` of shape `(rows, *src.shape[index.ndim:])` with `out[index[t]] += src[t]` for every
    position t of `index` (any rank; `src` is indexed by the same leading axes); an index equal to
    `skip` (an embedding's padding_idx) adds nothing, and so does one outside [0, rows) (where
    np.add.at raises an IndexError: `scatter_add_sorted(check=True)` raises one, an IndexRangeError,
    and torch.compile checks the ids where they enter a compiled partition, torch_backend/bounds.py).

    Three formulations, and the planner keeps the one the model prefers (schedule/formulation.py):
    owner computes (`scatter_add_owner`), the atomic indirect write (`scatter_add_atomic`) and
    sorted segments (`scatter_add_sorted`). Over `MAX_TERMS` owner-computes terms owner computes
    is not offered; a deterministic compile never takes the atomic one."""
    tail, n, width = _check_rows(index, src, rows, "scatter_add_rows")
    forms = [("owner_computes", scatter_add_owner(index, src, rows, skip))] if rows * n * width <= MAX_TERMS else []
    forms.append(("atomic", scatter_add_atomic(index, src, rows, skip)))
    if _sortable(src):  # ids outside drop, as in the other forms
        forms.append(("sorted_segments", scatter_add_sorted(index, src, rows, skip, check=False)))
    if len(forms) == 1:
        return forms[0][1]
    return alternatives("scatter_add", tuple(n for n, _ in forms), tuple(t for _, t in forms))


def scatter_add_owner(index: Tensor, src: Tensor, rows: int, skip: int | None = None) -> Tensor:
    """`scatter_add_rows` by owner computes: each output element reduces over every id (a
    COLUMN reduction; `rows × len(index) × row size` terms, at most `MAX_TERMS`)."""
    tail, n, width = _check_rows(index, src, rows, "scatter_add_owner")
    if rows * n * width > MAX_TERMS:
        raise Unsupported(
            f"scatter_add_owner: {rows} rows × {n} indices × {width} elements is {rows * n * width} terms, over the "
            f"owner-computes form's {MAX_TERMS}; scatter_add_atomic takes any table"
        )
    ids = index.reshape((n, 1, 1))
    hit = ids == arange(rows).astype(index.dtype.name).reshape((1, rows, 1))
    if skip is not None:
        hit = hit & (ids != skip)
    return _owner_sum(hit, src.reshape((n, 1, width)), 0, src).reshape((rows, *tail))


def scatter_add_atomic(index: Tensor, src: Tensor, rows: int, skip: int | None = None) -> Tensor:
    """`scatter_add_rows` as an **indirect write**: one statement over the source elements
    `(t, d)` whose write goes through the index, `out[index[t], d] += src[t, d]`, each element
    one atomic add into an output zeroed every call (no terms for other rows: `len(index) × row
    size` work, any table size). Repeated ids are atomics to one address; an id outside
    [0, rows), or equal to `skip`, writes nothing. Atomic float adds run in any order, so the
    result may differ in its last bits run to run: a deterministic compile refuses it.

    >>> import panamera as pn
    >>> ids = pn.placeholder((5,), "int64", name="ids")
    >>> scatter_add_atomic(ids, pn.placeholder((5, 3), "float32", name="g"), rows=100000).shape
    (100000, 3)
    """
    tail, n, width = _check_rows(index, src, rows, "scatter_add_atomic")
    ids = index.reshape((n,))
    if skip is not None:
        ids = where(ids == skip, full((), -1, index.dtype.name), ids)
    vals = _accumulated(src).reshape((n, width))
    out = Tensor("scatter_add", (ids.reshape((n, 1)), vals), (rows, width), vals.dtype, (("axis", 0),))
    return out.astype(src.dtype.name).reshape((rows, *tail))


def scatter_add_sorted(index: Tensor, src: Tensor, rows: int, skip: int | None = None, check: bool = True) -> Tensor:
    """`scatter_add_rows` by **sorted segments**, deterministic for any table size: the ids
    sorted with their positions, each row's segment of source rows summed in position order (in
    pieces of a fixed length, then the pieces in order), so the bits depend on the ids alone,
    never on blocks, threads or timing; rows no id names are zero (schedule/segments.py plans
    it, codegen/segment_kernel.py renders it). An id equal to `skip` adds nothing; with `check`,
    an id outside [0, rows) is an InputError at run time naming `index` (the kernels record the
    least such position; no extra pass), without it adds nothing (`scatter_add_rows`'s contract,
    which every one of its forms keeps). Compiled on its own: the index and the source are the
    compiled computation's inputs.

    >>> import panamera as pn
    >>> ids = pn.placeholder((5,), "int64", name="ids")
    >>> scatter_add_sorted(ids, pn.placeholder((5, 3), "float16", name="g"), rows=100000).dtype.name
    'float16'
    """
    tail, n, width = _check_rows(index, src, rows, "scatter_add_sorted")
    if not _sortable(src):
        raise DTypeError(
            f"scatter_add_sorted: src {src.label!r} has dtype {src.dtype}; sorted segments sum floating-point, "
            "int32 or int64 rows"
        )
    attrs = (("skip", skip), ("index", index.label), ("check", bool(check)))
    out = Tensor("scatter_sorted", (index.reshape((n,)), src.reshape((n, width))), (rows, width), src.dtype, attrs)
    return out.reshape((rows, *tail))


def _owner_sum(hit: Tensor, values: Tensor, axis: int, src: Tensor) -> Tensor:
    """Owner computes' sum over `axis` of `values` where `hit`: in `src`'s dtype for an integer
    source (as the atomic form adds), so that the formulations agree."""
    if src.dtype.is_float:
        return sum(where(hit, values, 0.0), axis=axis)
    return sum(where(hit, values, 0), axis=axis, dtype=src.dtype.name)


def _sortable(src: Tensor) -> bool:
    """Whether sorted segments take `src`'s dtype (floating point, int32 or int64)."""
    return src.dtype.is_float or src.dtype.name in ("int32", "int64")


def _accumulated(src: Tensor) -> Tensor:
    """The values an indirect write adds: 16-bit floats in float32 (a 16-bit atomic would round
    every add; the result is cast back once), 8-bit integers in int32 (CUDA has no 8-bit atomic
    add; the cast back wraps as the 8-bit sum would), bool refused."""
    if src.dtype.name == "bool":
        raise DTypeError(f"scatter-add: src {src.label!r} is bool; atomic adds take numbers")
    if src.dtype.is_16bit_float:
        return src.astype("float32")
    return src.astype("int32") if src.dtype.name in ("int8", "uint8") else src


def _check_rows(index: Tensor, src: Tensor, rows: int, what: str) -> tuple[tuple[int, ...], int, int]:
    """(src's row shape, number of ids, row size) of a scatter-add of rows, its arguments checked."""
    if index.dtype.is_float or index.dtype.name == "bool":
        raise DTypeError(f"{what}: index {index.label!r} has dtype {index.dtype}, not an integer")
    lead = index.ndim
    if src.shape[:lead] != index.shape:
        raise ShapeError(
            f"{what}: src {src.label!r} of shape {src.shape} does not start with the shape {index.shape} "
            f"of index {index.label!r}"
        )
    if rows <= 0:
        raise ShapeError(f"{what}: rows must be positive, got {rows}")
    tail = src.shape[lead:]
    return tail, math.prod(index.shape), math.prod(tail)


def scatter_add_along(index: Tensor, src: Tensor, axis: int, size: int) -> Tensor:
    """torch's `zeros(...).scatter_add(axis, index, src)` for `index` and `src` of one shape S:
    `out[..., index[..., k, ...], ...] += src[..., k, ...]` along `axis`, out of shape S with
    extent `size` on `axis` (numpy: `np.put_along_axis` accumulating). The same two formulations
    as `scatter_add_rows`, the model's choice: owner computes (each output element reduces over
    the k of its line; bounded by `MAX_TERMS`) or the atomic indirect write (one atomic add per
    element of src, its write through index along `axis`; never in a deterministic compile).
    Over `MAX_TERMS` terms, a third where every extent of index off `axis` is 1 (a line of ids,
    `out[index[k]] += src[k]`) and src's dtype sorts: sorted segments (`scatter_add_sorted`,
    keyed by index itself; deterministic at any size, compiled alone). Any other deterministic
    scatter over `MAX_TERMS` has no deterministic form here: the atomic node is named after src,
    the axis and the limit, so that a deterministic compile's refusal (schedule/formulation.py)
    says which scatter and why; torch.compile's scatter_add / scatter_reduce(sum) writes it as
    sorted segments keyed by output position (torch_backend/isolate.py).

    >>> import panamera as pn
    >>> i = pn.placeholder((4, 2), "int64", name="i")
    >>> scatter_add_along(i, pn.placeholder((4, 2), "float32", name="s"), axis=1, size=6).shape
    (4, 6)
    """
    if index.dtype.is_float or index.dtype.name == "bool":
        raise DTypeError(f"scatter_add_along: index {index.label!r} has dtype {index.dtype}, not an integer")
    if src.shape != index.shape:
        raise ShapeError(f"scatter_add_along: src {src.label!r} of shape {src.shape} is not index's {index.shape}")
    if not -index.ndim <= axis < index.ndim:
        raise ShapeError(f"scatter_add_along: axis {axis} out of range for rank {index.ndim}")
    if size <= 0:
        raise ShapeError(f"scatter_add_along: size must be positive, got {size}")
    a = axis % index.ndim
    shape = index.shape
    out_shape = shape[:a] + (size,) + shape[a + 1 :]
    terms = size * math.prod(shape)
    vals = _accumulated(src)
    if terms > MAX_TERMS and _sortable(src) and all(e == 1 for b, e in enumerate(shape) if b != a):
        n = math.prod(shape)  # a line of ids: sorted segments keyed by index itself, first (the fallback)
        line = scatter_add_sorted(index.reshape((n,)), src.reshape((n,)), size, check=False).reshape(out_shape)
        atomic = Tensor("scatter_add", (index, vals), out_shape, vals.dtype, (("axis", a),)).astype(src.dtype.name)
        return alternatives("scatter_add_along", ("sorted_segments", "atomic"), (line, atomic))
    over = f"scatter_add_along of {src.label} on axis {a}: {terms} terms > MAX_TERMS {MAX_TERMS}"
    atomic = Tensor(
        "scatter_add", (index, vals), out_shape, vals.dtype, (("axis", a),), name=over if terms > MAX_TERMS else ""
    )
    atomic = atomic.astype(src.dtype.name)
    if terms > MAX_TERMS:  # named for a deterministic compile's refusal (schedule/formulation.py)
        return atomic
    spread = shape[: a + 1] + (1,) + shape[a + 1 :]  # a new axis a+1 for the output position r
    r = arange(size).astype(index.dtype.name).reshape((1,) * (a + 1) + (size,) + (1,) * (len(shape) - a - 1))
    owner = _owner_sum(index.reshape(spread) == r, src.reshape(spread), a, src)
    return alternatives("scatter_add_along", ("owner_computes", "atomic"), (owner, atomic))
