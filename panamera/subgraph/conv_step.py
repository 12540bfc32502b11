"""A library Conv's host step, planned once per node and input shapes: its form, the C kernels'
integer arguments and pointer tables, its scratch buffers (padded input, column tensor, the
padded-width product), so that a call only writes the arrays' addresses into the tables, makes
one ctypes call per C stage and one np.matmul (a library Conv of a small model cost 15-30 us of
Python a call when each call re-derived its form and converted a dozen ctypes arguments).

A `HostConvStep` is a callable over numpy arrays, `step(x, w, b, *residuals) -> y` (b may be
None), the host-step interface the model's executor calls; arrays it was not planned for (another
dtype, shape, a non-contiguous view) take conv.host_conv's general path.

>>> import numpy as np
>>> step = HostConvStep.plan((1, 2, 5, 5), (4, 2, 3, 3), {"pads": [1, 1, 1, 1]}, True)
>>> step.form, step.out_shape
(<HostForm.COLUMNS: 'columns'>, (1, 4, 5, 5))
>>> x, w, b = np.ones((1, 2, 5, 5), np.float32), np.ones((4, 2, 3, 3), np.float32), np.zeros(4, np.float32)
>>> float(step(x, w, b)[0, 0, 2, 2])
18.0
"""

from __future__ import annotations

import ctypes
import math
import threading
from dataclasses import dataclass, field

import numpy as np

from . import conv_kernels as ck
from .conv import HostForm, _geometry_of, host_conv, host_form
from .conv_kernels import NO_EPILOGUE, Epilogue

_F32 = np.dtype(np.float32)


def _longs(*v: int):
    return (ctypes.c_long * len(v))(*v)


def _ok(a, shape: tuple) -> bool:
    return type(a) is np.ndarray and a.dtype == _F32 and a.shape == shape and a.flags.c_contiguous


@dataclass(frozen=True, eq=False)
class HostConvStep:
    """One library Conv (and its fused epilogue) planned for input shapes `x_shape`, `w_shape`."""

    x_shape: tuple
    w_shape: tuple
    attrs: tuple  # the Conv's attributes as a sorted tuple (conv._geometry_of's key)
    has_bias: bool
    epilogue: Epilogue
    form: HostForm
    out_shape: tuple
    fast: bool  # the C kernels take it (2-D, or pointwise; padding >= 0); else conv.host_conv
    _c: dict = field(default_factory=dict, repr=False)  # the C stages' tables and scratch, bound once
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # the scratch is shared

    @classmethod
    def plan(
        cls, x_shape, w_shape, attrs: dict, has_bias: bool, epilogue: Epilogue = NO_EPILOGUE
    ) -> HostConvStep | Lifted1d:
        """The step of a Conv with these input shapes and attributes (`ShapeError` where they do not
        fit); a 1-D Conv is planned as the 2-D one of unit height (`Lifted1d`)."""
        if len(x_shape) == 3 and len(w_shape) == 3:
            return Lifted1d.plan(x_shape, w_shape, attrs, has_bias, epilogue)
        key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))
        win, group = _geometry_of(tuple(x_shape), tuple(w_shape), key)
        form = host_form(tuple(w_shape), win, group)
        out = (x_shape[0], w_shape[0], *win.out)
        nonneg = min(min(win.pads)) >= 0
        fast = form is HostForm.POINTWISE or (len(win.kernel) == 2 and nonneg)
        step = cls(tuple(x_shape), tuple(w_shape), key, has_bias, epilogue, form, out, fast)
        if fast:
            step._bind(win, group)
        return step

    def _bind(self, win, group: int) -> None:
        lib, c = ck._lib(), self._c
        n, ch = self.x_shape[:2]
        m, cg = self.w_shape[:2]
        o, k = math.prod(win.out), math.prod(win.kernel)
        nops, ops, par = ck._epi_tables(self.epilogue)
        nres = self.epilogue.residuals
        c["w3"] = (group, m // group, cg * k)
        if self.form is HostForm.DEPTHWISE:
            (h, w), (kh, kw), (oh, ow) = self.x_shape[2:], win.kernel, win.out
            (sh, sw), (dh, dw), ((ph, pe), (pw, pwe)) = win.strides, win.dilations, win.pads
            c["dw"] = (lib.pn_step_depthwise, (ctypes.c_void_p * (6 + max(nres, 1)))())
            c["dw"][1][4], c["dw"][1][5] = ctypes.addressof(ops), ctypes.addressof(par)
            c["dw_d"] = _longs(n, ch, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, h + ph + pe, w + pw + pwe, nops)
            c["keep"] = (ops, par)
            return
        if self.form is HostForm.POINTWISE:
            rows, src_rows = (1, o), None
        else:
            (h, w), (kh, kw), (oh, ow) = self.x_shape[2:], win.kernel, win.out
            (sh, sw), (dh, dw), ((ph, pe), (pw, pwe)) = win.strides, win.dilations, win.pads
            hp, wp = h + ph + pe, w + pw + pwe
            if win.strides == (1, 1):  # the columns in the padded width, one run per (channel, tap)
                xpad = np.empty((n, ch, hp * wp + (kw - 1) * dw), np.float32)
                cols = np.empty((n, group, cg * k, oh * wp), np.float32)
                c["wide"] = np.empty((n, group, m // group, oh * wp), np.float32)
                c["cols_fn"] = lib.pn_step_cols_wide
                c["cols_p"] = (ctypes.c_void_p * 3)(0, xpad.ctypes.data, cols.ctypes.data)
                c["cols_d"] = _longs(n * ch, h, w, kh, kw, oh, hp, wp, ph, pw, dh, dw)
                rows, src_rows = (oh, ow), wp
                c["keep"] = (xpad,)
            else:
                cols = np.empty((n, group, cg * k, o), np.float32)
                c["cols_fn"] = lib.pn_step_im2col
                c["cols_p"] = (ctypes.c_void_p * 2)(0, cols.ctypes.data)
                c["cols_d"] = _longs(n * ch, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, hp, wp)
                rows, src_rows = (1, o), None
            c["cols"] = cols
        oh_, ow_ = rows
        c["epi"] = bool(self.has_bias or self.epilogue.steps or "wide" in c)
        c["epi_p"] = (ctypes.c_void_p * (5 + max(nres, 1)))(0, 0, 0, ctypes.addressof(ops), ctypes.addressof(par))
        c["epi_d"] = _longs(n * m, m, oh_, ow_, src_rows or ow_, nops)
        c["ops"] = (ops, par)

    def __call__(self, x, w, b=None, *residuals) -> np.ndarray:
        """The Conv of x with w (and bias b), then the epilogue reading `residuals`; float32 NCHW."""
        res = residuals
        if not (
            self.fast
            and _ok(x, self.x_shape)
            and _ok(w, self.w_shape)
            and (b is None) is not self.has_bias
            and (b is None or _ok(b, (self.w_shape[0],)))
            and len(res) == self.epilogue.residuals
            and all(_ok(r, self.out_shape) for r in res)
        ):
            return self._general(x, w, b, res)
        c, at = self._c, ck.address
        y = np.empty(self.out_shape, np.float32)
        if self.form is HostForm.DEPTHWISE:
            fn, p = c["dw"]
            p[0], p[1], p[2], p[3] = at(x), at(w), at(y), (at(b) if b is not None else None)
            for i, r in enumerate(res):
                p[6 + i] = at(r)
            fn(p, c["dw_d"])
            return y
        n, g = self.x_shape[0], c["w3"][0]
        with self._lock:
            if self.form is HostForm.POINTWISE:
                src = y
                np.matmul(w.reshape(c["w3"]), x.reshape(n, g, c["w3"][2], -1), out=y.reshape(n, g, c["w3"][1], -1))
            else:
                c["cols_p"][0] = at(x)
                c["cols_fn"](c["cols_p"], c["cols_d"])
                src = c.get("wide", y)
                np.matmul(w.reshape(c["w3"]), c["cols"], out=src.reshape(c["cols"].shape[:2] + (c["w3"][1], -1)))
            if c["epi"]:
                p = c["epi_p"]
                p[0], p[1], p[2] = at(y), at(src), (at(b) if b is not None else None)
                for i, r in enumerate(res):
                    p[5 + i] = at(r)
                ck._lib().pn_step_epilogue(p, c["epi_d"])
        return y

    def _general(self, x, w, b, res) -> np.ndarray:
        """Arrays the step was not planned for: conv.host_conv (numpy where the C kernels do not fit)."""
        win, group = _geometry_of(tuple(x.shape), tuple(w.shape), self.attrs)
        x, w = np.asarray(x), np.asarray(w)
        y = host_conv(
            x, w, win, group, None if b is None else np.asarray(b), self.epilogue, tuple(map(np.asarray, res))
        )
        return y.astype(x.dtype, copy=False)


def lift_1d(x_shape: tuple, w_shape: tuple, attrs: dict) -> tuple[tuple, tuple, dict]:
    """A 1-D Conv's input and weight shapes and attributes as those of the same Conv in 2-D with a
    unit height (kernel 1, stride 1, dilation 1, no padding along it): the two compute the same
    values in the same order, so the 1-D Conv takes the 2-D C kernels (whisper's Conv1d stem
    took numpy's strided path, 2-3x slower). auto_pad is kept: over a unit height with a unit
    kernel and stride it pads nothing.

    >>> lift_1d((1, 16, 10), (8, 16, 3), {"pads": [1, 2], "strides": [2]})
    ((1, 16, 1, 10), (8, 16, 1, 3), {'pads': [0, 1, 0, 2], 'strides': [1, 2], 'kernel_shape': [1, 3], 'dilations': [1, 1]})
    """
    a = dict(attrs)
    pads = list(a.get("pads") or (0, 0))
    if "pads" in a or "auto_pad" not in a:
        a["pads"] = [0, pads[0], 0, pads[1]]
    a["strides"] = [1, *(a.get("strides") or (1,))]
    a["kernel_shape"] = [1, *(a.get("kernel_shape") or w_shape[2:])]
    a["dilations"] = [1, *(a.get("dilations") or (1,))]
    return (*x_shape[:2], 1, x_shape[2]), (*w_shape[:2], 1, w_shape[2]), a


@dataclass(frozen=True, eq=False)
class Lifted1d:
    """A 1-D Conv run as its 2-D step of unit height (`lift_1d`): the arrays viewed with a unit
    axis 2 (no copy), the 2-D step's output viewed back (N, M, L)."""

    step: HostConvStep
    out_shape: tuple

    @classmethod
    def plan(cls, x_shape, w_shape, attrs: dict, has_bias: bool, epilogue: Epilogue = NO_EPILOGUE) -> Lifted1d:
        x2, w2, a2 = lift_1d(tuple(x_shape), tuple(w_shape), attrs)
        step = HostConvStep.plan(x2, w2, a2, has_bias, epilogue)
        return cls(step, (*step.out_shape[:2], step.out_shape[3]))

    @property
    def form(self) -> HostForm:
        return self.step.form

    @property
    def fast(self) -> bool:
        return self.step.fast

    def __call__(self, x, w, b=None, *residuals) -> np.ndarray:
        """The 1-D Conv of x (N, C, L) with w (M, C/G, K) (and bias b), then the epilogue reading `residuals`."""
        y = self.step(x[:, :, None], w[:, :, None], b, *(r[:, :, None] for r in residuals))
        return y.reshape(self.out_shape)
