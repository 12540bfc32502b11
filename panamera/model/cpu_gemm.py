"""The BLAS numpy uses (schedule/cpu_blas.py's calls) as the CPU model sees it: a peer library whose
speed is measured on the machine, not a generated kernel's. Every figure is *modeled*.

An optimized gemm (OpenBLAS, MKL, BLIS) follows Goto's algorithm (K. Goto and R. van de Geijn,
"Anatomy of high-performance matrix multiplication", ACM TOMS 34(3), 2008): it copies ("packs")
each operand once into contiguous panels, then a register-tiled micro-kernel runs over them near
the machine's SIMD FMA rate. A call therefore costs

    HOST_STEP_US + call_us + packed bytes x (one read + one write at the level the operands live in) + flops / gflops

with the read and write rates of the STREAM-like probe (model/cpu.py `Rates`, one thread) and
`gflops`, the micro-kernel's rate, from a short probe of numpy's own matmul
(runtime/gemm_probe.py, cached per machine): a 256^3 product on one BLAS thread, less its call and
packing.

Threads. A call runs the BLAS on the call's `threads` (runtime/blas_threads.py, since 0.4.0), and
OpenBLAS (numpy's) decides per call whether to use them: a product of M N K <= 65536 x
GEMM_MULTITHREAD_THRESHOLD (4 by default) runs on one thread, a larger one on every thread it has
(OpenBLAS interface/gemm.c, `SMP_THRESHOLD_MIN`; `blas_threads_used`). Those threads split the
product (driver/level3/level3_thread.c: each packs and multiplies its share), so on `t` threads the
packing takes 1/t of one thread's time and the flops run at the probe's rate on `t` threads,
`GemmRates.gflops_all`: the same 256^3 product timed on every thread, fitted the same way
(interpolated linearly between one and all threads, as the bandwidths are). Measured here
(2026-11-25, min of 40 x 5 calls, loaded): 128x32x1024 80 us on one thread, 51 on two; 256^3 223
and 151; 64^3 (M N K at the threshold) 5.1 and 4.3 (one thread either way). A gemm called from C
(runtime/cpu_gemm.py) pays no Python step: left to refit on an idle machine.

The pool's cost per call (`blas_wake_us`). On more than one thread a call also pays for its pool:
waking the threads and their hand-offs, a fixed cost that a 256^3 product amortizes and a small one
does not. On an AMD EPYC VM (AVX2, 2 vCPUs, idle bench 2026-11-25) 128x32x1024 took 174 us in numpy
on one thread and 224 on two, where flops and packing alone model 97 on two: the cost is the
machine's, not the shape's. The probe (runtime/gemm_probe.py) measures it on the `WAKE_MNK` product as
the median single call on every thread less a `threads`-th of its one-thread median, and fits the
all-thread rate with it taken out; without that figure the OpenMP probe's region entry stands in.

>>> from panamera.model.cpu import CpuModel
>>> m = CpuModel.nominal(cores=2, simd_bytes=64)
>>> t = gemm_time(2 * 128 * 32 * 1024, (128 + 32) * 1024 * 4, 4, m)
>>> t.compute_us > t.memory_us > 0, t.level
(True, 'L2')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cpu import CpuModel, KernelTime, Rates

PROBE_N = 256  # the probe's product: N x N times N x N, float32 and float64
# The Python step around a BLAS call in a CPU program beyond the program's own call (model/cpu.py
# CALL_US; runtime/cpu_call.py: the program's C segments around it, the operands' views,
# `BlasCall.run`), fitted on this project's machine: a program of one `x @ w.T` took 8.5-9.9 us
# more than `np.matmul(x, w.T, out=o)` itself at 128x32x64, 128x32x1024 and 256^3 float32 (one
# BLAS thread, 30 interleaved rounds, 2026-11-24), then 5.0 beside a CALL_US of 4.0. CALL_US is
# now 2.4 (it no longer counts the ctypes call that a generated kernel's region entry holds; a
# BLAS program at one thread pays no region entry): 9.0 - 2.4 = 6.6 keeps that total. Refit when
# runtime/cpu_call.py changes.
HOST_STEP_US = 6.6


@dataclass(frozen=True)
class GemmRates:
    """numpy's matmul on this machine: `gflops` (float32, float64) of its micro-kernel, `call_us`
    of a tiny product (the call through numpy and the BLAS's dispatch)."""

    gflops: tuple[float, float]
    call_us: float
    source: str = "nominal"
    threads: int = 1  # the threads `gflops_all` was measured on (1: no multi-thread figure)
    gflops_all: tuple[float, float] | None = None
    wake_us: float | None = None  # a call's cost of running on the BLAS's pool (`WAKE_MNK`), where probed

    def rate(self, itemsize: int, threads: int = 1) -> float:
        """GFLOP/s of the micro-kernel for operands of `itemsize` bytes (4: sgemm, 8: dgemm) on
        `threads` threads: linear between the one-thread and the all-thread probe, flat beyond
        (one thread's rate where no all-thread figure was probed).

        >>> g = GemmRates((100.0, 50.0), 1.0, threads=4, gflops_all=(250.0, 125.0))
        >>> g.rate(4), g.rate(4, 1), g.rate(4, 2), g.rate(8, 8)
        (100.0, 100.0, 150.0, 125.0)
        """
        k = 0 if itemsize <= 4 else 1
        one = self.gflops[k]
        if self.gflops_all is None or self.threads <= 1 or threads <= 1:
            return one
        return one + (self.gflops_all[k] - one) * (min(threads, self.threads) - 1) / (self.threads - 1)


# Nominal (no probe): a 2020s AVX2 core, 2 FMA units x 8 float32 lanes x 2 flops at ~3 GHz, about
# two thirds of it reached; float64 half.
NOMINAL_GEMM = GemmRates((64.0, 32.0), 1.0)
# OpenBLAS interface/gemm.c: SMP_THRESHOLD_MIN (65536, real types) x GEMM_MULTITHREAD_THRESHOLD (4,
# its build default): a product of at most this many M N K runs on one thread.
BLAS_SERIAL_MNK = 65536 * 4


# The product the probe times on one and on every BLAS thread for `GemmRates.wake_us` (runtime/gemm_probe.py):
# M N K = 128 x 32 x 128, twice BLAS_SERIAL_MNK (threaded), its flops (~1 MFLOP) a few us of one core, so the
# difference is the pool's cost per call: waking its threads and their hand-offs of packed panels
# (OpenBLAS driver/level3/level3_thread.c: each thread waits on flags for the others' shares of B). On a
# VM whose second vCPU another process holds, a thread waits for its core at every hand-off.
WAKE_MNK = (128, 32, 128)


def blas_threads_used(mnk: int, threads: int) -> int:
    """The threads numpy's OpenBLAS runs an M x N x K product on, given `threads`: one up to
    BLAS_SERIAL_MNK, else all of them.

    >>> blas_threads_used(64 * 64 * 64, 2), blas_threads_used(128 * 32 * 1024, 2), blas_threads_used(1 << 30, 1)
    (1, 2, 1)
    """
    return 1 if mnk <= BLAS_SERIAL_MNK else max(1, threads)


def pack_us(packed_bytes: int, r: Rates, level: str, threads: int = 1) -> float:
    """Packing `packed_bytes` of operands once: each byte read and written at one thread's rate
    of `level` (the probe's sum and triad), the work split over `threads` (each packs its share)."""
    one = packed_bytes * (1 / r.bandwidth(level, 1) + 1 / r.bandwidth(level, 1, write=True)) / 1e3
    return one / max(1, threads)


def gemm_time(flops: int, packed_bytes: int, itemsize: int, m: CpuModel, threads: int = 1,
              mnk: int | None = None) -> KernelTime:  # fmt: skip
    """A BLAS call of `flops` (2 M N K; `mnk`: the M N K of each product where the call makes
    several, default flops / 2) whose operands take `packed_bytes`, on `threads` BLAS threads, as
    a `KernelTime`: memory = its packing, compute = its flops, fork = the call and the Python step
    around it, and on more than one thread its pool's wake-up (the probe's parallel-region entry,
    as a generated or tile kernel pays it: a passive pool either way); threads as OpenBLAS uses
    them (`blas_threads_used`)."""
    from .cpu import KernelTime

    used = blas_threads_used(flops // 2 if mnk is None else mnk, threads)
    level = m.level(packed_bytes, used)
    mem = pack_us(packed_bytes, m.rates, level, used)
    comp = flops / m.gemm.rate(itemsize, used) / 1e3
    fork = HOST_STEP_US + m.gemm.call_us + (blas_wake_us(m, used) if used > 1 else 0.0)  # its pool woken
    return KernelTime(fork + mem + comp, mem, comp, fork, 0.0, level, used)


def blas_wake_us(m: CpuModel, threads: int) -> float:
    """A BLAS call's cost of running on `threads` (> 1) of its pool: the probed `wake_us` where the
    probe measured one, else the OpenMP probe's parallel-region entry (a passive pool's wake-up).

    >>> import dataclasses
    >>> from panamera.model.cpu import CpuModel
    >>> m = CpuModel.nominal(cores=2, simd_bytes=32)
    >>> probed = GemmRates((100.0, 50.0), 1.0, threads=2, gflops_all=(160.0, 80.0), wake_us=40.0)
    >>> blas_wake_us(m, 2) == m.rates.fork(2), blas_wake_us(dataclasses.replace(m, gemm=probed), 2)
    (True, 40.0)
    """
    return m.gemm.wake_us if m.gemm.wake_us is not None else m.rates.fork(threads)
