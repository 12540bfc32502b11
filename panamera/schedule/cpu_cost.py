"""A kernel group's demands on the CPU (`work`), the split and the threads the CPU model picks
(`best_split`, `best_threads`) and a whole CPU plan's modeled time against its limit
(`plan_time`): model/cpu.py's formulas applied to schedule/cpu_mapper.py's decisions.

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> from panamera.model.cpu import CpuModel
>>> g = lower(pn.sum(pn.exp(pn.placeholder((8, 4096), "float32")), axis=1), stop_after="groups",
...           target="emulator").groups[0]
>>> w = work(g)
>>> w.elements, w.read_bytes, w.write_bytes, w.transcendental
(32768, 131072, 32, 1.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..algebra import WELFORD
from ..model.cpu import (
    DIVISION,
    FREE,
    TRANSCENDENTAL,
    CpuModel,
    CpuWork,
    KernelTime,
    call_us,
    kernel_time,
    limit_us,
)
from ..poly.program import KernelGroup
from ..poly.statement import Form, StatementKind
from ..poly.stitch import levels
from .cpu_lane_kind import LaneKind, group_vectors, lane_kind
from .cpu_reuse import Reuse, saved_by_statement

# Cheap operations that take more than one SIMD instruction (fitted here against a plain sum:
# a NaN-propagating max / min is a compare and a blend; an argmax key orders the float's bits
# and packs the index), for the body's operations and the reduction's combine.
OP_WEIGHT = {"maximum": 2.0, "minimum": 2.0, "argkey_max": 2.0, "argkey_min": 2.0}
COMBINE_WEIGHT = {"max": 2.0, "min": 2.0}
# A float16 value converted to or from float (runtime/cuda_emulation.h: exact, branch-free, about
# ten integer SIMD instructions; bfloat16 is one shift) costs this many cheap operations more: a
# float16 load, store or rounding cast. Fitted on softmax 64x30522 float16 against bfloat16.
F16_CONVERT = 2.0
# A float16 store (pn_emu_f2h: the rounding in float arithmetic, then the bits; ~12 instructions
# where the load's pn_emu_h2f has ~12 and the former integer rounding ~25): layer_norm 1024x768
# float16's kernel measured 949 -> 840 us on one thread when the store became this.
F16_STORE = 1.0
# An argmax/argmin scanned in (value, offset) lanes (LaneKind.ARG: two compares and an and on the
# value, a blend of the value and of its 32-bit offset in the block; the keys only once a block) costs this
# many cheap operations an element at the value's width, not the key's: argmax [64x30522] float32
# measured 327 us on one thread (bench/cpu, 2026-11-24), modeled 876 with the per-element key.
ARG_LANE_OPS = 3.0
MIN_TASK_ITERATIONS = 1024  # a split chunk keeps at least this many reduced iterations (whole vectors)


def _ops(body, reads, on_chip, reciprocal: bool = False) -> tuple[float, float, float]:
    """Operations per element of `body`: those that depend on a value loaded from memory (what
    depends only on constants and the group's own results, such as a row's 1/sqrt(sum), is
    hoisted out of the SIMD loop by the compiler). `reciprocal`: a float division by such a
    value is a product with its reciprocal (a stitched row's later passes, codegen/cpu_kernel.py)."""
    varying: set[int] = set()
    cheap = trans = div = 0.0
    for e in body.walk():
        if e.op == "load" and reads[e.read].memory and reads[e.read].tensor.uid not in on_chip:
            varying.add(id(e))
            cheap += F16_CONVERT if reads[e.read].tensor.dtype.name == "float16" else 0.0
        elif any(id(a) in varying for a in e.args):
            varying.add(id(e))
        if e.op in FREE or id(e) not in varying:
            continue
        if e.op == "cast" and e.dtype.name == "float16":
            cheap += 2 * F16_CONVERT  # to float16 and back
        if e.op in TRANSCENDENTAL:
            trans += 1
        elif reciprocal and e.op == "div" and e.dtype.is_float and id(e.args[1]) not in varying:
            cheap += 1
        elif e.op in DIVISION:
            div += 1
        else:
            cheap += OP_WEIGHT.get(e.op, 1.0)
    return cheap, trans, div


def _width(s) -> int:
    """The bytes of a reduction's SIMD lanes: its accumulator's, an ARG lane's value's."""
    return s.body.args[0].dtype.itemsize if lane_kind(s) == LaneKind.ARG else s.acc.itemsize


def work(
    g: KernelGroup, reuse: tuple[Reuse, ...] = (), rows: int = 1, prefetch: bool = False, block: int = 0
) -> CpuWork:
    """What group `g` asks of the CPU: its iterations, compulsory bytes and operations per element;
    `reuse` (schedule/cpu_reuse.py): values later passes read back instead of recomputing. A
    stitched group's passes over a row are also given one by one (`CpuWork.passes`); `rows`: the
    rows a pass scans at once (schedule/cpu_rows.py); `prefetch`: the first pass's reads prefetched
    (schedule/cpu_prefetch.py); `block`: a COLUMN task's kept outputs (the decision's, cpu_mapper.py
    `column_block`; 0: not known), which with its accumulators sets its read rate (model/cpu.py
    `column_rate`)."""
    stmts = g.statements
    on_chip = g.on_chip
    inputs: dict[int, int] = {}
    for s in stmts:
        for r in s.reads:
            if r.memory and r.tensor.uid not in on_chip:
                inputs[r.tensor.uid] = r.tensor.size * r.tensor.dtype.itemsize
    read_by_group = {r.tensor.uid for s in stmts for r in s.reads}
    writes = [
        s.result.size * s.result.dtype.itemsize
        if not (g.stitched or g.epilogue) or s.result.uid in g.external or s.result.uid not in read_by_group
        else 0
        for s in stmts
    ]
    space = max(g.M * g.N, 1)  # operations per point of the group's M x N space, over its statements
    lv = levels(stmts) if g.stitched else {}
    passes = max(lv.values(), default=0) + 1
    ops = [[0.0, 0.0, 0.0] for _ in range(passes)]  # cheap, transcendental, division per pass
    for s in stmts:
        share = math.prod(s.extents) / space
        body = s.body
        if s.kind == StatementKind.MAP and s.result.dtype.name == "float16":  # its store (and no final cast)
            body = body.args[0] if body.op == "cast" and body.args[0].dtype.compute == "float" else body
        c, t, d = _ops(body, s.reads, on_chip, s.kind == StatementKind.MAP and lv.get(s.name, 0) > 0)
        c += F16_STORE if s.kind == StatementKind.MAP and s.result.dtype.name == "float16" else 0.0
        if s.kind == StatementKind.REDUCE and lane_kind(s) == LaneKind.ARG:  # the value's ops, then the lanes'
            c, t, d = _ops(s.body.args[0], s.reads, on_chip)
            c += ARG_LANE_OPS
        elif s.kind == StatementKind.REDUCE:  # the combine; a sum of products is one FMA a product
            fma = s.combiner.name == "sum" and s.body.op == "mul"
            c += 0.0 if fma else COMBINE_WEIGHT.get(s.combiner.name, 1.0)
        o = ops[lv.get(s.name, 0)]
        o[0], o[1], o[2] = o[0] + c * share, o[1] + t * share, o[2] + d * share
    row_bytes = sum(inputs.values())
    firsts, rereads, seen = [0] * passes, [0] * passes, set()
    for p in range(passes):  # an input's first pass reads it from memory, a later one from cache
        for uid in dict.fromkeys(r.tensor.uid for s in stmts if lv.get(s.name, 0) == p for r in s.reads):
            if uid in inputs:
                (rereads if uid in seen else firsts)[p] += inputs[uid]
                seen.add(uid)
    shares = [
        max((math.prod(s.extents) / space for s in stmts if lv.get(s.name, 0) == p), default=0.0) for p in range(passes)
    ]
    for k, (c, t, d, kept) in saved_by_statement(g, reuse).items():  # the scratch rows and the ops they save
        o = ops[lv.get(stmts[k].name, 0)]
        o[0], o[1], o[2] = max(o[0] - c, 0.0), max(o[1] - t, 0.0), max(o[2] - d, 0.0)
        rereads[lv.get(stmts[k].name, 0)] += kept
    struct_at = {lv.get(stmts[k].name, 0) for k in g.accumulators if _struct(stmts[k])}
    struct_ops = [(1.0, 0.0)] * passes  # per pass, the costliest scalar combine of a struct accumulator
    for k in g.accumulators:
        if _struct(stmts[k]):
            c, p = stmts[k].combiner, lv.get(stmts[k].name, 0)
            struct_ops[p] = max(struct_ops[p], (float(c.merge_instructions), float(c.merge_transcendentals)))
    vectors = group_vectors(g)  # the registers of lanes each pass's reductions fold
    combines = [0] * passes
    for k in g.accumulators:
        combines[lv.get(stmts[k].name, 0)] += 1 if g.form in (Form.ROW, Form.ALL) else 0
    width = max((_width(s) for s in stmts if s.kind == StatementKind.REDUCE and not s.acc.is_struct), default=4)
    # an output row that is a kept value's scratch row (cpu_reuse.py `Reuse.into`) streams out in the producer's pass
    written_in = {x.into: lv.get(stmts[x.producer].name, 0) for x in reuse if x.into is not None}
    one = [
        CpuWork(
            M=g.M,
            N=g.N,
            elements=round(g.M * g.N * shares[p]),  # a pass of one value per row (a loss): M elements
            read_bytes=firsts[p],
            write_bytes=sum(b for k, b in enumerate(writes) if written_in.get(k, lv.get(stmts[k].name, 0)) == p),
            cheap=ops[p][0] / max(shares[p], 1e-12),
            transcendental=ops[p][1] / max(shares[p], 1e-12),
            division=ops[p][2] / max(shares[p], 1e-12),
            reread_bytes=max(rereads[p], 0),
            struct=p in struct_at,
            struct_ops=struct_ops[p],
            width=width,
            row_combines=combines[p],
            rows=rows,
            vectors=vectors[p],
            prefetch=prefetch and p == 0,
        )
        for p in range(passes)
    ]
    return CpuWork(
        M=g.M,
        N=g.N,
        elements=g.M * g.N,
        read_bytes=row_bytes,
        write_bytes=sum(writes),
        cheap=sum(o[0] for o in ops),
        transcendental=sum(o[1] for o in ops),
        division=sum(o[2] for o in ops),
        reread_bytes=max(sum(rereads), 0),
        struct=bool(struct_at),
        struct_ops=max(struct_ops),
        width=width,
        row_combines=sum(combines),
        rows=rows,
        vectors=vectors[0] if passes == 1 else max(vectors),
        passes=tuple(one) if passes > 1 else (),
        prefetch=prefetch,
        column=g.form == Form.COLUMN,
        accumulators=max(1, len(g.accumulators)),
        block=block if g.form == Form.COLUMN else 0,
    )


def _struct(s) -> bool:
    """An accumulator whose combine does not vectorize (Welford is a declared reduction in lanes)."""
    return s.acc.is_struct and s.combiner.name != WELFORD.name


def time_of(g: KernelGroup, d, m: CpuModel, threads: int | None = None) -> KernelTime:
    """The modeled time of group `g` run as decision `d` (schedule/cpu_mapper.py's CpuDecision) on
    `threads` threads: a contraction the decision gives to the BLAS or the tile kernel (`d.gemm`,
    schedule/cpu_contraction.py) at that kernel's modeled time, the choice read, not made again;
    any other group as a generated kernel, its split's partials merged as the decision's `merge`."""
    if d.gemm is not None:
        return d.gemm.time(m, threads)
    t = min(max(1, threads or m.cores), d.threads)  # a call's threads, capped at the decision's
    w = work(g, d.reuse, d.rows, d.prefetch is not None, d.block)
    return kernel_time(w, m, d.tasks, d.split, t, d.lanes, d.merge)


def best_split(g: KernelGroup, m: CpuModel, lanes: int, block: int, threads: int | None = None) -> int:
    """The chunks per output the model finds fastest on `threads` threads (default: every core):
    1, or a multiple of the threads (a static schedule gives each thread whole chunks) while a
    chunk keeps at least MIN_TASK_ITERATIONS iterations (COLUMN: that many elements over its
    block); ties keep fewer."""
    nt = max(1, threads or m.cores)
    if nt <= 1:
        return 1
    w = work(g, block=block)
    outputs = math.ceil(g.M / block)
    min_chunk = max(lanes, math.ceil(MIN_TASK_ITERATIONS / block))
    best, best_t = 1, kernel_time(w, m, outputs, 1, nt, lanes).total_us
    s = nt
    while s <= 64 and g.N // s >= min_chunk:
        t = kernel_time(w, m, outputs * s, s, nt, lanes).total_us
        if t < best_t * 0.98:
            best, best_t = s, t
        s *= 2
    return best


def best_threads(
    g: KernelGroup, m: CpuModel, lanes: int, block: int, reuse: tuple[Reuse, ...] = (), splits: bool = True
) -> tuple[int, int]:
    """(threads, split): the thread count the model finds fastest for group `g`, each with its best
    split (`best_split`; 1 where `splits` is off: element-wise and stitched groups). Every core unless fewer (halving down to 1) win by 2 %: a kernel whose parallel
    region's entry (the probe's fork_us: with a passive OpenMP pool, a wake-up of its threads)
    outweighs what splitting its work saves runs on fewer threads.

    >>> import dataclasses, panamera as pn
    >>> from panamera.compiler import lower
    >>> from panamera.model.cpu import CpuModel
    >>> lw = lambda n: lower(pn.sum(pn.placeholder((n,), "float32")), stop_after="groups", target="emulator").groups[0]
    >>> m = CpuModel.nominal(cores=2, simd_bytes=64)
    >>> woken = dataclasses.replace(m, rates=dataclasses.replace(m.rates, fork_us=(0.2, 40.0)))
    >>> best_threads(lw(1280), woken, 16, 1), best_threads(lw(1 << 20), woken, 16, 1)
    ((1, 1), (2, 2))
    """
    outputs = math.ceil(g.M / block)
    w = work(g, reuse, block=block)
    best = None
    t = max(1, m.cores)
    while True:
        s = best_split(g, m, lanes, block, t) if splits else 1
        took = kernel_time(w, m, outputs * s, s, t, lanes).total_us
        if best is None or took < best[2] * 0.98:
            best = (t, s, took)
        if t == 1:
            return best[0], best[1]
        t = max(1, t // 2)


@dataclass(frozen=True)
class PlanTime:
    """A CPU plan's modeled time: per kernel and in total, and the limit, in microseconds."""

    kernels: tuple[KernelTime, ...]
    total_us: float
    limit_us: float

    @property
    def ratio(self) -> float:
        return self.total_us / self.limit_us if self.limit_us else math.inf


def plan_time(pairs, m: CpuModel, compulsory_bytes: int, threads: int | None = None, outputs: int = 1) -> PlanTime:
    """The modeled time of a call of ((group, decision), ...) returning `outputs` arrays on
    `threads` threads (default: every core); the limit of `compulsory_bytes` (the program's
    inputs and outputs, each once)."""
    ks = tuple(time_of(g, d, m, threads) for g, d in pairs)
    total = call_us(outputs) + sum(k.total_us for k in ks)
    return PlanTime(ks, total, limit_us(compulsory_bytes, m, threads, outputs))
