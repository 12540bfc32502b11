"""The model's cost of one mapping decision (model/kernel_cost.py's `kernel_time` on its launch): the
same for the search (schedule/search.py) and for a replay (schedule/replay.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..algebra import SUM, AtomicStrategy
from ..model.gpu import GPUSpec
from ..model.kernel_cost import KernelCost, kernel_time
from ..model.workspace import workspace_traffic
from ..poly.program import KernelGroup
from ..poly.statement import Form, StatementKind
from .cluster import exchange_cycles as cluster_exchange_cycles
from .cluster import merge_cycles as cluster_merge_cycles
from .cluster import setup_cycles as cluster_setup_cycles
from .contraction import l2_bytes as contraction_l2_bytes
from .decision import Decision, Mapping, MergeMode, Residence
from .derived import (
    LINE_BYTES,
    column_partial_bytes,
    column_tree_cycles,
    combine_columns,
    combine_lanes,
    combine_owns_lines,
    drops_column_partials,
    exchanges,
    group_columns,
    input_bytes,
    kernel_buffers,
    passes,
    tree_buffers,
    tree_chunk,
)
from .hold import block_bytes, held_bytes
from .onchip import block_shared_bytes, blocks_per_sm, kept_bytes, steps
from .rtile import op_divisors, register_budget
from .tc_tiling import tc_cost

TRANSCENDENTAL = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "pow", "sin", "cos", "fmod", "mod")


@dataclass(frozen=True)
class Arithmetic:
    """Thread instructions of a kernel group, by the pipe that issues them (the model's issue term)."""

    fp32: float = 0.0
    fp64: float = 0.0
    sfu: float = 0.0

    def features(self) -> dict[str, float]:
        return {"fp32_ops": self.fp32, "fp64_ops": self.fp64, "sfu_ops": self.sfu}


def arithmetic(group: KernelGroup, d: Decision | None = None) -> Arithmetic:
    """Per iteration of each statement: one instruction per operation of its body (in its
    dtype's register precision; a transcendental also occupies the SFU), and one merge into the
    accumulator (the combiner's `merge_instructions` and `merge_transcendentals`, in the
    accumulator's precision: Welford in double costs FP64 issue slots; a sum of products merges
    in the product's multiply-add). Under a register tile
    (`d.rtile`), an operation whose loads are all shared along the tile (a dequantized weight)
    runs once per tile."""
    fp32 = fp64 = sfu = 0.0
    for k, s in enumerate(group.statements):
        if group.accumulator_of[k] != k:
            continue  # its owner's accumulation is the same work
        n = s.M * s.N
        div = op_divisors(s, k, d) if d is not None and d.rtile * d.ctile > 1 else {}
        for e in s.body.walk():
            if e.op in ("load", "const"):
                continue
            w = n / div.get(id(e), 1)
            if e.dtype.compute == "double":
                fp64 += w
            else:
                fp32 += w
            sfu += w if e.op in TRANSCENDENTAL else 0
        if s.combiner is not None:
            acc = s.acc.field if s.acc.is_struct else s.acc
            # a product summed is one fused multiply-add (nvcc contracts acc + a * b by default)
            fma = s.combiner is SUM and s.body.op == "mul" and not acc.is_struct
            merge = 0 if fma else n * s.combiner.merge_instructions
            if acc.compute == "double":
                fp64 += merge
            else:
                fp32 += merge
            sfu += n * s.combiner.merge_transcendentals
    return Arithmetic(fp32, fp64, sfu)


def streamed_bytes_per_iteration(group: KernelGroup) -> int:
    """Input bytes each (i, j) iteration streams from DRAM: the tensors that span the whole
    iteration space. Broadcast parameters (a LayerNorm's gamma) are re-read from cache, and
    values a stitched group keeps in registers are not memory reads at all: neither is a DRAM
    request in flight."""
    members = group.on_chip
    tensors = {
        r.tensor.uid: r.tensor
        for s in group.statements
        for r in s.reads
        if r.memory and r.tensor.uid not in members and r.tensor.size >= group.M * group.N
    }
    return sum(t.dtype.itemsize for t in tensors.values())


def in_flight(group: KernelGroup, d: Decision) -> int:
    """Streamed bytes a thread has in flight per loop step: vector width x unrolled loads. Under
    a register tile the stream is the operand its rows share (loaded once per tile)."""
    if d.rshared:
        tensors = {
            r.tensor.uid: r.tensor
            for s, sh in zip(group.statements, d.rshared)
            for r, b in zip(s.reads, sh)
            if b and r.memory
        }
        return max(1, sum(t.dtype.itemsize for t in tensors.values())) * d.vec * d.unroll * d.ctile
    return max(1, streamed_bytes_per_iteration(group)) * d.vec * d.unroll


def decision_cost(group: KernelGroup, gpu: GPUSpec, d: Decision, partials: bool) -> KernelCost:
    """The model's time of one candidate decision: the same for the search and for a replay."""
    if group.columns:
        return joined_cost(group, gpu, d)
    if group.stitched:
        return stitched_cost(group, gpu, d)
    if d.mma:  # tensor cores
        return tc_cost(group, gpu, d)
    kept = group.on_chip - group.external  # an epilogue group's reduction nothing else reads
    stored = [s for s in group.statements if s.kind == StatementKind.MAP or s.result.uid not in kept]
    out_bytes = group.M * sum(s.result.dtype.itemsize for s in stored)
    work = arithmetic(group, d).features()
    if d.form == Form.MAP:
        return kernel_time(
            gpu,
            dram_bytes=input_bytes(group) + out_bytes,
            write_bytes=out_bytes,
            blocks=d.grid[0],
            threads=d.tx,
            bytes_in_flight_per_thread=in_flight(group, d),
            registers=register_budget(d),
            **_scatter_atomics(group),
            **work,
        )
    blocks = d.grid[0] * d.split
    s_eff = d.split // d.cluster  # partials merged through memory: one per cluster (schedule/cluster.py)
    is_split = s_eff > 1
    own = group.accumulators  # an epilogue group's element-wise statements have none
    owners = [group.statements[k] for k in own]
    outputs = group.M * len(owners)
    widths = d.atomic_vec or (1,) * len(group.statements)
    merge_atomics = sum(group.M // widths[k] for k in own)
    acc_bytes = max(st.acc.itemsize for st in owners)
    # A split merges into a resident workspace (one atomic per block per output, plus the
    # block's arrival on the counter) that the last block reads, stores and resets; or,
    # partials: every block writes its partials and the last block reads them all. Written back,
    # read from L2 where it fits (model/workspace.py, the one rule of every split plan).
    merges = s_eff if partials else 1
    ws = workspace_traffic(gpu, outputs * merges * acc_bytes if is_split else 0)
    cas = 0
    if is_split and not partials:
        cas = sum(group.M * s_eff for st in owners if st.combiner.atomic(st.acc) == AtomicStrategy.CAS)
    return kernel_time(
        gpu,
        dram_bytes=input_bytes(group) + out_bytes + ws["dram_bytes"],
        write_bytes=out_bytes + ws["write_bytes"],
        blocks=blocks,
        threads=d.tx * d.ty,
        bytes_in_flight_per_thread=in_flight(group, d),  # unroll unguarded loads per step
        registers=register_budget(d),  # what the launch bounds let ptxas use (model/gpu.py launch_bound_registers)
        atomics=(blocks + (0 if partials else merge_atomics * s_eff)) if is_split else 0,
        same_address=s_eff if is_split else 0,
        cas_atomics=cas,
        # the merged words' type sets the atomic rate (the widest accumulator merges slowest)
        atomic_dtype=max((st.acc for st in owners), key=lambda a: a.itemsize).name if is_split and not partials else "",
        # the block reduction; a register tile's rows reduce together, a shuffle chain (5 steps of
        # an L1-latency shuffle, ~30 cycles) more per further row
        epilogue_cycles=400
        + cluster_merge_cycles(d)
        + 150 * (d.rtile * d.ctile - 1)
        + (_combine_cycles(group, gpu, d) if is_split and partials else 0)
        + _epilogue_cycles(group, gpu),
        # a contraction's shared operand, re-read by every row, and the workspace's read where it fits
        l2_bytes=contraction_l2_bytes(group, d) + ws["l2_bytes"],
        **work,
    )


def _scatter_atomics(group: KernelGroup) -> dict:
    """An indirect write's atomics (poly/statement.py `scatter`): one per element; the ids are
    data, so the adds into one word are taken as the ids per row of the table, as uniform ids
    would give (an assumption: repeated ids of a skewed vocabulary serialize more)."""
    scat = [s for s in group.statements if s.scatter is not None]
    if not scat:
        return {}
    per_row = max(math.ceil(group.M / s.result.size) for s in scat)  # source elements per destination
    return dict(atomics=group.M * len(scat), same_address=per_row, atomic_dtype=scat[0].result.dtype.name)


def _epilogue_cycles(group: KernelGroup, gpu: GPUSpec) -> int:
    """An epilogue group's element-wise statements run after the output is final, on the thread
    that finishes it: their loads (issued together, one per read) are one DRAM round trip the
    kernel's tail waits for, counted once per joiner (a joiner may read an earlier one's value)."""
    if not group.epilogue:
        return 0
    joiners = sum(1 for s in group.statements if s.kind == StatementKind.MAP)
    return int(joiners * gpu.dram_latency_s * gpu.clock_hz)


def _combine_cycles(group: KernelGroup, gpu: GPUSpec, d: Decision) -> int:
    """The last block's combine of the partials (codegen/reduce_kernel.py): the threads of each
    output stride over its `split` partials, coalesced, one L2 round trip per step (the loop
    carries its accumulator), then reduce across the block as the main loop does."""
    split = d.split // d.cluster
    if group.form == Form.COLUMN:
        steps = math.ceil(split / d.ty) * d.vec
    else:
        steps = math.ceil(split / d.tx) * d.rtile * d.ctile
    return steps * gpu.l2_latency_cycles * len(set(group.accumulator_of))


def row_reductions(group: KernelGroup, lv: tuple[int, ...]) -> int:
    """Passes of a stitched group that end in a block reduction of its rows (at least one): the
    levels of its row REDUCE statements (a column statement's partials merge once, after the
    row loop). Softmax backward: 1 (sum(dy * y), then dx element-wise); softmax: 2.

    >>> import panamera as pn
    >>> x = pn.placeholder((8, 64))
    >>> k = pn.compile(x - pn.sum(x, axis=1, keepdims=True), target="emulator")
    >>> passes(k.groups[0], k.mappings[0].levels), row_reductions(k.groups[0], k.mappings[0].levels)
    (2, 1)
    """
    cols = set(group.columns)
    rows = {v for k, (s, v) in enumerate(zip(group.statements, lv)) if s.kind == StatementKind.REDUCE and k not in cols}
    return max(1, len(rows))


def stitched_cost(group: KernelGroup, gpu: GPUSpec, d: Decision) -> KernelCost:
    """Blocks own whole rows; one pass per level. Passes after the first re-read the inputs, from
    L2 when the rows in flight fit in half of it.

    Split rows (d.split > 1, all blocks resident): every block streams its chunk of the row, and
    after each pass with reductions the row's blocks exchange partials through a grid-wide wait.
    The passes no longer overlap (a pass starts when every block has finished the one before),
    so the L2 re-reads add to the DRAM time (kernel_time's `grid_syncs`), and each exchange costs
    two L2 round trips (the arrival, seen by the poll) plus `_exchange_cycles`. Every row is in
    flight at the first exchange: the re-reads hit in L2 when all the input fits in half of it.

    Rows kept on chip (d.onchip, schedule/onchip.py): the kept tensors are read once; only the
    others are re-read. Kept in registers, the unrolled row's loads are all in flight at once;
    either residence holds fewer blocks per SM (`onchip.blocks_per_sm`), which scales the bytes
    in flight per SM (kernel_time counts blocks per SM from the threads alone).

    A split row that is one thread-block cluster (d.cluster, schedule/cluster.py) exchanges on
    chip: no grid-wide wait (the clusters run in waves, their passes overlap other clusters'),
    each exchange `cluster.exchange_cycles` (by the cluster barrier or by mbarriers, plus their
    set-up `cluster.setup_cycles`), exposed once at the kernel's end."""
    M = group.M
    in_bytes = input_bytes(group)
    out_bytes = sum(
        s.result.size * s.result.dtype.itemsize
        for s in group.statements
        if s.kind == StatementKind.MAP or s.result.uid in group.external
    )
    row_bytes = in_bytes / max(M, 1)
    gx, S = d.launch_grid  # a persistent grid: its blocks loop over the row tiles
    shared = block_shared_bytes(group, d)  # rows kept in shared memory (schedule/onchip.py): fewer blocks per SM
    if d.cluster > 1:  # clusters of S blocks in waves: the rows of the clusters resident at once
        resident = max(1, min(gx, gpu.sms * blocks_per_sm(gpu, group, d) // S)) * d.ty
    elif S > 1:
        resident = gx * d.ty
    else:
        resident = min(gx, gpu.sms * blocks_per_sm(gpu, group, d)) * d.ty
    if group.consumed:  # poly/column_stitch.py: every row is read before any is re-read
        resident = M
    n_passes = passes(group, d.levels)
    kept = kept_bytes(group, d.vec) if d.onchip != Residence.MEMORY else 0
    reread = (n_passes - 1) * (in_bytes - kept)
    flight = in_flight(group, d)
    if d.onchip == Residence.REGISTERS:
        flight = flight // max(1, d.unroll) * steps(d)
    in_l2 = resident * row_bytes <= gpu.l2_reach
    n_ex = exchanges(group, d.levels) if S > 1 else 0
    return kernel_time(
        gpu,
        dram_bytes=in_bytes + out_bytes + (0 if in_l2 else reread),
        write_bytes=out_bytes,
        l2_bytes=(reread if in_l2 else 0) + contraction_l2_bytes(group, d),
        blocks=gx * S,
        threads=d.tx * d.ty,
        bytes_in_flight_per_thread=flight,
        # a block reduction's barrier per pass that reduces rows (an element-wise last pass, dx,
        # ends without one, as every peer's row kernel pays one epilogue), each tile row's
        epilogue_cycles=400 * (1 if S > 1 else row_reductions(group, d.levels)) * d.rtile * d.ctile,
        grid_syncs=0 if d.cluster > 1 else n_ex,
        sync_cycles=n_ex * (cluster_exchange_cycles(d) if d.cluster > 1 else _exchange_cycles(gpu, d))
        + cluster_setup_cycles(d)
        if n_ex
        else 0,
        shared_bytes=shared,
        registers=register_budget(d),  # with the shared memory, the blocks an SM holds (onchip.blocks_per_sm)
        **arithmetic(group, d).features(),
    )


# [assumed] a lane's partial loads in flight at once, of every column owner together: the loop is unrolled
# with a constant trip count (codegen/column_partials.py `_in_lanes`), so ptxas may issue them all; 8, not
# measured, is what the model charges
COMBINE_IN_FLIGHT = 8


def joined_cost(group: KernelGroup, gpu: GPUSpec, d: Decision) -> KernelCost:
    """A stitched row group with column partials (schedule/persistent.py): the stitched kernel
    on the persistent grid, whose passes also accumulate the columns (their loads are the
    row's, their operations `arithmetic`'s), then per block the reduction of the column partials
    over its rows (`column_tree_cycles`: chunks of partials through shared memory) and the merge: one atomic
    per block per column into the resident workspace, whose values the last block stores and
    resets; or (partials) every block's partials written and read back by the last block, which
    sums each column in block order. The last block's pass over the columns is one SM's work at
    its share of the L2 bandwidth, after every other block: a tail. Or (PARTIALS_GRID) after a
    grid-wide wait every block sums its share of the columns in block order: one sync. Columns
    the group's own statements read (poly/column_stitch.py) wait a second time, and every thread
    loads its columns' final values from L2 before the consumers' pass, which re-reads the row
    tiles in reverse: from L2 where all the input fits in half of it, else that half from L2."""
    f = dict(stitched_cost(group, gpu, d).features)
    reread = input_bytes(group)
    C = d.cgroups  # column groups run in turn (consumed only): each its own passes, merge and re-read
    if group.consumed and reread > gpu.l2_reach:  # the consumers' pass runs the row tiles backwards:
        hits = C * min(gpu.l2_reach, reread / C)  # the last ones the columns' pass read are still in L2 (half
        f["dram_bytes"] -= hits  # of it), once per column group
        f["l2_bytes"] += hits
    if d.hold:  # each block's first tiles of each group from shared memory (schedule/hold.py): the oldest, DRAM's first
        held = held_bytes(group, d)
        from_dram = min(held, max(reread - (hits if group.consumed and reread > gpu.l2_reach else reread), 0))
        f["dram_bytes"] -= from_dram
        f["l2_bytes"] = max(f["l2_bytes"] - (held - from_dram), 0)
    owners = [k for k in group.columns if group.accumulator_of[k] == k]
    cols = [group.statements[k] for k in owners]
    B, width = d.blocks, group_columns(group, d)
    merges = B * group.N * len(cols)
    acc = max(c.acc.itemsize for c in cols)
    ws = column_partial_bytes(group, d)  # merges x acc: the workspace
    steps = math.ceil(width / (d.vec * d.tx)) * d.vec  # one statement's partials per thread
    per_thread = steps * len(cols)  # partials in a thread's registers
    nbuf = tree_buffers(group)
    tree = C * sum(column_tree_cycles(steps, d.ty, tree_chunk(d.threads, steps, c.acc.itemsize, nbuf)) for c in cols)
    # a block's shared memory, static (the column tree, the row reductions' arrays, the flag) and dynamic
    # (the held tiles): schedule/hold.py `block_bytes`, the residency checks' count; occupancy counts it
    f["shared_bytes"] = block_bytes(group, d)
    outputs = sum(group.statements[k].result.size * group.statements[k].result.dtype.itemsize for k in group.columns)
    grid = any(d.merges[k] == MergeMode.PARTIALS_GRID for k in owners)
    discard = drops_column_partials(group, d)
    if any(d.merges[k] in (MergeMode.PARTIALS, MergeMode.PARTIALS_GRID) for k in owners):
        # the partials' bytes: written back unless dropped once read, read in this kernel from L2 where they
        # fit (model/workspace.py); the round trips are the combine's cycles or the last block's tail
        for key, nbytes in workspace_traffic(gpu, ws, discarded=discard).items():
            f[key] = f.get(key, 0) + nbytes
    if grid:  # every block combines its share
        f["atomics"] += 2 * B  # arrivals and departures
        # the wait at the end (its arrival and poll: two L2 round trips; the passes before it are
        # not phased), then each thread's columns: B partial loads (4 in flight) each
        lanes = combine_lanes(B, d.threads, width)
        sweeps = math.ceil(width / (B * d.threads // lanes))
        if lanes > 1:  # every owner's loads in one unrolled loop, its shuffle trees in one loop: they overlap
            batches = sweeps * math.ceil(math.ceil(B / lanes) * len(cols) / COMBINE_IN_FLIGHT)
            shuffles = sweeps * (lanes.bit_length() - 1) * 30
        else:  # one thread per column, each owner's loop of gridDim.x loads in turn
            batches = sweeps * len(cols) * math.ceil(B / 4)
            shuffles = 0
        f["sync_cycles"] = (2 + batches) * gpu.l2_latency_cycles + shuffles
        if discard and not group.consumed and combine_owns_lines(group, d):
            # a barrier of the block's own, then its threads drop the lines it read, one partials row each
            rows = math.ceil(B / d.threads)
            sweeps = math.ceil(width / (B * combine_columns(B, d.threads, width)))
            lines = rows * sweeps * math.ceil(combine_columns(B, d.threads, width) * acc / LINE_BYTES)
            f["sync_cycles"] += 30 + 30 * lines * len(cols)
        elif discard and not group.consumed:  # a second wait, then every thread drops its share of the lines
            lines = math.ceil(math.ceil(ws / 128) / (B * d.threads))
            f["sync_cycles"] += 2 * gpu.l2_latency_cycles + 30 * lines
        last = 0
        if group.consumed:  # poly/column_stitch.py: a second wait, then each thread's columns from L2
            f["grid_syncs"] = 2 * C  # the passes are phased: the re-read (L2 or DRAM) adds to the first
            f["sync_cycles"] += (2 + math.ceil(per_thread / 4)) * gpu.l2_latency_cycles
            f["sync_cycles"] = C * f["sync_cycles"] + _group_restarts(gpu, C)
            f["l2_bytes"] += B * d.threads // d.tx * group.N * len(cols) * acc
    elif any(d.merges[k] == MergeMode.PARTIALS for k in owners):
        f["atomics"] += B
        last = ws + outputs
    else:
        f["atomics"] += merges + B
        f["same_address"] = B
        f["atomic_dtype"] = max((c.acc for c in cols), key=lambda a: a.itemsize).name
        last = width * len(cols) * 2 * acc + outputs
    if any(d.merges[k] == MergeMode.ATOMIC_GRID for k in owners):  # poly/column_stitch.py
        f["atomics"] += B  # the departures
        f["grid_syncs"] = C  # the passes are phased: the re-read (L2 or DRAM) adds to the first
        # the wait, then the columns, per column group
        f["sync_cycles"] = C * (2 + math.ceil(per_thread / 4)) * gpu.l2_latency_cycles + _group_restarts(gpu, C)
        f["l2_bytes"] += B * d.threads // d.tx * group.N * len(cols) * acc
        last = width * len(cols) * acc  # the last to depart resets the workspace
    tail = last / (gpu.l2_bw / gpu.sms) + gpu.l2_latency_cycles / gpu.clock_hz if last else 0.0
    f["epilogue_cycles"] += tree + int(tail * gpu.clock_hz)
    return kernel_time(gpu, **f)


def _group_restarts(gpu: GPUSpec, cgroups: int) -> int:
    """Column groups run in turn (`Decision.cgroups`): each group's two passes start after a
    grid-wide wait with nothing in flight, so each pass beyond the two of one group waits for a
    loaded DRAM round trip before its stream flows (kernel_time charges the first)."""
    return int((2 * cgroups - 2) * gpu.loaded_latency_s * gpu.clock_hz)


def _exchange_cycles(gpu: GPUSpec, d: Decision) -> int:
    """One exchange of a split row beyond the two L2 round trips kernel_time charges for it: the
    block reductions before it and after it (400 cycles, as a pass of an unsplit row), the S
    arrivals on the row's counter serialized at one per L2 clock, the combine of the S partials
    (ceil(S / tx) loop-carried L2 loads per thread), and the next pass's first load (an L2 hit)."""
    S = d.split
    arrivals = S * gpu.clock_hz / gpu.l2_clock_hz
    return int(400 + arrivals + (math.ceil(S / d.tx) + 1) * gpu.l2_latency_cycles)


def complete(group: KernelGroup, d: Decision, gpu: GPUSpec, name: str, cost: KernelCost | None = None) -> Mapping:
    partials = any(m in (MergeMode.PARTIALS, MergeMode.PARTIALS_GRID) for m in d.merges)
    cost = cost if cost is not None else decision_cost(group, gpu, d, partials)
    buffers = kernel_buffers(group, name, d.merges, d.split // d.cluster, d.launch_grid)
    return Mapping(**{f.name: getattr(d, f.name) for f in fields(Decision)}, name=name, buffers=buffers, cost=cost)
