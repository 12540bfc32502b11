"""Rows kept on chip: a stitched group's later passes read the values its block loaded in pass 0.

A stitched group (poly/stitch.py) makes one pass over each row per level: softmax reads x for
its max and sum (pass 0), then again for exp(x - max) / sum (pass 1). Kept on chip, pass 0
leaves each thread's loaded vectors where pass 1 finds them, and x crosses DRAM once:

    before:  pass 0: v = x[o, g]; acc = lse(acc, v)         pass 1: v = x[o, g]; out = f(v, acc)
    after:   pass 0: row[k] = x[o, g]; acc = lse(acc, row[k])   pass 1: out = f(row[k], acc)

where g = by * chunk + k * tx + tx is the thread's k-th vector of the row (schedule/mapping.py's
binding) and the k loop is unrolled in full, so that `row[k]` names registers. The mapper decides
where the block's chunk lives (`Residence`, frozen on the decision as `onchip`):

  REGISTERS  `T row[steps][vec]` per thread: at most `REGISTER_VALUES` values per thread, and
             the kernel asks ptxas for their registers (`Decision.min_blocks`: fewer blocks per
             SM, so `REGISTER_VALUES` + `REGISTER_OTHERS` = 128 registers each);
  SHARED     `__shared__ T rows[ty][steps][tx][vec]` (each thread reads back only what it
             wrote: no barrier), at most `SHARED_BYTES` per block (static shared memory);
  MEMORY     the plan re-reads the row (before this module).

The cost (schedule/cost.py `stitched_cost`) then counts only the bytes really re-read: the
later passes' reads of the tensors not kept, and the occupancy the residence leaves.

Preconditions (`check`; one negative test each in tests/test_onchip.py):
  1. a stitched group with more than one pass, rows unsplit by a register tile (rtile = ctile = 1),
     neither with column partials nor a persistent row loop (schedule/persistent.py: its later
     passes re-read the row from L2 by design, and its column pass has no kept-row loop);
  2. vectors of at least two lanes (vec > 1: the row is kept as the vectors it was loaded as);
  3. some read of a later pass is one of pass 0's contiguous loads (same tensor, same address);
  4. REGISTERS: at most `REGISTER_VALUES` values per thread and at most 512 threads per block;
     SHARED: at most `SHARED_BYTES` per block;
  5. a split (cooperative) group stays co-resident at the residence's occupancy.

>>> Residence("registers") is Residence.REGISTERS, REGISTER_VALUES
(True, 48)
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..errors import ScheduleError
from ..model.gpu import GPUSpec
from ..poly.access import AccessKind
from ..poly.program import KernelGroup
from ..poly.stitch import is_epilogue
from .decision import REGISTER_VALUES, Decision, Residence
from .derived import access_for, co_resident, levels_for, passes, resident_per_sm

SHARED_BYTES = 48 * 1024  # static shared memory of one block (beyond it: a dynamic opt-in launch)

Kept = tuple[tuple[tuple[int, int], ...], ...]  # per kept value: its (statement, read) pairs, pass 0's first


_memo: dict[tuple[int, int], tuple[KernelGroup, Kept]] = {}  # by (id, vec); the group itself proves the hit


def kept_reads(group: KernelGroup, vec: int) -> Kept:
    """The values a block can keep: each contiguous pass-0 read (at vector width `vec`) that a
    later pass reads again at the same address, with every (statement, read) that reads it."""
    if not group.stitched:
        return ()
    hit = _memo.get((id(group), vec))
    if hit is not None and hit[0] is group:
        return hit[1]
    if len(_memo) > 256:
        _memo.clear()
    kept = _kept_reads(group, vec)
    _memo[(id(group), vec)] = (group, kept)
    return kept


def _kept_reads(group: KernelGroup, vec: int) -> Kept:
    lv = levels_for(group)
    access = access_for(group, vec)
    members = group.on_chip
    first: list[list[tuple[int, int]]] = []
    for k, s in enumerate(group.statements):
        if is_epilogue(s):
            continue
        for ri, r in enumerate(s.reads):
            if not r.memory or r.indirect is not None or r.tensor.uid in members:
                continue
            if access[k][ri] != AccessKind.CONTIG:
                continue
            same = [
                f
                for f in first
                if group.statements[f[0][0]].reads[f[0][1]].tensor is r.tensor
                and group.statements[f[0][0]].reads[f[0][1]].addr.is_equal(r.addr)
            ]
            if same:
                same[0].append((k, ri))
            elif lv[k] == 0:
                first.append([(k, ri)])
    return tuple(tuple(f) for f in first if any(lv[k] > 0 for k, _ in f))


def values_per_thread(group: KernelGroup, d: Decision) -> int:
    """Values each thread keeps: per kept tensor, its steps x vector lanes."""
    return len(kept_reads(group, d.vec)) * (d.chunk // d.tx) * d.vec


def shared_bytes(group: KernelGroup, d: Decision) -> int:
    """Shared memory the block's kept rows take (each value in its compute type: 4 or 8 bytes)."""
    size = sum(_compute_bytes(group, f) for f in kept_reads(group, d.vec))
    return d.ty * (d.chunk // d.tx) * d.tx * d.vec * size


def _compute_bytes(group: KernelGroup, f) -> int:
    k, ri = f[0]
    dt = group.statements[k].reads[ri].tensor.dtype
    return 8 if dt.compute in ("double", "long long") else 4


def kept_bytes(group: KernelGroup, vec: int) -> int:
    """DRAM bytes of the tensors whose later-pass reads are served on chip (each read once)."""
    tensors = {}
    for f in kept_reads(group, vec):
        r = group.statements[f[0][0]].reads[f[0][1]]
        tensors[r.tensor.uid] = r.tensor
    return sum(t.size * t.dtype.itemsize for t in tensors.values())


def blocks_per_sm(gpu: GPUSpec, group: KernelGroup, d: Decision) -> int:
    """Blocks one SM holds under the residence: its threads, shared memory and the registers its
    launch bounds leave each thread (`Decision.min_blocks`: a row kept in registers asks for more;
    `derived.resident_per_sm`)."""
    return resident_per_sm(gpu, d.threads, block_shared_bytes(group, d), d.min_blocks)


def block_shared_bytes(group: KernelGroup, d: Decision) -> int:
    """The shared memory of the kept rows under `d`'s residence (0 unless SHARED): what bounds the
    blocks an SM holds (`GPUSpec.resident_blocks`), passed on to the kernel's cost as data."""
    return shared_bytes(group, d) if d.onchip == Residence.SHARED else 0


def problem(group: KernelGroup, d: Decision, gpu: GPUSpec, res: Residence) -> str:
    """Why `res` is not legal for `d` (the module's preconditions), or "" when it is."""
    if res == Residence.MEMORY:
        return ""
    if not group.stitched or passes_of(group) < 2 or d.rtile * d.ctile > 1:
        return "1: rows on chip need a stitched group of two or more passes without a register tile"
    if group.columns or d.persistent:
        return "1: rows on chip are not kept by column partials or a persistent row loop"
    if d.vec < 2:
        return "2: rows on chip are kept as loaded vectors (vec > 1)"
    if not kept_reads(group, d.vec):
        return "3: no later pass re-reads a contiguous load of pass 0"
    if res == Residence.REGISTERS and (values_per_thread(group, d) > REGISTER_VALUES or d.threads > 512):
        return (
            f"4: {values_per_thread(group, d)} values per thread of a {d.threads}-thread block exceed the "
            f"register budget ({REGISTER_VALUES} values, at most 512 threads)"
        )
    if res == Residence.SHARED and shared_bytes(group, d) > SHARED_BYTES:
        return f"4: {shared_bytes(group, d)} bytes of kept rows exceed {SHARED_BYTES} bytes of shared memory per block"
    if d.cooperative:
        kept = _with(d, res)
        at_once = co_resident(gpu, d.threads, block_shared_bytes(group, kept), kept.min_blocks)
        if d.blocks > at_once:
            return f"5: the split's {d.blocks} blocks are not co-resident at that occupancy (at most {at_once})"
    return ""


def _with(d: Decision, res: Residence) -> Decision:
    return replace(d, onchip=res)


def passes_of(group: KernelGroup) -> int:
    return passes(group, levels_for(group))


def choose(group: KernelGroup, d: Decision, gpu: GPUSpec) -> tuple[Residence, ...]:
    """The residences legal for `d`, besides MEMORY: registers first, then shared memory."""
    return tuple(r for r in (Residence.REGISTERS, Residence.SHARED) if not problem(group, d, gpu, r))


def check(group: KernelGroup, d: Decision, gpu: GPUSpec, at: str) -> None:
    """A replayed decision's residence: a ScheduleError naming the kernel and the precondition."""
    why = problem(group, d, gpu, d.onchip)
    if why:
        raise ScheduleError(f"{at}: rows kept in {d.onchip}: precondition {why} (schedule/onchip.py)")


def steps(d: Decision) -> int:
    """Vectors of the row each thread loads: the unrolled k loop's trip count."""
    return math.ceil(d.chunk / d.tx)
