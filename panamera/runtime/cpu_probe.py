"""The CPU model's measurements (model/cpu.py `Rates`), taken once per machine by a short
STREAM-like probe and kept on disk.

A tiny generated C++ library (built like every CPU kernel: runtime/cpu.py, `-O3 -march=native
-fopenmp`, libmvec) times, each the fastest of 9 runs of about 1 ms (or one repetition):
- a read-only SIMD sum (LANE_VECTORS registers of lanes, the generated row scans' shape) over a buffer and a triad (a = b + 0.5 c) over its thirds, the buffer
  resident in L2 (half of it per thread), in L3 (8 x L2, at least 16 MiB, at most half the L3:
  the sizes of the bench's workloads) and beyond (4 x L3, at most `LARGE` bytes: the model's
  "DRAM" level), at one thread and at `threads`: the read rate is the sum's, the write rate
  the triad's (its 12 bytes per element over its time);
- one thread's SIMD `s += x`, `s += exp(x)`, `s += x / (x + 2)` over 24 KiB (L1);
- every region's team placed as the kernels' are (runtime/cpu_team.py: off the caller's core);
- an empty parallel region, called from Python through ctypes (the median of single calls), under this process's OpenMP wait
  policy (`spin_count`): a pool that spins between regions (libgomp's default) enters one in about
  a microsecond or two; a passive one (OMP_WAIT_POLICY=PASSIVE, as the CPU bench runs every
  library) sleeps between them and pays a futex wake-up each time (tens of microseconds here).

The whole probe takes well under a second; its figures are cached as JSON in the library cache
(runtime/diskcache.py) under a key of the CPU's model and flags, the thread count, the probe's
version, the pool's spin count and what its library is built from (`_key`), so a machine probes
once per setting. A probe taken
while other processes held the cores is kept CONTENDED_TTL_S (10 minutes) only (`judge`): its
all-thread figures are extrapolated from one thread's where the load showed (a slow region entry,
a collapsed all-thread rate, or the load average), and kept as measured, but provisional, where
only the per-core L2 rate failed to scale (the cores may share a physical core; a re-probe tells).

>>> r = rates(2)  # doctest: +SKIP
>>> r.source  # doctest: +SKIP
'probed 2026-11-24 12:40 UTC (DRAM: 64 MiB arrays)'
"""

from __future__ import annotations

import ctypes
import datetime
import enum
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import TypeVar

import numpy as np

from ..model.cpu import LANE_VECTORS, LEVELS, Caches, Rates
from . import diskcache
from .cpu_team import TEAM_SOURCE

Probed = TypeVar("Probed")  # a probe's result: a value with a `source` string

log = logging.getLogger("panamera.cpu")
VERSION = 8  # 8: the read sum keeps LANE_VECTORS registers of lanes (L2 rate); 7: a loaded probe (load average, L2 scaling) is kept briefly (`judge`); 6: spin-keyed entry
LARGE = 64 << 20
TARGET_S = 0.001  # each sample runs for about this long (short: more likely to run unpreempted)
SAMPLES = 9
FORK_S = 0.02  # an empty region's single calls are timed for this long
CONTENDED_FORK_US = 50.0  # an empty parallel region slower than this waited for a busy core
# ... and, where the pool sleeps between regions, a wake-up slower than this (2 threads here: a
# median of 4.7 us at load 13 in one run, 45 us in another): kept CONTENDED_TTL_S only
CONTENDED_WAKE_US = 25.0
CONTENDED_TTL_S = 600.0  # a contended or provisional probe is reused this long, then the machine is probed again
# Other processes' share of the cores, read from the 1-minute load average less the probe's own
# process, above which the all-thread samples are not trusted: half a core (the CPU bench's own
# warning is at a load of 1.5 on this 2-core machine). The 01:47 passive probe cached on
# 2026-11-25 under a load of 10-15 held DRAM 5.5 GB/s and no 2-thread scaling, and passed the
# region-entry test.
LOADED_CORES = 0.5
# The L2 (private to each core) read rate on every thread over one thread's, per thread, below
# which the all-thread figures are provisional: idle probes here read 2.1-2.2x on 2 threads
# (48/107, 50/104 GB/s); the 03:00 passive probe of 2026-11-25 read 51/50 and was cached for good.
SCALING_MIN = 0.75
# libgomp's spin counts (its manual, GOMP_SPINCOUNT; libgomp/env.c): OMP_WAIT_POLICY unset, ACTIVE, PASSIVE
SPIN_DEFAULT, SPIN_ACTIVE, SPIN_PASSIVE = 300_000, 30_000_000_000, 0
SPIN_INFINITE = (1 << 64) - 1
_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}  # either case, as libgomp reads them

# The read rates' sum keeps PN_W = LANE_VECTORS x 16 float lanes (four AVX-512 registers)
# independent, as the generated row scans do (codegen/cpu_lanes.py): one accumulator register is
# bound by the add's latency, not by the cache. g++ -O3 -march=native, 1 thread, thread CPU time,
# medians of 20 rounds, load 8 (2026-11-25): 1 MiB (L2) 54 GB/s with one register, 74 with four;
# 16 MiB (L3) 28.6 and 28.1.
SOURCE = (
    TEAM_SOURCE
    + r"""
#include <omp.h>
extern "C" {
double pn_sum(const float* a, long n, int reps, int nt) {
  pn_team_place(nt);
  double keep = 0;
  for (int r = 0; r < reps; ++r) {
    float s = 0;
#pragma omp parallel num_threads(nt) reduction(+ : s)
    {
      float acc[PN_W] = {0};
#pragma omp for schedule(static)
      for (long b = 0; b < n / PN_W; ++b) {
#pragma omp simd
        for (int l = 0; l < PN_W; ++l) acc[l] += a[b * PN_W + l];
      }
      for (int l = 0; l < PN_W; ++l) s += acc[l];
    }
    for (long i = n / PN_W * PN_W; i < n; ++i) s += a[i];
    keep += s;
  }
  return keep;
}
void pn_triad(float* a, const float* b, const float* c, long n, int reps, int nt) {
  pn_team_place(nt);
  for (int r = 0; r < reps; ++r) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (long i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
  }
}
double pn_add(const float* a, long n, int reps) {
  double keep = 0;
  for (int r = 0; r < reps; ++r) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (long i = 0; i < n; ++i) s += a[i];
    keep += s;
  }
  return keep;
}
double pn_exp(const float* a, long n, int reps) {
  double keep = 0;
  for (int r = 0; r < reps; ++r) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (long i = 0; i < n; ++i) s += expf(a[i]);
    keep += s;
  }
  return keep;
}
double pn_div(const float* a, long n, int reps) {
  double keep = 0;
  for (int r = 0; r < reps; ++r) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (long i = 0; i < n; ++i) s += a[i] / (a[i] + 2.0f);
    keep += s;
  }
  return keep;
}
void pn_empty(int nt) {
  pn_team_place(nt);
  volatile int x = 0;
#pragma omp parallel num_threads(nt)
  { x = 1; }
}
}
""".replace("PN_W", str(LANE_VECTORS * 16))
)


def spin_count(env: Mapping[str, str] | None = None) -> int:
    """How long an idle thread of libgomp's pool spins before it sleeps, read from `env` (default:
    this process's environment) as libgomp reads it when it loads: GOMP_SPINCOUNT (a count, with
    an optional k, M, G or T suffix, or INFINITE), else by OMP_WAIT_POLICY (unset: 300000, ACTIVE:
    30 billion, PASSIVE: 0); a value libgomp rejects counts as unset, as libgomp ignores it.
    0: every parallel region wakes its threads.

    >>> spin_count({}), spin_count({"OMP_WAIT_POLICY": " passive "}), spin_count({"GOMP_SPINCOUNT": "10k"})
    (300000, 0, 10000)
    >>> spin_count({"GOMP_SPINCOUNT": "2M"}), spin_count({"GOMP_SPINCOUNT": "2m"})
    (2000000, 2000000)
    >>> spin_count({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}), spin_count({"OMP_WAIT_POLICY": "fast"})
    (0, 300000)
    """
    env = os.environ if env is None else env
    text = env.get("GOMP_SPINCOUNT", "").strip()
    if text.lower() in ("infinite", "infinity"):
        return SPIN_INFINITE
    digits, mult = (text[:-1], _SUFFIX[text[-1].lower()]) if text and text[-1].lower() in _SUFFIX else (text, 1)
    if digits.strip().isdigit():
        return int(digits) * mult
    policy = env.get("OMP_WAIT_POLICY", "").strip().lower()
    return {"active": SPIN_ACTIVE, "passive": SPIN_PASSIVE}.get(policy, SPIN_DEFAULT)


class Verdict(enum.Enum):
    """How far a probe's figures are trusted (`judge`); the value starts its `source`."""

    SETTLED = "probed"  # cached for good
    CONTENDED = "contended"  # all-thread figures extrapolated from one thread's, kept CONTENDED_TTL_S
    PROVISIONAL = "provisional"  # kept as measured, CONTENDED_TTL_S only


def provisional(source: str) -> bool:
    """Whether a probe's `source` marks it kept CONTENDED_TTL_S only (contended or provisional).

    >>> provisional("probed 2026-11-25 02:21 UTC"), provisional("provisional probe (...)")
    (False, True)
    """
    return source.startswith((Verdict.CONTENDED.value, Verdict.PROVISIONAL.value))


def others_load() -> float:
    """Other processes' share of the cores: the 1-minute load average less the probe's own process
    (0 where the OS gives none)."""
    try:
        return max(0.0, os.getloadavg()[0] - 1.0)
    except OSError:
        return 0.0


def judge(
    threads: int, fork: tuple[float, float], read: list | tuple, write: list | tuple, wakes: bool, load: float
) -> tuple[Verdict, str]:
    """The verdict on a probe's all-thread figures and its reason. CONTENDED where
    1. an empty all-thread region was slow to enter (`slowed`), or
    2. some level streamed slower on every thread than on one (`slowed`), or
    3. other processes held more than LOADED_CORES of the cores (`load`, `others_load`);
    PROVISIONAL where
    4. the L2 read rate, private to each core, grew less than SCALING_MIN x threads over one
       thread's: the cores may share a physical core (hyperthreads: then it is the machine's
       scaling, and every re-probe confirms it) or a burst of load the average missed;
    else SETTLED. One thread has no all-thread figures: SETTLED; no rates (before they are
    sampled): rules 1 and 3 only.

    >>> ok = [(50.0, 105.0), (29.0, 58.0), (29.0, 58.0)]
    >>> judge(2, (0.8, 4.9), ok, ok, True, 0.1)[0], judge(2, (0.8, 4.9), ok, ok, True, 6.0)[0]
    (<Verdict.SETTLED: 'probed'>, <Verdict.CONTENDED: 'contended'>)
    >>> judge(2, (0.8, 4.9), [(51.0, 50.0), *ok[1:]], ok, True, 0.1)[0]
    <Verdict.PROVISIONAL: 'provisional'>
    """
    if threads <= 1:
        return Verdict.SETTLED, ""
    if slowed(fork, wakes=wakes):
        return Verdict.CONTENDED, f"a {threads}-thread region took {fork[1]:.0f} us"
    if slowed(fork, [*read, *write], wakes):
        return Verdict.CONTENDED, f"{threads} threads streamed slower than one"
    if load > LOADED_CORES:
        return Verdict.CONTENDED, f"other processes held {load:.1f} cores (1-minute load average)"
    one, full = read[LEVELS.index("L2")] if read else (0.0, 0.0)
    if full < SCALING_MIN * threads * one:
        return Verdict.PROVISIONAL, f"L2 read {one:.0f} GB/s on one thread, {full:.0f} on {threads}"
    return Verdict.SETTLED, ""


def _timed(call, per_rep: float | None = None) -> float:
    """Seconds per repetition of `call(reps)`: the fastest of SAMPLES samples of about TARGET_S each."""
    t0 = time.perf_counter()
    call(1)
    one = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, int(TARGET_S / one))
    best = math.inf
    for _ in range(SAMPLES):
        t0 = time.perf_counter()
        call(reps)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def _median_call_us(call, seconds: float = FORK_S, least: int = 20) -> float:
    """The median of `call()`'s single calls over about `seconds` (at least `least` calls), in
    microseconds: a region's typical entry. Measured here with load average 13 on 2 cores, a
    passive pool's 2-thread region: median 4.7 us, and a mean of 1 ms of calls up to 4 ms,
    inflated by the few calls whose woken thread waited for a core."""
    call()  # the pool's threads are created by the first region
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < least:
        t0 = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - t0)
    return float(np.median(times)) / 1e3


def measure(threads: int, caches: Caches) -> Rates:
    """Run the probe now (well under a second on an idle machine) and return its rates; when an
    empty all-thread region shows other processes holding the cores, only one thread is timed."""
    from .cpu import SIMD_MATH, build

    lib = build(SIMD_MATH + SOURCE)
    P, L, I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int  # noqa: E741, N806
    lib.pn_sum.argtypes, lib.pn_sum.restype = (P, L, I, I), ctypes.c_double
    lib.pn_triad.argtypes, lib.pn_triad.restype = (P, P, P, L, I, I), None
    for f in (lib.pn_add, lib.pn_exp, lib.pn_div):
        f.argtypes, f.restype = (P, L, I), ctypes.c_double
    lib.pn_empty.argtypes, lib.pn_empty.restype = (I,), None

    fork = tuple(_median_call_us(lambda t=t: lib.pn_empty(t)) for t in (1, threads))
    wakes = spin_count() == 0  # each region wakes the pool: its entry is a wake-up
    load = others_load()
    early = judge(threads, fork, (), (), wakes, load)[0] is Verdict.CONTENDED  # the all-thread samples would wait
    counts = (1,) if early or threads == 1 else (1, threads)
    sizes = {"L2": caches.l2 // 2 * threads, "L3": min(caches.l3 // 2, max(8 * caches.l2, 16 << 20))}
    sizes["DRAM"] = min(4 * caches.l3, LARGE)
    read, write = [], []
    for level in LEVELS:
        buf = np.full(sizes[level] // 4, 1.0, np.float32)  # the sum reads all of it, the triad its thirds
        n, n3 = buf.size, buf.size // 3
        pb, p3 = buf.ctypes.data, tuple(buf[k * n3 :].ctypes.data for k in range(3))
        pair_r, pair_w = [], []
        for t in counts:
            # L2 is per core: t threads read t halves of an L2 (one thread read the whole 2-core buffer
            # before, twice its L2's half: 50-54 GB/s where 1 MiB reads at 74)
            part = t / threads if level == "L2" else 1.0
            m, m3 = int(n * part), int(n3 * part)
            rs = _timed(lambda reps, t=t, pb=pb, n=m: lib.pn_sum(pb, n, reps, t))
            ts = _timed(lambda reps, t=t, p=p3, n=m3: lib.pn_triad(*p, n, reps, t))
            if wakes:  # each repetition is a region that woke the pool: the model charges that apart
                rs, ts = (max(x - fork[t > 1] * 1e-6, x / 2) for x in (rs, ts))
            pair_r.append(4 * m / rs / 1e9)
            pair_w.append(12 * m3 / ts / 1e9)
        read.append((pair_r[0], pair_r[-1]))
        write.append((pair_w[0], pair_w[-1]))
    k = 6144  # 24 KiB: in L1
    x = np.linspace(-1.0, 1.0, k, dtype=np.float32)
    px = x.ctypes.data
    add_ns, exp_ns, div_ns = (
        _timed(lambda reps, f=f: f(px, k, reps)) / k * 1e9 for f in (lib.pn_add, lib.pn_exp, lib.pn_div)
    )
    verdict, why = judge(threads, fork, read, write, wakes, load)  # CONTENDED again where `early`
    note = f" (DRAM: {sizes['DRAM'] >> 20} MiB arrays; OpenMP spin count {spin_count()})"
    if verdict is Verdict.CONTENDED:
        forkn = fork[1] if wakes else 2 * fork[0]
        return _extrapolated(threads, tuple(read), tuple(write), add_ns, exp_ns, div_ns, fork[0], forkn, why, note)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")  # noqa: UP017 (3.10)
    head = f"provisional probe ({why}): {when}" if verdict is Verdict.PROVISIONAL else f"probed {when}"
    return Rates(threads, tuple(read), tuple(write), add_ns, exp_ns, div_ns, fork, f"{head}{note}")


def slowed(fork: tuple[float, float], rates: list | tuple = (), wakes: bool = False) -> bool:
    """Whether other processes held the cores while the probe ran: an empty all-thread region
    slow to enter (where the pool `wakes` each region, slower than CONTENDED_WAKE_US: the wake is
    a region's cost, its wait for a busy core is not), or all threads
    streaming slower than one did (an empty region can still enter quickly between two
    preemptions: a probe here read 0.18 GB/s from L2 on two threads against 54 on one, and was
    cached as this machine's rate).

    >>> slowed((0.7, 1.5), [(54.0, 0.18)]), slowed((0.7, 1.5), [(54.0, 100.0)]), slowed((0.7, 80.0))
    (True, False, True)
    >>> slowed((0.7, 12.0), wakes=True), slowed((0.7, 80.0), wakes=True)
    (False, True)
    """
    if wakes:
        slow_fork = fork[1] > CONTENDED_WAKE_US
    else:
        slow_fork = fork[1] > CONTENDED_FORK_US or fork[1] > 20 * fork[0]
    return slow_fork or any(n < 0.5 * one for one, n in rates)


def _extrapolated(threads, read, write, add_ns, exp_ns, div_ns, fork1, forkn, why: str = "", note: str = "") -> Rates:
    """Rates when the all-thread samples waited for busy cores (other processes hold them): the
    all-thread bandwidth is the one-thread figure times the threads (L2, private per core) or
    times at most 2 (L3, DRAM: shared), and a region's entry `forkn` (measure: twice one thread's,
    or as measured where the pool wakes each region: its wake-up is the cost). Marked `contended`
    (`why`; `note`: the probe's settings): kept CONTENDED_TTL_S only, then a later process on a
    quieter machine probes again."""
    scaled = lambda pairs: tuple((a, a * threads if k == 0 else a * min(threads, 2)) for k, (a, _) in enumerate(pairs))  # noqa: E731
    why = why or f"a {threads}-thread region took {forkn:.0f} us"
    src = f"contended probe ({why}): all-thread figures extrapolated from one thread{note}"
    return Rates(threads, scaled(read), scaled(write), add_ns, exp_ns, div_ns, (fork1, forkn), src)


def _key(threads: int, spin: int | None = None) -> str:
    """The cache key of a probe on `threads` threads: the machine, the threads, the probe's version,
    the OpenMP pool's spin count (default: this process's, `spin_count`), which sets the parallel
    region's entry cost, and what its library is built from (`measure`: the math prelude, whose
    inline expf `exp_ns` times, the probe's SOURCE, the compile flags, libmvec's among them, and the
    compiler's identity).

    >>> _key(2, 0) != _key(2, 300000), _key(2, 0) == _key(2, 0)
    (True, True)
    """
    from .cpu import SIMD_MATH, flags, machine_key
    from .emulator import compiler_identity

    spin = spin_count() if spin is None else spin
    built = SIMD_MATH + SOURCE + " ".join(flags()) + compiler_identity("target='cpu'")
    built = hashlib.sha256(built.encode()).hexdigest()[:8]
    return hashlib.sha256(f"{machine_key()}|{threads}|{VERSION}|spin={spin}|{built}".encode()).hexdigest()[:20]


def _to_json(r: Rates) -> str:
    return json.dumps({k: getattr(r, k) for k in Rates.__dataclass_fields__}, indent=1)


def _from_json(text: str) -> Rates:
    d = json.loads(text)
    pairs = lambda v: tuple(tuple(map(float, p)) for p in v)  # noqa: E731
    return Rates(
        int(d["threads"]),
        pairs(d["read_gbs"]),
        pairs(d["write_gbs"]),
        float(d["add_ns"]),
        float(d["exp_ns"]),
        float(d["div_ns"]),
        tuple(map(float, d["fork_us"])),
        str(d["source"]),
    )


def cached(
    path: Path, load: Callable[[str], Probed], dump: Callable[[Probed], str], probe: Callable[[], Probed], what: str
) -> Probed:
    """A probe's result kept on disk at `path`: `load(text)` of a verified entry, unless it was taken
    contended or is provisional (its `source` says so) more than CONTENDED_TTL_S ago; else `probe()`, stored as
    `dump(result)` where the cache is writable. Shared by this probe and runtime/gemm_probe.py."""
    try:
        if diskcache.verified(path):
            r = load(path.read_text())
            if not provisional(r.source) or time.time() - path.stat().st_mtime < CONTENDED_TTL_S:
                return r
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        log.info("%s cache %s unreadable: probing again", what, path)
    r = probe()
    if provisional(r.source):
        log.info("%s: %s", what, r.source)
    try:
        diskcache.store(path.parent, path.name, dump(r).encode())
    except OSError as e:  # a read-only cache: probe again next process
        log.info("%s not cached (%s)", what, e)
    return r


@cache
def rates(threads: int, caches: Caches | None = None) -> Rates:
    """This machine's rates for `threads` threads: from the disk cache, else probed and stored."""
    caches = caches or Caches.detect()
    path = diskcache.directory() / f"cpu_probe_{_key(threads)}.json"
    return cached(path, _from_json, _to_json, lambda: measure(threads, caches), "CPU probe")
