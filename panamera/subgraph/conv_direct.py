"""A dense 2-D stride-1 convolution in one C call: the input padded once per image, every output
channel block accumulated in registers over (input channel, tap) straight from the padded planes,
then the bias and the epilogue (conv_kernels.Epilogue) on each output plane while it is in cache,
and a fused MaxPool (conv_fuse.py precondition 5) over that plane, so only the pooled plane is stored.

The columns form (conv_kernels.pn_cols_wide, np.matmul, pn_conv_epilogue) copies the input once
per tap (9x for a 3x3 window) and crosses Python three times; measured on this project's 2-core
AVX-512 Xeon, 1 thread, on the exported ResNet's 2x16x16x16 * 16x16x3x3 Conv: columns + BLAS +
epilogue 45 us, per-tap sgemm from C with beta 1 (no columns) 36 us, this kernel 33 us in a
23-argument ctypes call (about 8 us of it the arguments: the step's table call drops them).

The output is computed in the padded width `wp` (output position oy * wp + ox, the wp - ow last
columns of each row dropped by the epilogue pass), so that a tap is one offset
`i * dh * wp + j * dw` into the padded plane and a register tile is `NB` contiguous vectors of
one row run: `MB` output channels x `NB` vectors of accumulators (8 x 3 zmm with AVX-512, 4 x 3
ymm otherwise), each (channel, tap) one broadcast weight per output channel and `NB` loads.
Positions are rounded up to whole tiles (`span`), the plane given zeros up to the last tap's
furthest read, so no tile has a tail.

Preconditions (`direct_geometry` returns None where one fails; the step then takes another form):
  1. a 2-D window (4-D tensors);
  2. one group (dense: depthwise has its own kernel, conv_kernels.pn_depthwise2d);
  3. stride 1 on both axes (the padded-width run);
  4. no negative padding;
  5. at most `MAX_TAPS` taps (the C side's tap-offset table).
float32 and C-contiguous arrays are the caller's check (conv_step.HostConvStep).

The sum over (channel, tap) runs in that order with one fused multiply-add per term, the BLAS's
order over the column tensor's K: the two forms agree to rounding, not bit for bit.

>>> from panamera.subgraph.conv import geometry
>>> win, g = geometry((1, 2, 5, 5), (4, 2, 3, 3), {"pads": [1, 1, 1, 1]})
>>> d = direct_geometry((1, 2, 5, 5), (4, 2, 3, 3), win, g)
>>> d.wp, d.oh * d.wp <= d.span, d.plane >= d.span + 2 * d.wp + 2
(7, True, True)
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass

from ..frontend import pool
from ..runtime import cpu
from . import conv_kernels

MAX_TAPS = 256  # the C side's tap-offset table
# The register tile's positions: NB vectors of VL lanes (conv_direct's C: 3 x 16 with AVX-512, 3 x 8 otherwise);
# the span is rounded to 48, a multiple of both.
TILE = 48

SOURCE = (
    conv_kernels.SOURCE
    + r"""
#if defined(__AVX512F__)
#define PN_DVL 16
#define PN_DMB 8
#else
#define PN_DVL 8
#define PN_DMB 4
#endif
#define PN_DNB 3
typedef float pn_dv __attribute__((vector_size(PN_DVL * 4)));
typedef float pn_dvu __attribute__((vector_size(PN_DVL * 4), aligned(4)));
// the larger of v and u, NaN where either is (numpy's max, the pool's fallback)
static inline float pn_nanmax(float v, float u) { return (u > v || u != u) ? u : v; }

// MB output channels (weights w, row stride ck) x PN_DNB vectors of positions from x (channel 0 at
// the tile's first position; planes `plane` apart), summed over C channels and K taps (offsets toff)
template <int MB>
static inline void pn_direct_tile(const float* __restrict x, L plane, const float* __restrict w, L ck, L C,
                                  const L* toff, L K, float* __restrict acc, L span) {
    pn_dv a[MB][PN_DNB];
    for (int m = 0; m < MB; m++)
        for (int v = 0; v < PN_DNB; v++) a[m][v] = pn_dv{};
    for (L c = 0; c < C; c++) {
        const float* xc = x + c * plane;
        const float* wc = w + c * K;
        for (L t = 0; t < K; t++) {
            const float* s = xc + toff[t];
            pn_dv xv[PN_DNB];
            for (int v = 0; v < PN_DNB; v++) xv[v] = *(const pn_dvu*)(s + v * PN_DVL);
            for (int m = 0; m < MB; m++) {
                float wm = wc[m * ck + t];
                for (int v = 0; v < PN_DNB; v++) a[m][v] += wm * xv[v];
            }
        }
    }
    for (int m = 0; m < MB; m++)
        for (int v = 0; v < PN_DNB; v++) *(pn_dvu*)(acc + m * span + v * PN_DVL) = a[m][v];
}

// y (n, M, oh, ow) = the stride-1 conv of x (n, C, h, w) with w (M, C, kh, kw), then bias and epilogue.
// xp: C planes of `plane` floats (scratch), acc: M rows of `span` floats (scratch).
extern "C" void pn_conv_direct(const float* x, const float* w, float* y, float* xp, float* acc, L n, L C, L h,
                               L wd, L M, L kh, L kw, L oh, L ow, L ph, L pw, L dh, L dw, L wp, L plane, L span,
                               const float* bias, int nops, const int* ops, const float* par,
                               const float* const* res, L pkh, L pkw, L psh, L psw, int nt) {
    L K = kh * kw, ck = C * K, toff[256];
    int nres = 0;  // the epilogue's residual reads (Add steps, op code 0)
    for (int k = 0; k < nops; k++) nres += ops[k] == 0;
    for (L i = 0; i < kh; i++)
        for (L j = 0; j < kw; j++) toff[i * kw + j] = i * dh * wp + j * dw;
    for (L b = 0; b < n; b++) {
        for (L c = 0; c < C; c++) {
            float* __restrict q = xp + c * plane;
            const float* __restrict s = x + (b * C + c) * h * wd;
            if (ph || pw || plane != h * wd) {
                std::memset(q, 0, plane * sizeof(float));
                for (L iy = 0; iy < h; iy++) std::memcpy(q + (ph + iy) * wp + pw, s + iy * wd, wd * sizeof(float));
            }
        }
        const float* src = (ph || pw || plane != h * wd) ? xp : x + b * C * h * wd;
        L full = M / PN_DMB, blocks = full + M % PN_DMB, tiles = span / (PN_DNB * PN_DVL);
        // (channel block, position tile) pairs: each output value is one tile's, whatever the thread count
        #pragma omp parallel for schedule(static) num_threads(nt) if(nt > 1)
        for (L e = 0; e < blocks * tiles; e++) {
            L blk = e % blocks, p = (e / blocks) * PN_DNB * PN_DVL;
            L m = blk < full ? blk * PN_DMB : full * PN_DMB + (blk - full);
            if (blk < full)
                pn_direct_tile<PN_DMB>(src + p, plane, w + m * ck, ck, C, toff, K, acc + m * span + p, span);
            else
                pn_direct_tile<1>(src + p, plane, w + m * ck, ck, C, toff, K, acc + m * span + p, span);
        }
        #pragma omp parallel for schedule(static) num_threads(nt) if(nt > 1)
        for (L o = 0; o < M; o++) {
            float* __restrict s = acc + o * span;
            if (pkh) {  // a fused MaxPool: the epilogue in the padded width (row by row where it reads a
                        // residual), then per pooled row the window rows' maxima, then the columns'
                if (nres)
                    for (L oy = 0; oy < oh; oy++)
                        epi_row(s + oy * wp, ow, bias ? bias + o : nullptr, nops, ops, par, res,
                                (b * M + o) * oh * ow + oy * ow);
                else
                    epi_row(s, oh * wp, bias ? bias + o : nullptr, nops, ops, par, res, 0);
                L qh = (oh - pkh) / psh + 1, qw = (ow - pkw) / psw + 1;
                float col[ow];
                for (L qy = 0; qy < qh; qy++) {
                    const float* __restrict r = s + qy * psh * wp;
                    _Pragma("omp simd") for (L x = 0; x < ow; x++) col[x] = r[x];
                    for (L i = 1; i < pkh; i++)
                        _Pragma("omp simd") for (L x = 0; x < ow; x++) col[x] = pn_nanmax(col[x], r[i * wp + x]);
                    float* __restrict d = y + ((b * M + o) * qh + qy) * qw;
                    for (L qx = 0; qx < qw; qx++) {
                        float v = col[qx * psw];
                        for (L j = 1; j < pkw; j++) v = pn_nanmax(v, col[qx * psw + j]);
                        d[qx] = v;
                    }
                }
                continue;
            }
            float* __restrict d = y + (b * M + o) * oh * ow;
            for (L oy = 0; oy < oh; oy++)
                _Pragma("omp simd") for (L ox = 0; ox < ow; ox++) d[oy * ow + ox] = s[oy * wp + ox];
            epi_row(d, oh * ow, bias ? bias + o : nullptr, nops, ops, par, res, (b * M + o) * oh * ow);
        }
    }
}

// The step's table entry (conv_step.py): pointers x, w, y, xp, acc, bias, ops, params, residuals...; integers d
// (the geometry, the epilogue's op count, a fused MaxPool's kh, kw, sh, sw (kh 0: none), the thread count)
extern "C" void pn_step_direct(void** p, const L* d) {
    pn_conv_direct((const float*)p[0], (const float*)p[1], (float*)p[2], (float*)p[3], (float*)p[4], d[0], d[1], d[2],
                   d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15],
                   (const float*)p[5], (int)d[16], (const int*)p[6], (const float*)p[7], (const float* const*)(p + 8),
                   d[17], d[18], d[19], d[20], (int)d[21]);
}
"""
)


@dataclass(frozen=True)
class DirectGeometry:
    """The direct kernel's integers for one Conv: input (n, c, h, w), m outputs, window, padding,
    the padded width `wp`, a padded plane's floats `plane` and the positions computed per output
    channel `span` (oh * wp rounded up to whole tiles)."""

    n: int
    c: int
    h: int
    w: int
    m: int
    kh: int
    kw: int
    oh: int
    ow: int
    ph: int
    pw: int
    dh: int
    dw: int
    wp: int
    plane: int
    span: int

    @property
    def ints(self) -> tuple[int, ...]:
        """The C entry's integer table, in its order (before the epilogue's op count)."""
        return (self.n, self.c, self.h, self.w, self.m, self.kh, self.kw, self.oh, self.ow, self.ph, self.pw,
                self.dh, self.dw, self.wp, self.plane, self.span)  # fmt: skip

    @property
    def pads_input(self) -> bool:
        """Whether the kernel copies the input into padded planes (else it reads x itself)."""
        return bool(self.ph or self.pw or self.plane != self.h * self.w)


def direct_geometry(x_shape: tuple, w_shape: tuple, win: pool.Window, group: int) -> DirectGeometry | None:
    """The direct kernel's geometry for this Conv, or None where a precondition (module docstring) fails.

    >>> from panamera.subgraph.conv import geometry
    >>> win, g = geometry((1, 4, 6, 6), (4, 2, 3, 3), {"group": 2})
    >>> direct_geometry((1, 4, 6, 6), (4, 2, 3, 3), win, g) is None  # 2: grouped
    True
    """
    if len(win.kernel) != 2 or len(x_shape) != 4:  # 1
        return None
    if group != 1:  # 2
        return None
    if win.strides != (1, 1):  # 3
        return None
    if min(min(win.pads)) < 0:  # 4
        return None
    if math.prod(win.kernel) > MAX_TAPS:  # 5
        return None
    n, c, h, w = x_shape
    (kh, kw), (oh, ow), (dh, dw) = win.kernel, win.out, win.dilations
    (ph, pe), (pw, pwe) = win.pads
    hp, wp = h + ph + pe, w + pw + pwe
    span = -(-oh * wp // TILE) * TILE
    plane = max(hp * wp, (kh - 1) * dh * wp + (kw - 1) * dw + span)
    return DirectGeometry(n, c, h, w, w_shape[0], kh, kw, oh, ow, ph, pw, dh, dw, wp, plane, span)


@functools.cache
def lib() -> ctypes.CDLL:
    """The direct kernel's library (built once, cached on disk by runtime/cpu.build)."""
    return cpu.build(SOURCE)
