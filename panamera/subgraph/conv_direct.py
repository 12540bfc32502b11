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
Positions are rounded up to whole vectors (`span`, a multiple of `LANES`), the plane given zeros
up to the last tap's furthest read; a span that is not whole tiles ends with one short tile of 1 or
2 vectors (`MB` x 1 or 2 accumulators), so at most 15 positions per output channel are wasted
rather than up to 47 with whole tiles only.

On a small plane the padded width wastes lanes: (wp - ow) / wp, 1/9 of them at 16x16 with pads 1.
There (`shifted_layout`: where it computes at least 1/16 fewer positions) the input is copied
instead into kw planes per channel, copy j the padded plane shifted left by j * dw and ow wide: tap
(i, j) is offset `j * plane + i * dh * ow`, positions run oy * ow + ox with no dropped column, in
the same tiles (16 x 16 = 256 = 10 tiles of 24 and one of 16 with AVX2, 5 of 48 and one of 16 with
AVX-512). The sum runs over the same (channel, tap) order: the values are the same bits as the
padded-width layout's. Measured (1 thread, AVX-512, UNet's 16x16 planes, 32 output channels, tiles
of 2 vectors then): 16 -> 32 channels 22.3 -> 19.5 us, 32 -> 32 40.7 -> 38.5 us. kw copies of the
input is ~kw/(K*M) of the arithmetic, but kw times the footprint: only planes whose copies stay
within `SHIFT_BYTES`.

The shifted layout's tiles were 2 vectors before (whole tiles of 32 positions): 4 x 2 = 8 ymm
accumulators with AVX2, no more than the FMA latency (4 cycles) times the 2 FMA pipes keep busy, so
any stall idles a pipe. Measured on a 2-core AMD EPYC (Zen 3, AVX2, 1 thread, thread CPU time,
medians of 31 interleaved bursts, load ~10): 3 vectors and a short last tile take 0.88x the time
on the resnet's 2x16x16x16 * 16x16x3x3, 0.90x on UNet's 16 -> 32 channels, 0.94x on 32 -> 32, 0.87x
on a 24-channel 28x28 plane (1.02x on an 8x8 plane: 64 = 2 x 24 + 16); the values are bit-equal.

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
>>> d.kws, d.wp, d.oh * d.wp <= d.span, d.plane >= d.span + 2 * d.wp  # shifted: 2 of 7 lanes dropped else
(3, 5, True, True)
>>> win, g = geometry((1, 2, 40, 40), (4, 2, 3, 3), {"pads": [1, 1, 1, 1]})
>>> d = direct_geometry((1, 2, 40, 40), (4, 2, 3, 3), win, g)
>>> d.kws, d.wp, d.oh * d.wp <= d.span, d.plane >= d.span + 2 * d.wp + 2  # 2 of 42: the padded width
(0, 42, True, True)
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..frontend import pool
from ..runtime import cpu
from . import conv_kernels

if TYPE_CHECKING:
    from ..model.cpu import CpuModel

MAX_TAPS = 256  # the C side's tap-offset table
# The span's rounding: whole vectors (16 lanes with AVX-512, 8 otherwise: a multiple of both). The C side
# tiles it by NB = 3 vectors and runs a short last tile (1 or 2 vectors) where it is not whole tiles.
LANES = 16
SHIFT_BYTES = 256 * 1024  # the shifted copies of one image at most (in L2 beside the weights)

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
// f(0..count-1) statically shared among nt threads; on one thread no region (codegen/cpu_region.py: a team's
// closing barrier is a futex call, an `if(nt > 1)` clause included)
template <class F> static inline void pn_direct_for(int nt, L count, const F& f) {
    if (nt > 1) {
        #pragma omp parallel for schedule(static) num_threads(nt)
        for (L e = 0; e < count; e++) f(e);
    } else {
        for (L e = 0; e < count; e++) f(e);
    }
}

// MB output channels (weights w, row stride ck) x NB vectors of positions from x (channel 0 at
// the tile's first position; planes `plane` apart), summed over C channels and K taps (offsets toff)
template <int MB, int NB>
static inline void pn_direct_tile(const float* __restrict x, L plane, const float* __restrict w, L ck, L C,
                                  const L* toff, L K, float* __restrict acc, L span) {
    pn_dv a[MB][NB];
    for (int m = 0; m < MB; m++)
        for (int v = 0; v < NB; v++) a[m][v] = pn_dv{};
    for (L c = 0; c < C; c++) {
        const float* xc = x + c * plane;
        const float* wc = w + c * K;
        for (L t = 0; t < K; t++) {
            const float* s = xc + toff[t];
            pn_dv xv[NB];
            for (int v = 0; v < NB; v++) xv[v] = *(const pn_dvu*)(s + v * PN_DVL);
            for (int m = 0; m < MB; m++) {
                float wm = wc[m * ck + t];
                for (int v = 0; v < NB; v++) a[m][v] += wm * xv[v];
            }
        }
    }
    for (int m = 0; m < MB; m++)
        for (int v = 0; v < NB; v++) *(pn_dvu*)(acc + m * span + v * PN_DVL) = a[m][v];
}
// one (channel block, tile) pair: `nv` (1..PN_DNB) vectors of positions (a span's last tile may be short)
static inline void pn_direct_block(bool full, int nv, const float* x, L plane, const float* w, L ck, L C,
                                   const L* toff, L K, float* acc, L span) {
#define PN_DBLOCK(NB)                                                                                         \
    (full ? pn_direct_tile<PN_DMB, NB>(x, plane, w, ck, C, toff, K, acc, span)                               \
          : pn_direct_tile<1, NB>(x, plane, w, ck, C, toff, K, acc, span))
    if (nv >= PN_DNB)
        PN_DBLOCK(PN_DNB);
    else if (nv == 2)
        PN_DBLOCK(2);
    else
        PN_DBLOCK(1);
#undef PN_DBLOCK
}

// y (n, M, oh, ow) = the stride-1 conv of x (n, C, h, w) with w (M, C, kh, kw), then bias and epilogue.
// xp: C planes of `plane` floats (scratch), acc: M rows of `span` floats (scratch). kws > 0: the shifted
// layout (kws = kw copies of each padded plane, copy j shifted left by j * dw and `wp` = ow wide).
extern "C" void pn_conv_direct(const float* x, const float* w, float* y, float* xp, float* acc, L n, L C, L h,
                               L wd, L M, L kh, L kw, L oh, L ow, L ph, L pw, L dh, L dw, L wp, L plane, L span,
                               L kws, const float* bias, int nops, const int* ops, const float* par,
                               const float* const* res, L pkh, L pkw, L psh, L psw, int nt) {
    L K = kh * kw, ck = C * K, toff[256], cs = kws ? kws * plane : plane;  // cs: one channel's floats in xp
    int nres = 0;  // the epilogue's residual reads (Add steps, op code 0)
    for (int k = 0; k < nops; k++) nres += ops[k] == 0;
    for (L i = 0; i < kh; i++)
        for (L j = 0; j < kw; j++) toff[i * kw + j] = kws ? j * plane + i * dh * wp : i * dh * wp + j * dw;
    const bool padded = kws || ph || pw || plane != h * wd;
    for (L b = 0; b < n; b++) {
        for (L c = 0; c < C; c++) {
            const float* __restrict s = x + (b * C + c) * h * wd;
            if (kws) {  // copy j: q[(ph + iy) * ow + ox] = x[iy][ox + j * dw - pw] where that is inside x, else 0
                for (L j = 0; j < kws; j++) {
                    float* __restrict q = xp + c * cs + j * plane;
                    L lo = std::max<L>(0, pw - j * dw), hi = std::min<L>(ow, wd + pw - j * dw);
                    std::memset(q, 0, plane * sizeof(float));
                    if (hi > lo)
                        for (L iy = 0; iy < h; iy++)
                            std::memcpy(q + (ph + iy) * ow + lo, s + iy * wd + lo + j * dw - pw, (hi - lo) * sizeof(float));
                }
            } else if (padded) {
                float* __restrict q = xp + c * plane;
                std::memset(q, 0, plane * sizeof(float));
                for (L iy = 0; iy < h; iy++) std::memcpy(q + (ph + iy) * wp + pw, s + iy * wd, wd * sizeof(float));
            }
        }
        const float* src = padded ? xp : x + b * C * h * wd;
        // tiles of PN_DNB vectors, the last one short where span (a multiple of PN_DVL) is not whole tiles
        L full = M / PN_DMB, blocks = full + M % PN_DMB, tv = PN_DNB * PN_DVL, tiles = (span + tv - 1) / tv;
        // (channel block, position tile) pairs: each output value is one tile's, whatever the thread count
        pn_direct_for(nt, blocks * tiles, [&](L e) {
            L blk = e % blocks, p = (e / blocks) * tv;
            L m = blk < full ? blk * PN_DMB : full * PN_DMB + (blk - full);
            pn_direct_block(blk < full, (int)std::min<L>(PN_DNB, (span - p) / PN_DVL), src + p, cs, w + m * ck, ck, C,
                            toff, K, acc + m * span + p, span);
        });
        pn_direct_for(nt, M, [&](L o) {
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
                return;
            }
            float* __restrict d = y + (b * M + o) * oh * ow;
            for (L oy = 0; oy < oh; oy++)
                _Pragma("omp simd") for (L ox = 0; ox < ow; ox++) d[oy * ow + ox] = s[oy * wp + ox];
            epi_row(d, oh * ow, bias ? bias + o : nullptr, nops, ops, par, res, (b * M + o) * oh * ow);
        });
    }
}

// The step's table entry (conv_step.py): pointers x, w, y, xp, acc, bias, ops, params, residuals...; integers d
// (the geometry with its shifted copies, the epilogue's op count, a fused MaxPool's kh, kw, sh, sw (kh 0:
// none), the most threads the model found worth their region's entry (`direct_threads`), the call's thread count)
extern "C" void pn_step_direct(void** p, const L* d) {
    pn_conv_direct((const float*)p[0], (const float*)p[1], (float*)p[2], (float*)p[3], (float*)p[4], d[0], d[1], d[2],
                   d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15], d[16],
                   (const float*)p[5], (int)d[17], (const int*)p[6], (const float*)p[7], (const float* const*)(p + 8),
                   d[18], d[19], d[20], d[21], (int)(d[23] < d[22] ? d[23] : d[22]));
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
    kws: int = 0  # the shifted layout's copies per channel (kw), 0: the padded-width layout

    @property
    def ints(self) -> tuple[int, ...]:
        """The C entry's integer table, in its order (before the epilogue's op count)."""
        return (self.n, self.c, self.h, self.w, self.m, self.kh, self.kw, self.oh, self.ow, self.ph, self.pw,
                self.dh, self.dw, self.wp, self.plane, self.span, self.kws)  # fmt: skip

    @property
    def pads_input(self) -> bool:
        """Whether the kernel copies the input into padded planes (else it reads x itself)."""
        return bool(self.kws or self.ph or self.pw or self.plane != self.h * self.w)

    @property
    def scratch_floats(self) -> int:
        """The floats of the padded planes' scratch (1 where x is read in place)."""
        return self.c * self.plane * max(self.kws, 1) if self.pads_input else 1


def direct_threads(dg: DirectGeometry, m: CpuModel) -> int:
    """The most threads the direct kernel of `dg` runs on: the machine's cores unless fewer (halving
    down to 1) are modeled faster by 2 %, as a generated kernel's (schedule/cpu_cost.py
    `best_threads`): its multiply-adds at the BLAS micro-kernel's rate (model/cpu_gemm.py: the direct
    kernel is a register tile of the same kind), split evenly, plus the parallel region's entry
    (`Rates.fork`: with a passive pool, a wake-up of its threads). A call on fewer threads runs on
    those; each output value is one tile's, so the bits do not depend on the count.

    >>> import dataclasses
    >>> from panamera.model.cpu import CpuModel
    >>> m = CpuModel.nominal(cores=2, simd_bytes=32)
    >>> woken = dataclasses.replace(m, rates=dataclasses.replace(m.rates, fork_us=(0.2, 40.0)))
    >>> small = DirectGeometry(1, 16, 16, 16, 16, 3, 3, 16, 16, 1, 1, 1, 1, 18, 324, 288)
    >>> big = dataclasses.replace(small, c=256, m=256, h=56, w=56, oh=56, ow=56, wp=58, plane=3364, span=3248)
    >>> direct_threads(small, woken), direct_threads(big, woken)
    (1, 2)
    """
    flops = 2.0 * dg.n * dg.m * dg.span * dg.c * dg.kh * dg.kw

    def took(t: int) -> float:
        return flops / (m.gemm.rate(4, t) * 1e3 * t) + m.rates.fork(t)

    best = t = max(1, m.cores)
    while t > 1:
        t //= 2
        if took(t) < took(best) * 0.98:
            best = t
    return best


def shifted_layout(c: int, kw: int, span: int, shifted_span: int, shifted_plane: int) -> bool:
    """Whether the shifted layout pays (module docstring): it computes `shifted_span` positions per
    output channel instead of `span`, at least 1/16 fewer, and the kw copies of the c channels'
    planes (`shifted_plane` floats each) fit SHIFT_BYTES.

    >>> shifted_layout(32, 3, 288, 256, 288), shifted_layout(32, 3, 3248, 3136, 3248)  # 16x16 / 56x56, pads 1
    (True, False)
    """
    return shifted_span * 16 <= span * 15 and c * kw * shifted_plane * 4 <= SHIFT_BYTES


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
    sspan = -(-oh * ow // LANES) * LANES
    splane = max(hp * ow, (kh - 1) * dh * ow + sspan)
    span = -(-oh * wp // LANES) * LANES
    if shifted_layout(c, kw, span, sspan, splane):
        return DirectGeometry(n, c, h, w, w_shape[0], kh, kw, oh, ow, ph, pw, dh, dw, ow, splane, sspan, kw)
    plane = max(hp * wp, (kh - 1) * dh * wp + (kw - 1) * dw + span)
    return DirectGeometry(n, c, h, w, w_shape[0], kh, kw, oh, ow, ph, pw, dh, dw, wp, plane, span)


@functools.cache
def lib() -> ctypes.CDLL:
    """The direct kernel's library (built once, cached on disk by runtime/cpu.build)."""
    return cpu.build(SOURCE)
