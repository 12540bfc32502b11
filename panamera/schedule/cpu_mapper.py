"""The CPU mapper: one kernel group onto the cores and SIMD lanes of this machine, as data.

A reduction's kept loop runs over the cores (`#pragma omp parallel for`); its reduced loop over
the SIMD lanes (`#pragma omp simd reduction(...)`, or, for COLUMN, lanes along the contiguous
kept extent). A reduction whose outputs cannot occupy the cores (ALL, or few rows / column
blocks) is **split** when the CPU model (model/cpu.py, via schedule/cpu_cost.py) finds it faster:
its reduced extent is cut into `split` fixed chunks of `chunk` iterations, one task per
(output, chunk). The partials of an output are merged in one of two ways (`CpuMerge`, model/cpu.py;
`merge_mode` chooses by the model's price, `merge_us`):

- LAST: each task writes its partial and counts itself in the output's counter (an atomic
  fetch-add); the task that counts last combines the partials in chunk order and finishes the
  output: no barrier, no second pass, and deterministic;
- ATOMIC: each task combines its partial into the output's accumulator with an atomic
  compare-and-swap (std::atomic_ref); after the barrier each output is finished. No partials
  array; the order of the combines, hence the last bits of a float result, varies from run to run.

The partition is a function of the decision only, never of the number of threads that run it,
so LAST results are bit-identical for every thread count. (An ORDERED merge, the partials
combined in chunk order after a barrier, was deterministic as LAST is but waited at one barrier
more: no case where it was the right one; removed.)

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> g = lower(pn.sum(pn.placeholder((1 << 20,), "float32")), stop_after="groups", target="emulator").groups[0]
>>> map_cpu(g, CpuMachine(cores=2, simd_bytes=32, name="x")).describe()
'ALL M=1 N=1048576 split=2 chunk=524288 block=1 threads=2 lanes=8 merge=last prefetch=4096'
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from ..model.cpu import COLUMN_BLOCK_BYTES, CpuMerge, CpuModel, column_rows, merge_us
from ..poly.program import KernelGroup
from ..poly.statement import Form, StatementKind
from .cpu_lane_kind import LaneKind, group_vectors, lane_kind
from .cpu_prefetch import Prefetch, choose_prefetch
from .cpu_reuse import Reuse, choose
from .cpu_rows import choose_rows

if TYPE_CHECKING:
    from .cpu_contraction import GemmPlan

INNER = 4096  # reduced iterations per block of fresh accumulators (cpu_kernel.row_pass: the rounding of long rows)


@dataclass(frozen=True)
class CpuMachine:
    """What the mapper knows of the CPU: usable cores, SIMD register width in bytes, model name."""

    cores: int
    simd_bytes: int
    name: str

    @staticmethod
    @cache
    def detect() -> CpuMachine:
        """This process's machine: cores from its CPU affinity (capped by a valid OMP_NUM_THREADS),
        SIMD width from the /proc/cpuinfo flags (AVX-512: 64 bytes, AVX2: 32, else 16)."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
        if env.isdigit() and int(env) > 0:
            cores = min(cores, int(env))
        flags, name = set(), "unknown CPU"
        try:
            with open("/proc/cpuinfo") as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        for line in lines:
            key, _, value = line.partition(":")
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
            elif key.strip() == "model name" and name == "unknown CPU":
                name = value.strip()
        simd = 64 if "avx512f" in flags else 32 if "avx2" in flags else 16
        return CpuMachine(max(1, cores), simd, name)


@dataclass(frozen=True)
class CpuDecision:
    """Every decision the CPU codegen and runtime need for one kernel group.

    form: the canonical form; M, N: kept and reduced extents; split: chunks per reduction
    (1: none); chunk: reduced iterations per chunk; block: kept outputs per task (COLUMN, else
    1); threads: the most threads the kernel runs on (the model's choice, at most the cores: fewer
    where a parallel region's entry outweighs the split; a call asking for more runs on this many); lanes: SIMD lanes of the accumulator;
    merge: how a split reduction's partials are merged; inner: reduced iterations a task scans
    into fresh block accumulators before merging them into its own (the precision of long sums);
    reuse: values a stitched row stores in one pass and reads back in later ones
    (schedule/cpu_reuse.py); exp_le0: the exps of x - max(x) printed without the general exp's
    overflow select (schedule/cpu_exp_range.py)."""

    form: Form
    M: int
    N: int
    split: int
    chunk: int
    block: int
    threads: int
    lanes: int
    merge: CpuMerge = CpuMerge.NONE
    inner: int = INNER
    reuse: tuple[Reuse, ...] = ()
    rows: int = 1  # rows a stitched ROW pass scans at once (codegen/cpu_interleave.py; schedule/cpu_rows.py)
    gemm: GemmPlan | None = None  # a contraction run by the BLAS or the tile kernel (schedule/cpu_contraction.py)
    prefetch: Prefetch | None = None  # the first pass's rows prefetched ahead (schedule/cpu_prefetch.py)
    # each row pass's vector registers of lanes (W = that x lanes; schedule/cpu_lane_kind.py `group_vectors`)
    vectors: tuple[int, ...] = ()
    exp_le0: tuple[tuple[int, tuple], ...] = ()  # exps of x - max(x) (schedule/cpu_exp_range.py)
    # COLUMN: input rows a step adds into its blocks per load and store of them (model/cpu.py `column_rows`)
    column_rows: int = 1

    @property
    def tasks(self) -> int:
        """Parallel tasks of the main loop: (output block, chunk) pairs."""
        return math.ceil(self.M / self.block) * self.split

    def describe(self) -> str:
        if self.gemm is not None:
            return self.gemm.describe()
        return (
            f"{self.form} M={self.M} N={self.N} split={self.split} chunk={self.chunk} block={self.block} "
            f"threads={self.threads} lanes={self.lanes}"
            + (f" merge={self.merge}" if self.split > 1 else "")
            + "".join(f" reuse={r.ops}" for r in self.reuse)
            + (f" rows={self.rows}" if self.rows > 1 else "")
            + (f" column_rows={self.column_rows}" if self.column_rows > 1 else "")
            + (f" prefetch={self.prefetch.ahead}" if self.prefetch else "")
        )


def _lanes(group: KernelGroup, simd_bytes: int) -> int:
    """SIMD lanes of the group's widest register element: a reduction's accumulator, an
    argmax/argmin scanned as (value, 32-bit block offset) lanes (LaneKind.ARG) its value's (at
    least 4 bytes), not its 8-byte key's; a map's result."""
    sizes = [
        max(s.body.args[0].dtype.itemsize, 4) if lane_kind(s) == LaneKind.ARG else s.acc.itemsize
        for s in group.statements
        if s.kind == StatementKind.REDUCE and not s.acc.is_struct
    ]
    sizes += [s.result.dtype.itemsize for s in group.statements if s.kind == StatementKind.MAP]
    return max(1, simd_bytes // max(sizes, default=4))


def column_block(lanes: int, simd_bytes: int) -> int:
    """A COLUMN task's kept outputs: COLUMN_BLOCK_BYTES of accumulators of `lanes` to a
    `simd_bytes` register (a whole number of registers)."""
    return lanes * max(1, COLUMN_BLOCK_BYTES // simd_bytes)


def merge_mode(group: KernelGroup, split: int, deterministic: bool, price: Callable[[CpuMerge], float]) -> CpuMerge:
    """How a group split in `split` chunks merges its partials: not split, NONE; else the mode of
    least `price` (the model's, model/cpu.py `merge_us`, at the decision's outputs, tasks and
    threads) among those that apply, LAST on a tie. LAST always applies; ATOMIC where

    1. `deterministic` is off (its compare-and-swaps land in any order: a float sum's last bits
       vary from run to run), and
    2. every accumulator is a scalar (a struct one, Welford's or log-sum-exp's, is no word a
       compare-and-swap replaces).

    The model prices ATOMIC above LAST on every machine it knows (a CAS per output and task and
    two barriers, against a counter per task and a combine step per partial), so the mappers
    choose LAST; a probe or a machine whose rates made ATOMIC cheaper would have it chosen.

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> g = lower(pn.sum(pn.placeholder((1 << 20,), "float32")), stop_after="groups", target="emulator").groups[0]
    >>> cheap_cas = {CpuMerge.LAST: 2.0, CpuMerge.ATOMIC: 1.0}.get
    >>> [str(merge_mode(g, s, d, cheap_cas)) for s, d in ((1, False), (8, True), (8, False))]
    ['none', 'last', 'atomic']
    """
    if split <= 1:
        return CpuMerge.NONE
    modes = [CpuMerge.LAST]
    reductions = [s for s in group.statements if s.kind == StatementKind.REDUCE]
    if not deterministic and not any(s.acc.is_struct for s in reductions):  # 1, 2
        modes.append(CpuMerge.ATOMIC)
    return min(modes, key=price)


def map_cpu(
    group: KernelGroup,
    machine: CpuMachine,
    split: int | None = None,
    *,
    model: CpuModel | None = None,
    deterministic: bool = False,
    gemm: GemmPlan | None = None,
) -> CpuDecision:
    """The decision for one group; `split` overrides the chunks per reduction (clamped to N; the
    kernel then runs on every core), else the CPU `model` picks the threads and the split on them
    (default: nominal rates for `machine`); `deterministic`: a merge whose bits do not depend on
    the threads or the run. A contraction schedule/cpu_blas.py's rule accepts is decided here too,
    once, on every core: the BLAS or the tile kernel (`gemm`: schedule/cpu_contraction.py), or given as
    `gemm` where the grouping already made it (`cpu_plans`)."""
    form, M, N = group.form, group.M, group.N
    lanes = _lanes(group, machine.simd_bytes)
    model = model or CpuModel.nominal(machine.cores, machine.simd_bytes, machine.name)
    from .cpu_contraction import plan_gemm
    from .cpu_cost import work
    from .cpu_exp_range import nonpositive_exps

    if (gemm := gemm or plan_gemm(group, model, machine.cores, deterministic)) is not None:
        return CpuDecision(form, M, N, 1, N, 1, gemm.threads, 1, gemm=gemm)
    block = min(M, column_block(lanes, machine.simd_bytes)) if form == Form.COLUMN else 1
    reuse = choose(group, model)
    threads = machine.cores
    if split is not None and form != Form.MAP and not group.stitched:
        s = min(split, N)
    else:  # the CPU model's choice (schedule/cpu_cost.py, model/cpu.py): threads, and the split on them
        from .cpu_cost import best_threads

        threads, s = best_threads(group, model, lanes, block, reuse, splits=form != Form.MAP and not group.stitched)
    chunk = math.ceil(N / s)
    if s > 1:  # chunks start on whole SIMD vectors
        chunk = math.ceil(chunk / lanes) * lanes
        s = math.ceil(N / chunk)
    tasks = math.ceil(M / block) * s
    merge = merge_mode(group, s, deterministic, lambda mode: merge_us(mode, model.rates, M, tasks, s, threads, lanes))
    rows = choose_rows(group, s, lanes, reuse, model)  # schedule/cpu_rows.py: short rows side by side
    prefetch = choose_prefetch(group, model, threads)  # schedule/cpu_prefetch.py: rows from beyond L2
    le0 = nonpositive_exps(group)  # schedule/cpu_exp_range.py: exp(x - max(x)) without its overflow select
    col_rows = column_rows(work(group, block=block), machine.simd_bytes) if form == Form.COLUMN else 1
    return CpuDecision(
        form, M, N, s, chunk, block, threads, lanes, merge, reuse=reuse, rows=rows, prefetch=prefetch,
        vectors=group_vectors(group), exp_le0=le0, column_rows=col_rows,
    )  # fmt: skip
