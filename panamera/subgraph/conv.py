"""Convolution in the array library: its own convolution when it has one (cuDNN through CuPy; on
the host, numpy's strided window view and matmul), otherwise (CuPy without cuDNN) an im2col
Panamera kernel feeding the library's matmul (cuBLAS).

im2col is a data-movement statement: the column tensor
cols[n, g, c, k1.., o1..] = x[n, g*Cg + c, o1*s1 + k1*d1 - p1, ...] (0 in the padding) is a remap of
x (frontend/movement.py) compiled like any Panamera kernel, laid out (N, G, Cg*K, O) so that
the grouped product W[g] (M/G, Cg*K) @ cols[n, g] (Cg*K, O) lands directly in NCHW order:

>>> import numpy as np
>>> x, w = np.ones((1, 2, 4, 4), np.float32), np.ones((3, 2, 3, 3), np.float32)
>>> conv(np, {"pads": [1, 1, 1, 1]}, x, w).shape
(1, 3, 4, 4)
"""

from __future__ import annotations

import functools
import math
import threading
from enum import Enum
from types import ModuleType

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import compile as pn_compile
from ..errors import ShapeError
from ..frontend import pool
from ..frontend.movement import AxisMap, Boundary, remap
from ..frontend.tensor import Tensor, constant, iota, placeholder, reshape, where
from . import conv_kernels
from .conv_kernels import NO_EPILOGUE, Epilogue


def _s(v, default: str) -> str:
    return default if v is None else v.decode() if isinstance(v, bytes) else str(v)


def geometry(x_shape, w_shape, attrs: dict) -> tuple[pool.Window, int]:
    """The window of a Conv (kernel from W, strides, pads or auto_pad, dilations) and its groups."""
    x = placeholder(x_shape, "float32", name="X")
    group = int(attrs.get("group", 1))
    kernel = tuple(attrs.get("kernel_shape") or w_shape[2:])
    d = len(kernel)
    if len(w_shape) != len(x_shape) or tuple(w_shape[2:]) != kernel:
        raise ShapeError(
            f"Conv: weight shape {tuple(w_shape)} does not match kernel_shape {kernel} for input {x_shape}"
        )
    if group <= 0 or x_shape[1] % group or w_shape[0] % group or w_shape[1] * group != x_shape[1]:
        raise ShapeError(f"Conv: group {group} does not divide input channels {x_shape[1]} into weight's {w_shape[1]}")
    strides = tuple(attrs.get("strides") or (1,) * d)
    dil = tuple(attrs.get("dilations") or (1,) * d)
    pads = pool.auto_pads(x, kernel, strides, dil, _s(attrs.get("auto_pad"), "NOTSET"), "Conv") or attrs.get("pads")
    return pool.window(x, kernel, strides, pads, dil, False, "Conv"), group


def im2col(x: Tensor, w: pool.Window, group: int) -> Tensor:
    """The column tensor (N, G, Cg * prod(kernel), prod(out)) of x: a remap with a zero select
    in the padding; one Panamera kernel.

    >>> c = im2col(placeholder((2, 4, 5, 5), name="x"), geometry((2, 4, 5, 5), (6, 2, 3, 3), {"group": 2})[0], 2)
    >>> c.shape
    (2, 2, 18, 9)
    """
    d = len(w.kernel)
    n, c = x.shape[:2]
    cg = c // group
    shape = (n, group, cg, *w.kernel, *w.out)
    maps = [AxisMap(((0, 1),)), AxisMap(((1, cg), (2, 1)))]
    mask = None
    for a, (size, s, (pb, _), dl) in enumerate(zip(x.shape[2:], w.strides, w.pads, w.dilations)):
        maps.append(AxisMap(((3 + d + a, s), (3 + a, dl)), offset=-pb, boundary=Boundary.MASKED))
        pos = iota(shape, 3 + d + a) * s + iota(shape, 3 + a) * dl - pb
        inside = (pos >= 0) & (pos < size)
        mask = inside if mask is None else mask & inside
    cols = where(mask, remap(x, shape, maps), constant(0, x.dtype))
    return reshape(cols, (n, group, cg * math.prod(w.kernel), math.prod(w.out)))


def _library_conv(xp: ModuleType):
    """CuPy's cuDNN convolution when it is there, else None."""
    if xp is np:
        return None
    try:
        from cupy import cudnn  # noqa: F401
        from cupy.cuda import cudnn as libcudnn  # noqa: F401
    except Exception:  # noqa: BLE001 - no cuDNN: the im2col path
        return None
    return cudnn


class HostForm(Enum):
    """How `host_conv` computes a convolution (`host_form`)."""

    POINTWISE = "pointwise"  # a 1-wide kernel, stride 1, no padding: one matmul on the input itself
    DEPTHWISE = "depthwise"  # one input channel and one output per group: window view, per-channel matmul
    COLUMNS = "columns"  # the column tensor, one strided copy, then one matmul


def host_form(w_shape: tuple, win: pool.Window, group: int) -> HostForm:
    """The form `host_conv` takes for weights of `w_shape` over `win` in `group` groups.

    >>> host_form((8, 1, 3, 3), geometry((1, 8, 6, 6), (8, 1, 3, 3), {"group": 8})[0], 8)
    <HostForm.DEPTHWISE: 'depthwise'>
    """
    m, cg = w_shape[:2]
    if math.prod(win.kernel) == 1 and all(s == 1 for s in win.strides) and not any(p for ps in win.pads for p in ps):
        return HostForm.POINTWISE
    return HostForm.DEPTHWISE if cg == 1 and m == group else HostForm.COLUMNS


def host_conv(
    x: np.ndarray,
    w: np.ndarray,
    win: pool.Window,
    group: int,
    bias: np.ndarray | None = None,
    epilogue: Epilogue = NO_EPILOGUE,
    residuals: tuple = (),
) -> np.ndarray:
    """The convolution with numpy and the host's C kernels (conv_kernels.py), written straight
    into NCHW order, then its bias and `epilogue` (reading `residuals`) in place. The host's
    library convolution: on the CPU an im2col kernel on the emulator would compile and run CUDA C
    for what numpy does in microseconds (issue 20: a MobileNetV3's 22 library Convs took 40 s a
    run that way). Three forms, by the window (`host_form`):

    - pointwise (a 1-wide kernel, stride 1, no padding): the product W[g] (M/G, Cg) @ x[n, g] (Cg, O)
      with no column tensor at all, then the epilogue pass;
    - depthwise (one input channel and one output per group): 2-D float32, a direct C kernel (taps
      accumulated over the channel's padded plane, SIMD along it, the epilogue on each plane while in cache);
      otherwise the input's windows as one strided view copied once in (N, C, O, K) order, times
      each channel's K weights;
    - otherwise the column tensor (N, G, Cg*K, O): 2-D float32, built by a C kernel (no padded copy
      of the input, zeros written in the padding) into a buffer reused across calls; otherwise the
      windows as a strided view (N, C, K..., O...) copied once in that order; then the product
      W[g] (M/G, Cg*K) @ cols[n, g] (Cg*K, O) into the output, then the epilogue pass.

    >>> w = pool.Window((3,), (2,), ((1, 1),), (1,), (3,))
    >>> host_conv(np.arange(6.0).reshape(1, 1, 6), np.ones((1, 1, 3)), w, 1)
    array([[[ 1.,  6., 12.]]])
    """
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    o, k = math.prod(win.out), math.prod(win.kernel)
    form = host_form(w.shape, win, group)
    fast = len(win.kernel) == 2 and min(min(win.pads)) >= 0 and conv_kernels.fits(x, w, bias, *residuals)
    if form is HostForm.DEPTHWISE and fast:
        return conv_kernels.depthwise2d(x, w, win, bias, epilogue, residuals)
    if form is HostForm.POINTWISE:
        y = np.matmul(w.reshape(group, m // group, cg), x.reshape(n, group, cg, o))  # (N, G, M/G, O)
    elif form is HostForm.COLUMNS and fast and win.strides == (1, 1):  # the padded width: one run per tap
        (ph, pe), (pw, pwe) = win.pads
        hp, wp = x.shape[2] + ph + pe, x.shape[3] + pw + pwe
        xpad = _buffer((n, c, hp * wp + (win.kernel[1] - 1) * win.dilations[1]), "pad")
        cols = _buffer((n, group, cg * k, win.out[0] * wp))
        conv_kernels.cols_wide(x, xpad, cols, win)
        wide = _buffer((n, group, m // group, win.out[0] * wp), "out")
        np.matmul(w.reshape(group, m // group, cg * k), cols, out=wide)
        y = np.empty((n, m, *win.out), np.float32)
        conv_kernels.apply_epilogue(y, epilogue, bias, residuals, wide.reshape(n, m, win.out[0], wp))
        return y
    elif form is HostForm.COLUMNS and fast:
        cols = _buffer((n, group, cg * k, o))
        conv_kernels.im2col2d(x, cols, win)
        y = np.empty((n, group, m // group, o), np.float32)
        np.matmul(w.reshape(group, m // group, cg * k), cols, out=y)
    else:
        y = _strided_conv(x, w, win, group, form)
    y = y.reshape(n, m, *win.out)
    if bias is not None or epilogue.steps:
        conv_kernels.apply_epilogue(y, epilogue, bias, residuals)
    return y


_buffers = threading.local()


def _buffer(shape: tuple, role: str = "cols") -> np.ndarray:
    """A float32 scratch array of `shape` for `role`, reused by later calls on this thread (a few per model)."""
    held = _buffers.__dict__.setdefault("held", {})
    if (shape, role) not in held:
        if len(held) >= 64:
            held.clear()
        held[shape, role] = np.empty(shape, np.float32)
    return held[shape, role]


def _strided_conv(x: np.ndarray, w: np.ndarray, win: pool.Window, group: int, form: HostForm) -> np.ndarray:
    """The depthwise or columns form with numpy's strided views (any rank, any dtype): (N, G, M/G, O)."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    o, k = math.prod(win.out), math.prod(win.kernel)
    xp = x
    if any(p for pair in win.pads for p in pair):
        xp = np.zeros((n, c, *(s + a + b for s, (a, b) in zip(x.shape[2:], win.pads))), dtype=x.dtype)
        xp[(slice(None), slice(None)) + tuple(slice(a, a + s) for s, (a, _) in zip(x.shape[2:], win.pads))] = x
    st = xp.strides[2:]
    at_out = tuple(a * s for a, s in zip(st, win.strides))  # one output position further
    at_tap = tuple(a * dl for a, dl in zip(st, win.dilations))  # one kernel tap further
    if form is HostForm.DEPTHWISE:  # the windows (N, C, O..., K...), copied once in that order
        v = as_strided(xp, (n, c, *win.out, *win.kernel), xp.strides[:2] + at_out + at_tap, writeable=False)
        return np.matmul(v.reshape(n, c, o, k), w.reshape(c, k, 1))  # (N, C, O, 1): one row of K per channel
    v = as_strided(xp, (n, c, *win.kernel, *win.out), xp.strides[:2] + at_tap + at_out, writeable=False)
    cols = v.reshape(n, group, cg * k, o)  # one copy, contiguous runs along the output rows
    return np.matmul(w.reshape(group, m // group, cg * k), cols)  # (N, G, M/G, O)


@functools.lru_cache(maxsize=1024)
def _geometry_of(x_shape: tuple, w_shape: tuple, attrs: tuple) -> tuple[pool.Window, int]:
    """`geometry` found once per shapes and attributes (a model's run asks for it every call)."""
    return geometry(x_shape, w_shape, dict(attrs))


def conv(xp: ModuleType, attrs: dict, x, w, b=None, epilogue: Epilogue = NO_EPILOGUE, residuals: tuple = ()):
    """ONNX Conv (N, C, spatial...) with groups, strides, pads/auto_pad and dilations, then the
    `epilogue` steps (conv_fuse.py) reading `residuals` (one per Add step, of the output's shape)."""
    attrs_key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))
    win, group = _geometry_of(tuple(x.shape), tuple(w.shape), attrs_key)
    if xp is np:
        res = tuple(np.asarray(r) for r in residuals)
        y = host_conv(np.asarray(x), np.asarray(w), win, group, None if b is None else np.asarray(b), epilogue, res)
        return y.astype(x.dtype, copy=False)
    if epilogue.steps:  # the fusion is the CPU target's (numpy arrays); any other array: the steps after it
        y, res = conv(xp, attrs, x, w, b), iter(residuals)
        for s in epilogue.steps:
            y = conv_kernels.numpy_step(s, y, next(res) if s.op is conv_kernels.EpiOp.ADD else None)
        return y
    cudnn = _library_conv(xp)
    if cudnn is not None and len(win.kernel) >= 2:
        pads = tuple(p for p, _ in win.pads)
        if all(p == e for p, e in win.pads):
            out_shape = (x.shape[0], w.shape[0], *win.out)
            y = xp.empty(out_shape, dtype=x.dtype)
            cudnn.convolution_forward(
                xp.ascontiguousarray(x), xp.ascontiguousarray(w), None if b is None else xp.asarray(b), y,
                pads, win.strides, win.dilations, group, auto_tune=False, tensor_core="auto",
            )  # fmt: skip
            return y
    xt = placeholder(tuple(x.shape), str(x.dtype), name="X")
    k = pn_compile(im2col(xt, win, group), target="cuda" if xp is not np else "emulator")
    cols = k(x)  # (N, G, Cg*K, O), on the device that holds x
    m = w.shape[0]
    wg = xp.asarray(w).reshape(1, group, m // group, -1)
    y = xp.matmul(wg, cols).reshape(x.shape[0], m, *win.out)
    if b is not None:
        y = y + xp.asarray(b).reshape((1, m) + (1,) * len(win.out))
    return y.astype(x.dtype, copy=False)
