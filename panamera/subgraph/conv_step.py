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
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import conv_kernels as ck
from .conv import HostForm, _geometry_of, host_conv, host_form
from .conv_direct import direct_geometry
from .conv_kernels import NO_EPILOGUE, Epilogue

_F32 = np.dtype(np.float32)


def _longs(*v: int):
    return (ctypes.c_long * len(v))(*v)


def _ok(a, shape: tuple) -> bool:
    return type(a) is np.ndarray and a.dtype == _F32 and a.shape == shape and a.flags.c_contiguous


def channels_last(channels: int, plane: int) -> bool:
    """Whether a 2-D depthwise conv runs channels last (`pn_step_depthwise_cl`: SIMD over the
    channels at each output pixel) rather than plane by plane (SIMD over a padded plane): small
    output planes, enough channels for the vector lanes.

    Measured (thread CPU time, 1 thread, AVX-512): 2x64x4x4 3x3 10.7 -> 3.8 us, 1x96x4x4 5x5 11.2 ->
    4.8, 1x16x8x8 7x7 6.9 -> 4.2; from 16x16 planes the two transposes cost more than they save
    (1x16x16x16 3x3 5.7 -> 7.3, 1x64x16x16 21 -> 70).

    >>> channels_last(96, 4), channels_last(16, 4096)
    (True, False)
    """
    return plane <= CHANNELS_LAST_MAX_PLANE and channels >= 8


CHANNELS_LAST_MAX_PLANE = 64  # output pixels per channel up to which a depthwise conv runs channels last


@dataclass(frozen=True, eq=False)
class HostConvStep:
    """One library Conv (and its fused epilogue) planned for input shapes `x_shape`, `w_shape`."""

    x_shape: tuple
    w_shape: tuple
    attrs: tuple  # the Conv's attributes as a sorted tuple (conv._geometry_of's key)
    has_bias: bool
    epilogue: Epilogue
    form: HostForm
    out_shape: tuple  # the step's output: the conv's, or a fused MaxPool's
    fast: bool  # the C kernels take it (2-D, or pointwise; padding >= 0); else conv.host_conv
    pool: tuple = ()  # a fused MaxPool's (kh, kw, sh, sw) (conv_fuse.py precondition 5): the direct kernel's
    conv_shape: tuple = ()  # the conv's output (the residuals' shape)
    _c: dict = field(default_factory=dict, repr=False)  # the C stages' tables and scratch, bound once
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # the scratch is shared

    @classmethod
    def plan(
        cls, x_shape, w_shape, attrs: dict, has_bias: bool, epilogue: Epilogue = NO_EPILOGUE, pool: tuple = ()
    ) -> HostConvStep | Lifted1d:
        """The step of a Conv with these input shapes and attributes (`ShapeError` where they do not
        fit), then `epilogue`, then a max pool of window and strides `pool` (kh, kw, sh, sw) if given
        (2-D only: conv_fuse.py precondition 5); a 1-D Conv is planned as the 2-D one of unit height
        (`Lifted1d`)."""
        if len(x_shape) == 3 and len(w_shape) == 3 and not pool:
            return Lifted1d.plan(x_shape, w_shape, attrs, has_bias, epilogue)
        key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))
        win, group = _geometry_of(tuple(x_shape), tuple(w_shape), key)
        form = host_form(tuple(w_shape), win, group)
        out = (x_shape[0], w_shape[0], *win.out)
        nonneg = min(min(win.pads)) >= 0
        fast = form is HostForm.POINTWISE or (len(win.kernel) == 2 and nonneg)
        pooled = out
        if pool:
            (kh, kw, sh, sw), (oh, ow) = pool, win.out
            pooled = (*out[:2], (oh - kh) // sh + 1, (ow - kw) // sw + 1)
            fast = fast and form is HostForm.COLUMNS and direct_geometry(tuple(x_shape), tuple(w_shape), win, group)
        step = cls(tuple(x_shape), tuple(w_shape), key, has_bias, epilogue, form, pooled, bool(fast), pool, out)
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
            c["dw_d"] = _longs(n, ch, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, h + ph + pe, w + pw + pwe, nops, 0)
            if channels_last(ch, oh * ow):  # scratch: x, y and the weights transposed (conv_kernels.py)
                cp = -(-ch // 16) * 16  # channels padded to the vector blocks; the pad lanes stay zero
                hwp = (h + ph + pe) * (w + pw + pwe)  # the padded plane: its border stays zero too
                scratch = np.zeros((hwp + oh * ow + kh * kw) * cp, np.float32)
                c["dw"] = (lib.pn_step_depthwise_cl, (ctypes.c_void_p * (9 + max(nres, 1)))())
                base = scratch.ctypes.data
                c["dw"][1][6:9] = [base, base + 4 * hwp * cp, base + 4 * (hwp + oh * ow) * cp]
                c["dw_res"], c["keep"] = 9, (ops, par, scratch)
            else:
                c["dw"] = (lib.pn_step_depthwise, (ctypes.c_void_p * (6 + max(nres, 1)))())
                c["dw_res"], c["keep"] = 6, (ops, par)
            c["dw"][1][4], c["dw"][1][5] = ctypes.addressof(ops), ctypes.addressof(par)
            return
        if self.form is HostForm.COLUMNS and (dg := direct_geometry(self.x_shape, self.w_shape, win, group)):
            self._bind_direct(dg, nops, ops, par, nres)
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

    def _bind_direct(self, dg, nops: int, ops, par, nres: int) -> None:
        """A dense stride-1 2-D Conv: one C call (conv_direct.py) with its padded planes and
        accumulator rows as scratch."""
        from ..cpu_compiled import cpu_model
        from .conv_direct import direct_threads, lib

        c = self._c
        xp = np.empty(dg.scratch_floats, np.float32)
        acc = np.empty(dg.m * dg.span, np.float32)
        p = (ctypes.c_void_p * (8 + max(nres, 1)))()
        p[3], p[4], p[6], p[7] = xp.ctypes.data, acc.ctypes.data, ctypes.addressof(ops), ctypes.addressof(par)
        cap = direct_threads(dg, cpu_model())  # decided once here; the call's count is the table's last entry
        c["direct"] = (lib().pn_step_direct, p, _longs(*dg.ints, nops, *(self.pool or (0, 0, 1, 1)), cap, 1))
        c["keep"] = (xp, acc, ops, par)

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
            and all(_ok(r, self.conv_shape) for r in res)
        ):
            return self._general(x, w, b, res)
        c, at = self._c, ck.address
        y = np.empty(self.out_shape, np.float32)
        if self.form is HostForm.DEPTHWISE:
            fn, p = c["dw"]
            with self._lock:  # the channels-last form's scratch is shared
                p[0], p[1], p[2], p[3] = at(x), at(w), at(y), (at(b) if b is not None else None)
                for i, r in enumerate(res):
                    p[c["dw_res"] + i] = at(r)
                fn(p, c["dw_d"])
            return y
        if "direct" in c:
            fn, p, d = c["direct"]
            with self._lock:
                _direct_weights(p, w, b)
                _direct_io(p, x, y, res)
                fn(p, d)
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

    def with_weights(self, w, b) -> Callable | None:
        """This step with the weights `w` and bias `b` (a model's constants) in its own table, as
        `call(x, residuals, threads) -> y` (None where x or a residual is not the planned float32
        array: the caller's general path); None unless the step is one C call (conv_direct.py) and
        w, b are the planned arrays. A call writes only x's, y's and the residuals' addresses and
        the thread count (each output value is one register tile's: bit-stable across counts)."""
        if "direct" not in self._c or not (_ok(w, self.w_shape) and (b is None) is not self.has_bias):
            return None
        if b is not None and not _ok(b, (self.w_shape[0],)):
            return None
        fn, p0, d0 = self._c["direct"]
        p, d = (ctypes.c_void_p * len(p0))(*p0), _longs(*d0)
        _direct_weights(p, w, b)
        xs, out, nres, lock, keep = self.x_shape, self.out_shape, self.epilogue.residuals, self._lock, (w, b, self)
        rs = self.conv_shape

        def call(x, residuals: tuple, threads: int) -> np.ndarray | None:
            if not (_ok(x, xs) and len(residuals) == nres and all(_ok(r, rs) for r in residuals)):
                return None
            y = np.empty(out, np.float32)
            with lock:
                _direct_io(p, x, y, residuals)
                d[-1] = threads
                fn(p, d)
            return y

        call.keep = keep  # the arrays whose addresses the table holds
        return call

    def _general(self, x, w, b, res) -> np.ndarray:
        """Arrays the step was not planned for: conv.host_conv (numpy where the C kernels do not fit)."""
        win, group = _geometry_of(tuple(x.shape), tuple(w.shape), self.attrs)
        x, w = np.asarray(x), np.asarray(w)
        y = host_conv(
            x, w, win, group, None if b is None else np.asarray(b), self.epilogue, tuple(map(np.asarray, res))
        )
        if self.pool:
            y = max_pool(y, self.pool)
        return y.astype(x.dtype, copy=False)


# The direct call's pointer table (conv_direct.py `pn_step_direct`): x 0, w 1, y 2, padded planes 3,
# accumulator rows 4, bias 5, epilogue operands and parameters 6-7, residuals from 8; every writer
# of it (a call, a bound call, the chain's stage) goes through these two.
def _direct_weights(p, w, b) -> None:
    p[1], p[5] = ck.address(w), (ck.address(b) if b is not None else None)


def _direct_io(p, x, y, residuals) -> None:
    p[0], p[2] = ck.address(x), ck.address(y)
    for i, r in enumerate(residuals):
        p[8 + i] = ck.address(r)


def c_stages(
    step: HostConvStep | Lifted1d, x, w, b, residuals: tuple, y, w_constant: bool = False
) -> tuple[tuple, ...] | None:
    """The C calls of a `fast` step (planned for the chain alone: its tables are written here, once)
    on these fixed arrays, as (kind, function address, pointer table, integer table) for
    subgraph/cpu_chain.py. Kinds "columns", "depthwise", "epilogue" are `fn(p, d)` ("direct" too,
    its `d` ending with the thread count the chain writes) (the epilogue
    over the whole output at once where no column is dropped; with `w_constant` a channels-last
    depthwise's weights are transposed here, once); "gemm" is the chain's own product: `d` = m, n,
    k, lda, ldb, ldc, count, then (A, B, C offsets, beta) per call. None where the step is not
    `fast`. The arrays stay the caller's to keep alive."""
    if isinstance(step, Lifted1d):  # the 2-D step's stages over unit-height views (same addresses)
        lift = lambda a: a[:, :, None]  # noqa: E731
        return c_stages(step.step, lift(x), lift(w), b, tuple(map(lift, residuals)), lift(y), w_constant)
    if not step.fast:
        return None
    c, at = step._c, ck.address
    fn_of = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    if "direct" in c:  # one C call (conv_direct.py); its integer table ends with the thread count
        fn, p, d = c["direct"]
        _direct_weights(p, w, b)
        _direct_io(p, x, y, residuals)
        return (("direct", fn_of(fn), p, d),)
    if step.form is HostForm.DEPTHWISE:
        fn, p = c["dw"]
        d = c["dw_d"]
        if c["dw_res"] == 9 and w_constant:  # channels last: the weights transposed once, here
            taps, ch = w.shape[2] * w.shape[3], w.shape[0]
            c["wt"] = np.zeros((taps, -(-ch // 16) * 16), np.float32)
            c["wt"][:, :ch] = w.reshape(ch, taps).T
            d = c["dw_d_chain"] = _longs(*d[:17], 1)
            w = c["wt"]
        p[0], p[1], p[2], p[3] = at(x), at(w), at(y), (at(b) if b is not None else None)
        for i, r in enumerate(residuals):
            p[c["dw_res"] + i] = at(r)
        return (("depthwise", fn_of(fn), p, d),)
    out: list[tuple] = []
    n, (g, mg, cgk) = step.x_shape[0], c["w3"]
    if step.form is HostForm.POINTWISE:
        src, cols, o = y, x, math.prod(step.x_shape[2:])
    else:
        c["cols_p"][0] = at(x)
        out.append(("columns", fn_of(c["cols_fn"]), c["cols_p"], c["cols_d"]))
        src, cols, o = c.get("wide", y), c["cols"], c["cols"].shape[-1]
    calls = [(gi * mg * cgk, (ni * g + gi) * cgk * o, (ni * g + gi) * mg * o, 0) for ni in range(n) for gi in range(g)]
    gp = (ctypes.c_void_p * 3)(at(w), at(cols), at(src))
    gd = (ctypes.c_longlong * (7 + 4 * len(calls)))(mg, o, cgk, cgk, o, o, len(calls), *(v for t in calls for v in t))
    out.append(("gemm", None, gp, gd))
    if c["epi"]:
        p = c["epi_p"]
        p[0], p[1], p[2] = at(y), at(src), (at(b) if b is not None else None)
        for i, r in enumerate(residuals):
            p[5 + i] = at(r)
        flat = ck._lib().pn_step_epilogue_flat if src is y else ck._lib().pn_step_epilogue
        out.append(("epilogue", fn_of(flat), p, c["epi_d"]))
    return tuple(out)


def max_pool(y: np.ndarray, pool: tuple) -> np.ndarray:
    """ONNX MaxPool of y (N, C, H, W) with window (kh, kw) and strides (sh, sw), no padding:
    the strided windows' maxima (numpy, for arrays the direct kernel does not take).

    >>> max_pool(np.arange(16.0).reshape(1, 1, 4, 4), (2, 2, 2, 2))[0, 0].tolist()
    [[5.0, 7.0], [13.0, 15.0]]
    """
    kh, kw, sh, sw = pool
    n, c, h, w = y.shape
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    s = y.strides
    v = np.lib.stride_tricks.as_strided(y, (n, c, oh, ow, kh, kw), (*s[:2], s[2] * sh, s[3] * sw, *s[2:]))
    return v.max(axis=(4, 5))


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

    def with_weights(self, w, b) -> Callable | None:
        """The 2-D step's bound call (`HostConvStep.with_weights`) over unit-height views of the
        arrays (the same memory), its output viewed back (N, M, L); None where that one is None."""
        call = self.step.with_weights(w[:, :, None], b)
        if call is None:
            return None
        out = self.out_shape

        def lifted(x, residuals: tuple, threads: int) -> np.ndarray | None:
            y = call(x[:, :, None], tuple(r[:, :, None] for r in residuals), threads)
            return None if y is None else y.reshape(out)

        lifted.keep = call.keep
        return lifted

    def __call__(self, x, w, b=None, *residuals) -> np.ndarray:
        """The 1-D Conv of x (N, C, L) with w (M, C/G, K) (and bias b), then the epilogue reading `residuals`."""
        y = self.step(x[:, :, None], w[:, :, None], b, *(r[:, :, None] for r in residuals))
        return y.reshape(self.out_shape)
