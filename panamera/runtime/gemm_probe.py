"""The speed of numpy's BLAS on this machine (model/cpu_gemm.py `GemmRates`), measured once by a
short probe and kept on disk beside the STREAM-like probe (runtime/cpu_probe.py).

numpy.matmul, called as the CPU target calls it (into a preallocated output): an 8 x 8 x 8 float32
product for the call's cost, then PROBE_N^3 products in float32 and float64, each the fastest of
SAMPLES samples of about a millisecond (~30 ms in all). The micro-kernel's rate is the product's
flops over its time less the call and the packing of its operands (model/cpu_gemm.py, from the
bandwidth probe's rates), so the model's two terms add back up to what was measured. A probe taken
while the bandwidth probe saw other processes holding the cores is marked contended and kept 10
minutes only, like that probe.

>>> g = rates(2)  # doctest: +SKIP
>>> g.source  # doctest: +SKIP
'probed 2026-11-24 23:10 UTC (numpy matmul 256^3)'
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from functools import cache

import numpy as np

from ..model.cpu import Caches, Rates
from ..model.cpu_gemm import PROBE_N, GemmRates, pack_us
from . import cpu_probe, diskcache
from .blas_threads import blas_threads

log = logging.getLogger("panamera.cpu")
VERSION = 1


def measure(r: Rates, caches: Caches) -> GemmRates:
    """Time numpy's matmul now (on one BLAS thread) and fit `GemmRates` against the bandwidth rates `r`."""
    with blas_threads(1):  # one thread's rate: what a loaded machine lets the probe measure
        return _measure(r, caches)


def _measure(r: Rates, caches: Caches) -> GemmRates:
    from ..model.cpu import CpuModel

    rng = np.random.default_rng(0)
    small = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(3)]
    call = cpu_probe._timed(lambda reps: [np.matmul(small[0], small[1], out=small[2]) for _ in range(reps)]) * 1e6
    level = CpuModel(1, 64, "probe", caches, r).level(2 * PROBE_N * PROBE_N * 8, 1)
    flops = 2 * PROBE_N**3
    gflops = []
    for dt in (np.float32, np.float64):
        a, b, c = (rng.standard_normal((PROBE_N, PROBE_N)).astype(dt) for _ in range(3))
        t = cpu_probe._timed(lambda reps, a=a, b=b, c=c: [np.matmul(a, b, out=c) for _ in range(reps)]) * 1e6
        rest = t - call - pack_us(2 * a.nbytes, r, level)
        gflops.append(flops / max(rest, 0.25 * t) / 1e3)  # a rest below a quarter: packing over-estimated
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")  # noqa: UP017 (3.10)
    mark = "contended" if r.source.startswith("contended") else "probed"
    return GemmRates((gflops[0], gflops[1]), call, f"{mark} {when} (numpy matmul {PROBE_N}^3)")


def _key(threads: int) -> str:
    from .cpu import machine_key

    return hashlib.sha256(f"gemm|{machine_key()}|{threads}|{np.__version__}|{VERSION}".encode()).hexdigest()[:20]


def _to_json(g: GemmRates) -> str:
    return json.dumps({"gflops": list(g.gflops), "call_us": g.call_us, "source": g.source})


def _from_json(text: str) -> GemmRates:
    d = json.loads(text)
    return GemmRates((float(d["gflops"][0]), float(d["gflops"][1])), float(d["call_us"]), str(d["source"]))


@cache
def rates(threads: int, caches: Caches | None = None) -> GemmRates:
    """numpy's BLAS speed on this machine: from the disk cache, else probed and stored."""
    caches = caches or Caches.detect()
    path = diskcache.directory() / f"gemm_probe_{_key(threads)}.json"
    return cpu_probe.cached(
        path, _from_json, _to_json, lambda: measure(cpu_probe.rates(threads, caches), caches), "gemm probe"
    )
