"""Which kernel runs a contraction the CPU target can call from C (schedule/cpu_gemm.py's `Gemm`):
numpy's BLAS (model/cpu_gemm.py `gemm_time`) or the register-tiled kernel (codegen/cpu_tile.py),
whichever the model finds faster (`gemm_choice`): a decision made once, carried by the kernel.
Every figure is *modeled*.

The tile kernel's time on `t` threads (the (N panel, M tile) tasks spread over them):

    fork + pack + both(memory, compute) + merge

(both: the longer plus the share of the shorter the core does not hide, the probe's `overlap`: the
rule of every generated kernel, model/cpu.py `Rates.both`; it was max(), which priced A's streams
from L3 as wholly hidden under the FMAs)

- compute: 2 M N K flops at TILE_SHARE of the BLAS micro-kernel's probed rate on min(t, tasks)
  threads (the same FMA units fed from registers: model/cpu_gemm.py `GemmRates.rate`), scaled by
  the static schedule's waves;
- memory: A read once per N panel (it is not packed), B once (a KC x NR block stays in L1 while
  the panel's M tiles read it), C read and written once per K block, at the rate of the level
  the operands live in (`CpuModel.gbs`);
- pack: where B is transposed (`tb`) or N is not whole panels, B copied into panels (`pack_us`),
  each thread copying the panels its own tasks read (`pack_share`: no barrier before the tiles);
- fork: one parallel region's entry (no Python step: the call is the program's C);
- merge (a K split): the chunks' partials written, then read and added, after a barrier priced as
  a generated kernel's (half a region's entry).

So a small or skinny product (no Python step, no packing of A, nothing to amortize) goes to the
tile, a large one (C re-read per K block, A per panel) to the BLAS.

>>> import dataclasses
>>> from panamera.model.cpu import CpuModel
>>> from panamera.model.cpu_gemm import GemmRates
>>> from panamera.schedule.cpu_gemm import Gemm
>>> m = CpuModel.nominal(cores=1, simd_bytes=64)
>>> m = dataclasses.replace(m, gemm=GemmRates((165.0, 72.0), 0.9))  # this machine's probe
>>> small = Gemm(128, 32, 1024, False, 1024, True, 1024, 32, ((0, 0, 0, 0),))
>>> big = Gemm(1024, 1024, 1024, False, 1024, False, 1024, 1024, ((0, 0, 0, 0),))
>>> gemm_choice(small, 4, m, 1)[0], gemm_choice(big, 4, m, 1)[0]
(<GemmKernel.TILE: 'tile'>, <GemmKernel.BLAS: 'blas'>)
"""

from __future__ import annotations

import dataclasses
import math
from enum import Enum
from typing import TYPE_CHECKING

from .cpu_gemm import gemm_time

if TYPE_CHECKING:
    from ..schedule.cpu_gemm import Gemm
    from .cpu import CpuModel, KernelTime

# The register tile codegen/cpu_tile.py prints (`pn_tile_gemm`), here because the model sizes and
# prices it (model is below schedule and codegen).
# A B block (KC K steps x NR columns) is KC_BYTES, half of L1: KC = 128 for AVX-512's 32 float32 columns,
# 256 for AVX2's 16 (AMD EPYC, 128x32x1024 x @ w.T in C, thread CPU time, 2 x 40 interleaved rounds at
# load 15, 2026-11-25 14:01 UTC: KC 128 / 256 / 512 medians 114-118 / 111-113 / 110-113 us, min 109 / 105 /
# 103; the M-major task order instead of panel-major changed nothing).
KC_BYTES = 16384


@dataclasses.dataclass(frozen=True)
class TileShape:
    """The register tile: `mr` rows x `nv` vectors of `lanes` columns; K cut into `ksplit` chunks
    (whole KC blocks), each chunk's partial product a task of its own, the partials then added in
    chunk order (the multi-block binding of a reduction: where the C tiles cannot occupy the threads).

    >>> TileShape(4, 2, 16).nr
    32
    """

    mr: int
    nv: int
    lanes: int
    ksplit: int = 1

    @property
    def nr(self) -> int:
        return self.nv * self.lanes

    def kc(self, itemsize: int) -> int:
        """K steps per block: a KC x NR block of B is KC_BYTES (the kernel's `KC`).

        >>> TileShape(8, 2, 16).kc(4), TileShape(6, 2, 8).kc(4), TileShape(6, 2, 4).kc(8)
        (128, 256, 256)
        """
        return max(1, KC_BYTES // (self.nr * itemsize))


# The tile kernel's FMA rate as a share of the BLAS micro-kernel's probed rate (gemm_probe: 256^3),
# the mean of two machines' fits, 128x32x1024 float32 with B row-major (no pack), one thread:
# - a 2-core Xeon (AVX-512, the 8x32 tile): 62.8 us a call (median of 30 interleaved rounds, load 3.5,
#   2026-11-25), the probe's rate 165 GFLOP/s: 0.81;
# - a 2-core AMD EPYC (AVX2, the 6x16 tile): 99.6 us in C (best of 200 x 10 calls, load 9, 2026-11-25),
#   the probe's 89 GFLOP/s: 0.95.
TILE_SHARE = 0.88
# A transposed B's pack, per element: scalar moves in blocks of a cache line of K (the same product with
# B transposed, x @ w.T, took 17 us more: 32768 elements), or (float32, whole panels) blocks transposed
# in registers: 16 x 16 with AVX-512 (was gathers: 8 us more, 2026-11-25; the transposes measured 3-6 us
# more in C, min of 40 x 20 calls at load 8: not refit, kept as an upper bound), 8 x 8 with AVX2 (AMD
# EPYC, 128x32x1024 in C, best of 200 x 10 calls at load 9, 2026-11-25: 24 us more than B row-major
# with the scalar copy, 8.6 with the transposes); float64 4 x 4 (AVX2, also AVX-512's panels: AMD EPYC,
# 13x16x301 in C, min of 5 x 10 calls at load 13, 2026-11-25: 1.0 us more than B row-major, 5.9 with
# the scalar copy: 0.2 and 1.2 ns an element).
TRANSPOSE_NS, GATHER_NS = 0.5, 0.25


class GemmKernel(Enum):
    """What runs a `Gemm`: the BLAS numpy links, or the register-tiled kernel."""

    BLAS = "blas"
    TILE = "tile"


def tile_shape(simd_bytes: int, itemsize: int) -> TileShape:
    """The register tile for vectors of `simd_bytes`: two vectors of columns, and as many rows as
    the register file holds beside the two B vectors and the broadcast (32 registers with
    AVX-512, else 16): 8 rows, else 6.

    >>> tile_shape(64, 4), tile_shape(32, 8)
    (TileShape(mr=8, nv=2, lanes=16, ksplit=1), TileShape(mr=6, nv=2, lanes=4, ksplit=1))
    """
    return TileShape(8 if simd_bytes >= 64 else 6, 2, max(1, simd_bytes // itemsize))


def tile_time(gm: Gemm, itemsize: int, m: CpuModel, threads: int = 1, ksplit: int | None = None) -> KernelTime:
    """The tile kernel's modeled time for `gm` on `threads` threads (module docstring), K in
    `ksplit` chunks (default: the best, `tile_plan`)."""
    return tile_plan(gm, itemsize, m, threads, ksplit)[1]


def tile_plan(
    gm: Gemm, itemsize: int, m: CpuModel, threads: int = 1, ksplit: int | None = None
) -> tuple[TileShape, KernelTime]:
    """The tile for `gm` and its modeled time on `threads` threads. K is split (`TileShape.ksplit`:
    1, 2, 4, ... chunks of whole KC blocks) only where the C tiles are fewer than the threads, and
    only where the model finds it faster: the chunks' partials (ksplit x M x N) are written, then
    read and added in chunk order, at the rates of the level they live in (the merge).

    >>> import dataclasses
    >>> from panamera.model.cpu import CpuModel
    >>> from panamera.model.cpu_gemm import GemmRates
    >>> from panamera.schedule.cpu_gemm import Gemm
    >>> m = CpuModel.nominal(cores=2, simd_bytes=64)  # a BLAS probe that scales to 2 threads:
    >>> m = dataclasses.replace(m, gemm=GemmRates((165.0, 72.0), 0.9, threads=2, gflops_all=(300.0, 130.0)))
    >>> g = Gemm(8, 32, 8192, False, 8192, False, 32, 32, ((0, 0, 0, 0),))
    >>> tile_plan(g, 4, m, 1)[0].ksplit, tile_plan(g, 4, m, 2)[0].ksplit
    (1, 2)
    """
    from .cpu import KernelTime

    base = tile_shape(m.simd_bytes, itemsize)
    mt, panels = math.ceil(gm.m / base.mr), math.ceil(gm.n / base.nr)
    tasks = max(1, mt * panels)
    splits = [1]
    kc = base.kc(itemsize)
    while ksplit is None and tasks * splits[-1] < threads and gm.k >= 2 * splits[-1] * kc:
        splits.append(2 * splits[-1])
    calls = len(gm.calls)
    flops = 2 * gm.m * gm.n * gm.k * calls
    a, b, c = (x * itemsize for x in (gm.m * gm.k, gm.k * gm.n, gm.m * gm.n))
    blocks = max(1, math.ceil(gm.k / kc))
    best: tuple[TileShape, KernelTime] | None = None
    for ks in splits if ksplit is None else [ksplit]:
        used = max(1, min(threads, tasks * ks))
        waves = math.ceil(tasks * ks / used) * used / (tasks * ks)
        comp = flops / (m.gemm.rate(itemsize, used) * TILE_SHARE) / 1e3 * waves
        moved = calls * (a * panels + b + 2 * c * blocks)
        level = m.level(a + b + c * ks, used)
        mem = moved / m.gbs(a + b + c * ks, used) / 1e3
        pack = calls * pack_us(gm, itemsize, base, m, level) * pack_share(tasks * ks, used, mt, panels * ks)
        merge = 0.0
        if ks > 1:  # partials written, then read and added, each C element by one thread
            merge = calls * c * ks * (1 / m.gbs(c * ks, used, write=True) + 1 / m.gbs(c * ks, used)) / 1e3
            merge += m.rates.fork(used) / 2  # the barrier before it, priced as a generated kernel's (model/cpu.py)
        fork = m.rates.fork(used)
        t = KernelTime(fork + pack + m.rates.both(mem, comp) + merge, mem + pack, comp, fork, merge, level, used)
        if best is None or t.total_us < best[1].total_us:
            best = (dataclasses.replace(base, ksplit=ks), t)
    assert best is not None
    return best


def pack_share(total: int, threads: int, mt: int, pieces: int) -> float:
    """The largest share of B's pack one thread copies: each thread packs the pieces (K chunk x N
    panel, `task // mt` in the kernel's task order) its own contiguous share of the `total` tasks
    reads (codegen/cpu_tile.py: no barrier between the pack and the tiles), the first `total %
    threads` threads one task more, as a static schedule's.

    >>> pack_share(44, 1, 22, 2), pack_share(44, 2, 22, 2), pack_share(22, 2, 22, 1)
    (1.0, 0.5, 1.0)
    """
    threads = max(1, min(threads, total))
    per, extra = divmod(total, threads)
    most = 0
    for me in range(threads):
        lo = me * per + min(me, extra)
        hi = lo + per + (1 if me < extra else 0)
        most = max(most, (hi - 1) // mt - lo // mt + 1)
    return most / max(1, pieces)


def pack_us(gm: Gemm, itemsize: int, ts: TileShape, m: CpuModel, level: str) -> float:
    """One thread's copy of B into panels: element by element at TRANSPOSE_NS where B is transposed
    (`tb`; GATHER_NS where the kernel transposes blocks in registers: AVX2 or AVX-512, float32 or
    float64, whole panels), else read and written at `level`'s rates where N is not whole panels, else none.

    >>> from panamera.schedule.cpu_gemm import Gemm
    >>> pack_us(Gemm(8, 32, 1024, False, 1024, True, 1024, 32, ()), 4, TileShape(8, 2, 16), None, "L2")
    8.192
    """
    if gm.tb:
        gathered = ts.lanes * itemsize >= 32 and itemsize in (4, 8) and gm.n % ts.nr == 0
        return gm.k * math.ceil(gm.n / ts.nr) * ts.nr * (GATHER_NS if gathered else TRANSPOSE_NS) / 1e3
    if gm.n % ts.nr == 0:
        return 0.0
    b = gm.k * gm.n * itemsize
    return b * (1 / m.rates.bandwidth(level, 1) + 1 / m.rates.bandwidth(level, 1, write=True)) / 1e3


def gemm_choice(gm: Gemm, itemsize: int, m: CpuModel, threads: int = 1) -> tuple[GemmKernel, KernelTime]:
    """The faster of the BLAS and the tile kernel for a call of `gm` on `threads` threads, and its time:
    the tile on the count it runs on (`tile_threads`: `threads` or fewer, where a parallel region's
    entry outweighs a thread; schedule/cpu_contraction.py keeps the plan's tile there)."""
    mnk = gm.m * gm.n * gm.k
    blas = gemm_time(2 * mnk * len(gm.calls), (gm.m * gm.k + gm.k * gm.n) * itemsize, itemsize, m, threads, mnk)
    tile = tile_plan(gm, itemsize, m, tile_threads(gm, itemsize, m, threads))[1]
    return (GemmKernel.TILE, tile) if tile.total_us < blas.total_us else (GemmKernel.BLAS, blas)


def tile_threads(gm: Gemm, itemsize: int, m: CpuModel, threads: int) -> int:
    """The threads the tile kernel runs `gm` on: `threads` unless fewer (halving down to 1) are modeled
    faster by 2 %, as a generated kernel's (schedule/cpu_cost.py `best_threads`): where the parallel
    region's entry (a passive pool's wake-up) outweighs what the second thread saves. The one rule
    for both the choice over the BLAS (`gemm_choice`) and the plan's threads (schedule/cpu_contraction.py).

    >>> import dataclasses
    >>> from panamera.model.cpu import CpuModel
    >>> from panamera.schedule.cpu_gemm import Gemm
    >>> m = CpuModel.nominal(cores=2, simd_bytes=64)
    >>> woken = dataclasses.replace(m, rates=dataclasses.replace(m.rates, fork_us=(0.2, 400.0)))
    >>> g = Gemm(128, 32, 1024, False, 1024, True, 1024, 32, ((0, 0, 0, 0),))
    >>> tile_threads(g, 4, m, 2), tile_threads(g, 4, woken, 2)
    (2, 1)
    """
    best, best_us, t = threads, math.inf, max(1, threads)
    while True:
        us = tile_plan(gm, itemsize, m, t)[1].total_us
        if us < best_us * 0.98:
            best, best_us = t, us
        if t == 1:
            return best
        t = max(1, t // 2)


def gemm_tile(gm: Gemm | None, itemsize: int, m: CpuModel, threads: int = 1) -> TileShape | None:
    """The tile `gm` runs as where the model picks the tile kernel (`gemm_choice`), else None (the
    BLAS, or no `Gemm`: numpy runs the contraction)."""
    if gm is None or gemm_choice(gm, itemsize, m, threads)[0] is GemmKernel.BLAS:
        return None
    return tile_plan(gm, itemsize, m, threads)[0]
