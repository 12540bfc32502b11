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
packing. A call runs the BLAS on the call's `threads` (runtime/blas_threads.py, since 0.4.0), but
the model charges one thread's rate whatever `threads` is: bench/cpu (2026-11-24, before the
count was set) measured table1 128x32x1024's call at 80 us (p25) with 1 and with 2 threads, and
a product this small does not split well. A large product on every core is over-predicted (up to
the cores' count), and a gemm called from C (runtime/cpu_gemm.py) pays no Python step: both
left to refit on an idle machine.

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
# CALL_US, 4.0; runtime/cpu_call.py: the program's C segments around it, the operands' views,
# `BlasCall.run`), fitted on this project's machine: a program of one `x @ w.T` took 8.5-9.9 us
# more than `np.matmul(x, w.T, out=o)` itself at 128x32x64, 128x32x1024 and 256^3 float32 (one
# BLAS thread, 30 interleaved rounds, 2026-11-24). Refit when runtime/cpu_call.py changes.
HOST_STEP_US = 5.0


@dataclass(frozen=True)
class GemmRates:
    """numpy's matmul on this machine: `gflops` (float32, float64) of its micro-kernel, `call_us`
    of a tiny product (the call through numpy and the BLAS's dispatch)."""

    gflops: tuple[float, float]
    call_us: float
    source: str = "nominal"

    def rate(self, itemsize: int) -> float:
        """GFLOP/s of the micro-kernel for operands of `itemsize` bytes (4: sgemm, 8: dgemm)."""
        return self.gflops[0] if itemsize <= 4 else self.gflops[1]


# Nominal (no probe): a 2020s AVX2 core, 2 FMA units x 8 float32 lanes x 2 flops at ~3 GHz, about
# two thirds of it reached; float64 half.
NOMINAL_GEMM = GemmRates((64.0, 32.0), 1.0)


def pack_us(packed_bytes: int, r: Rates, level: str) -> float:
    """Packing `packed_bytes` of operands once: each byte read and written at one thread's rate
    of `level` (the probe's sum and triad)."""
    return packed_bytes * (1 / r.bandwidth(level, 1) + 1 / r.bandwidth(level, 1, write=True)) / 1e3


def gemm_time(flops: int, packed_bytes: int, itemsize: int, m: CpuModel) -> KernelTime:
    """A BLAS call of `flops` (2 M N K) whose operands take `packed_bytes`, as a `KernelTime`:
    memory = its packing, compute = its flops, fork = the call and the Python step around it (numpy's
    BLAS picks its own threads; the probe's rate is one thread's)."""
    from .cpu import KernelTime

    level = m.level(packed_bytes, 1)
    mem = pack_us(packed_bytes, m.rates, level)
    comp = flops / m.gemm.rate(itemsize) / 1e3
    fork = HOST_STEP_US + m.gemm.call_us
    return KernelTime(fork + mem + comp, mem, comp, fork, 0.0, level, 1)
