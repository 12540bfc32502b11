"""The CPU model's measurements (model/cpu.py `Rates`), taken once per machine by a short
STREAM-like probe and kept on disk.

A tiny generated C++ library (runtime/cpu_probe_source.py, built like every CPU kernel:
runtime/cpu.py, `-O3 -march=native -fopenmp`, libmvec) times, each figure the median of
short trials that held their cores, one and all threads interleaved, the streams twice
(runtime/cpu_probe_trials.py: why; how far a figure's slower trials were from it, and the least
share of whole trials, are written in the figures' `source`):
- a read-only SIMD sum (LANE_VECTORS registers of lanes, the generated row scans' shape) over a
  buffer and a triad (a = b + 0.5 c) over its thirds, the buffer resident in L2 (half of it per
  thread), in L3 and beyond (4 x L3, at most `LARGE` bytes: the model's "DRAM" level), at one
  thread and at `threads`: the read rate is the sum's, the write rate the triad's (its 12 bytes
  per element over its time). Each trial is one parallel region whose threads first wait for one
  another, then each times its share by the wall clock and its own CPU time: the region's entry
  (a passive pool's wake-up, 45-54 us on the AMD EPYC guests of 2026-11-25 when the woken thread
  takes the other vCPU) stays out of the rates and is carried as its own term (`fork_us`,
  below), and a trial where a thread lost its core is dropped. (Before VERSION 9 each repetition
  was a region and a passive probe subtracted the median entry: L2 read 137 or 60 GB/s in two
  probes of one idle machine.)
- the L3's extent (`l3_extent`): one thread's read rate over doubling buffers from 4 x L2; the
  L3 figures are taken over half the largest that still reads at the L3's rate;
- the COLUMN form's read rate over a plain sum's (`column_ratio`: rows summed into the kernels'
  16 KiB block of accumulators) and the share of a loop's memory or compute hidden under the
  other (`overlap`), one thread over the DRAM buffer;
- one thread's SIMD `s += x` (one register: the add's latency) and in LANE_VECTORS registers (a
  cheap operation's throughput), `s += exp(x)`, `s += x / (x + 2)` over 24 KiB (L1);
- every region's team placed as the kernels' are (runtime/cpu_team.py: off the caller's core);
- an empty parallel region, called from Python through ctypes (the median of single calls), under
  this process's OpenMP wait policy (`spin_count`): a pool that spins between regions (libgomp's
  default) enters one in about a microsecond or two; a passive one (OMP_WAIT_POLICY=PASSIVE, as
  the CPU bench runs every library) sleeps between them and pays a futex wake-up each time (tens
  of microseconds here). That wake-up is the machine's cost, not a sign of load (`judge`).

The whole probe takes 2-3 seconds idle (4-13 under a load of 10 on 2 cores); its figures are cached as JSON in the library cache
(runtime/diskcache.py) under a key of the CPU's model and flags, the thread count, the probe's
version, the pool's spin count and what its library is built from (`_key`), so a machine probes
once per setting. A probe taken while other processes held the cores is kept CONTENDED_TTL_S (10
minutes) only (`judge`): its all-thread figures are extrapolated from one thread's where the load
showed in them (a slow entry of a spinning pool's region, a collapsed all-thread rate, too few
trials that held their cores), and kept as measured, but provisional, where the per-core L2
rate failed to scale (the cores may share a physical core; a re-probe tells) or the load
average shows other processes (the region's entry and the shared levels are then the load's).

>>> r = rates(2)  # doctest: +SKIP
>>> r.source  # doctest: +SKIP
'probed 2026-11-25 10:40 UTC (L3: 4 MiB arrays, 8 MiB held; ...)'
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

from ..model.cpu import LEVELS, Caches, Rates
from . import diskcache
from .cpu_probe_source import LANES, SOURCE
from .cpu_probe_trials import GAP_S, Timed, _clocked, _in_region, _median_call_us, _timed, _trials, region_entry  # noqa: F401 (runtime/gemm_probe.py times with them)

Probed = TypeVar("Probed")  # a probe's result: a value with a `source` string

log = logging.getLogger("panamera.cpu")
VERSION = 10  # 10: trials validated by each thread's CPU over wall time and interleaved 1/all threads, the column ratio over the kernels' 16 KiB block; 9: rates timed inside one region (its entry outside), thread CPU time, the median of the faster trials; the L3 extent, lane op, column and overlap figures; 8: the read sum keeps LANE_VECTORS registers of lanes (L2 rate); 7: a loaded probe (load average, L2 scaling) is kept briefly (`judge`); 6: spin-keyed entry
LARGE = 64 << 20
# A spinning pool's empty parallel region slower than this waited for a busy core. A sleeping
# pool's (OMP_WAIT_POLICY=PASSIVE) is no test of load: its wake-up is the machine's own cost, a
# median of 4.7 us at load 13 in one run and 45-54 us idle on these KVM guests whenever the woken
# thread takes the other vCPU (2026-11-25).
CONTENDED_FORK_US = 50.0
CONTENDED_TTL_S = 600.0  # a contended or provisional probe is reused this long, then the machine is probed again
# Other processes' share of the cores, read from the 1-minute load average less the probe's own
# process, above which the all-thread samples are not trusted: half a core (the CPU bench's own
# warning is at a load of 1.5 on this 2-core machine). The 01:47 passive probe cached on
# 2026-11-25 under a load of 10-15 held DRAM 5.5 GB/s and no 2-thread scaling, and passed the
# region-entry test.
LOADED_CORES = 0.5
# The least share of an all-thread figure's trials that held their cores throughout (`judge`) for it to
# be taken as measured (rather than extrapolated from one thread's).
WHOLE_MIN = 0.5
# The L2 (private to each core) read rate on every thread over one thread's, per thread, below
# which the all-thread figures are provisional: idle probes here read 2.1-2.2x on 2 threads
# (48/107, 50/104 GB/s); the 03:00 passive probe of 2026-11-25 read 51/50 and was cached for good.
SCALING_MIN = 0.75
# libgomp's spin counts (its manual, GOMP_SPINCOUNT; libgomp/env.c): OMP_WAIT_POLICY unset, ACTIVE, PASSIVE
SPIN_DEFAULT, SPIN_ACTIVE, SPIN_PASSIVE = 300_000, 30_000_000_000, 0
SPIN_INFINITE = (1 << 64) - 1
_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}  # either case, as libgomp reads them


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
    threads: int,
    fork: tuple[float, float],
    read: list | tuple,
    write: list | tuple,
    wakes: bool,
    load: float,
    whole: float = 1.0,
) -> tuple[Verdict, str]:
    """The verdict on a probe's all-thread figures and its reason. CONTENDED where
    1. an empty all-thread region of a spinning pool was slow to enter (`slowed`), or
    2. some level streamed slower on every thread than on one (`slowed`), or
    3. less than WHOLE_MIN of some all-thread figure's trials were whole (`whole`: each thread on
       its core throughout, runtime/cpu_probe_trials.py), so its figure is one of preempted trials;
    PROVISIONAL where
    4. the L2 read rate, private to each core, grew less than SCALING_MIN x threads over one
       thread's (`measure` has timed the levels twice and kept the faster): the cores may share a
       physical core (hyperthreads: then it is the machine's scaling, and every re-probe confirms
       it) or a burst of load, or
    5. other processes held more than LOADED_CORES of the cores (`load`, `others_load`): the
       rates are whole trials', but the region's entry (a wake-up that may wait for a busy core)
       and the shared levels (a neighbour's traffic) are the load's;
    else SETTLED. One thread has no all-thread figures: SETTLED; no rates (before they are
    sampled): rule 1 only.

    >>> ok = [(50.0, 105.0), (29.0, 58.0), (29.0, 58.0)]
    >>> judge(2, (0.8, 4.9), ok, ok, True, 0.1)[0], judge(2, (0.8, 4.9), ok, ok, True, 6.0)[0]
    (<Verdict.SETTLED: 'probed'>, <Verdict.PROVISIONAL: 'provisional'>)
    >>> judge(2, (0.8, 4.9), ok, ok, True, 0.1, whole=0.2)[0], judge(2, (0.8, 4.9), [(51.0, 50.0), *ok[1:]], ok, True, 0.1)[0]
    (<Verdict.CONTENDED: 'contended'>, <Verdict.PROVISIONAL: 'provisional'>)
    """
    if threads <= 1:
        return Verdict.SETTLED, ""
    if slowed(fork, wakes=wakes):
        return Verdict.CONTENDED, f"a {threads}-thread region took {fork[1]:.0f} us"
    if slowed(fork, [*read, *write], wakes):
        return Verdict.CONTENDED, f"{threads} threads streamed slower than one"
    if whole < WHOLE_MIN:
        return Verdict.CONTENDED, f"{100 * whole:.0f} % of an all-thread figure's trials held their cores"
    one, full = read[LEVELS.index("L2")] if read else (0.0, 0.0)
    if full < SCALING_MIN * threads * one:
        return Verdict.PROVISIONAL, f"L2 read {one:.0f} GB/s on one thread, {full:.0f} on {threads}"
    if load > LOADED_CORES:
        return Verdict.PROVISIONAL, f"other processes held {load:.1f} cores (1-minute load average)"
    return Verdict.SETTLED, ""


def _library():
    """The probe's library (`SOURCE`), its functions' signatures set."""
    from .cpu import SIMD_MATH, build

    lib = build(SIMD_MATH + SOURCE)
    P, L, I, D = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.POINTER(ctypes.c_double)  # noqa: E741, N806
    for f in (lib.pn_sum, lib.pn_column, lib.pn_sum_exp):
        f.argtypes, f.restype = (P, L, I, I, I, D), ctypes.c_double
    lib.pn_triad.argtypes, lib.pn_triad.restype = (P, P, P, L, I, I, I, D), ctypes.c_double
    for f in (lib.pn_add, lib.pn_lanes, lib.pn_exp, lib.pn_div):
        f.argtypes, f.restype = (P, L, I), ctypes.c_double
    lib.pn_empty.argtypes, lib.pn_empty.restype = (I,), None
    lib.pn_entry.argtypes, lib.pn_entry.restype = (I, ctypes.c_double), ctypes.c_double
    return lib


def _streams(lib, sizes: dict[str, int], threads: int, counts: tuple[int, ...]) -> tuple[list, list, list]:
    """(read, write, trials) per level of LEVELS: the read sum's and the triad's GB/s on one thread
    and on `threads` ((one, all): the last of `counts`), their four figures' trials interleaved;
    trials: (threads, `Timed`) per figure."""
    read, write, timed = [], [], []
    for level in LEVELS:
        buf = _buffer(sizes[level])  # the sum reads all of it, the triad its thirds
        n, n3 = buf.size, buf.size // 3
        pb, p3 = buf.ctypes.data, tuple(buf[k * n3 :].ctypes.data for k in range(3))
        samples, floats = [], []
        for t in counts:
            # L2 is per core: t threads read t halves of an L2 (one thread read the whole 2-core buffer
            # before, twice its L2's half: 50-54 GB/s where 1 MiB reads at 74)
            part = t / threads if level == "L2" else 1.0
            m, m3 = int(n * part) // LANES * LANES, int(n3 * part) // LANES * LANES  # whole blocks per thread
            samples += [_in_region(lib.pn_sum, pb, m, t), _in_region(lib.pn_triad, *p3, m3, t)]
            floats += [4 * m, 12 * m3]
        got = _trials(*samples)
        gbs = [b / g.sec / 1e9 for b, g in zip(floats, got)]
        read.append((gbs[0], gbs[-2]))
        write.append((gbs[1], gbs[-1]))
        timed += [(counts[i // 2], g) for i, g in enumerate(got)]  # a sum and a triad per thread count
    return read, write, timed


def measure(threads: int, caches: Caches) -> Rates:
    """Run the probe now (about a second on an idle machine) and return its rates; where a spinning
    pool's region was slow to enter, only one thread is timed (`judge`)."""
    lib = _library()
    fork = region_entry(lambda: lib.pn_empty(1), lambda t: lib.pn_entry(t, GAP_S), threads)
    wakes = spin_count() == 0  # each region wakes the pool: its entry is a wake-up
    early = judge(threads, fork, (), (), wakes, 0.0)[0] is Verdict.CONTENDED  # the all-thread samples would wait
    counts = (1,) if early or threads == 1 else (1, threads)

    def one_read_gbs(nbytes: int) -> float:  # one thread's read rate over `nbytes`
        buf = _buffer(nbytes)
        return 4 * buf.size / _trials(_in_region(lib.pn_sum, buf.ctypes.data, buf.size, 1))[0].sec / 1e9

    sizes = {"L2": caches.l2 // 2 * threads, "DRAM": min(4 * caches.l3, LARGE)}
    sizes["L3"], l3_bytes = l3_extent(caches, one_read_gbs, sizes["DRAM"])
    first = _streams(lib, sizes, threads, counts)
    # one thread over the DRAM buffer (the column sum's and the plain sum's trials side by side) and L1
    big, l1 = _buffer(sizes["DRAM"]), _buffer(24 << 10)
    on = lambda f, b: _in_region(f, b.ctypes.data, b.size, 1)  # noqa: E731
    plain, cols, exps, exps_l1 = _trials(
        on(lib.pn_sum, big), on(lib.pn_column, big), on(lib.pn_sum_exp, big), on(lib.pn_sum_exp, l1)
    )
    column = column_ratio(plain.sec, cols.sec)
    both = overlap(plain.sec / big.size, exps_l1.sec / l1.size, exps.sec / big.size)
    k = 6144  # 24 KiB: in L1
    x = np.linspace(-1.0, 1.0, k, dtype=np.float32)
    px = x.ctypes.data
    ops = _trials(
        *(_clocked(lambda reps, f=f: f(px, k, reps)) for f in (lib.pn_add, lib.pn_lanes, lib.pn_exp, lib.pn_div))
    )
    add_ns, op_ns, exp_ns, div_ns = (t.sec / k * 1e9 for t in ops)
    # the streams again, a second or so later: each figure the faster of its two (a burst of load
    # can outlast one figure's trials; it slows, never speeds, a trial timed by the wall clock)
    again = _streams(lib, sizes, threads, counts)
    read, write = ([tuple(map(max, a, b)) for a, b in zip(x, y)] for x, y in zip(first[:2], again[:2]))
    streams = [
        (t, Timed(0.0, min(a.spread, b.spread), max(a.whole, b.whole))) for (t, a), (_, b) in zip(first[2], again[2])
    ]
    timed = [g for _, g in streams] + [plain, cols, exps, exps_l1, *ops]
    whole = min((g.whole for t, g in streams if t > 1), default=1.0)  # of the all-thread figures (rule 3)
    verdict, why = judge(threads, fork, read, write, wakes, others_load(), whole)  # CONTENDED again where `early`
    note = (
        f" (L3: {sizes['L3'] >> 20} MiB arrays, {l3_bytes >> 20} MiB held; DRAM: {sizes['DRAM'] >> 20} MiB arrays;"
        f" OpenMP spin count {spin_count()}; a figure's slower trials (90 % quantile) up to {100 * max(t.spread for t in timed):.0f} %"
        f" slower than it; {100 * whole:.0f} % of an all-thread figure's trials whole at least)"
    )
    if verdict is Verdict.CONTENDED:
        forkn = fork[1] if wakes else 2 * fork[0]
        ops = (add_ns, exp_ns, div_ns, op_ns)
        return _extrapolated(
            threads, tuple(read), tuple(write), ops, fork[0], forkn, why, note, (l3_bytes, column, both)
        )
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")  # noqa: UP017 (3.10)
    head = f"provisional probe ({why}): {when}" if verdict is Verdict.PROVISIONAL else f"probed {when}"
    return Rates(
        threads, tuple(read), tuple(write), add_ns, exp_ns, div_ns, fork, f"{head}{note}", op_ns, l3_bytes, column, both
    )


def _buffer(nbytes: int) -> np.ndarray:
    """A buffer of `nbytes` (whole LANES blocks) of ones, written once: its pages are mapped."""
    return np.full(max(LANES, nbytes // 4 // LANES * LANES), 1.0, np.float32)


def l3_extent(caches: Caches, read_gbs: Callable[[int], float], dram_bytes: int) -> tuple[int, int]:
    """(the bytes the L3 figures are measured over, the bytes the L3 holds at its rate) from one
    thread's read rate `read_gbs(nbytes)`: over buffers of 4 x L2, doubling up to the L3 the OS
    reports (at most half of `dram_bytes`), the largest that still reads faster than the geometric
    mean of the first one's rate and the DRAM buffer's; the L3 figures are taken over half of it
    (at least the first). What the OS reports can exceed what a core reaches at its rate: this
    AMD EPYC guest reports 32 MiB, and a sum read 54-67 GB/s over 1-8 MiB, 18-22 over 16 MiB and
    16-17 over 64 MiB (2026-11-25, thread CPU time, load 9).

    >>> rate = {2 << 20: 60.0, 4 << 20: 62.0, 8 << 20: 54.0, 16 << 20: 20.0, 32 << 20: 17.0, 64 << 20: 16.0}
    >>> [n >> 20 for n in l3_extent(Caches(32 << 10, 512 << 10, 32 << 20), rate.__getitem__, 64 << 20)]
    [4, 8]
    """
    first = 4 * caches.l2
    sizes = [first]
    while sizes[-1] * 2 <= min(caches.l3, dram_bytes // 2):
        sizes.append(sizes[-1] * 2)
    rates = [read_gbs(n) for n in sizes]
    enough = math.sqrt(rates[0] * read_gbs(dram_bytes))
    held = max([n for n, r in zip(sizes, rates) if r >= enough], default=first)
    return max(first, held // 2), held


def column_ratio(plain: float, column: float) -> float:
    """The COLUMN form's read rate over a plain sum's: `plain` and `column` are the seconds one
    thread took over the same buffer (the last level's, beyond the L3; their trials alternate),
    the column sum's rows summed into the kernels' block of accumulators (COLUMN_BLOCK_BYTES,
    16 KiB; 4 KiB before VERSION 10). At most 1. On this AMD EPYC guest (2026-11-25, thread CPU
    time, load 10) the generated column kernels read at 0.63-0.69 of a plain sum over the same
    input (A2#7, A2#9, sum column 21128x768 and 768x768), 0.85 with 64 accumulators (bias_grad).

    >>> column_ratio(2.0, 3.0), column_ratio(2.0, 1.0)
    (0.6666666666666666, 1.0)
    """
    return min(1.0, plain / column)


def overlap(stream: float, compute: float, both: float) -> float:
    """The share of the shorter of a loop's stream (`stream`: seconds per element of a plain sum
    from beyond the L3) and its compute (`compute`: of a sum of exps over L1 data) that the core
    hides under the longer, from the time per element of the sum of exps over the stream
    (`both`), in [0, 1]: 1 where `both` is the longer alone, 0 where it is their sum. This AMD
    EPYC guest: 0.71 (0.285, 0.484 and 0.566 ns; 2026-11-25, thread CPU time, load 10).

    >>> round(overlap(0.285, 0.484, 0.566), 2), overlap(1.0, 2.0, 2.0), overlap(1.0, 2.0, 3.5)
    (0.71, 1.0, 0.0)
    """
    return min(1.0, max(0.0, (stream + compute - both) / max(min(stream, compute), 1e-15)))


def slowed(fork: tuple[float, float], rates: list | tuple = (), wakes: bool = False) -> bool:
    """Whether other processes held the cores while the probe ran: an empty all-thread region
    slow to enter (not where the pool `wakes` each region: that wake is the machine's cost,
    CONTENDED_FORK_US), or all threads
    streaming slower than one did (an empty region can still enter quickly between two
    preemptions: a probe here read 0.18 GB/s from L2 on two threads against 54 on one, and was
    cached as this machine's rate).

    >>> slowed((0.7, 1.5), [(54.0, 0.18)]), slowed((0.7, 1.5), [(54.0, 100.0)]), slowed((0.7, 80.0))
    (True, False, True)
    >>> slowed((0.7, 12.0), wakes=True), slowed((0.7, 80.0), wakes=True)
    (False, False)
    """
    slow_fork = not wakes and (fork[1] > CONTENDED_FORK_US or fork[1] > 20 * fork[0])
    return slow_fork or any(n < 0.5 * one for one, n in rates)


def _extrapolated(
    threads,
    read,
    write,
    ops: tuple[float, ...],
    fork1,
    forkn,
    why: str = "",
    note: str = "",
    more: tuple = (0, 1.0, 1.0),
) -> Rates:
    """Rates when the all-thread samples waited for busy cores (other processes hold them): the
    all-thread bandwidth is the one-thread figure times the threads (L2, private per core) or
    times at most 2 (L3, DRAM: shared), and a region's entry `forkn` (measure: twice one thread's,
    or as measured where the pool wakes each region: its wake-up is the cost). Marked `contended`
    (`why`; `note`: the probe's settings): kept CONTENDED_TTL_S only, then a later process on a
    quieter machine probes again."""
    scaled = lambda pairs: tuple((a, a * threads if k == 0 else a * min(threads, 2)) for k, (a, _) in enumerate(pairs))  # noqa: E731
    why = why or f"a {threads}-thread region took {forkn:.0f} us"
    src = f"contended probe ({why}): all-thread figures extrapolated from one thread{note}"
    add_ns, exp_ns, div_ns, op_ns = ops
    return Rates(threads, scaled(read), scaled(write), add_ns, exp_ns, div_ns, (fork1, forkn), src, op_ns, *more)


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
        float(d.get("op_ns", 0.0)),
        int(d.get("l3_bytes", 0)),
        float(d.get("column", 1.0)),
        float(d.get("overlap", 1.0)),
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
