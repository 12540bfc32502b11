"""The speed of numpy's BLAS on this machine (model/cpu_gemm.py `GemmRates`), measured once by a
short probe and kept on disk beside the STREAM-like probe (runtime/cpu_probe.py).

numpy.matmul, called as the CPU target calls it (into a preallocated output): an 8 x 8 x 8 float32
product for the call's cost, then PROBE_N^3 products in float32 and float64, each the fastest of
SAMPLES samples of about a millisecond, on one BLAS thread and again on every core (~60 ms in all);
on more than one core, the pool's cost per call (`wake_us`, model/cpu_gemm.py `blas_wake_us`) from a
small threaded product's median single calls (~40 ms more).
The micro-kernel's rate is the product's flops over its time less the call and the packing of its
operands (model/cpu_gemm.py, from the bandwidth probe's rates; on t threads a t-th of it), so the
model's two terms add back up to what was measured. A probe taken
while the bandwidth probe saw other processes holding the cores is marked contended and kept 10
minutes only, like that probe.

>>> g = rates(2)  # doctest: +SKIP
>>> g.source  # doctest: +SKIP
'probed 2026-11-25 01:20 UTC (numpy matmul 256^3, 1 and 2 threads)'
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
from functools import cache

import numpy as np

from ..model.cpu import Caches, Rates
from ..model.cpu_gemm import PROBE_N, WAKE_MNK, GemmRates, pack_us
from . import cpu_probe, diskcache
from .blas_threads import blas_threads

log = logging.getLogger("panamera.cpu")
VERSION = 3  # 2: the all-thread rate; 3: the pool's cost per call (`wake_us`)


def measure(r: Rates, caches: Caches, threads: int = 1) -> GemmRates:
    """Time numpy's matmul now, on one BLAS thread and (`threads` > 1) on `threads`, and fit
    `GemmRates` against the bandwidth rates `r`. The all-thread rate is kept between one thread's
    and `threads` times it (a core another process holds can make the product slower on two
    threads than on one: then no gain is modeled)."""
    with blas_threads(1):
        call, one = _measure(r, caches, 1)
    if threads <= 1:
        return _rates(r, call, one, 1, None)
    wake = _wake_us(call, threads)
    with blas_threads(threads):
        _, full = _measure(r, caches, threads, call, wake)
    full = tuple(min(max(f, o), threads * o) for f, o in zip(full, one))
    return _rates(r, call, one, threads, full, wake)


def _wake_us(call: float, threads: int) -> float:
    """The BLAS pool's cost per call on `threads` threads (model/cpu_gemm.py `blas_wake_us`): the
    median single call of a `WAKE_MNK` float32 product on `threads` less the call and a `threads`-th
    of the rest of its one-thread median, at least 0."""
    m, n, k = WAKE_MNK
    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (m, n)))
    med = []
    for t in (1, threads):
        with blas_threads(t):
            med.append(cpu_probe._median_call_us(lambda: np.matmul(a, b, out=c)))
    return max(0.0, med[1] - call - (med[0] - call) / threads)


def _rates(r: Rates, call: float, one, threads: int, full, wake: float | None = None) -> GemmRates:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")  # noqa: UP017 (3.10)
    mark = "contended" if cpu_probe.provisional(r.source) else "probed"
    where = f"numpy matmul {PROBE_N}^3" + (f", 1 and {threads} threads" if threads > 1 else "")
    return GemmRates(tuple(one), call, f"{mark} {when} ({where})", threads, tuple(full) if full else None, wake)


def _measure(
    r: Rates, caches: Caches, threads: int, call: float | None = None, wake: float = 0.0
) -> tuple[float, list[float]]:
    """(the call's us, [float32, float64] GFLOP/s of the micro-kernel on `threads` threads; `wake`:
    the pool's cost per call, taken out with the call and the packing)."""
    from ..model.cpu import CpuModel

    rng = np.random.default_rng(0)
    if call is None:
        small = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(3)]
        call = cpu_probe._timed(lambda reps: [np.matmul(small[0], small[1], out=small[2]) for _ in range(reps)]) * 1e6
    level = CpuModel(1, 64, "probe", caches, r).level(2 * PROBE_N * PROBE_N * 8, threads)
    flops = 2 * PROBE_N**3
    gflops = []
    for dt in (np.float32, np.float64):
        a, b, c = (rng.standard_normal((PROBE_N, PROBE_N)).astype(dt) for _ in range(3))
        t = cpu_probe._timed(lambda reps, a=a, b=b, c=c: [np.matmul(a, b, out=c) for _ in range(reps)]) * 1e6
        rest = t - call - wake - pack_us(2 * a.nbytes, r, level, threads)
        gflops.append(flops / max(rest, 0.25 * t) / 1e3)  # a rest below a quarter: packing over-estimated
    return call, gflops


def _key(threads: int) -> str:
    from .cpu import machine_key

    idle = os.environ.get("OPENBLAS_THREAD_TIMEOUT", "")  # how long the pool spins: `wake_us` depends on it
    return hashlib.sha256(f"gemm|{machine_key()}|{threads}|{np.__version__}|{VERSION}|{idle}".encode()).hexdigest()[:20]


def _to_json(g: GemmRates) -> str:
    return json.dumps({"gflops": list(g.gflops), "call_us": g.call_us, "source": g.source, "threads": g.threads,
                       "gflops_all": list(g.gflops_all) if g.gflops_all else None, "wake_us": g.wake_us})  # fmt: skip


def _from_json(text: str) -> GemmRates:
    d = json.loads(text)
    full = d.get("gflops_all")
    wake = d.get("wake_us")
    return GemmRates((float(d["gflops"][0]), float(d["gflops"][1])), float(d["call_us"]), str(d["source"]),
                     int(d.get("threads", 1)), (float(full[0]), float(full[1])) if full else None,
                     None if wake is None else float(wake))  # fmt: skip


@cache
def rates(threads: int, caches: Caches | None = None) -> GemmRates:
    """numpy's BLAS speed on this machine: from the disk cache, else probed and stored."""
    caches = caches or Caches.detect()
    path = diskcache.directory() / f"gemm_probe_{_key(threads)}.json"
    return cpu_probe.cached(
        path, _from_json, _to_json, lambda: measure(cpu_probe.rates(threads, caches), caches, threads), "gemm probe"
    )
