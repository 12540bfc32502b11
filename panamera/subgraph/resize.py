"""ONNX Resize in every mode: the per-axis tap tables, computed on the host at convert time.

Resize is separable: along each axis the source coordinate of output index o is a function of o
alone (`source_coords`, one formula per coordinate_transformation_mode), its neighbours and their
weights follow from the mode (nearest, linear, cubic with cubic_coeff_a and exclude_outside,
linear/cubic antialiased when downscaling), and points beyond the input are the edge's (indices
clamped). So each axis is an (out, T) table of subscripts and weights that depends on shapes and
attributes only; the device computes the weighted sum of gathered reads (frontend/interpolate.py).
The formulas, tie-breaking and neighbour windows are those of the ONNX specification, as its
reference implementation computes them (float64), so every Resize node test matches it.

Nearest resizes whose coordinate map is affine stay a quasi-affine access with no table at all
(frontend/movement.resize_nearest); the rest (tf_crop_and_resize, half_pixel_symmetric,
interpolation) go through the tables.

>>> t = axis_table(0, 2, 4, 2.0, ResizeSpec(mode=Mode.LINEAR), None)  # 2x, half_pixel: edges clamp
>>> t.index.tolist(), t.weight.tolist()
([[0, 0], [0, 1], [0, 1], [1, 1]], [[0.25, 0.75], [0.75, 0.25], [0.25, 0.75], [0.75, 0.25]])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..enums import StrEnum
from ..errors import OptionError, ShapeError


class Mode(StrEnum):
    NEAREST = "nearest"
    LINEAR = "linear"
    CUBIC = "cubic"


class Coord(StrEnum):
    HALF_PIXEL = "half_pixel"
    HALF_PIXEL_SYMMETRIC = "half_pixel_symmetric"
    PYTORCH_HALF_PIXEL = "pytorch_half_pixel"
    ALIGN_CORNERS = "align_corners"
    ASYMMETRIC = "asymmetric"
    TF_HALF_PIXEL_FOR_NN = "tf_half_pixel_for_nn"
    TF_CROP_AND_RESIZE = "tf_crop_and_resize"


class Nearest(StrEnum):
    ROUND_PREFER_FLOOR = "round_prefer_floor"
    ROUND_PREFER_CEIL = "round_prefer_ceil"
    FLOOR = "floor"
    CEIL = "ceil"


@dataclass(frozen=True)
class ResizeSpec:
    """A Resize node's interpolation attributes, checked."""

    mode: Mode = Mode.NEAREST
    coord: Coord = Coord.HALF_PIXEL
    nearest: Nearest = Nearest.ROUND_PREFER_FLOOR
    cubic_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False
    extrapolation: float = 0.0


@dataclass(frozen=True)
class AxisTable:
    """One axis' taps: `index` (out, T) subscripts in [0, n), `weight` (out, T) or None (a single
    tap of weight 1), `outside` (out,) bool or None (tf_crop_and_resize's extrapolated points)."""

    axis: int
    index: np.ndarray
    weight: np.ndarray | None
    outside: np.ndarray | None


def source_coords(n: int, out: int, scale: float, coord: Coord, roi) -> tuple[np.ndarray, np.ndarray | None]:
    """The input coordinate of each output index (float64) and, for tf_crop_and_resize, which of
    them fall outside [0, n - 1]."""
    y = np.arange(out, dtype=np.float64)
    width = scale * n  # the unrounded output extent
    outside = None
    if coord == Coord.ALIGN_CORNERS:
        x = np.zeros(out) if width == 1 else y * (n - 1) / (width - 1)
    elif coord == Coord.ASYMMETRIC:
        x = y / scale
    elif coord == Coord.TF_HALF_PIXEL_FOR_NN:
        x = (y + 0.5) / scale
    elif coord == Coord.TF_CROP_AND_RESIZE:
        lo, hi = roi
        x = np.full(out, (hi - lo) * (n - 1) / 2) if width == 1 else y * (hi - lo) * (n - 1) / (width - 1)
        x = x + lo * (n - 1)
        outside = (x < 0) | (x > n - 1)
    elif coord == Coord.PYTORCH_HALF_PIXEL:
        x = np.full(out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif coord == Coord.HALF_PIXEL_SYMMETRIC:
        x = n / 2 * (1 - out / width) + (y + 0.5) / scale - 0.5
    else:
        x = (y + 0.5) / scale - 0.5
    return x, (outside if outside is not None and outside.any() else None)


def _cubic(s: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances s."""
    s = np.abs(s)
    near = ((a + 2) * s - (a + 3)) * s * s + 1
    far = ((a * s - 5 * a) * s + 8 * a) * s - 4 * a
    return np.where(s <= 1, near, np.where(s < 2, far, 0.0))


def coefficients(ratio: np.ndarray, scale: float, spec: ResizeSpec) -> np.ndarray:
    """(out, T) weights of the T neighbours of each point, `ratio` in (0, 1] its distance past
    the left neighbour (1 on an input point)."""
    r = ratio[:, None]
    if spec.mode == Mode.NEAREST:
        if spec.nearest == Nearest.ROUND_PREFER_FLOOR:
            right = r > 0.5
        elif spec.nearest == Nearest.ROUND_PREFER_CEIL:
            right = r >= 0.5
        else:
            right = np.full(r.shape, spec.nearest == Nearest.CEIL)
        right = right | (r == 1)
        return np.concatenate([~right, right], axis=1).astype(np.float64)
    down = min(scale, 1.0)
    if spec.mode == Mode.LINEAR:
        if not spec.antialias:
            return np.concatenate([1 - r, r], axis=1)
        start = math.floor(-1 / down) + 1
        c = np.clip(1 - np.abs((np.arange(start, 2 - start) - r) * down), 0, 1)
    elif not spec.antialias:
        return np.concatenate([_cubic(r + 1, spec.cubic_a), _cubic(r, spec.cubic_a), _cubic(1 - r, spec.cubic_a),
                               _cubic(2 - r, spec.cubic_a)], axis=1)  # fmt: skip
    else:
        start = math.floor(-2 / down) + 1
        c = _cubic(down * (np.arange(start, 2 - start) - r), spec.cubic_a)
    return c / c.sum(axis=1, keepdims=True)


def neighbours(x: np.ndarray, t: int) -> np.ndarray:
    """(out, T) subscripts of the T input points nearest x (ties to the smaller), unclamped."""
    pad = -(-t // 2)
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if t % 2 == 0:
        off = np.where(frac == 0, -(t // 2), -(t // 2) + 1)
    else:
        off = np.where(frac <= 0.5, -((t - 1) // 2), -((t - 1) // 2) + 1)
    return (p + off)[:, None] + np.arange(t)[None, :] - pad


def axis_table(axis: int, n: int, out: int, scale: float, spec: ResizeSpec, roi) -> AxisTable | None:
    """The taps of one axis (None: the axis is kept as it is), zero-weight taps dropped."""
    if math.isclose(scale, 1.0) and out == n and (roi is None or (math.isclose(roi[0], 0) and math.isclose(roi[1], 1))):
        return None
    x, outside = source_coords(n, out, scale, spec.coord, roi)
    fl = np.floor(x)
    ratio = np.where(x == fl, 1.0, x - fl)
    coef = coefficients(ratio, scale, spec) if out else np.zeros((0, 2))
    idx = neighbours(x, coef.shape[1])
    if spec.exclude_outside:
        coef = np.where((idx < 0) | (idx >= n), 0.0, coef)
        total = coef.sum(axis=1, keepdims=True)
        coef = coef / np.where(total == 0, 1.0, total)
    idx = np.clip(idx, 0, max(n - 1, 0))
    keep = coef != 0
    t = max(int(keep.sum(axis=1).max(initial=0)), 1)
    order = np.argsort(~keep, axis=1, kind="stable")[:, :t]
    idx = np.take_along_axis(idx, order, axis=1)
    coef = np.take_along_axis(np.where(keep, coef, 0.0), order, axis=1)
    weight = None if t == 1 and (coef == 1).all() else coef
    return AxisTable(axis, idx, weight, outside)


def output_shape(shape, scales, sizes, axes, policy: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(output extents, per-axis scales) from Resize's `scales` or `sizes` (with its `axes` and
    keep_aspect_ratio_policy), as ONNX defines them: scales exact float32 values, an output
    extent floor(scale * n)."""
    r = len(shape)
    if scales is not None and scales.size:
        sc = [1.0] * r
        for a, s in zip(axes, scales.reshape(-1)):
            sc[a] = float(np.float32(s))
        return tuple(int(Fraction(s) * n) for s, n in zip(sc, shape)), tuple(sc)
    if sizes is None:
        raise ShapeError("Resize: neither scales nor sizes is given")
    want = list(shape)
    for a, s in zip(axes, sizes):
        want[a] = int(s)
    sc = [w / n for w, n in zip(want, shape)]
    if policy != "stretch":
        if policy not in ("not_larger", "not_smaller"):
            raise OptionError(f"Resize: keep_aspect_ratio_policy {policy!r} is not stretch, not_larger or not_smaller")
        s = (min if policy == "not_larger" else max)(sc[a] for a in axes)
        sc = [s if a in axes else 1.0 for a in range(r)]
        want = [int(s * shape[a] + 0.5) if a in axes else shape[a] for a in range(r)]
    return tuple(want), tuple(sc)


def tables(shape, out, scales, spec: ResizeSpec, roi) -> list[AxisTable]:
    """Every resized axis' table; `roi` is ONNX's (starts..., ends...) over all axes or None."""
    r = len(shape)
    found = []
    for a in range(r):
        t = axis_table(a, shape[a], out[a], scales[a], spec, None if roi is None else (roi[a], roi[a + r]))
        if t is not None:
            found.append(t)
    return found
