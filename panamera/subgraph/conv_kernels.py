"""The host convolution's C kernels (the CPU target's compiler, runtime/cpu.build): the 2-D column
tensor (each channel padded into a small scratch plane, then fixed-length row copies; at stride 1
one contiguous run per channel and tap in the padded width), a direct depthwise convolution, and
the conv's epilogue (bias, a residual Add, an activation) applied to the output in place, one
channel plane at a time while it is in cache.

An `Epilogue` is data: the element-wise steps after a convolution's bias, in order, each an
`EpiOp` (an ONNX activation, or the Add of one more tensor of the output's shape). The
partitioner decides it once (conv_fuse.py) and the library's Conv step carries it.

>>> import numpy as np
>>> y = np.array([[[-1.0, 2.0]]], np.float32)
>>> apply_epilogue(y, Epilogue((EpiStep(EpiOp.RELU),)), None, ())
>>> y.tolist()
[[[0.0, 2.0]]]
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..runtime import cpu
from ..runtime.cpu_call import address


class EpiOp(Enum):
    """One element-wise step of a convolution's epilogue (the ONNX op it stands for)."""

    ADD = "Add"  # + one more tensor of the output's shape (a residual)
    RELU = "Relu"
    CLIP = "Clip"  # params (lo, hi)
    HARDSWISH = "HardSwish"
    HARDSIGMOID = "HardSigmoid"  # params (alpha, beta)
    SIGMOID = "Sigmoid"
    LEAKYRELU = "LeakyRelu"  # params (alpha,)
    SILU = "Silu"  # x * Sigmoid(x) (a Sigmoid and a Mul in ONNX: conv_fuse's Swish pair)
    GELU = "Gelu"  # x (1 + erf(x / sqrt 2)) 0.5 (conv_fuse's erf chain: Div, Erf, Add, Mul, Mul)


_CODE = {op: k for k, op in enumerate(EpiOp)}


@dataclass(frozen=True)
class EpiStep:
    """An epilogue step: its op and float parameters."""

    op: EpiOp
    params: tuple[float, ...] = ()


@dataclass(frozen=True)
class Epilogue:
    """The steps after a conv's bias, in order; each ADD reads the next residual operand."""

    steps: tuple[EpiStep, ...] = ()

    @property
    def residuals(self) -> int:
        """How many extra operands (ADD steps) it reads."""
        return sum(s.op is EpiOp.ADD for s in self.steps)


NO_EPILOGUE = Epilogue()


SOURCE = (
    cpu.SIMD_MATH
    + r"""
#include <cstring>
#include <algorithm>
#include <vector>
typedef long L;

// the plane x (h, w) into q (hp, wp) at (ph, pw), zeros around it and up to `size` values
static inline void pad_plane(const float* __restrict x, float* __restrict q, L h, L w, L ph, L pw, L hp, L wp, L size) {
    for (L t = 0; t < ph * wp; t++) q[t] = 0.0f;
    for (L iy = 0; iy < h; iy++) {
        float* __restrict d = q + (ph + iy) * wp;
        for (L ox = 0; ox < pw; ox++) d[ox] = 0.0f;
        for (L ox = 0; ox < w; ox++) d[pw + ox] = x[iy * w + ox];
        for (L ox = pw + w; ox < wp; ox++) d[ox] = 0.0f;
    }
    for (L t = (ph + h) * wp; t < size; t++) q[t] = 0.0f;
}

// the epilogue over one row of o outputs (channel bias b, then the steps in order)
static inline void epi_row(float* __restrict y, L o, const float* b, int nops, const int* ops,
                           const float* par, const float* const* res, L at) {
    if (b) { float v = *b; _Pragma("omp simd") for (L i = 0; i < o; i++) y[i] += v; }
    int r = 0;
    for (int k = 0; k < nops; k++) {
        float p = par[2 * k], q = par[2 * k + 1];
        switch (ops[k]) {
        case 0: { const float* __restrict a = res[r++] + at; _Pragma("omp simd") for (L i = 0; i < o; i++) y[i] += a[i]; break; }
        case 1: _Pragma("omp simd") for (L i = 0; i < o; i++) y[i] = y[i] > 0.0f ? y[i] : 0.0f; break;
        case 2: _Pragma("omp simd") for (L i = 0; i < o; i++) y[i] = std::min(std::max(y[i], p), q); break;
        case 3: _Pragma("omp simd") for (L i = 0; i < o; i++)
            y[i] = y[i] * std::min(std::max(y[i] * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f); break;
        case 4: _Pragma("omp simd") for (L i = 0; i < o; i++) y[i] = std::min(std::max(p * y[i] + q, 0.0f), 1.0f); break;
        case 5: _Pragma("omp simd") for (L i = 0; i < o; i++) y[i] = 1.0f / (1.0f + expf(-y[i])); break;
        case 6: _Pragma("omp simd") for (L i = 0; i < o; i++) y[i] = y[i] >= 0.0f ? y[i] : p * y[i]; break;
        case 7: _Pragma("omp simd") for (L i = 0; i < o; i++) y[i] = y[i] / (1.0f + expf(-y[i])); break;
        case 8: for (L i = 0; i < o; i++) y[i] = y[i] * (1.0f + erff(y[i] / 1.41421353816986083984375f)) * 0.5f; break;
        }
    }
}

// y (rows of oh x ow, row r of channel r % m) = src (rows of oh x wp: wp - ow columns dropped), then the
// bias and the epilogue, in place, one output plane at a time (src may be y itself when wp == ow)
extern "C" void pn_conv_epilogue(float* y, const float* src, L rows, L m, L oh, L ow, L wp, const float* bias,
                                 int nops, const int* ops, const float* par, const float* const* res) {
    for (L r = 0; r < rows; r++) {
        if (src != y)
            for (L oy = 0; oy < oh; oy++) {
                float* __restrict d = y + (r * oh + oy) * ow;
                const float* __restrict s = src + (r * oh + oy) * wp;
                _Pragma("omp simd") for (L ox = 0; ox < ow; ox++) d[ox] = s[ox];
            }
        epi_row(y + r * oh * ow, oh * ow, bias ? bias + r % m : nullptr, nops, ops, par, res, r * oh * ow);
    }
}

// stride-1 2-D columns in the padded width wp = w + pads: each (channel, tap) row of cols is one
// contiguous run of oh * wp values of the padded input xp (hp * wp + tail per channel, built
// here), so that out[oy * wp + ox] (ox < ow; the wp - ow last ones are dropped) is the conv
extern "C" void pn_cols_wide(const float* x, float* xp, float* cols, L nc, L h, L w, L kh, L kw, L oh, L hp,
                             L wp, L ph, L pw, L dh, L dw) {
    L plane = hp * wp + (kw - 1) * dw;
    for (L p = 0; p < nc; p++) {
        float* __restrict q = xp + p * plane;
        pad_plane(x + p * h * w, q, h, w, ph, pw, hp, wp, plane);
        for (L i = 0; i < kh; i++)
            for (L j = 0; j < kw; j++)
                std::memcpy(cols + ((p * kh + i) * kw + j) * oh * wp, q + i * dh * wp + j * dw, oh * wp * sizeof(float));
    }
}

// cols[n][c][i][j][oy][ox] = x[n][c][oy*sh + i*dh - ph][ox*sw + j*dw - pw] (0 outside): each channel
// padded into a scratch plane first, so that every row is a fixed-length loop without bounds
extern "C" void pn_im2col2d(const float* x, float* cols, L nc, L h, L w, L kh, L kw, L oh, L ow,
                            L sh, L sw, L ph, L pw, L dh, L dw, L hp, L wp) {
    std::vector<float> plane(hp * wp);
    float* q = plane.data();
    for (L p = 0; p < nc; p++) {
        pad_plane(x + p * h * w, q, h, w, ph, pw, hp, wp, hp * wp);
        for (L i = 0; i < kh; i++)
            for (L j = 0; j < kw; j++) {
                float* __restrict d = cols + ((p * kh + i) * kw + j) * oh * ow;
                for (L oy = 0; oy < oh; oy++, d += ow) {
                    const float* __restrict s = q + (oy * sh + i * dh) * wp + j * dw;
                    if (sw == 1) std::memcpy(d, s, ow * sizeof(float));
                    else for (L ox = 0; ox < ow; ox++) d[ox] = s[ox * sw];
                }
            }
    }
}

// depthwise: y[n][c][oy][ox] = bias[c] + sum_ij wt[c][i][j] x[n][c][oy*sh + i*dh - ph][ox*sw + j*dw - pw],
// taps in (i, j) order, then the epilogue over the channel's output plane. Each channel is padded into a scratch
// plane; at stride 1 the taps run over the whole plane in the padded width (one long SIMD loop
// per tap, the wp - ow last columns of each row dropped), else row by row.
extern "C" void pn_depthwise2d(const float* x, const float* wt, float* y, L n, L c, L h, L w, L kh, L kw, L oh,
                               L ow, L sh, L sw, L ph, L pw, L dh, L dw, L hp, L wp, const float* bias, int nops,
                               const int* ops, const float* par, const float* const* res) {
    L tail = (kw - 1) * dw, span = oh * wp;
    std::vector<float> plane(hp * wp + tail), accs(span);
    float* __restrict q = plane.data();
    float* __restrict acc = accs.data();
    for (L p = 0; p < n * c; p++) {
        pad_plane(x + p * h * w, q, h, w, ph, pw, hp, wp, hp * wp + tail);
        const float* wc = wt + (p % c) * kh * kw;
        const float* b = bias ? bias + p % c : nullptr;
        if (sh == 1 && sw == 1) {
            for (L t = 0; t < span; t++) acc[t] = 0.0f;
            for (L i = 0; i < kh; i++)
                for (L j = 0; j < kw; j++) {
                    const float* __restrict s = q + i * dh * wp + j * dw;
                    float v = wc[i * kw + j];
                    _Pragma("omp simd") for (L t = 0; t < span; t++) acc[t] += v * s[t];
                }
            for (L oy = 0; oy < oh; oy++) {
                float* __restrict d = y + (p * oh + oy) * ow;
                for (L ox = 0; ox < ow; ox++) d[ox] = acc[oy * wp + ox];
            }
            epi_row(y + p * oh * ow, oh * ow, b, nops, ops, par, res, p * oh * ow);
            continue;
        }
        for (L oy = 0; oy < oh; oy++) {
            float* __restrict d = y + (p * oh + oy) * ow;
            for (L ox = 0; ox < ow; ox++) d[ox] = 0.0f;
            for (L i = 0; i < kh; i++)
                for (L j = 0; j < kw; j++) {
                    const float* __restrict s = q + (oy * sh + i * dh) * wp + j * dw;
                    float v = wc[i * kw + j];
                    for (L ox = 0; ox < ow; ox++) d[ox] += v * s[ox * sw];
                }
        }
        epi_row(y + p * oh * ow, oh * ow, b, nops, ops, par, res, p * oh * ow);
    }
}

// The steps' table entries (conv_step.py): pointers p, then integers d, bound once per node
extern "C" void pn_step_epilogue(void** p, const L* d) {
    pn_conv_epilogue((float*)p[0], (const float*)p[1], d[0], d[1], d[2], d[3], d[4], (const float*)p[2], (int)d[5],
                     (const int*)p[3], (const float*)p[4], (const float* const*)(p + 5));
}
// pn_step_epilogue where src is y itself (no dropped columns): the bias row by row, then each step once
// over the whole output (element-wise; residuals in y's layout): no per-row switch for 1x1 outputs
extern "C" void pn_step_epilogue_flat(void** p, const L* d) {
    float* y = (float*)p[0];
    const float* b = (const float*)p[2];
    L rows = d[0], m = d[1], o = d[2] * d[3];
    if (b)
        for (L r = 0; r < rows; r++) {
            float v = b[r % m];
            float* __restrict q = y + r * o;
            _Pragma("omp simd") for (L i = 0; i < o; i++) q[i] += v;
        }
    epi_row(y, rows * o, nullptr, (int)d[5], (const int*)p[3], (const float*)p[4], (const float* const*)(p + 5), 0);
}
extern "C" void pn_step_im2col(void** p, const L* d) {
    pn_im2col2d((const float*)p[0], (float*)p[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10],
                d[11], d[12], d[13], d[14]);
}
extern "C" void pn_step_cols_wide(void** p, const L* d) {
    pn_cols_wide((const float*)p[0], (float*)p[1], (float*)p[2], d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8],
                 d[9], d[10], d[11]);
}
extern "C" void pn_step_depthwise(void** p, const L* d) {
    pn_depthwise2d((const float*)p[0], (const float*)p[1], (float*)p[2], d[0], d[1], d[2], d[3], d[4], d[5], d[6],
                   d[7], d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15], (const float*)p[3], (int)d[16],
                   (const int*)p[4], (const float*)p[5], (const float* const*)(p + 6));
}

// depthwise over small planes, channels last: per image, x (C, H, W) is transposed into xt (HP*WP, CP), the
// padded plane (its border never written: zeros), and the weights into wt (KH*KW, CP), CP = C rounded up to 16
// (the pad lanes stay zero: the scratch is zeroed once); then per block of 16 channels PN_DWP output pixels of a
// row at once (PN_DWP x 16 lanes of accumulators: independent chains, where one pixel's taps were one chain of
// latency-bound FMAs), each over all KH*KW taps in (i, j) order as pn_depthwise2d (a padded tap adds w * 0),
// stored to yt (OH*OW, CP) and transposed back into y (C, OH*OW) with the bias added last; the epilogue runs
// over the whole output at once (element-wise; residuals in y's layout). p: x, w, y, bias, ops, params, xt, yt,
// wt, then the residuals; d as pn_step_depthwise's, then 1 where w is already transposed and padded (KH*KW, CP).
// Both transposes write contiguously (each pixel's channels; they wrote one float per channel plane's stride
// before). Measured (AMD EPYC Zen 3, AVX2, 1 thread, min of 3000 calls): 1x16x8x8 7x7 4.5 -> 3.4 us, 2x64x4x4
// 3x3 3.8 -> 3.4, 2x96x4x4 5x5 stride 2 unchanged (4.8); on these planes the transposes, not the taps, take most.
#define PN_DWP 4
template <int P>
static inline void pn_dw_pixels(const float* __restrict xt, const float* __restrict wt, float* __restrict yt, L cp,
                                L kh, L kw, L wp, L dh, L dw, L sw, L c0) {
    // xt: the first tap's row start for the first pixel; pixel q reads q * sw * cp further
    float a[P][16];
    for (int q = 0; q < P; q++) _Pragma("omp simd") for (int l = 0; l < 16; l++) a[q][l] = 0.0f;
    for (L i = 0; i < kh; i++)
        for (L j = 0; j < kw; j++) {
            const float* __restrict v = wt + (i * kw + j) * cp + c0;
            const float* __restrict s = xt + (i * dh * wp + j * dw) * cp + c0;
            for (int q = 0; q < P; q++) _Pragma("omp simd") for (int l = 0; l < 16; l++) a[q][l] += v[l] * s[q * sw * cp + l];
        }
    for (int q = 0; q < P; q++) _Pragma("omp simd") for (int l = 0; l < 16; l++) yt[q * cp + c0 + l] = a[q][l];
}
extern "C" void pn_step_depthwise_cl(void** p, const L* d) {
    const float* x = (const float*)p[0];
    const float* wt0 = (const float*)p[1];
    float* y = (float*)p[2];
    const float* bias = (const float*)p[3];
    float* __restrict xt = (float*)p[6];
    float* __restrict yt = (float*)p[7];
    float* __restrict wt = (float*)p[8];
    const float* const* res = (const float* const*)(p + 9);
    L n = d[0], c = d[1], h = d[2], w = d[3], kh = d[4], kw = d[5], oh = d[6], ow = d[7];
    L sh = d[8], sw = d[9], ph = d[10], pw = d[11], dh = d[12], dw = d[13], wp = d[15];
    int nops = (int)d[16];
    L cp = (c + 15) / 16 * 16;
    if (d[17]) wt = (float*)wt0;  // the caller's weights already (KH*KW, CP): conv_step.c_stages
    else
        for (L t = 0; t < kh * kw; t++)
            for (L ch = 0; ch < c; ch++) wt[t * cp + ch] = wt0[ch * kh * kw + t];
    L hw = h * w, o = oh * ow;
    for (L b = 0; b < n; b++) {
        const float* xb = x + b * c * hw;
        for (L iy = 0; iy < h; iy++)
            for (L ix = 0; ix < w; ix++) {
                float* __restrict q = xt + ((iy + ph) * wp + ix + pw) * cp;
                for (L ch = 0; ch < c; ch++) q[ch] = xb[ch * hw + iy * w + ix];
            }
        for (L oy = 0; oy < oh; oy++) {
            const float* row = xt + oy * sh * wp * cp;
            float* yrow = yt + oy * ow * cp;
            L ox = 0;
            for (; ox + PN_DWP <= ow; ox += PN_DWP)
                for (L c0 = 0; c0 < cp; c0 += 16)
                    pn_dw_pixels<PN_DWP>(row + ox * sw * cp, wt, yrow + ox * cp, cp, kh, kw, wp, dh, dw, sw, c0);
            for (; ox < ow; ox++)
                for (L c0 = 0; c0 < cp; c0 += 16)
                    pn_dw_pixels<1>(row + ox * sw * cp, wt, yrow + ox * cp, cp, kh, kw, wp, dh, dw, sw, c0);
        }
        float* yb = y + b * c * o;
        for (L t = 0; t < o; t++) {
            const float* __restrict q = yt + t * cp;
            if (bias)
                for (L ch = 0; ch < c; ch++) yb[ch * o + t] = q[ch] + bias[ch];
            else
                for (L ch = 0; ch < c; ch++) yb[ch * o + t] = q[ch];
        }
    }
    epi_row(y, n * c * o, nullptr, nops, (const int*)p[4], (const float*)p[5], res, 0);
}

"""
)

_L = ctypes.c_long
_P = ctypes.c_void_p


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = cpu.build(SOURCE)
    epi = [_P, ctypes.c_int, _P, _P, _P]  # bias, nops, ops, params, residual pointers
    lib.pn_conv_epilogue.argtypes = [_P, _P, _L, _L, _L, _L, _L, *epi]
    lib.pn_cols_wide.argtypes = [_P, _P, _P] + [_L] * 12
    lib.pn_im2col2d.argtypes = [_P, _P] + [_L] * 15
    lib.pn_depthwise2d.argtypes = [_P, _P, _P] + [_L] * 16 + epi
    for f in (lib.pn_conv_epilogue, lib.pn_cols_wide, lib.pn_im2col2d, lib.pn_depthwise2d):
        f.restype = None
    return lib


@functools.lru_cache(maxsize=256)
def _epi_tables(epi: Epilogue) -> tuple:
    """The epilogue as C tables: (nops, op codes, two params per op), built once per epilogue."""
    n = len(epi.steps)
    ops = (ctypes.c_int * max(n, 1))(*(_CODE[s.op] for s in epi.steps))
    par = (ctypes.c_float * max(2 * n, 2))(*(p for s in epi.steps for p in (tuple(s.params) + (0.0, 0.0))[:2]))
    return n, ops, par


def _epi_args(epi: Epilogue, bias: np.ndarray | None, residuals: tuple) -> tuple:
    n, ops, par = _epi_tables(epi)
    res = (_P * max(len(residuals), 1))(*(address(r) for r in residuals))
    return (None if bias is None else address(bias)), n, ops, par, res


def fits(*arrays) -> bool:
    """Whether the C kernels take these arrays: float32 and C-contiguous (None: absent)."""
    return all(a is None or (a.dtype == np.float32 and a.flags.c_contiguous) for a in arrays)


def apply_epilogue(
    y: np.ndarray, epi: Epilogue, bias: np.ndarray | None, residuals: tuple, wide: np.ndarray | None = None
) -> None:
    """Bias (one per channel, axis 1) and the epilogue's steps applied to y (N, M, ...) in place:
    the C pass for float32, numpy otherwise. `wide` (float32 (N, M, OH, WP), 2-D only): the source
    rows, their first OW columns copied into y first."""
    if fits(y, bias, *residuals):
        n, m = y.shape[:2]
        oh, ow = (y.shape[2], y.shape[3]) if wide is not None else (1, math.prod(y.shape[2:]))
        src = y if wide is None else wide
        _lib().pn_conv_epilogue(
            address(y), address(src), n * m, m, oh, ow, src.shape[-1] if wide is not None else ow,
            *_epi_args(epi, bias, residuals),
        )  # fmt: skip
        return
    if bias is not None:
        y += bias.reshape((1, -1) + (1,) * (y.ndim - 2))
    res = iter(residuals)
    for s in epi.steps:
        y[...] = numpy_step(s, y, next(res) if s.op is EpiOp.ADD else None)


def numpy_step(s: EpiStep, y: np.ndarray, other: np.ndarray | None = None) -> np.ndarray:
    """One epilogue step in numpy, in y's dtype (the C kernel's arithmetic, for other dtypes)."""
    one = y.dtype.type(1)
    if s.op is EpiOp.ADD:
        return y + other
    if s.op is EpiOp.RELU:
        return np.maximum(y, 0)
    if s.op is EpiOp.CLIP:
        return np.minimum(np.maximum(y, y.dtype.type(s.params[0])), y.dtype.type(s.params[1]))
    if s.op is EpiOp.HARDSWISH:
        return y * np.clip(y / y.dtype.type(6) + y.dtype.type(0.5), 0, one)
    if s.op is EpiOp.HARDSIGMOID:
        return np.clip(y.dtype.type(s.params[0]) * y + y.dtype.type(s.params[1]), 0, one)
    if s.op is EpiOp.SIGMOID:
        return one / (one + np.exp(-y))
    if s.op is EpiOp.SILU:
        return y / (one + np.exp(-y))
    if s.op is EpiOp.GELU:  # numpy has no erf: math.erf per element (a fallback for other dtypes)
        e = np.frompyfunc(math.erf, 1, 1)(y / y.dtype.type(math.sqrt(2))).astype(y.dtype)
        return y * (one + e) * y.dtype.type(0.5)
    return np.where(y >= 0, y, y.dtype.type(s.params[0]) * y)  # LEAKYRELU


def im2col2d(x: np.ndarray, cols: np.ndarray, win) -> None:
    """The 2-D column tensor (N, C, KH, KW, OH, OW) of float32 x (N, C, H, W) into `cols`, zeros in the padding."""
    n, c, h, w = x.shape
    (kh, kw), (oh, ow), (sh, sw), (dh, dw) = win.kernel, win.out, win.strides, win.dilations
    (ph, pe), (pw, pwe) = win.pads
    _lib().pn_im2col2d(
        address(x), address(cols), n * c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, h + ph + pe, w + pw + pwe
    )


def cols_wide(x: np.ndarray, xp: np.ndarray, cols: np.ndarray, win) -> None:
    """Stride-1 2-D columns (N, C, KH, KW, OH * WP) of float32 x in the padded width WP (the
    padded input written into `xp`, (N, C, HP * WP + (KW - 1) * DW)): `pn_cols_wide`."""
    n, c, h, w = x.shape
    (kh, kw), (dh, dw) = win.kernel, win.dilations
    (ph, pe), (pw, pwe) = win.pads
    _lib().pn_cols_wide(
        address(x), address(xp), address(cols), n * c, h, w, kh, kw, win.out[0], h + ph + pe, w + pw + pwe,
        ph, pw, dh, dw,
    )  # fmt: skip


def depthwise2d(x, w, win, bias, epi: Epilogue, residuals: tuple) -> np.ndarray:
    """The 2-D depthwise convolution (one input channel and one output per group) of float32
    x (N, C, H, W) with w (C, 1, KH, KW), its bias and epilogue applied per output plane."""
    n, c, h, wd = x.shape
    (kh, kw), (oh, ow), (sh, sw), (dh, dw) = win.kernel, win.out, win.strides, win.dilations
    y = np.empty((n, c, oh, ow), np.float32)
    (ph, pe), (pw, pwe) = win.pads
    _lib().pn_depthwise2d(
        address(x), address(w), address(y), n, c, h, wd, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw,
        h + ph + pe, wd + pw + pwe, *_epi_args(epi, bias, residuals),
    )  # fmt: skip
    return y
