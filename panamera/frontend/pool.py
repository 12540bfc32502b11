"""Windowed reductions: pooling as a reduction whose domain includes the window.

`max_pool(x, kernel, ...)` on (N, C, H, W) is the reduction over the last two axes of the window
view w[n, c, oh, ow, kh, kw] = x[n, c, oh*sh + kh*dh - ph, ow*sw + kw*dw - pw]: the window dims
are reduction dims, the output dims are spatial, the view is an access relation of x (a remap,
frontend/movement.py), and a read that falls in the padding is masked to the combiner's identity
(-inf for max, 0 for sum). So coalescing, multi-block mapping and producer/consumer fusion apply
as to any reduction: `global_avg_pool(relu(batch_norm(x)))` is one kernel.

>>> import panamera as pn
>>> x = pn.placeholder((1, 3, 8, 8), "float32", name="x")
>>> pn.max_pool(x, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)).shape
(1, 3, 4, 4)
>>> pn.avg_pool(x, (2, 2), ceil_mode=True, strides=(3, 3)).shape
(1, 3, 3, 3)
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np

from .. import algebra, dtypes
from ..errors import DTypeError, OptionError, ShapeError
from . import ops
from .movement import AxisMap, Boundary, remap
from .reduce import reduction
from .tensor import Tensor, binary, constant, iota, where


@dataclass(frozen=True)
class Window:
    """The pooling geometry of the trailing `len(kernel)` axes: each output position o reads
    input positions o*stride + k*dilation - pad_begin for k < kernel."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]  # (begin, end) per spatial axis
    dilations: tuple[int, ...]
    out: tuple[int, ...]

    def count(self, spatial: tuple[int, ...], include_pad: bool) -> np.ndarray:
        """How many window positions each output averages over (numpy, for the planner's check
        and the tests): those inside the input, or with `include_pad` inside the padded input."""
        c = np.ones(self.out, np.int64)
        for a, (n, k, s, (pb, pe), d, o) in enumerate(
            zip(spatial, self.kernel, self.strides, self.pads, self.dilations, self.out)
        ):
            lo, hi = (-pb, n + pe) if include_pad else (0, n)
            pos = np.arange(o)[:, None] * s + np.arange(k)[None, :] * d - pb
            per = ((pos >= lo) & (pos < hi)).sum(axis=1)
            c = c * per.reshape((1,) * a + (o,) + (1,) * (len(self.out) - a - 1))
        return c


def _ints(v, n: int, what: str, op: str, label: str, default: int) -> tuple[int, ...]:
    if v is None:
        return (default,) * n
    if isinstance(v, (int, np.integer)):
        return (int(v),) * n
    try:
        t = tuple(operator.index(a) for a in v)
    except TypeError:
        raise ShapeError(f"{op} of {label!r}: {what} {v!r} are not integers") from None
    if len(t) != n:
        raise ShapeError(f"{op} of {label!r}: {what} {t} must have {n} entries (one per window axis)")
    return t


def window(
    x: Tensor, kernel, strides=None, pads=None, dilations=None, ceil_mode: bool = False, op: str = "pool"
) -> Window:
    """The pooling geometry, checked. `pads` is ONNX's (b1, ..., bd, e1, ..., ed), an int, or
    ((b1, e1), ...); the output extent is floor (ceil with `ceil_mode`) of
    (n + b + e - ((k-1)*d + 1)) / s + 1, and a ceil-mode window must start inside the input or
    its leading padding."""
    try:
        kernel = tuple(operator.index(k) for k in kernel)
    except TypeError:
        raise ShapeError(f"{op} of {x.label!r}: kernel_shape {kernel!r} is not a sequence of integers") from None
    d = len(kernel)
    if d == 0 or d > x.ndim - 2:
        raise ShapeError(f"{op} of {x.label!r}: kernel_shape {kernel} needs 1 to {x.ndim - 2} axes for shape {x.shape}")
    strides = _ints(strides, d, "strides", op, x.label, 1)
    dilations = _ints(dilations, d, "dilations", op, x.label, 1)
    if pads is None or isinstance(pads, (int, np.integer)):
        p = 0 if pads is None else int(pads)
        pairs = ((p, p),) * d
    else:
        pads = list(pads)
        if pads and isinstance(pads[0], (tuple, list)):
            pairs = tuple((int(b), int(e)) for b, e in pads)
        elif len(pads) == 2 * d:
            pairs = tuple((int(pads[k]), int(pads[k + d])) for k in range(d))
        else:
            raise ShapeError(f"{op} of {x.label!r}: pads {tuple(pads)} must have {2 * d} entries (begins, then ends)")
    for name, vals in (("kernel_shape", kernel), ("strides", strides), ("dilations", dilations)):
        if any(v <= 0 for v in vals):
            raise ShapeError(f"{op} of {x.label!r}: {name} {vals} must be positive")
    if len(pairs) != d or any(b < 0 or e < 0 for b, e in pairs):
        raise ShapeError(f"{op} of {x.label!r}: pads {pairs} must be non-negative, one (begin, end) per axis")
    spatial = x.shape[x.ndim - d :]
    out = []
    for n, k, s, (b, e), dl in zip(spatial, kernel, strides, pairs, dilations):
        span = n + b + e - ((k - 1) * dl + 1)
        if span < 0:
            raise ShapeError(
                f"{op} of {x.label!r}: the window ({k - 1} * {dl} + 1) exceeds the padded extent {n + b + e}"
            )
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= n + b:  # the last window would start in the end padding
            o -= 1
        out.append(o)
    return Window(kernel, strides, pairs, dilations, tuple(out))


def _window_view(x: Tensor, w: Window) -> tuple[Tensor, Tensor | None]:
    """(the window view (..., O1..Od, K1..Kd) of x; the mask of reads inside x or None). A read in
    the padding is masked off, so its subscript may be any inside one (Boundary.MASKED: one
    piece per axis, where a clamp's three per axis multiply to 3^d pieces of the address)."""
    d = len(w.kernel)
    lead = x.ndim - d
    shape = x.shape[:lead] + w.out + w.kernel
    maps = [AxisMap(((k, 1),)) for k in range(lead)]
    mask = None
    for a, (n, s, (pb, _), dl) in enumerate(zip(x.shape[lead:], w.strides, w.pads, w.dilations)):
        m = AxisMap(((lead + a, s), (lead + d + a, dl)), offset=-pb, boundary=Boundary.MASKED)
        maps.append(m)
        pos = iota(shape, lead + a) * s + iota(shape, lead + d + a) * dl - pb
        if pb or (w.out[a] - 1) * s + (w.kernel[a] - 1) * dl - pb >= n:  # some reads fall outside
            inside = (pos >= 0) & (pos < n)
            mask = inside if mask is None else mask & inside
    return remap(x, shape, maps), mask


def _float(x: Tensor, op: str, ints: bool = False) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    if not (x.dtype.is_float or ints and x.dtype.name != "bool"):
        kind = "a numeric" if ints else "a floating-point"
        raise DTypeError(f"{op} of {x.label!r}: pooling needs {kind} tensor, got {x.dtype}")
    if x.ndim < 3:
        raise ShapeError(f"{op} of {x.label!r}: needs (N, C, spatial...), got shape {x.shape}")
    return x


def max_pool(x: Tensor, kernel, strides=None, pads=None, dilations=None, ceil_mode: bool = False) -> Tensor:
    """ONNX MaxPool (torch's max_pool{1,2,3}d): the max over each window; padding never wins
    (floats and integers)."""
    x = _float(x, "max_pool", ints=True)
    w = window(x, kernel, strides, pads, dilations, ceil_mode, "max_pool")
    view, _ = _padded_max_view(x, w)  # padding reads max's identity
    d = len(w.kernel)
    return ops.max(view, axis=tuple(range(view.ndim - d, view.ndim)))


def _padded_max_view(x: Tensor, w: Window) -> tuple[Tensor, Tensor | None]:
    """The window view with padding read as max's identity, and the inside mask."""
    view, mask = _window_view(x, w)
    if mask is not None:
        low = -math.inf if x.dtype.is_float else int(np.iinfo(x.dtype.np).min)
        view = where(mask, view, constant(low, x.dtype))
    return view, mask


def max_pool_indices(
    x: Tensor, kernel, strides=None, pads=None, dilations=None, ceil_mode: bool = False, storage_order: int = 0
) -> Tensor:
    """ONNX MaxPool's Indices output: where each window's max is, as the flat position in x
    (N and C included; the spatial axes row-major, or column-major with `storage_order` 1);
    ties keep the first position in window order, and padding never wins.

    The argmax over the window is one reduction of (value, window position) keys, argmax's
    machinery (algebra.argkey): a padded position carries the position + K (K the window's size),
    so a real -inf still beats it. The winner's window position, decoded element-wise, gives the
    input position. 8-byte values do not fit a key: their max is reduced first, then the first
    window position holding it (a min over the window).

    >>> import panamera as pn
    >>> max_pool_indices(pn.placeholder((1, 2, 5, 5), name="x"), (2, 2), strides=(2, 2), ceil_mode=True).shape
    (1, 2, 3, 3)
    """
    x = _float(x, "max_pool", ints=True)
    if storage_order not in (0, 1):
        raise OptionError(f"max_pool of {x.label!r}: storage_order {storage_order!r} is not 0 or 1")
    w = window(x, kernel, strides, pads, dilations, ceil_mode, "max_pool")
    view, mask = _padded_max_view(x, w)
    d, size = len(w.kernel), math.prod(w.kernel)
    lead = x.ndim - d
    axes = tuple(range(view.ndim - d, view.ndim))
    kstride = [math.prod(w.kernel[j + 1 :]) for j in range(d)]
    pos = None
    for j, st in enumerate(kstride):
        t = iota(view.shape, lead + d + j) * st if st != 1 else iota(view.shape, lead + d + j)
        pos = t if pos is None else pos + t
    if mask is not None:
        pos = where(mask, pos, pos + size)
    if x.dtype.itemsize <= 4:
        key = Tensor("argkey_max", (view, pos), view.shape, dtypes.int64)
        k = reduction("max", key, axes, False, post=algebra.Finish(algebra.FinishKind.ARGMAX_INDEX, last_index=-1))
    else:
        top = ops.max(view, axis=axes, keepdims=True)
        k = ops.min(where(view == top, pos, constant(2 * size, dtypes.int64)), axis=axes)
    out = k.shape
    spatial = x.shape[lead:]
    sstride = [
        math.prod(spatial[j + 1 :]) if storage_order == 0 or d == 1 else math.prod(spatial[:j]) for j in range(d)
    ]
    flat = None
    for a in range(lead):
        t = iota(out, a) * (math.prod(x.shape[a + 1 :]))
        flat = t if flat is None else flat + t
    for j, (kn, st, s, (pb, _), dl) in enumerate(zip(w.kernel, kstride, w.strides, w.pads, w.dilations)):
        kj = binary("mod", binary("trunc_div", k, st) if st != 1 else k, kn)
        h = iota(out, lead + j) * s + kj * dl - pb
        flat = flat + h * sstride[j]
    return flat


def avg_pool(
    x: Tensor,
    kernel,
    strides=None,
    pads=None,
    dilations=None,
    ceil_mode: bool = False,
    count_include_pad: bool = False,
) -> Tensor:
    """ONNX AveragePool: the window's sum over the number of positions counted: those inside x
    (count_include_pad=False) or inside the padded x (True; never the positions a ceil-mode
    window adds beyond the end padding). A constant count is the reduction's mean; a varying one
    is an element-wise count of the output index, fused into the reduction's epilogue."""
    x = _float(x, "avg_pool")
    w = window(x, kernel, strides, pads, dilations, ceil_mode, "avg_pool")
    view, mask = _window_view(x, w)
    d = len(w.kernel)
    axes = tuple(range(view.ndim - d, view.ndim))
    xc = view.astype(dtypes.float32) if x.dtype.is_16bit_float else view
    if mask is not None:
        xc = where(mask, xc, constant(0, xc.dtype))
    counts = w.count(x.shape[x.ndim - d :], count_include_pad)
    if (counts == math.prod(w.kernel)).all():
        return ops.mean(xc, axis=axes).astype(x.dtype)
    total = ops.sum(xc, axis=axes)
    return (total / _count_tensor(total.shape, x.shape[x.ndim - d :], w, count_include_pad, xc.dtype)).astype(x.dtype)


def _count_tensor(shape, spatial, w: Window, include_pad: bool, d) -> Tensor:
    """The count of `Window.count` as an element-wise tensor of the output index (iota sums)."""
    lead = len(shape) - len(w.out)
    count = None
    for a, (n, k, s, (pb, pe), dl) in enumerate(zip(spatial, w.kernel, w.strides, w.pads, w.dilations)):
        lo, hi = (-pb, n + pe) if include_pad else (0, n)
        o = iota(shape, lead + a)
        per = None
        for kk in range(k):
            pos = o * s + (kk * dl - pb)
            inside = ((pos >= lo) & (pos < hi)).astype(d)
            per = inside if per is None else per + inside
        count = per if count is None else count * per
    return count


def global_avg_pool(x: Tensor) -> Tensor:
    """ONNX GlobalAveragePool: the mean over every spatial axis, kept as extents 1."""
    x = _float(x, "global_avg_pool")
    return ops.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


def global_max_pool(x: Tensor) -> Tensor:
    """ONNX GlobalMaxPool: the max over every spatial axis, kept as extents 1."""
    x = _float(x, "global_max_pool")
    return ops.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


def same_pads(spatial, kernel, strides, dilations, upper: bool) -> tuple[tuple[int, int], ...]:
    """ONNX auto_pad SAME_UPPER / SAME_LOWER: the output is ceil(n / s); the extra pad goes at
    the end (upper) or the beginning (lower)."""
    pairs = []
    for n, k, s, dl in zip(spatial, kernel, strides, dilations):
        o = -(-n // s)
        total = max(0, (o - 1) * s + (k - 1) * dl + 1 - n)
        small = total // 2
        pairs.append((small, total - small) if upper else (total - small, small))
    return tuple(pairs)


def auto_pads(x: Tensor, kernel, strides, dilations, auto_pad: str, op: str):
    """The pads of an ONNX auto_pad value (None for NOTSET: use the explicit pads)."""
    d = len(kernel)
    strides = strides or (1,) * d
    dilations = dilations or (1,) * d
    spatial = x.shape[x.ndim - d :]
    if auto_pad in ("NOTSET", "", None):
        return None
    if auto_pad == "VALID":
        return ((0, 0),) * d
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return same_pads(spatial, kernel, strides, dilations, auto_pad == "SAME_UPPER")
    raise OptionError(f"{op} of {x.label!r}: auto_pad {auto_pad!r} is not NOTSET, VALID, SAME_UPPER or SAME_LOWER")


def conv(x: Tensor, weight: Tensor, w: Window, group: int = 1) -> Tensor:
    """ONNX Conv without bias as a windowed reduction: y[n, g*Mg + m, o] = sum over c < Cg and
    the window k of x[n, g*Cg + c, o*s + k*d - p] * weight[g*Mg + m, c, k]. One statement over
    (N, G, Mg, O..., Cg, K...): the view of x is a remap (the padding masked to 0), the weight a
    broadcast read, the reduction the trailing Cg and window axes (adjacent: one ROW form).
    Meant for the convolutions that are reductions rather than GEMMs: depthwise (Cg = 1, a
    weighted pooling), narrow groups, 1x1 on tiny extents (a squeeze-excitation's); the
    partitioner's router (subgraph/route.py) weighs it against the library's convolution.

    >>> import panamera as pn
    >>> x, wt = pn.placeholder((1, 4, 6, 6), name="x"), pn.placeholder((4, 1, 3, 3), name="w")
    >>> conv(x, wt, window(x, (3, 3), pads=1), group=4).shape
    (1, 4, 6, 6)
    """
    d = len(w.kernel)
    n, c = x.shape[:2]
    m, cg = weight.shape[:2]
    if c != cg * group or m % group:
        raise ShapeError(f"conv of {x.label!r}: group {group} does not split {c} input / {m} output channels")
    mg = m // group
    shape = (n, group, mg, *w.out, cg, *w.kernel)  # axes: 0 n, 1 g, 2 m, 3.. o, 3+d c, 4+d.. k
    maps = [AxisMap(((0, 1),)), AxisMap(((1, cg), (3 + d, 1)))]
    mask = None
    for a, (size, s, (pb, _), dl) in enumerate(zip(x.shape[2:], w.strides, w.pads, w.dilations)):
        maps.append(AxisMap(((3 + a, s), (4 + d + a, dl)), offset=-pb))
        if pb or (w.out[a] - 1) * s + (w.kernel[a] - 1) * dl - pb >= size:  # some reads fall outside
            pos = iota(shape, 3 + a) * s + iota(shape, 4 + d + a) * dl - pb
            inside = (pos >= 0) & (pos < size)
            mask = inside if mask is None else mask & inside
    view = remap(x, shape, maps)
    wt = weight.reshape((1, group, mg) + (1,) * d + (cg, *w.kernel))
    xc = view.astype(dtypes.float32) if x.dtype.is_16bit_float else view
    prod = xc * wt
    if mask is not None:
        prod = where(mask, prod, constant(0, prod.dtype))
    y = ops.sum(prod, axis=tuple(range(3 + d, 4 + 2 * d)))
    return y.reshape((n, m, *w.out)).astype(x.dtype)
