"""The CPU mapping of a symbolic program's kernels per size class (issues 22 and 24).

A kernel of a parametric program (poly/params.py, poly/param_stitch.py) runs on the CPU as the
static CPU target runs a group (schedule/cpu_mapper.py): kept outputs over the cores, the reduced
loop over the SIMD lanes, and a reduction whose outputs cannot occupy the cores split into
`split` chunks per output, merged as `cpu_mapper.merge_mode` says. On a CPU no vector width needs
a proof (`#pragma omp simd` loops have scalar tails), so a class is only a power-of-two range per
symbol (schedule/size_class.py, no alignment), and the one decision that depends on the sizes is
the split. It is chosen by the CPU model (model/cpu.py) once per class: the candidate (1, or a
multiple of the cores, as `cpu_cost.best_split`) whose worst ratio to the best candidate over the
class's smallest, representative and largest sizes is least: robust over the class, as the GPU
classes are (schedule/param_mapping.py). The chunk length is computed from the bound N at run
time (whole SIMD vectors), so one kernel serves every size of the class. The threads are chosen
with it, as the static mapper's `best_threads` chooses them: every core unless fewer are as fast
over the class (a kernel whose parallel region's entry outweighs its work runs on one thread, and
then opens no region at all: codegen/cpu_region.py). The lanes are the static mapper's
(`cpu_mapper._lanes` of the model's SIMD width: the probe's, the same figure a static kernel uses);
long rows of cheap reductions scan in W = LANE_VECTORS x lanes accumulators as the static kernels
do (`lane_scan`, decided here from the class's smallest rows, carried to the codegen as data).

>>> import panamera as pn
>>> from panamera.poly.params import build
>>> from panamera.model.cpu import CpuModel
>>> from panamera.schedule.size_class import SizeClass
>>> p = build((pn.sum(pn.placeholder(("N",), name="x")),))
>>> m = CpuModel.nominal(4, 32)
>>> map_cpu_group(p.statements, "single", SizeClass.of({"N": 1 << 20}, frozenset()), m, False).describe()
'ALL split=4 block=1 threads=4 lanes=8 merge=last lane_scan=32'
>>> map_cpu_group(p.statements, "single", SizeClass.of({"N": 100}, frozenset()), m, False).describe()
'ALL split=1 block=1 threads=4 lanes=8'
>>> import dataclasses  # a machine whose parallel region wakes its threads: short rows on one thread
>>> woken = dataclasses.replace(m, rates=dataclasses.replace(m.rates, fork_us=(0.2, 40.0)))
>>> map_cpu_group(p.statements, "single", SizeClass.of({"N": 100}, frozenset()), woken, False).describe()
'ALL split=1 block=1 threads=1 lanes=8'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

from ..algebra import WELFORD
from ..frontend import symbolic
from ..model.cpu import LANE_VECTORS, CpuModel, CpuWork, KernelTime, kernel_time
from ..poly.params import PStatement
from ..poly.statement import Form, StatementKind
from .cpu_cost import MIN_TASK_ITERATIONS, _ops
from .cpu_lane_kind import LANE_TYPES, LaneKind, lane_kind
from .cpu_mapper import INNER, CpuMerge, _lanes, column_block, merge_mode
from .cpu_param_reuse import choose as choose_reuse
from .cpu_reuse import Reuse
from .size_class import SizeClass

MAX_SPLIT = 64  # chunks per output at most (cpu_cost.best_split's bound)
# A row scan in W = LANE_VECTORS x lanes accumulators (`lane_scan`) where each row of the class has at
# least this many groups of W: measured on the AMD EPYC (AVX2, W 32, 1 thread, thread_time medians
# of 11, 2026-11-25 10:31-10:35 UTC, load ~12): sum [64x30522] 745 us vs 868 one accumulator,
# [8x128256] 217 vs 265, rms_norm [1024x512] 272 vs 336; rows of 128 lose (sum [6144x128] 436 vs
# 226, max 1045 vs 460: the lanes' start and fold per row, unknown trip counts).
LANE_MIN_GROUPS = 16


@dataclass(frozen=True)
class CpuParamDecision:
    """One kernel's CPU decision for a size class: `split` chunks per output (1: none, chunk
    length from N at run time), `block` kept outputs per COLUMN task (1 otherwise), `threads` the
    most threads it runs on (a call asking for more runs on this many; 1: no parallel region), `lanes` of
    the accumulator, `merge` of a split's partials, `inner` reduced iterations per block of fresh
    accumulators (cpu_kernel.row_pass: the rounding of long rows); `modeled_us` at the class's
    representative size."""

    statement: str
    form: Form
    kind: str  # the kernel's kind (poly/param_stitch.py): single, stitched, epilogue or siblings
    split: int
    block: int
    lanes: int
    merge: CpuMerge = CpuMerge.NONE
    inner: int = INNER
    modeled_us: float = 0.0
    threads: int = 1
    lane_scan: int = 0  # W lane accumulators of a scalar row scan (codegen/cpu_param_kernel.py `lanes`); 0: one
    reuse: tuple[Reuse, ...] = ()  # values the MAP reads back from its output row (schedule/cpu_param_reuse.py)
    arg_lanes: bool = False  # the lane_scan keeps (value, index) per lane, not a key per element (`arg_lanes`)

    def describe(self) -> str:
        merge = f" merge={self.merge}" if self.split > 1 else ""
        scan = f" lane_scan={self.lane_scan}" if self.lane_scan else ""
        scan += "".join(f" keep={x.ops}" for x in self.reuse)
        return (
            f"{self.form} split={self.split} block={self.block} threads={self.threads} lanes={self.lanes}{merge}{scan}"
        )


@dataclass(frozen=True)
class CpuClassPlan:
    """Every kernel's CPU decision for one size class."""

    cls: SizeClass
    decisions: tuple[CpuParamDecision, ...]

    @property
    def modeled_us(self) -> float:
        """The kernels' modeled time at the class's representative size (the call excluded)."""
        return sum(d.modeled_us for d in self.decisions)

    def describe(self) -> str:
        rep = ", ".join(f"{k}={v}" for k, v in self.cls.representative().items())
        kernels = "; ".join(f"{d.statement}: {d.describe()}" for d in self.decisions)
        return f"class {self.cls.describe()} (planned at {rep}, {self.modeled_us:.1f} us modeled): {kernels}"


def _at(extent, sizes: dict[str, int]) -> int:
    return symbolic.evaluate((extent,), sizes)[0]


def param_work(members: tuple[PStatement, ...], kind: str, sizes: dict[str, int]) -> CpuWork:
    """What a parametric kernel asks of the CPU at `sizes` (schedule/cpu_cost.py's `work` for a
    static group): iterations, compulsory bytes (inputs once, every member's result once), the
    operations per element on loaded values, and a stitched group's re-reads of its row."""
    own = {m.result.uid for m in members}
    lead = members[0]
    M, N = _at(lead.M, sizes), _at(lead.N, sizes)  # noqa: N806
    inputs = {
        r.tensor.uid: math.prod(symbolic.evaluate(r.tensor.shape, sizes)) * r.tensor.dtype.itemsize
        for m in members
        for r in m.reads
        if r.tensor.uid not in own and r.memory
    }
    write = sum(math.prod(symbolic.evaluate(m.result.shape, sizes)) * m.result.dtype.itemsize for m in members)
    space = max(M * max(N, 1), 1)
    cheap = trans = div = 0.0
    for m in members:
        share = math.prod(symbolic.evaluate(m.shape, sizes)) / space
        reads = [SimpleNamespace(memory=True, tensor=r.tensor) for r in m.reads]
        c, t, d = _ops(m.body, reads, own)
        if m.kind == StatementKind.REDUCE:
            fma = m.combiner.name == "sum" and m.body.op == "mul"
            c += 0.0 if fma else (2.0 if m.combiner.name in ("max", "min") else 1.0)
        cheap, trans, div = cheap + c * share, trans + t * share, div + d * share
    reds = [m for m in members if m.kind == StatementKind.REDUCE]
    passes = len({m.accumulator_key() for m in reds}) + 1 if kind == "stitched" else 1
    row = sum(inputs.values())
    return CpuWork(
        M=M,
        N=N,
        elements=M * N if reds else M,
        read_bytes=row,
        write_bytes=write,
        cheap=cheap,
        transcendental=trans,
        division=div,
        reread_bytes=(passes - 1) * row,
        struct=any(m.acc.is_struct and m.combiner.name != WELFORD.name for m in reds),
        width=max((m.acc.itemsize for m in reds if not m.acc.is_struct), default=4),
        column=lead.form == Form.COLUMN,  # its reads at the probe's column rate, as cpu_cost.work's
    )


def block_of(members: tuple[PStatement, ...], lanes: int, simd_bytes: int) -> int:
    """A COLUMN task's kept outputs (a compile-time constant: whole rows of accumulators in L1,
    cpu_mapper.column_block; the last block is clipped to M at run time)."""
    return column_block(lanes, simd_bytes) if members[0].form == Form.COLUMN else 1


def time_at(
    members,
    kind: str,
    sizes: dict[str, int],
    split: int,
    block: int,
    lanes: int,
    m: CpuModel,
    threads=None,
    merge: CpuMerge = CpuMerge.LAST,
) -> KernelTime:
    """The modeled time of the kernel at `sizes` with `split` chunks per output, merged as `merge`."""
    w = param_work(members, kind, sizes)
    if w.elements == 0:
        return KernelTime(0.0, 0.0, 0.0, 0.0, 0.0, "L2", 0)
    s = max(1, min(split, w.N)) if w.N else 1
    tasks = math.ceil(w.M / min(block, max(w.M, 1))) * s
    return kernel_time(w, m, tasks, s, threads, lanes, merge)


def candidates(
    members: tuple[PStatement, ...], kind: str, cls: SizeClass, m: CpuModel, lanes: int, block: int, threads=None
) -> list[int]:
    """The splits worth comparing on `threads` threads (default: every core): 1 (and only 1 for a
    MAP, a stitched group and a single thread), else multiples of the threads up to MAX_SPLIT
    whose chunks keep MIN_TASK_ITERATIONS iterations (a COLUMN chunk: that many elements over its
    block of outputs; whole vectors) at the class's largest sizes, as `cpu_cost.best_split`."""
    lead, nt = members[0], max(1, threads or m.cores)
    if lead.kind == StatementKind.MAP or kind == "stitched" or nt <= 1:
        return [1]
    up = cls.upper()
    n_max, outputs = _at(lead.N, up), max(1, min(block, _at(lead.M, up)))
    min_chunk = max(lanes, math.ceil(MIN_TASK_ITERATIONS / outputs))
    out, s = [1], nt
    while s <= MAX_SPLIT and n_max // s >= min_chunk:
        out.append(s)
        s *= 2
    return out


def thread_counts(m: CpuModel) -> list[int]:
    """The thread counts compared: every core, halved down to 1 (as `cpu_cost.best_threads`)."""
    out, t = [], max(1, m.cores)
    while True:
        out.append(t)
        if t == 1:
            return out
        t = max(1, t // 2)


def lane_scan(members: tuple[PStatement, ...], cls: SizeClass, lanes: int) -> int:
    """W = LANE_VECTORS x lanes lane accumulators for the kernel's row scans, or 0 (one accumulator):
    a ROW or ALL reduction whose accumulators are scalars of LANE_TYPES, whose reduced bodies are
    cheap (no transcendental, no division per element: an exp-bound scan gains nothing, measured),
    and whose rows have at least LANE_MIN_GROUPS groups of W at the class's smallest sizes."""
    w = LANE_VECTORS * lanes
    reds = [m for m in members if m.kind == StatementKind.REDUCE]
    if not reds or members[0].form == Form.COLUMN:
        return 0
    if any(m.acc.is_struct or m.acc.compute not in LANE_TYPES for m in reds):
        return 0
    own = {m.result.uid for m in members}
    for m in reds:
        _, trans, div = _ops(m.body, [SimpleNamespace(memory=True, tensor=r.tensor) for r in m.reads], own)
        if trans or div:
            return 0
    n_min = min(_at(members[0].N, z) for z in cls.samples())
    return w if n_min >= LANE_MIN_GROUPS * w else 0


def arg_lanes(members: tuple[PStatement, ...], scan: int) -> bool:
    """Whether a lane scan (`scan` = W > 0) of an argmax/argmin keeps per lane its best value and
    index in the value's own type: one ROW or ALL reduction of LaneKind.ARG, the static kernels'
    rule (schedule/cpu_lane_kind.py `lane_kind`; codegen/cpu_lanes.py `arg_lane`). Otherwise each
    element packs an int64 key, which AVX2 compares in scalar."""
    if not scan or len(members) != 1 or members[0].kind != StatementKind.REDUCE or members[0].form == Form.COLUMN:
        return False
    return lane_kind(members[0]) == LaneKind.ARG


def map_cpu_group(
    members: tuple[PStatement, ...],
    kind: str,
    cls: SizeClass,
    m: CpuModel,
    deterministic: bool,
    split: int | None = None,
) -> CpuParamDecision:
    """The class's decision for one kernel: `split` forced (an override for tests and
    experiments, 1 for kernels that cannot split; on every core), else the (threads, split) pair
    with the least worst ratio to the best over the class's sample sizes; ties keep more threads
    (a region's entry is only skipped where the model finds it costs), then fewer chunks."""
    lead = members[0]
    group = SimpleNamespace(statements=members)
    lanes = _lanes(group, m.simd_bytes)
    block = block_of(members, lanes, m.simd_bytes)
    if split is not None:
        can = lead.kind != StatementKind.MAP and kind != "stitched"
        threads, best = max(1, m.cores), (max(1, min(split, MAX_SPLIT)) if can else 1)
    else:
        samples = cls.samples()
        options = [(t, s) for t in thread_counts(m) for s in candidates(members, kind, cls, m, lanes, block, t)]
        times = {o: [time_at(members, kind, z, o[1], block, lanes, m, o[0]).total_us for z in samples] for o in options}
        floor = [min(times[o][k] for o in options) for k in range(len(samples))]

        def worst(o: tuple[int, int]) -> float:
            return max(t / f if f > 0 else 1.0 for t, f in zip(times[o], floor))

        threads, best = min(options, key=lambda o: (round(worst(o), 2), -o[0], o[1]))
    z = cls.representative()
    merge = merge_mode(  # priced at the representative size (model/cpu.py `merge_us`)
        group,
        best,
        deterministic,
        lambda mode: time_at(members, kind, z, best, block, lanes, m, threads, mode).merge_us,
    )
    rep = time_at(members, kind, z, best, block, lanes, m, threads, merge).total_us
    return CpuParamDecision(
        "+".join(s.name for s in members), lead.form, kind, best, block, lanes,
        merge, INNER, rep, threads, scan := lane_scan(members, cls, lanes),
        choose_reuse(members, kind, cls, m), arg_lanes(members, scan),
    )  # fmt: skip
