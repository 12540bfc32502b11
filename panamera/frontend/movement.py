"""Data movement as access relations: slicing, padding, concatenation, tiling, resizing and
gathers, fused into whatever reads them (never a copy of their own).

Every op here is a *remap*: a tensor whose element at `out` is its input's element at a
(quasi-)affine function of `out` per input axis (`AxisMap`; poly/movement.py turns it into an
isl piecewise quasi-affine subscript), optionally selected by an index mask (padding's constant,
concatenation's pieces) built from `iota` comparisons. Gathers read through an index tensor:
their subscript is a loaded value, so they are the one *non-affine* access (see `take`).

>>> import panamera as pn
>>> x = pn.placeholder((4, 6), "float32", name="x")
>>> pn.slice(x, (0, 5), (4, 0), axes=(0, 1), steps=(2, -2)).shape
(2, 3)
>>> pn.pad(x, ((1, 1), (0, 2)), mode="reflect").shape
(6, 8)
>>> [t.shape for t in pn.split(x, 3, axis=1)]
[(4, 2), (4, 2), (4, 2)]
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from ..dtypes import promote
from ..enums import StrEnum
from ..errors import AxisError, DTypeError, EmptyAxisError, OptionError, ShapeError
from . import symbolic
from .reduce import keep_inputs
from .tensor import Tensor, _check_shape, broadcast_to, constant, iota, reshape, transpose, where


class Boundary(StrEnum):
    """What a subscript outside [0, n) of the input becomes."""

    NONE = "none"  # cannot happen (the map stays inside)
    CLAMP = "clamp"  # the nearest edge element (pad edge)
    MASKED = "masked"  # any element: a select discards the read (constant pad, concat, pool and conv windows)
    REFLECT = "reflect"  # mirrored about the edges, edges not repeated (numpy's reflect)
    WRAP = "wrap"  # modulo n (tile, pad wrap)


@dataclass(frozen=True)
class AxisMap:
    """One input subscript as a function of the output index `out`:
    `boundary(floor((sum(c * out[k] for k, c in terms) + offset) / den))`.

    >>> AxisMap(((0, 2),), offset=1).describe()
    'floor((2*o0 + 1) / 1) clamp'
    """

    terms: tuple[tuple[int, int], ...]
    offset: int = 0
    den: int = 1
    boundary: Boundary = Boundary.CLAMP

    def describe(self) -> str:
        lin = " + ".join(f"{c}*o{k}" for k, c in self.terms) or "0"
        return f"floor(({lin} + {self.offset}) / {self.den}) {self.boundary}"


def _x(x, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    return x


def _axis(a, ndim: int, op: str, label: str) -> int:
    try:
        a = operator.index(a)
    except TypeError:
        raise AxisError(f"{op} of {label!r}: axis {a!r} is not an integer") from None
    if not -ndim <= a < max(ndim, 1):
        raise AxisError(f"{op} of {label!r}: axis {a} is out of range for rank {ndim}")
    return a % max(ndim, 1)


def remap(x: Tensor, shape, maps: Sequence[AxisMap]) -> Tensor:
    """The tensor of `shape` whose element `out` is x[maps[0](out), maps[1](out), ...]."""
    x = _x(x, "remap")
    shape = _check_shape(shape, f"remap of {x.label!r}")
    if len(maps) != x.ndim:
        raise ShapeError(f"remap of {x.label!r}: {len(maps)} axis maps for rank {x.ndim}")
    if any(k >= len(shape) for m in maps for k, _ in m.terms):
        raise AxisError(f"remap of {x.label!r}: an axis map reads beyond the output rank {len(shape)}")
    ident = tuple(AxisMap(((k,),)) for k in range(x.ndim))
    if shape == x.shape and tuple(maps) == ident:
        return x
    return Tensor("movement", (x,), shape, x.dtype, attrs=(("index", tuple(maps)),))


def _index_in(shape, m: AxisMap, lo: int, hi: int) -> Tensor | None:
    """A bool mask: lo <= sum(c * out[k]) + offset < hi (None when always true)."""
    v = None
    for k, c in m.terms:
        t = iota(shape, k) * c if c != 1 else iota(shape, k)
        v = t if v is None else v + t
    if v is None:
        return None if lo <= m.offset < hi else iota(shape) < 0
    v = v + m.offset if m.offset else v
    return (v >= lo) & (v < hi)


def _and(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    return b if a is None else a if b is None else a & b


# -- slicing and splitting ------------------------------------------------------------------
def slice(x: Tensor, starts, ends, axes=None, steps=None) -> Tensor:  # noqa: A001 - ONNX's and Python's name
    """ONNX Slice (numpy's x[start:end:step] per axis, negative steps included; out-of-range
    bounds clamp as in Python). The result is an affine access of x, never a copy.

    >>> import panamera as pn
    >>> pn.slice(pn.placeholder((10,), name="v"), (-1,), (-11,), steps=(-3,)).shape
    (4,)
    """
    x = _x(x, "slice")
    starts, ends = tuple(starts), tuple(ends)
    axes = tuple(range(len(starts))) if axes is None else tuple(axes)
    steps = (1,) * len(starts) if steps is None else tuple(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError(f"slice of {x.label!r}: starts, ends, axes and steps differ in length")
    axes = tuple(_axis(a, x.ndim, "slice", x.label) for a in axes)
    if len(set(axes)) != len(axes):
        raise AxisError(f"slice of {x.label!r}: axes {axes} repeat")
    shape, maps = list(x.shape), [AxisMap(((k, 1),), boundary=Boundary.NONE) for k in range(x.ndim)]
    for a, s, e, st in zip(axes, starts, ends, steps):
        if int(st) == 0:
            raise ShapeError(f"slice of {x.label!r}: step 0 on axis {a}")
        start, stop, step = builtins.slice(int(s), int(e), int(st)).indices(x.shape[a])
        shape[a] = len(range(start, stop, step))
        maps[a] = AxisMap(((a, step),), offset=start, boundary=Boundary.NONE)
    return remap(x, shape, maps)


def split(x: Tensor, sections, axis: int = 0) -> tuple[Tensor, ...]:
    """numpy.split / ONNX Split: `sections` equal parts (an int; ONNX's uneven last part
    allowed) or the given sizes (a sequence). Each part is a slice: an access, not a copy."""
    x = _x(x, "split")
    a = _axis(axis, x.ndim, "split", x.label)
    n = x.shape[a]
    if isinstance(sections, int):
        if sections <= 0:
            raise ShapeError(f"split of {x.label!r}: {sections} parts")
        size = -(-n // sections)
        sizes = [min(size, n - k * size) for k in range(sections)]
    else:
        sizes = [int(s) for s in sections]
    if any(s < 0 for s in sizes) or sum(sizes) != n:
        raise ShapeError(f"split of {x.label!r}: sizes {sizes} do not add up to axis {a}'s extent {n}")
    out, off = [], 0
    for s in sizes:
        out.append(slice(x, (off,), (off + s,), (a,)))
        off += s
    return tuple(out)


# -- joining ----------------------------------------------------------------------------------
def concatenate(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """numpy.concatenate: a select over the pieces by the output index along `axis`, each piece
    read through a shifted (clamped) access; one statement, no copies.

    >>> import panamera as pn
    >>> a, b = pn.placeholder((2, 3), name="a"), pn.placeholder((2, 5), name="b")
    >>> pn.concatenate([a, b], axis=1).shape
    (2, 8)
    """
    ts = [_x(t, "concatenate") for t in tensors]
    if not ts:
        raise ShapeError("concatenate: no tensors")
    a = _axis(axis, ts[0].ndim, "concatenate", ts[0].label)
    for t in ts[1:]:
        if t.ndim != ts[0].ndim or any(s != r for k, (s, r) in enumerate(zip(t.shape, ts[0].shape)) if k != a):
            raise ShapeError(f"concatenate along axis {a}: shapes {ts[0].shape} and {t.shape} do not match")
    d = ts[0].dtype
    for t in ts[1:]:
        d = promote(d, t.dtype, what="concatenate")
    shape = list(ts[0].shape)
    shape[a] = sum(t.shape[a] for t in ts)
    shape = tuple(shape)
    pieces, off = [], 0
    for t in ts:
        if t.shape[a]:
            maps = [AxisMap(((k, 1),)) for k in range(t.ndim)]
            maps[a] = AxisMap(((a, 1),), offset=-off, boundary=Boundary.MASKED)
            pieces.append((off, remap(t, shape, maps).astype(d)))
        off += t.shape[a]
    if not pieces:  # all empty: an empty result that keeps every piece an input
        y = remap(ts[0], shape, [AxisMap(((k, 1),)) for k in range(ts[0].ndim)]).astype(d)
        return keep_inputs(y, *ts[1:])
    y = pieces[-1][1]
    for (_, piece), (end, _) in zip(reversed(pieces[:-1]), reversed(pieces[1:])):
        y = where(iota(shape, a) < end, piece, y)  # piece k covers [its start, the next piece's start)
    return keep_inputs(y, *(t for t in ts if not t.shape[a]))  # the empty pieces stay inputs


def pad(x: Tensor, pads, mode: str = "constant", value=0) -> Tensor:
    """numpy.pad with ((before, after), ...) per axis; mode constant (a select against `value`),
    edge (a clamped access), reflect (a mirrored access, any pad length) or wrap. Negative pads
    crop.

    >>> import panamera as pn
    >>> pn.pad(pn.placeholder((3,), name="p"), ((2, -1),), mode="edge").shape
    (4,)
    """
    x = _x(x, "pad")
    pads = [tuple(int(v) for v in p) for p in pads]
    if len(pads) != x.ndim or any(len(p) != 2 for p in pads):
        raise ShapeError(f"pad of {x.label!r}: need (before, after) for each of {x.ndim} axes, got {pads}")
    try:
        mode = PadMode(mode)
    except ValueError:
        raise OptionError(f"pad of {x.label!r}: mode {mode!r} is not one of {[m.value for m in PadMode]}") from None
    shape = tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, pads))
    if any(s < 0 for s in shape):
        raise ShapeError(f"pad of {x.label!r}: pads {pads} crop more than the extents {x.shape}")
    if mode != PadMode.CONSTANT and x.size == 0 and math.prod(shape):
        raise ShapeError(f"pad of {x.label!r}: mode {mode} of an empty tensor")
    if x.size == 0:  # nothing to read: all `value` (an empty x stays an input)
        return keep_inputs(broadcast_to(constant(value, x.dtype), shape), x)
    bound = {PadMode.CONSTANT: Boundary.MASKED, PadMode.EDGE: Boundary.CLAMP, PadMode.REFLECT: Boundary.REFLECT}
    maps, mask = [], None
    for k, (n, (lo, _)) in enumerate(zip(x.shape, pads)):
        b = bound.get(mode, Boundary.WRAP)
        if b == Boundary.REFLECT and n == 1:
            b = Boundary.CLAMP
        m = AxisMap(((k, 1),), offset=-lo, boundary=b)
        maps.append(m)
        if mode == PadMode.CONSTANT:
            mask = _and(mask, _index_in(shape, m, 0, n))
    y = remap(x, shape, maps)
    if mask is None:
        return y
    return where(mask, y, constant(value, x.dtype))


class PadMode(StrEnum):
    CONSTANT = "constant"
    EDGE = "edge"
    REFLECT = "reflect"
    WRAP = "wrap"


def tile(x: Tensor, reps) -> Tensor:
    """numpy.tile (reps of x's rank or longer): a modulo access."""
    x = _x(x, "tile")
    reps = tuple(int(r) for r in reps)
    if any(r < 0 for r in reps):
        raise ShapeError(f"tile of {x.label!r}: negative repetitions {reps}")
    if len(reps) > x.ndim:
        x = reshape(x, (1,) * (len(reps) - x.ndim) + x.shape)
    reps = (1,) * (x.ndim - len(reps)) + reps
    shape = tuple(n * r for n, r in zip(x.shape, reps))
    maps = [AxisMap(((k, 1),), boundary=Boundary.WRAP if r > 1 else Boundary.NONE) for k, r in enumerate(reps)]
    return remap(x, shape, maps)


def tril(x: Tensor, k: int = 0) -> Tensor:
    """numpy.tril over the last two axes: a select on the index (j - i <= k)."""
    x = _x(x, "tril")
    return _tri(x, k, upper=False)


def triu(x: Tensor, k: int = 0) -> Tensor:
    """numpy.triu over the last two axes: a select on the index (j - i >= k)."""
    x = _x(x, "triu")
    return _tri(x, k, upper=True)


def _tri(x: Tensor, k: int, upper: bool) -> Tensor:
    if x.ndim < 2:
        raise ShapeError(f"{'triu' if upper else 'tril'} of {x.label!r}: needs rank >= 2, got {x.shape}")
    if x.size == 0:
        return x
    diff = iota(x.shape, x.ndim - 1) - iota(x.shape, x.ndim - 2)
    keep = diff >= int(k) if upper else diff <= int(k)
    return where(keep, x, constant(0, x.dtype))


def depth_to_space(x: Tensor, block: int, mode: str = "DCR") -> Tensor:
    """ONNX DepthToSpace on NCHW: reshape, transpose, reshape (three views, one access)."""
    x = _x(x, "depth_to_space")
    if x.ndim != 4 or block <= 0 or x.shape[1] % (block * block):
        raise ShapeError(f"depth_to_space of {x.label!r}: needs NCHW with C divisible by {block}², got {x.shape}")
    n, c, h, w = x.shape
    b, cc = block, c // (block * block)
    if mode == "DCR":
        y = transpose(reshape(x, (n, b, b, cc, h, w)), (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        y = transpose(reshape(x, (n, cc, b, b, h, w)), (0, 1, 4, 2, 5, 3))
    else:
        raise OptionError(f"depth_to_space of {x.label!r}: mode {mode!r} is not 'DCR' or 'CRD'")
    return reshape(y, (n, cc, h * b, w * b))


def space_to_depth(x: Tensor, block: int, mode: str = "DCR") -> Tensor:
    """ONNX SpaceToDepth on NCHW (the inverse of depth_to_space): reshape, transpose, reshape."""
    x = _x(x, "space_to_depth")
    if x.ndim != 4 or block <= 0 or x.shape[2] % block or x.shape[3] % block:
        raise ShapeError(f"space_to_depth of {x.label!r}: needs NCHW with H, W divisible by {block}, got {x.shape}")
    if mode not in ("DCR", "CRD"):
        raise OptionError(f"space_to_depth of {x.label!r}: mode {mode!r} is not 'DCR' or 'CRD'")
    n, c, h, w = x.shape
    b = block
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    y = transpose(reshape(x, (n, c, h // b, b, w // b, b)), perm)
    return reshape(y, (n, c * b * b, h // b, w // b))


class CoordMode(StrEnum):
    HALF_PIXEL = "half_pixel"
    PYTORCH_HALF_PIXEL = "pytorch_half_pixel"
    ALIGN_CORNERS = "align_corners"
    ASYMMETRIC = "asymmetric"
    TF_HALF_PIXEL_FOR_NN = "tf_half_pixel_for_nn"


class NearestMode(StrEnum):
    ROUND_PREFER_FLOOR = "round_prefer_floor"
    ROUND_PREFER_CEIL = "round_prefer_ceil"
    FLOOR = "floor"
    CEIL = "ceil"


def resize_nearest(x: Tensor, shape, scales, coord: str = "half_pixel", nearest: str = "round_prefer_floor") -> Tensor:
    """ONNX Resize, nearest mode: each output subscript is the nearest input coordinate of a
    rational affine map, floor((a * out + b) / d) clamped to the input: quasi-affine.
    `scales` are exact rationals (Fractions or ints), one per axis.

    >>> import panamera as pn
    >>> resize_nearest(pn.placeholder((1, 1, 2, 2), name="im"), (1, 1, 4, 6), (1, 1, 2, 3)).shape
    (1, 1, 4, 6)
    """
    x = _x(x, "resize")
    shape = _check_shape(shape, f"resize of {x.label!r}")
    try:
        coord, nearest = CoordMode(coord), NearestMode(nearest)
    except ValueError as e:
        raise OptionError(f"resize of {x.label!r}: {e}") from None
    if len(shape) != x.ndim or len(scales) != x.ndim:
        raise ShapeError(f"resize of {x.label!r}: {len(shape)} sizes and {len(scales)} scales for rank {x.ndim}")
    maps = []
    for k, (n, s) in enumerate(zip(x.shape, scales)):
        s = Fraction(s)
        if s <= 0:
            raise ShapeError(f"resize of {x.label!r}: scale {s} on axis {k} is not positive")
        # x_original = (a * out + b) / d for each coordinate transformation; as ONNX's reference,
        # align_corners and pytorch_half_pixel use the unrounded output extent s * n
        w = s * n
        if coord == CoordMode.ALIGN_CORNERS:
            r = Fraction(n - 1) / (w - 1) if w != 1 else Fraction(0)
            a, b, d = r.numerator, 0, r.denominator
        elif coord == CoordMode.ASYMMETRIC:
            a, b, d = s.denominator, 0, s.numerator
        elif coord == CoordMode.TF_HALF_PIXEL_FOR_NN:  # (out + 1/2) / s
            a, b, d = 2 * s.denominator, s.denominator, 2 * s.numerator
        elif coord == CoordMode.PYTORCH_HALF_PIXEL and w == 1:
            a, b, d = 0, -1, 2
        else:  # half_pixel: (out + 1/2) / s - 1/2
            a, b, d = 2 * s.denominator, s.denominator - s.numerator, 2 * s.numerator
        # the nearest integer of (a out + b) / d, as floor((a' out + b') / d')
        if nearest == NearestMode.FLOOR:
            a2, b2, d2 = a, b, d
        elif nearest == NearestMode.CEIL:
            a2, b2, d2 = a, b + d - 1, d
        elif nearest == NearestMode.ROUND_PREFER_FLOOR:  # ceil(x - 1/2)
            a2, b2, d2 = 2 * a, 2 * b + d - 1, 2 * d
        else:  # floor(x + 1/2)
            a2, b2, d2 = 2 * a, 2 * b + d, 2 * d
        maps.append(AxisMap(((k, a2),) if a2 else (), offset=b2, den=d2))
    return remap(x, shape, maps)


# -- gathers: the non-affine reads --------------------------------------------------------------
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
