"""Multi-stage asynchronous-copy pipelines of the K loop (ALCOP: Huang et al., arXiv 2210.16691).

A ROW/ALL contraction whose block holds ty > 1 rows that read one operand (isl: the read is
UNIFORM along aligned groups of ty consecutive rows, `contraction.shared_along_rows`; the
activation row x[m, :] of `x @ W.T` is read by the rows (m, n), ..., (m, n + ty - 1)) may stage
K slabs of that operand in shared memory with `__pipeline_memcpy_async`: `stages` slabs of
tx * vec elements, stages - 1 of them in flight while the block consumes one.

Before (stages = 1: every thread loads its own vector of the shared row)::

    for k < chunk / tx (isl: only the steps this thread owns):
        xv = x[i / N, g * vec : +vec];  acc += xv . w[i % N, g * vec : +vec]

After (stages = S; g = by * chunk + k * tx + tx, slab k = the block's x[i0 / N, (g - tx) * vec : +tx * vec])::

    copy slabs 0 .. S - 2; commit each                       (prologue)
    for k < chunk / tx (every thread, every step):
        copy slab k + S - 1 into stage (k + S - 1) % S; commit
        wait_prior(S - 1); __syncthreads()                   (slab k has landed, for all threads)
        if (i, g) is the thread's (isl's guard): xv = stage[k % S][tx * vec : +vec]; acc += ...
        __syncthreads()                                      (WAR: stage k % S is refilled next)
    wait_prior(0)                                            (drain)

Preconditions (`check`; rule 10 of mapping.replay; one negative test each in tests/test_pipeline.py):
  1. stages is one of STAGES;
  2. with stages > 1: an unstitched ROW/ALL group without a register tile (its rows sharing a
     read are the block's ty rows; a tile shares its operands in registers already);
  3. some contiguous read is shared by the block's ty > 1 rows (isl, as above): M > 1 rows use
     each slab, else staging only adds a copy;
  4. every staged read's row is aligned for its copies: the address minus j is a multiple of
     the copy's elements on the whole domain (isl), 4, 8 or 16 bytes (`copy_bytes`);
  5. the barriers sit in a loop of block-uniform trip count: the serial step k is the only
     serial factor of the g mapping and chunk is a multiple of tx, so every thread of the block
     runs chunk / tx steps; the thread's own bounds (isl's i < rows and g < N / vec, not
     uniform when K is not a multiple of the slab) only guard its body between the barriers.
A slab is tx * vec elements of at most 16 bytes per thread (at most 512 x 16 B = 8 KB), so 4
stages fit CUDA's 48 KB of static shared memory per block whatever the mapping.

The model (`choose`, after ALCOP's analytic model of §5): by Little's law an SM keeps
`gpu.in_flight_per_sm` bytes in flight to saturate DRAM; the register-direct loads keep
blocks x threads x bytes per thread; S stages add (S - 1) slabs per block, of which only the
share that is not an L2 re-read of another block's slab is DRAM traffic, while the S slabs of
shared memory may cost resident blocks. More stages win only where they save 3 % of the
kernel's modeled time; where direct loads already keep enough bytes in flight, 1.

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> a = lower(pn.placeholder((4, 512), name="x") @ pn.placeholder((64, 512), name="w").T,
...           stop_after="mappings", target="emulator")
>>> staged_reads(a.groups[0], a.mappings[0])
((0, 0),)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from ..errors import ScheduleError
from ..model.gpu import GPUSpec
from ..model.kernel_cost import KernelCost
from ..poly.access import AccessKind
from ..poly.bounded import proven_empty
from ..poly.program import KernelGroup
from ..poly.statement import Form
from .contraction import shared_along_rows
from .cost import in_flight
from .decision import Decision
from .derived import resident_per_sm
from .task import FactorKind

STAGES = (1, 2, 4)
COPY_SIZES = (16, 8, 4)  # bytes per __pipeline_memcpy_async, largest first


def _candidate(group: KernelGroup, d: Decision) -> bool:
    return (
        group.form in (Form.ROW, Form.ALL)
        and not group.stitched
        and d.rtile * d.ctile == 1
        and d.ty > 1
        and group.M > 1
    )


def staged_reads(group: KernelGroup, d: Decision) -> tuple[tuple[int, int], ...]:
    """(statement, read) of every contiguous read the block's ty rows share (isl)."""
    if not _candidate(group, d):
        return ()
    return tuple(
        (k, ri)
        for k, st in enumerate(group.statements)
        if group.accumulator_of[k] == k and st.M == group.M
        for ri, r in enumerate(st.reads)
        if r.memory
        and r.indirect is None
        and d.access[k][ri] == AccessKind.CONTIG
        and shared_along_rows(st, ri, 1, d.ty)
    )


def copy_bytes(group: KernelGroup, d: Decision, k: int, ri: int) -> int:
    """Bytes per asynchronous copy of read ri of statement k: the largest of 16, 8, 4 that
    divides the thread's vector and whose element count divides address - j everywhere on the
    domain (isl), so every copy is aligned; 0 if none."""
    st = group.statements[k]
    r = st.reads[ri]
    size = r.tensor.dtype.itemsize
    dom = st.domain.reset_tuple_id()
    ctx = dom.get_ctx()
    v = isl.make_zero_and_vars(["i", "j"], [], ctx=ctx)
    j = isl.PwAff.from_aff(isl.Aff.var_on_domain(isl.LocalSpace.from_space(dom.space), isl.dim_type.set, 1))
    rest = r.addr - j
    for b in COPY_SIZES:
        e = b // size
        if b % size or (d.vec * size) % b:
            continue
        if proven_empty(ctx, lambda e=e: rest.mod_val(isl.Val.int_from_si(ctx, e)).ne_set(v[0]) & dom):
            return b  # (isl's work is capped, poly/bounded.py: not aligned when it cannot tell)
    return 0


def slab_bytes(group: KernelGroup, d: Decision) -> int:
    """Shared memory one stage takes: tx * vec elements of every staged read."""
    return sum(d.tx * d.vec * group.statements[k].reads[ri].tensor.dtype.itemsize for k, ri in staged_reads(group, d))


def check(group: KernelGroup, d: Decision, at: str) -> None:
    """The preconditions of the module docstring; a ScheduleError naming the kernel otherwise."""
    if d.stages not in STAGES:
        raise ScheduleError(f"{at}: pipeline stages {d.stages} is not one of {list(STAGES)}")
    if d.stages == 1:
        return
    if not _candidate(group, d):
        raise ScheduleError(
            f"{at}: a {d.stages}-stage pipeline needs an unstitched ROW/ALL group without a register "
            f"tile and ty > 1 rows per block ({d.describe()})"
        )
    reads = staged_reads(group, d)
    if not reads:
        raise ScheduleError(f"{at}: no read is shared by the block's {d.ty} rows: nothing to pipeline")
    for k, ri in reads:
        if not copy_bytes(group, d, k, ri):
            raise ScheduleError(
                f"{at}: read {ri} of {group.statements[k].name} "
                f"({group.statements[k].reads[ri].tensor.name}) is not aligned to 4-byte copies"
            )
    serial = [f.index for f in d.tasks["g"].factors if f.kind == FactorKind.SERIAL]
    serial += [f.index for f in d.tasks["i"].factors if f.kind == FactorKind.SERIAL]
    if serial != ["k"] or d.chunk % d.tx:
        raise ScheduleError(
            f"{at}: the pipeline's barriers need a block-uniform step count: chunk {d.chunk} is not a "
            f"multiple of tx {d.tx} or the serial loops {serial} are not the one step k"
        )


@dataclass(frozen=True)
class Choice:
    """The model's pipeline decision: stages, and per candidate (stages, bytes in flight per
    SM, resident blocks per SM, modeled DRAM seconds)."""

    stages: int
    needed: float  # bytes in flight per SM that saturate DRAM (Little's law)
    options: tuple[tuple[int, float, int, float], ...]
    reason: str

    def describe(self) -> str:
        opts = ", ".join(f"{s}: {f / 1024:.1f} KB/SM x{b} blocks {t * 1e6:.2f} us" for s, f, b, t in self.options)
        return f"stages={self.stages} ({self.reason}; need {self.needed / 1024:.1f} KB/SM; {opts}; modeled)"


def choose(
    group: KernelGroup, gpu: GPUSpec, d: Decision, per_thread: float, dram_bytes: float, total_s: float
) -> Choice:
    """Stages for decision `d` (see the module docstring); `per_thread`: the bytes a thread's
    direct loads keep in flight, `dram_bytes`: the kernel's DRAM traffic, `total_s`: its modeled
    time with direct loads (a stage must save 3 % of it)."""
    needed = gpu.in_flight_per_sm
    slab = slab_bytes(group, d)
    present = max(1, math.ceil(d.blocks / gpu.sms))
    sms = min(gpu.sms, d.blocks)
    reads = staged_reads(group, d)
    if not reads or check_quiet(group, d):
        return Choice(1, needed, (), "no read shared by the block's rows to pipeline")
    staged = {group.statements[k].reads[ri].tensor.uid: group.statements[k].reads[ri].tensor for k, ri in reads}
    requested = d.blocks * (d.chunk // d.tx) * slab
    dram_share = min(1.0, sum(t.size * t.dtype.itemsize for t in staged.values()) / max(1, requested))
    options = []
    for s in STAGES:
        # the stages' shared memory and the registers the launch bounds leave (`derived.resident_per_sm`)
        blocks = min(present, resident_per_sm(gpu, d.threads, s * slab if s > 1 else 0, d.min_blocks))
        flight = blocks * (d.threads * per_thread + (s - 1) * slab * dram_share)
        options.append((s, flight, blocks, dram_bytes / gpu.bandwidth(max(1.0, flight * sms))))
    direct = options[0]
    if direct[1] >= needed:
        return Choice(1, needed, tuple(options), "direct loads already keep enough bytes in flight")
    best = direct
    for o in options[1:]:
        if o[3] < best[3] - 0.03 * total_s:
            best = o
    why = "more stages raise the bytes in flight" if best[0] > 1 else "stages add too little DRAM traffic in flight"
    return Choice(best[0], needed, tuple(options), why)


def check_quiet(group: KernelGroup, d: Decision) -> str:
    """`check`'s message for `d` with 2 stages, or '' when a pipeline is legal."""
    from dataclasses import replace

    try:
        check(group, replace(d, stages=2), "")
    except ScheduleError as e:
        return str(e)
    return ""


def explain_lines(group: KernelGroup, m: Decision, gpu: GPUSpec) -> list[str]:
    """explain()'s pipeline line of a kernel whose block rows share a read: the model's choice
    and the mapping's stages (forced by a schedule where they differ)."""

    if not staged_reads(group, m) or not isinstance(getattr(m, "cost", None), KernelCost):
        return []
    c = choose(group, gpu, m, in_flight(group, m), dict(m.cost.features).get("dram_bytes", 0.0), m.cost.total_s)
    forced = "" if c.stages == m.stages else f", stages={m.stages} as the schedule says"
    return [f"    pipeline (ALCOP, schedule/pipeline.py): model {c.describe()}{forced}"]
