"""The CPU model: the modeled time of one CPU kernel (schedule/cpu_mapper.py's decision) from the
bytes it moves, the SIMD work per element and the threads that share it. Every figure is *modeled*.

The machine is described by what it has (cores, SIMD width, cache sizes read from /sys) and by
what it does, measured once per machine by the short probe of runtime/cpu_probe.py (`Rates`):
read and write bandwidth with the data resident in L2, in L3 and beyond (`DRAM`), at one thread and at
all of them, and how much data the L3 serves at its rate; the time per element of a SIMD sum (one
register: the add's latency, and in the scans' lanes: a cheap operation's throughput), of an `exp`
and of a division with the data in L1; the COLUMN form's read rate over a plain sum's and the share
of a loop's memory and compute the core overlaps; the cost of entering an OpenMP parallel region under the process's wait policy (charged
once per kernel's region: with a passive pool, a wake-up of its threads; the mapper runs a kernel
on fewer threads when that outweighs the split: schedule/cpu_cost.py `best_threads`). Without a
probe, `NOMINAL` stands in.

A program's time is the Python side of its call (`call_us`, fitted here) plus each kernel's
time (`kernel_time`):

    fork + both(memory, compute) + merge

(both: the longer plus the share of the shorter the core does not hide, `Rates.both`; a stitched
group whose rows are too long to overlap its passes: the sum over its passes, `streamed`)

- memory: the bytes the kernel moves (each input read once, each output written once, and the
  re-reads of a stitched group's later passes at the L1 rate when a row's re-reads fit L1, else
  the L2 rate) over the bandwidth of the level the kernel's bytes fit in, the share the cache
  below holds at its rate (`CpuModel.gbs`; warm data: a benchmark calls the same kernel on the
  same arrays), a COLUMN group's reads at `column_rate` of it (the probe's column ratio per block
  of accumulators in L1, none in registers), a prefetched first pass's at `prefetch_gain` of it;
- compute: elements x (SIMD cost per element of the body's operations, a cheap one at the lanes'
  throughput, `element_ns`; a struct accumulator
  whose combine does not vectorize pays one scalar step per element), plus per output row the
  combine of each reduction's SIMD lanes (`combine_ns`), / threads;
- both spread over min(threads, tasks) threads, and scaled by the imbalance of a static schedule
  (ceil(tasks / threads) waves of equal tasks);
- merge (a split reduction), as the mapper's `CpuMerge` says (`merge_us`): LAST, a counter's
  atomic increment per task and, per output, its partials combined in order by its last task (no
  barrier beyond the region's end); ATOMIC, two barriers more and a compare-and-swap per output per
  task.

The limit is what no plan can beat: the compulsory bytes (inputs once, outputs once) at the best
bandwidth any probe measured at that level, plus one parallel region's entry.

>>> m = CpuModel.nominal(cores=2, simd_bytes=64, name="x")
>>> w = CpuWork(M=1, N=1 << 20, elements=1 << 20, read_bytes=4 << 20, write_bytes=4)
>>> one = kernel_time(w, m, tasks=1, split=1, threads=2)
>>> two = kernel_time(w, m, tasks=2, split=2, threads=2)
>>> two.total_us < one.total_us, one.level
(True, 'L3')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..enums import StrEnum
from .cpu_gemm import NOMINAL_GEMM, GemmRates

# Vector registers of accumulators per reduction in a row scan: the code shape codegen/cpu_lanes.py
# emits (`lanes_pass`, W = LANE_VECTORS x lanes) and `combine_ns` prices; here, so that codegen
# imports the model and not the other way round.
LANE_VECTORS = 4
# A COLUMN task's kept block (schedule/cpu_mapper.py `column_block`): whole rows up to 16 KiB of
# accumulators (in L1), so that a task streams contiguous rows; here, so that the probe
# (runtime/cpu_probe_source.py) times the column ratio over the block the kernels keep. Measured at
# one thread, sum over axis 0: 4096x768 660 -> 422 us, 1024x4096 865 -> 586 us against 16-vector
# strips (AVX-512). In bytes, not vectors: as 256 vectors it was 8 KiB on an AVX2 machine,
# 1024x4096 1682 -> 1394 us and 4096x3072 5850 -> 4481 us at 16 KiB (AMD EPYC, 1 thread, CPU
# time, medians of 15 and 9 interleaved rounds, load 12).
COLUMN_BLOCK_BYTES = 16384
# The share of a row's lane folds (`combine_ns`, latency chains) that R rows scanned side by side
# (schedule/cpu_rows.py) hide: each row's combines cost (1 - ROW_OVERLAP (1 - 1/R)) of one row's.
# Fitted on softmax [6144x128] at 1 thread (CPU time, loaded machine, 2026-11-25): R = 2 measured
# 4-8 % faster than one row a pass; a full overlap (1/R) modeled 12 %, this 6 %. (A plain row
# sum [1024x128] at R = 4 measured 4 %: its one-row combines are over-charged already.)
ROW_OVERLAP = 0.5
# How much faster a row scan's first pass streams its inputs from L3 or beyond with software
# prefetches ahead of the loads (schedule/cpu_prefetch.py, `CpuWork.prefetch`): argmax [64x30522],
# 1 thread, CPU time, kernel level, 2026-11-25 (load 1.5): 295 -> 277 us, at the probed L3 rate.
PREFETCH_GAIN = 1.06
# ... and (slower) wholly from DRAM (`prefetch_gain`): the generated kernels with and without their
# prefetches, one thread, thread CPU time, medians of 9-11 interleaved rounds (2026-11-25, load 10-14):
# sums over 25-67 MB 0.82-0.89 as fast, max row [256x30522] 0.98-1.07; argmax and max row [64x30522]
# (7.8 MB, part in L3) 1.39-1.41, an ALL sum over 4 MB 1.2.
PREFETCH_DRAM = 0.85

# A locked read-modify-write on a word of another task's line (a LAST counter's fetch-add, an
# ATOMIC compare-and-swap combine): they retire one after another, about this long each. Measured
# 2026-11-25 13:27 UTC (AMD EPYC AVX2, load 10, g++ -O2, std::atomic_ref, 3 rounds of 4M ops):
# 11.3-20.1 ns a float CAS combine, 12.5-17.0 a fetch-add, 13.6-18.0 a CAS with two threads on the
# same lines; the probe does not measure it.
ATOMIC_RMW_NS = 12.0


class CpuMerge(StrEnum):
    """How the tasks that share one split reduction merge their partials (schedule/cpu_mapper.py
    `merge_mode` chooses by `merge_us`; codegen/cpu_merge.py prints it). Here, below the mapper,
    because the model prices each."""

    NONE = "none"  # not split: each output's one task finishes it
    LAST = "last"  # partials; the last task of an output (an atomic counter) combines them in chunk order
    ATOMIC = "atomic"  # each task combines its partial into the output's accumulator by compare-and-swap


TRANSCENDENTAL = frozenset({"exp", "log", "tanh", "erf", "sin", "cos", "pow", "sigmoid", "expm1", "log1p"})
DIVISION = frozenset({"div", "sqrt", "rsqrt", "fmod", "mod", "trunc_div"})
FREE = frozenset({"load", "const"})
LEVELS = ("L2", "L3", "DRAM")
# The Python side of one call of a CPU program on numpy arrays (CpuCompiled.__call__ through
# runtime/cpu_call.py: a shape/dtype compare per input, np.empty per output, one ctypes call),
# less the ctypes call itself, which the probe's region entry (fork_us, timed as an empty region
# called through ctypes) already holds; each further output about 0.7 us more. Measured
# 2026-11-25 (load 8, 1 thread, medians of 40 x 300 calls, interleaved): a 16- and a 1280-element
# sum took 3.35 and 3.28 us a call, a ctypes no-op 0.29, an empty 1-thread region through ctypes
# 0.67; bench/cpu (idle, 06:08) A2#5 [1280] 3.4 us. So 3.3 - fork_us(1) (0.87-0.89) = 2.4. (4.0,
# fitted under load on 2026-11-24 with the fork counted apart, modeled A2#5 5.0 and sum all
# 65536 10.3 against 3.4 and 7.0 idle.) Other inputs (torch tensors, views to copy) take the
# general path, about 14 us. Refit when runtime/cpu_call.py changes.
CALL_US, OUTPUT_US = 2.4, 0.7
CACHE_FILL = 0.75  # a kernel's bytes "fit" a cache when they take at most this share of it
# Beyond this many bytes the model uses the large-array rates even when the L3 the OS reports
# is bigger, where the probe did not measure how much it holds (`Rates.l3_bytes`): in a virtual
# machine that L3 is shared with other guests (here 260 MiB reported, and a 64 MiB column sum ran
# at a third of the 16 MiB probe's rate).
L3_MAX = 32 << 20
# A column reduction (the COLUMN form) accumulates each element into its block of accumulators in
# L1 (codegen/cpu_kernel.py's pn_blk: a load, the body's operations and a store per vector), and
# that hides under the stream as a row's accumulate does: warm, the generated loop read 25 MB at
# 27.2-27.8 GB/s against 26.8-27.4 for a plain SIMD sum (g++ -O3 -march=native, one thread, load
# 1-4; 28.1 with two accumulators, A2#9's), and A2#7 [64x128x768] ran 941-975 us in one process
# (memory term 853). The 0.44 x the shorter term once added here (COLUMN_SERIAL) was fitted on
# bench/cpu samples of one cold call (panamera/bench/cpu_isolated.py: WARM_CALLS).
# The probe's column ratio is one block of accumulators in L1 (runtime/cpu_probe_source.py pn_column:
# a load and a store of it per vector read); k blocks pay it k times, and blocks that fit in
# REGISTER_VECTORS registers g++ keeps there (bias_grad [65536x64]'s loop: eight vaddps from memory),
# at the plain rate (`column_rate`). One thread, thread CPU time, medians of 7 interleaved rounds,
# 2026-11-25, load 10, 25 MB: column sums of 32-128-wide rows 0.76-0.82 x a plain sum's time, 256-
# and 768-wide 0.91-1.27; two sums (x, x^2) of 768-wide rows 1.16-1.26 x one (k = 2 models 1.24),
# of 32-64-wide 0.85-0.88 x a plain sum; idle bench: bias_grad 1.09 x the probe's plain DRAM read
# (1.32 modeled at the L1 ratio). 16: AVX2's ymm registers (AVX-512's 32 zmm: the side measured).
# Compiled with -march=skylake-avx512, one sum's 64-256-wide blocks stay in zmm registers, 512-wide
# do not; two 64-wide sums are mostly spilled (a store per two rows): modeled held, an optimistic case.
REGISTER_VECTORS = 16
# A COLUMN task whose blocks are in L1 adds COLUMN_ROWS input rows into each vector of its blocks per
# load and store of it (`column_rows`, codegen/cpu_column.py), in row order (the bits of one row at a
# time). One row a step read 0.52-0.63 x a plain sum's rate over 768-wide rows (25-62 MB, DRAM),
# whatever the inner loop's shape (g++'s two-row unroll-and-jam, a constant trip count, a restrict
# row pointer: all alike); 4 rows 0.67-0.83, 8 rows 0.92-0.94 (one sum) and 0.85-0.89 (x and x^2),
# 16 rows 0.79-0.81; over 768 rows (2.4 MB) 8 rows 0.50-0.59 against 0.40-0.57. One thread, thread
# CPU time, medians of 15-41 interleaved rounds, AMD EPYC AVX2, 2026-11-25 14:20 UTC, load 4. The
# 8-row figures are the probe's rule above at its 16 KiB figure (0.91: k = 1 gives 0.91, k = 2 0.83).
# The generated kernels, 1 and 8 rows in one process (14:30 UTC, load 1.5, medians of 61): sum column
# 21128x768 7134 -> 5587 us, A2#7 3044 -> 2398, A2#9 4055 -> 2754, sum column 768x768 74.6 -> 65.0
# (601); the ALL sum of the same 21128x768 bytes took 6850 (model 0.72 of it, the column sum 0.77): what
# the model still misses there is the DRAM read rate, not the COLUMN form.
COLUMN_ROWS = 8


@dataclass(frozen=True)
class Caches:
    """Data cache sizes in bytes: L1 and L2 per core, L3 shared."""

    l1: int
    l2: int
    l3: int

    @staticmethod
    def detect(root: str = "/sys/devices/system/cpu/cpu0/cache") -> Caches:
        """From /sys (index*/level, type, size); 48 KiB / 2 MiB / 32 MiB where it cannot be read."""
        sizes = {1: 48 << 10, 2: 2 << 20, 3: 32 << 20}
        found: dict[int, int] = {}
        for d in sorted(Path(root).glob("index*")):
            try:
                level = int((d / "level").read_text())
                kind = (d / "type").read_text().strip()
                size = _size((d / "size").read_text().strip())
            except (OSError, ValueError):
                continue
            if kind in ("Data", "Unified"):
                found[level] = size
        sizes.update(found)
        if 3 not in found and 2 in found:  # no L3: the "L3" level is the L2 of every core
            sizes[3] = sizes[2]
        return Caches(sizes[1], sizes[2], sizes[3])


def _size(text: str) -> int:
    """'48K' -> 49152; '2048K', '32M', '1G', '512'."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1].upper()] if text[-1].upper() in mult else int(text)


@dataclass(frozen=True)
class Rates:
    """What the machine does, measured (runtime/cpu_probe.py) or nominal.

    read_gbs: per level of LEVELS, (one thread, `threads` threads) in GB/s of a SIMD sum;
    write_gbs: the same of a triad (a = b + 0.5 c: two reads and a write), the rate of written bytes;
    add_ns, exp_ns, div_ns: one thread's time per float32 element of `s += x[i]`,
    `s += exp(x[i])`, `s += x[i] / (x[i] + 2)` (data in L1, SIMD, one accumulator register: the
    add's latency bounds the first); op_ns: `s += x[i]` in LANE_VECTORS registers of lanes (a
    cheap operation's throughput; 0: not measured, `lane_op_ns`); l3_bytes: the most data one
    thread still read from the L3 at its rate (runtime/cpu_probe.py `l3_extent`; 0: not measured,
    `CpuModel.l3_held`); column: the COLUMN form's read rate (rows summed into a block of
    accumulators in L1) over a plain sum's (1: not measured); overlap: the share of a loop's shorter
    part, memory or compute, hidden under the longer (runtime/cpu_probe.py `overlap`; 1: not
    measured, the longer alone); fork_us: entering and
    leaving a parallel region from Python through ctypes, (one thread, `threads`), under the
    process's OpenMP wait policy (a passive pool's threads sleep between regions: each region
    pays their wake-up; runtime/cpu_probe.py `spin_count`)."""

    threads: int
    read_gbs: tuple[tuple[float, float], ...]
    write_gbs: tuple[tuple[float, float], ...]
    add_ns: float
    exp_ns: float
    div_ns: float
    fork_us: tuple[float, float]
    source: str = "nominal"
    op_ns: float = 0.0
    l3_bytes: int = 0
    column: float = 1.0
    overlap: float = 1.0

    def both(self, memory: float, compute: float) -> float:
        """A loop's time from its memory and compute times: the longer, plus the share of the shorter
        the core does not hide under it (1 - `overlap`)."""
        return max(memory, compute) + (1.0 - self.overlap) * min(memory, compute)

    @property
    def lane_op_ns(self) -> float:
        """One thread's time per element of a cheap SIMD operation in the generated scans' LANE_VECTORS
        independent registers (the probe's `op_ns`: its throughput, where `add_ns` is one dependent
        register's latency); `add_ns` where no probe measured it."""
        return self.op_ns or self.add_ns

    def bandwidth(self, level: str, threads: int, write: bool = False) -> float:
        """GB/s at `level` with `threads` threads (linear between one and all threads, flat beyond)."""
        one, full = (self.write_gbs if write else self.read_gbs)[LEVELS.index(level)]
        return _between(one, full, threads, self.threads)

    def fork(self, threads: int) -> float:
        return _between(*self.fork_us, threads, self.threads)


def _between(one: float, full: float, t: int, n: int) -> float:
    if n <= 1 or t <= 1:
        return one
    return one + (full - one) * (min(t, n) - 1) / (n - 1)


# Nominal rates (a 2020s server core; only used when no probe ran): per-core bandwidth that
# scales with cores except from DRAM.
NOMINAL = Rates(
    threads=1,
    read_gbs=((60.0, 60.0), (25.0, 25.0), (12.0, 12.0)),
    write_gbs=((30.0, 30.0), (15.0, 15.0), (8.0, 8.0)),
    add_ns=0.08,
    exp_ns=0.35,
    div_ns=0.2,
    fork_us=(2.0, 2.0),
)


@dataclass(frozen=True)
class CpuWork:
    """What one kernel group asks of the CPU (schedule/cpu_cost.py's `work`).

    M, N: kept and reduced extents; elements: iterations over all statements; read_bytes,
    write_bytes: compulsory traffic; cheap, transcendental, division: operations per element
    summed over the statements (a reduction's combine is one cheap operation); reread_bytes:
    bytes a stitched group's later passes read again from cache; struct: an accumulator whose
    combine does not vectorize (Welford, online softmax, argmax); struct_ops: that combine's
    (instructions, transcendentals) per element, each run for one lane at a time (online softmax:
    8 and 2 exps, algebra.ONLINE_LSE; default one scalar step); width: bytes of the widest
    computed type (8: double lanes, half as many per vector); row_combines: reductions whose
    SIMD lanes are combined at the end of each output's scan (ROW and ALL forms); rows: outputs
    whose scans run side by side (schedule/cpu_rows.py), their combines' latencies overlapping;
    vectors: the vector registers of lanes each reduction of the pass folds (schedule/cpu_lane_kind.py
    `pass_vectors`: one in a pass that evaluates exp); passes: a
    stitched group's passes over a row, each as its own `CpuWork` (the first reads the inputs,
    later ones re-read; each with the operations, writes and combines of its statements);
    prefetch: the reads stream with software prefetches ahead (PREFETCH_GAIN); column: the COLUMN
    form, whose reads stream at `column_rate` of a plain sum's: `accumulators` blocks of `block`
    kept outputs each (the decision's block; 0: not known, the blocks in L1)."""

    M: int
    N: int
    elements: int
    read_bytes: int
    write_bytes: int
    cheap: float = 1.0
    transcendental: float = 0.0
    division: float = 0.0
    reread_bytes: int = 0
    struct: bool = False
    struct_ops: tuple[float, float] = (1.0, 0.0)
    width: int = 4
    row_combines: int = 0
    rows: int = 1
    vectors: int = LANE_VECTORS
    passes: tuple[CpuWork, ...] = ()
    prefetch: bool = False
    column: bool = False
    accumulators: int = 1
    block: int = 0

    @property
    def bytes(self) -> int:
        return self.read_bytes + self.write_bytes


@dataclass(frozen=True)
class CpuModel:
    """The machine the model describes: cores, SIMD width, caches and rates; `gemm`: the speed of
    numpy's BLAS (model/cpu_gemm.py)."""

    cores: int
    simd_bytes: int
    name: str
    caches: Caches = field(default_factory=lambda: Caches(48 << 10, 2 << 20, 32 << 20))
    rates: Rates = NOMINAL
    gemm: GemmRates = NOMINAL_GEMM

    @staticmethod
    def nominal(cores: int, simd_bytes: int, name: str = "nominal CPU") -> CpuModel:
        """A model with nominal rates and caches (no probe), scaled to `cores`."""
        r = NOMINAL
        scale = lambda pairs, last: tuple((a, a * (cores if k < last else 1)) for k, (a, _) in enumerate(pairs))  # noqa: E731
        rates = Rates(cores, scale(r.read_gbs, 2), scale(r.write_gbs, 2), r.add_ns, r.exp_ns, r.div_ns, r.fork_us)
        return CpuModel(cores, simd_bytes, name, Caches(48 << 10, 2 << 20, 32 << 20), rates)

    def l3_held(self) -> float:
        """The bytes of warm data the L3 serves at its rate: CACHE_FILL of what the probe found it
        holds (`Rates.l3_bytes`), else of the L3 the OS reports, at most L3_MAX."""
        return CACHE_FILL * (self.rates.l3_bytes or min(self.caches.l3, L3_MAX))

    def level(self, nbytes: int, threads: int) -> str:
        """The cache level `nbytes` of warm data live in when `threads` cores work on them."""
        if nbytes <= CACHE_FILL * self.caches.l2 * max(1, threads):
            return "L2"
        if nbytes <= self.l3_held():
            return "L3"
        return "DRAM"

    def gbs(self, nbytes: int, threads: int, write: bool = False) -> float:
        """The rate of `nbytes` of warm data on `threads` threads: that of the level they live in,
        except the share the cache below still holds, served at its rate. That share falls from all
        of it at the cache's fill (CACHE_FILL of it) to none at twice the fill: a call sweeping its
        data in order evicts what the next call reads first. Measured on one thread (bench/cpu and
        2026-11-24, loaded; L2 53 GB/s, L3 31 in the probe): sum row 768x768 (2.4 MB) at 34-39
        GB/s, l2_normalize [256x1000] (1 + 1 MB) in 57-70 us, where the all-L3 rate modeled them
        1.22-1.35x and 1.26-1.44x too slow; sum all 1024x1024 (4 MB) at the L3 rate. (That probe's one-thread
        L2 figure was a one-register sum over both cores' buffer; since 2026-11-25 it is the generated
        scans' LANE_VECTORS registers over one core's half, 74 GB/s: sum row 768x768 modeled 77.6 ->
        70.2 us against 59.3 measured idle.)

        >>> m = CpuModel.nominal(cores=1, simd_bytes=64)
        >>> m.gbs(1 << 20, 1) == m.rates.bandwidth("L2", 1) > m.gbs(2 << 20, 1) > m.gbs(3 << 20, 1)
        True
        >>> m.gbs(4 << 20, 1) == m.rates.bandwidth("L3", 1)
        True
        """
        level = self.level(nbytes, threads)
        r, k = self.rates, LEVELS.index(level)
        bw = r.bandwidth(level, threads, write)
        if k == 0:
            return bw
        below = LEVELS[k - 1]
        held = CACHE_FILL * self.caches.l2 * max(1, threads) if below == "L2" else self.l3_held()
        f = min(1.0, max(0.0, (2 * held - nbytes) / max(nbytes, 1)))
        return 1.0 / (f / r.bandwidth(below, threads, write) + (1.0 - f) / bw)

    def describe(self) -> str:
        c = self.caches
        r = self.rates
        return (
            f"{self.name}: {self.cores} cores, SIMD {self.simd_bytes * 8} bits, L1 {c.l1 >> 10} KiB, L2 {c.l2 >> 10} KiB, "
            f"L3 {c.l3 >> 20} MiB; read GB/s (1/{r.threads} threads) "
            + ", ".join(f"{lvl} {a:.0f}/{b:.0f}" for lvl, (a, b) in zip(LEVELS, r.read_gbs))
            + f"; {r.source}"
        )


@dataclass(frozen=True)
class KernelTime:
    """A kernel's modeled time and its parts, in microseconds."""

    total_us: float
    memory_us: float
    compute_us: float
    fork_us: float
    merge_us: float
    level: str
    threads: int  # threads that have work

    @property
    def bound(self) -> str:
        return "memory" if self.memory_us >= self.compute_us else "compute"


def element_ns(w: CpuWork, r: Rates, lanes: int) -> float:
    """One thread's time per element (ns) of the body's operations, SIMD: a cheap operation at its
    throughput in the scans' independent lanes (`Rates.lane_op_ns`; a dependent add's latency,
    `add_ns`, priced it before: sum row 768x768 on one thread modeled 92.5 us against 62.6
    measured, AMD EPYC AVX2, 2026-11-25), an exp or a division at the probe's rate less the
    add it was timed with."""
    op = r.lane_op_ns
    ns = op * max(w.cheap, 1.0) + max(r.exp_ns - op, 0.0) * w.transcendental + max(r.div_ns - op, 0.0) * w.division
    ns *= max(1.0, w.width / 4)  # fewer lanes per vector for 8-byte types
    if w.struct:  # the combine runs lane by lane: its instructions and exps one lane at a time
        ns += (r.add_ns * w.struct_ops[0] + r.exp_ns * w.struct_ops[1]) * lanes
    return ns


def column_rate(w: CpuWork, r: Rates, simd_bytes: int) -> float:
    """A COLUMN group's read rate over a plain sum's: 1 / (1 + k (1 / `Rates.column` - 1)) with k its
    accumulator blocks in L1 (each loaded and stored per vector of COLUMN_ROWS rows read, `column_rows`;
    the probe timed one block, a load and store per vector of its 16 KiB rows), k = 0 where all of them fit REGISTER_VECTORS vector registers (g++ keeps them there); 1 for other forms.

    >>> from dataclasses import replace
    >>> r = Rates(1, ((1, 1),) * 3, ((1, 1),) * 3, 0.1, 0.4, 0.2, (1, 1), column=0.8)
    >>> w = CpuWork(M=768, N=8192, elements=768 * 8192, read_bytes=0, write_bytes=0, column=True, block=768)
    >>> [round(column_rate(replace(w, accumulators=k), r, 32), 3) for k in (1, 2)]
    [0.8, 0.667]
    >>> column_rate(replace(w, M=64, block=64, accumulators=2), r, 32), column_rate(replace(w, column=False), r, 32)
    (1.0, 1.0)
    """
    if not w.column:
        return 1.0
    held = column_held(w, simd_bytes)
    return 1.0 / (1.0 + (0 if held else w.accumulators) * (1.0 / r.column - 1.0))


def column_held(w: CpuWork, simd_bytes: int) -> bool:
    """Whether a COLUMN group's `accumulators` blocks of `block` outputs fit REGISTER_VECTORS
    `simd_bytes` registers (g++ keeps them there; `block` 0, not known: not held)."""
    vectors = w.accumulators * math.ceil(w.block * w.width / max(simd_bytes, 1))
    return 0 < w.block and vectors <= REGISTER_VECTORS


def column_rows(w: CpuWork, simd_bytes: int) -> int:
    """The input rows a COLUMN step adds into its blocks per load and store of them (the mapper's
    `CpuDecision.column_rows`): COLUMN_ROWS where the blocks are in L1, 1 where they are held in
    registers (`column_held`: no load or store to save) and for other forms. The read rate of
    COLUMN_ROWS rows a step is `column_rate`'s (the probe's figure; COLUMN_ROWS says where measured).

    >>> w = CpuWork(M=768, N=8192, elements=768 * 8192, read_bytes=0, write_bytes=0, column=True, block=768)
    >>> from dataclasses import replace
    >>> column_rows(w, 32), column_rows(replace(w, M=64, block=64), 32), column_rows(replace(w, column=False), 32)
    (8, 1, 1)
    """
    return COLUMN_ROWS if w.column and not column_held(w, simd_bytes) else 1


def prefetch_gain(m: CpuModel, nbytes: int, threads: int) -> float:
    """How much faster a prefetched first pass reads its `nbytes` of warm inputs than the plain
    stream: PREFETCH_GAIN while the L3 serves some of them (`CpuModel.gbs`: up to twice what it
    holds), PREFETCH_DRAM (slower) once all of them stream from DRAM. (The inputs alone: softmax
    [64x30522]'s 7.8 MB, 15.6 MB with its output, measured 1.05x faster with its prefetches,
    schedule/cpu_prefetch.py.)

    >>> m = CpuModel.nominal(cores=1, simd_bytes=32)
    >>> [prefetch_gain(m, n << 20, 1) for n in (4, 40, 256)] == [PREFETCH_GAIN, PREFETCH_GAIN, PREFETCH_DRAM]
    True
    """
    return PREFETCH_DRAM if nbytes >= 2 * m.l3_held() else PREFETCH_GAIN


def reread_gbs(w: CpuWork, m: CpuModel, threads: int) -> float:
    """The rate of a stitched row's re-reads: from L1 when what one row re-reads fits there (the
    probe's SIMD add over L1 data, 4 bytes per add_ns, one per thread), else from L2."""
    if w.reread_bytes <= CACHE_FILL * m.caches.l1 * max(w.M, 1):
        return 4.0 / m.rates.add_ns * threads
    return m.rates.bandwidth("L2", threads)


def combine_ns(r: Rates, lanes: int, struct: bool = False, vectors: int = LANE_VECTORS) -> float:
    """One output's combine of its accumulators' lanes, each step the latency of a dependent
    SIMD add (the probe's add_ns x lanes). A scalar accumulator's `vectors` x lanes lanes (the
    pass's registers of lanes, schedule/cpu_lane_kind.py `pass_vectors`: LANE_VECTORS, one in
    an exp pass) fold as a tree (codegen/cpu_lanes.py's LANE_FOLD): log2(vectors) whole-register
    steps, then log2(lanes) steps of an operation and a move of the upper half, 2 latencies each;
    with the probe's add_ns, 16 lanes: 10 x 0.89 = 8.9 ns (softmax 6144 x 128 on one thread measured
    ~41 ns a row less than with the former w-loop, whose max g++ left scalar and branchy, ~20 ns
    a fold). A struct accumulator (Welford, log-sum-exp: a declared OpenMP reduction) combines
    its lanes in order: `lanes` dependent steps.

    >>> r = CpuModel.nominal(cores=2, simd_bytes=64).rates
    >>> [round(combine_ns(r, 16, vectors=v) / (r.add_ns * 16)) for v in (LANE_VECTORS, 1)]
    [10, 8]
    >>> round(combine_ns(r, 16, struct=True) / (r.add_ns * 16))
    16
    """
    step = lanes * r.add_ns
    if struct:
        return lanes * step
    return (math.log2(max(vectors, 1)) + 2 * math.log2(max(lanes, 1))) * step


def _combines_ns(w: CpuWork, r: Rates, lanes: int) -> float:
    """The lane combines of all of `w`'s outputs, each pass's at its own registers of lanes and
    accumulator kind (a stitched group's whole: the sum over its passes)."""
    if w.passes:
        return sum(_combines_ns(p, r, lanes) for p in w.passes)
    overlap = 1 - ROW_OVERLAP * (1 - 1 / w.rows)
    return w.M * w.row_combines * combine_ns(r, lanes, w.struct, w.vectors) * overlap


def merge_us(mode: CpuMerge, r: Rates, outputs: int, tasks: int, split: int, threads: int, lanes: int) -> float:
    """The modeled merge of `outputs` outputs split in `split` chunks (`tasks` tasks) on `threads`
    threads, in mode `mode` (us). LAST waits at no barrier (the region's end is the only one; half a
    region's entry was charged for one before, 17 us of bias_grad [65536x64]'s modeled 1076 us on 2
    threads at a 35 us wake-up). LAST: each task
    counts itself in its output's counter (one locked read-modify-write, ATOMIC_RMW_NS, a thread's
    tasks one after another), and each output's last task combines its `split` partials in chunk
    order (a dependent step each, the probe's add latency). ATOMIC: each task combines each of its
    outputs into the shared accumulator by compare-and-swap (outputs x split of them, spread over
    the threads), each output is read back once, and the region waits at two barriers (the
    accumulators set, the combines done: under a passive pool each a sleep and a wake-up, half a
    region's entry; sum column 768x768 split 2 at 2 threads measured 3.95 voluntary context
    switches a call with ATOMIC, 2.0 with LAST, AMD EPYC, 2026-11-25). A CAS costs more than a
    combine step, so ATOMIC is dearer wherever both apply; the price decides.

    >>> r = CpuModel.nominal(cores=2, simd_bytes=32).rates
    >>> [merge_us(mode, r, 40, 280, 7, 2, 8) > 0 for mode in CpuMerge]
    [False, True, True]
    >>> merge_us(CpuMerge.ATOMIC, r, 40, 280, 7, 2, 8) > merge_us(CpuMerge.LAST, r, 40, 280, 7, 2, 8)
    True
    """
    if mode == CpuMerge.NONE or split <= 1:
        return 0.0
    t = max(1, threads)
    wait = r.fork(t) / 2
    step = r.add_ns * lanes * 1e-3  # one dependent combine, us
    if mode == CpuMerge.LAST:
        return math.ceil(tasks / t) * ATOMIC_RMW_NS * 1e-3 + math.ceil(outputs / t) * split * step
    return 2 * wait + math.ceil(outputs * split / t) * ATOMIC_RMW_NS * 1e-3 + math.ceil(outputs / t) * step


def kernel_time(
    w: CpuWork,
    m: CpuModel,
    tasks: int,
    split: int,
    threads: int | None = None,
    lanes: int = 16,
    merge: CpuMerge = CpuMerge.LAST,
) -> KernelTime:
    """The modeled time of `w` run as `tasks` equal tasks (`split` chunks per output) on `threads`
    threads (default: every core) under a static schedule, a split's partials merged as `merge`
    says (`merge_us`; the mapper picks the split at LAST's price, then the mode)."""
    t = max(1, threads or m.cores)
    busy = max(1, min(t, tasks))
    waves = math.ceil(max(tasks, 1) / busy)
    imbalance = waves * busy / max(tasks, 1)
    level = m.level(w.bytes, busy)
    r = m.rates
    again = reread_gbs(w, m, busy)
    read = m.gbs(w.bytes, busy)
    rates = (read, m.gbs(w.bytes, busy, write=True), again, read * prefetch_gain(m, w.read_bytes, busy))
    parts = [_seconds(p, r, rates, busy, lanes, m.simd_bytes) for p in (w.passes if streamed(w, m) else (w,))]
    fork = r.fork(t)
    merge_t = merge_us(merge, r, w.M, tasks, split, t, lanes)
    mem_us, comp_us = (sum(x[k] for x in parts) * 1e6 * imbalance for k in (0, 1))
    body = sum(r.both(a, b) for a, b in parts) * 1e6 * imbalance
    return KernelTime(fork + body + merge_t, mem_us, comp_us, fork, merge_t, level, busy)


def _seconds(
    w: CpuWork, r: Rates, gbs: tuple[float, ...], busy: int, lanes: int, simd_bytes: int = 64
) -> tuple[float, float]:
    """(memory, compute) seconds of `w` on `busy` threads: its reads, writes and re-reads at the
    rates `gbs` (reads, writes, re-reads, prefetched reads; a COLUMN group's reads at
    `column_rate`), its operations and combines."""
    mem = (
        w.read_bytes / ((gbs[3] if w.prefetch else gbs[0]) * column_rate(w, r, simd_bytes))
        + w.write_bytes / gbs[1]
        + w.reread_bytes / gbs[2]
    ) / 1e9
    comp = (w.elements * element_ns(w, r, lanes) + _combines_ns(w, r, lanes)) / busy * 1e-9
    return mem, comp


def streamed(w: CpuWork, m: CpuModel) -> bool:
    """Whether a stitched group's passes over a row run one after the other, each bound by its own
    memory or compute (its time the sum over passes of max(memory, compute)), rather than
    overlapping (max of the sums). A pass over a row too long to be re-read from L1 (the test of
    `reread_gbs`) is thousands of vector instructions, beyond the core's out-of-order window, so
    the first pass's stream from memory cannot hide under a later pass's `exp`s. bench/cpu
    (2026-11-24, one thread): softmax [64x30522] (122 KB rows) measured 1390 us, modeled 1025
    as max(sums) and 1245 as sum(max); softmax [6144x128] (512 B rows) 466, modeled 463 as
    max(sums), ~800 as sum(max).

    >>> from dataclasses import replace
    >>> w = CpuWork(M=64, N=30522, elements=64 * 30522, read_bytes=0, write_bytes=0, reread_bytes=64 * 30522 * 8)
    >>> streamed(replace(w, passes=(w, w)), CpuModel.nominal(2, 64)), streamed(w, CpuModel.nominal(2, 64))
    (True, False)
    """
    return bool(w.passes) and w.reread_bytes > CACHE_FILL * m.caches.l1 * max(w.M, 1)


def call_us(outputs: int) -> float:
    """The Python side of one call returning `outputs` arrays (CALL_US, OUTPUT_US)."""
    return CALL_US + OUTPUT_US * max(outputs - 1, 0)


def limit_us(compulsory_bytes: int, m: CpuModel, threads: int | None = None, outputs: int = 1) -> float:
    """What no plan of `compulsory_bytes` (inputs once, outputs once) beats on `threads` threads:
    the call, one parallel region's entry and the bytes at the best rate of the level they fit in,
    on every thread or on one (the mapper runs a kernel on one where the region's entry, a
    passive pool's wake-up, outweighs the split: schedule/cpu_cost.py `best_threads`)."""

    def on(t: int) -> float:
        best = max(m.gbs(compulsory_bytes, t), m.gbs(compulsory_bytes, t, write=True))
        return m.rates.fork(t) + compulsory_bytes / best / 1e3

    return call_us(outputs) + min(on(max(1, threads or m.cores)), on(1))
