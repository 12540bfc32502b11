"""The parts of a `Decision` that its kernel group fixes, shared by the search, the cost and the
replay: the loop vectors run along, merge modes, vector atomics, access kinds, stitching levels,
buffers and co-residency.
"""

from __future__ import annotations

from .. import dtypes
from ..algebra import AtomicStrategy
from ..model.gpu import GPUSpec, launch_bound_registers
from ..poly.access import AccessKind, access_kinds
from ..poly.program import KernelGroup
from ..poly.row_columns import column_levels
from ..poly.statement import Form, StatementKind
from ..poly.stitch import is_epilogue, levels
from ..runtime.plan import BufferRole, BufferSpec
from .decision import Decision, MergeMode, bounds_blocks


def along(group: KernelGroup) -> str:
    """The canonical loop vectors run along: the contiguous one."""
    return "i" if group.form in (Form.COLUMN, Form.MAP) else "j"


def vector_extent(group: KernelGroup) -> int:
    return group.M if along(group) == "i" else group.N


def unroll_for(vec: int, iterations: int) -> int:
    """Loop copies per step: 4 vector loads in flight per thread, fewer for wide vectors (at most
    32 registers of lanes per input), never more than the thread's iterations."""
    return max(1, min(4, 32 // vec, iterations))


def atomicless(statements) -> bool:
    """Whether a reduction among `statements` (static or parametric) has a combiner no atomic
    merges (struct accumulators: Welford, online softmax): its split merges its block partials
    through the last block."""
    return any(st.combiner is not None and st.combiner.atomic(st.acc) == AtomicStrategy.NONE for st in statements)


def struct_accumulators(group: KernelGroup) -> bool:
    """A reduction no atomic merges (struct accumulators: Welford, online softmax) always merges
    its block partials through the last block."""
    return atomicless(group.statements)


def partials_options(statements, deterministic: bool) -> tuple[bool, ...]:
    """How a split may merge, partials (True) or atomics (False), atomics first: partials only
    when `deterministic` or a combiner has no atomic (`atomicless`); the model picks among them."""
    return (True,) if deterministic or atomicless(statements) else (False, True)


def merge_of(kind: StatementKind, split: int, partials: bool) -> MergeMode:
    """One statement's merge: STORE without a split (`split` partials per output) or for an
    element-wise statement, else through the last block's partials or atomics into a workspace.
    The static kernel groups (`merges_for`) and the parametric class plans
    (schedule/param_mapping.py) decide by it."""
    if split == 1 or kind == StatementKind.MAP:
        return MergeMode.STORE
    return MergeMode.PARTIALS if partials else MergeMode.ATOMIC_WS


def vector_atomic(gpu: GPUSpec, form: Form, vec: int, divides: bool, merge: MergeMode, st) -> bool:
    """Whether statement `st` (static or parametric) merges `vec` adjacent outputs per atomic: a
    COLUMN thread's float32 sums as one float2/float4 atomicAdd where the GPU has them (sm_90),
    merged by atomics, every thread's outputs all in range (`divides`: vec divides M)."""
    return bool(
        gpu.vector_atomics
        and form == Form.COLUMN
        and vec in (2, 4)
        and divides
        and merge == MergeMode.ATOMIC_WS
        and st.combiner is not None
        and st.combiner.vector_atomic
        and st.acc.name == "float32"
    )


def merges_for(group: KernelGroup, split: int, partials: bool) -> tuple[MergeMode, ...]:
    """Per statement: STORE without a split; a split reduction merges by atomics or partials (a
    stitched group's split rows always exchange partials, combined by every block in one order).
    A stitched group's COLUMN statements (column partials, one per block) always merge, by
    atomics or, with `partials`, through the last block. `split`: the partials merged through
    memory per output (under thread-block clusters, one per cluster, schedule/cluster.py: a split
    that is one cluster stores)."""
    columns = set(group.columns)
    col_mode = MergeMode.PARTIALS if partials else MergeMode.ATOMIC_WS
    partials = partials or group.stitched

    def one(k: int, st) -> MergeMode:
        return col_mode if k in columns else merge_of(st.kind, split, partials)

    return tuple(one(k, st) for k, st in enumerate(group.statements))


def atomic_vec_for(group: KernelGroup, gpu: GPUSpec, vec: int, merges: tuple[MergeMode, ...]) -> tuple[int, ...]:
    """Outputs per atomic merge of each statement: a COLUMN thread's `vec` adjacent float32 sums
    merge as one float2/float4 atomicAdd where the GPU has them (sm_90) and every thread's
    outputs are all in range (vec divides M); everything else merges one output per atomic."""

    def one(k: int, st) -> int:
        own = group.accumulator_of[k] == k
        return vec if own and vector_atomic(gpu, group.form, vec, group.M % vec == 0, merges[k], st) else 1

    return tuple(one(k, st) for k, st in enumerate(group.statements))


def input_bytes(group: KernelGroup) -> int:
    """Bytes of the distinct tensors the group reads from memory, each once from DRAM (a
    broadcast parameter re-read by every row hits the cache after its first read)."""
    members = group.on_chip
    reads = {
        r.tensor.uid: r.tensor for s in group.statements for r in s.reads if r.memory and r.tensor.uid not in members
    }
    return sum(t.size * t.dtype.itemsize for t in reads.values())


def access_for(group: KernelGroup, vec: int) -> tuple[tuple[AccessKind, ...], ...]:
    kinds = access_kinds(group.statements, along(group), vec)
    if not (group.stitched or group.epilogue):
        return kinds
    # A stitched group's row epilogue runs on the row's leader thread, an epilogue group's on the
    # thread that finishes the output: one scalar load per read.
    return tuple(tuple(AccessKind.GATHER for _ in k) if is_epilogue(s) else k for s, k in zip(group.statements, kinds))


def passes(group: KernelGroup, lv: tuple[int, ...]) -> int:
    """Passes over the rows of a stitched group: one per level of its reductions and row-space
    statements (a row epilogue runs after the pass of the values it reads, in no pass of its own)."""
    return max((v for s, v in zip(group.statements, lv) if not is_epilogue(s)), default=0) + 1


def levels_for(group: KernelGroup) -> tuple[int, ...]:
    if not group.stitched:
        return tuple(0 for _ in group.statements)
    lv = levels(group.statements)
    if group.columns:
        lv = column_levels(group.statements, lv)
    return tuple(lv[s.name] for s in group.statements)


def workspace_dtype(st, mode: MergeMode) -> dtypes.DType:
    """The element type of statement `st`'s (static or parametric) merge workspace under `mode`:
    its accumulator's, or for float max/min merged by integer atomics (AtomicStrategy.ORDERED)
    the integer images' (int32 of float32, int64 of float64: codegen/header.py pn_ordered)."""
    atomics = mode in (MergeMode.ATOMIC_WS, MergeMode.ATOMIC_GRID)  # merged by atomics, not partials
    if atomics and st.combiner.atomic(st.acc) == AtomicStrategy.ORDERED:
        return dtypes.int32 if st.acc.itemsize == 4 else dtypes.int64
    return st.acc


def kernel_buffers(group: KernelGroup, name: str, merges, split: int, grid) -> tuple[BufferSpec, ...]:
    """The kernel's parameters: every tensor read, then per statement its output and workspace,
    then the counter of block arrivals (a split stitched group: per row group its arrivals at
    the exchanges, then its departures, 2 x gridDim.x counters; column partials: the arrivals
    and the departures, their partials `grid[0]` (the blocks launched) x the columns). `split`:
    the partials merged per output (under thread-block clusters, one per cluster)."""
    stmts = group.statements
    inputs = []
    members = group.on_chip
    for s in stmts:
        for r in s.reads:
            if r.tensor.uid in members or not r.memory:  # registers (stitched) or an index (iota)
                continue
            if all(r.tensor is not t for t in inputs):  # identity: Tensor == builds a comparison
                inputs.append(r.tensor)
    # A result of an earlier kernel is read from that kernel's output buffer.
    out = [
        BufferSpec(
            f"in:{t.uid}" if t.op == "placeholder" else f"out:{t.uid}",
            t.dtype.c_type,
            t.dtype,
            t.size,
            BufferRole.INPUT,
            f"in{k}",
            uid=t.uid,
        )
        for k, t in enumerate(inputs)
    ]
    for k, (s, mode) in enumerate(zip(stmts, merges)):
        res = s.result
        on_chip = res.uid in group.on_chip and s.kind == StatementKind.REDUCE and res.uid not in group.external
        on_chip = on_chip and not (group.consumed and k in group.columns)  # every block reads it back
        if not on_chip:
            out.append(
                BufferSpec(
                    f"out:{res.uid}", res.dtype.c_type, res.dtype, res.size, BufferRole.OUTPUT, f"out{k}", k, res.uid
                )
            )
        if mode != MergeMode.STORE and group.accumulator_of[k] == k:  # a shared accumulator merges once
            partials = mode in (MergeMode.PARTIALS, MergeMode.PARTIALS_GRID)
            role = BufferRole.PARTIALS if partials else BufferRole.WORKSPACE
            size = s.M * (split if partials else 1)
            if s.form == Form.COLUMN and group.stitched:  # column partials: one per launched block
                size = s.result.size * (grid[0] if partials else 1)
            ws = workspace_dtype(s, mode)
            out.append(BufferSpec(f"ws:{name}:{k}", ws.c_type, ws, size, role, f"ws{k}", k))
    if any(m != MergeMode.STORE for m in merges):
        n = 2 if group.columns else grid[0] * (2 if group.stitched else 1)
        out.append(BufferSpec(f"cnt:{name}", "unsigned", None, n, BufferRole.COUNTER, "pn_counter"))
    return tuple(out)


def combine_lanes(blocks: int, threads: int, columns: int) -> int:
    """Threads that sum one column's partials after a grid-wide wait (PARTIALS_GRID): the most, a
    power of two up to a warp, with every column still taken in one sweep of the grid's threads.
    Lane l sums partials l, l + lanes, ... in block order; the lanes then combine by shuffles in a
    fixed tree (LayerNorm backward 4096 x 4096 on 132 blocks of 256: 8 lanes of 17 loads each,
    where one thread per column made 132 dependent-in-turn loads, 4 in flight).

    >>> combine_lanes(132, 256, 4096), combine_lanes(132, 256, 65536), combine_lanes(4, 256, 8)
    (8, 1, 32)
    """
    lanes = 1
    while lanes < 32 and blocks * threads // (2 * lanes) >= columns:
        lanes *= 2
    return lanes


# Shared memory a block's rows reduce their column partials through (all accumulator types of the
# kernel together): 32 KiB leaves a 1024-thread block one chunk of 8 float32 partials per statement
# (LayerNorm backward 4096 x 1024 bf16: 4 chunks and 12 barriers per statement at 8 KiB, 1 and 3
# here). A grid-wide combine's blocks (1024 threads per SM, `co_resident`) hold at most 4 x 32 KiB
# per SM; elsewhere the model counts the tree's bytes in the blocks an SM holds (`shared_bytes`).
COLUMN_TREE_BYTES = 32768


def tree_chunk(threads: int, partials: int, acc_bytes: int, buffers: int = 1) -> int:
    """Column partials of one statement a block's rows reduce together (codegen/column_partials.py,
    `pn_reduce_y_all`): every thread stores that many to shared memory, one barrier, then each
    thread sums a share of the (partial, column) pairs over the block's rows; within
    `COLUMN_TREE_BYTES` shared by the kernel's `buffers` (one per accumulator type).

    >>> tree_chunk(256, 16, 4), tree_chunk(256, 4, 4), tree_chunk(1024, 16, 8), tree_chunk(1024, 16, 4, buffers=2)
    (16, 4, 4, 4)
    """
    return max(1, min(partials, COLUMN_TREE_BYTES // max(1, buffers) // (threads * acc_bytes)))


def tree_buffers(group: KernelGroup) -> int:
    """The shared-memory buffers of a joined group's column tree: one per accumulator type of its
    column owners (codegen/column_partials.py `merge`)."""
    return len({group.statements[k].acc.compute for k in group.columns if group.accumulator_of[k] == k})


def column_tree_bytes(group: KernelGroup, tx: int, ty: int, vec: int, cgroups: int = 1) -> int:
    """Shared memory of the column tree of a block of tx x ty threads loading `vec`-wide vectors
    (codegen/column_partials.py): one buffer per accumulator type of the column statements,
    `tree_chunk` partials per thread; none for one row of threads (ty 1). It bounds the blocks of
    a joined-row kernel an SM holds (`co_resident`, the cost's `shared_bytes`). `cgroups`: the
    columns run in that many groups, one at a time (`group_columns`)."""
    if ty <= 1:
        return 0
    steps = -(-(group.N // cgroups) // (vec * tx)) * vec  # one statement's partials per thread
    by_type: dict[str, int] = {}
    for k in group.columns:
        if group.accumulator_of[k] == k:
            acc = group.statements[k].acc
            need = tx * ty * tree_chunk(tx * ty, steps, acc.itemsize, tree_buffers(group)) * acc.itemsize
            by_type[acc.compute] = max(by_type.get(acc.compute, 0), need)
    return sum(by_type.values())


def column_tree_cycles(partials: int, ty: int, chunk: int) -> int:
    """Cycles of the reduction of one statement's `partials` register partials over a block's
    `ty` rows, `chunk` at a time: per chunk three barriers and shared-memory round trips (30
    cycles each: store, sum over the rows, read back), and about three shared-memory accesses
    per partial (its store, its share of the sums, its read). The tree it replaces paid 2 +
    log2(ty) round trips for every partial in turn.

    >>> column_tree_cycles(16, 2, 8), column_tree_cycles(16, 1, 8)
    (228, 0)
    """
    if ty <= 1:
        return 0
    return -(-partials // chunk) * 3 * 30 + 3 * partials


def resident_per_sm(gpu: GPUSpec, threads: int, shared_bytes: int = 0, min_blocks: int = 0) -> int:
    """Blocks of `threads` threads, each with `shared_bytes` of shared memory, that one SM surely
    holds at once: the kernels carry __launch_bounds__(threads, min_blocks) (codegen/kernel.py;
    `Decision.min_blocks`, by default `bounds_blocks`: 1024 / threads), so ptxas uses at most the registers that leave
    room for that many per SM (`launch_bound_registers`), and the SM holds as many as its thread,
    block, register and shared-memory rules allow with those (`GPUSpec.resident_blocks`). The one
    definition of residency the schedule stage uses (the cost, pipelines, persistent grids,
    cooperative launches).

    >>> from panamera.model import H100
    >>> resident_per_sm(H100, 256), resident_per_sm(H100, 256, min_blocks=2), resident_per_sm(H100, 1024)
    (4, 2, 1)
    """
    bound = launch_bound_registers(threads, min_blocks or bounds_blocks(threads))
    return gpu.resident_blocks(threads, shared_bytes, bound)


def co_resident(gpu: GPUSpec, threads: int, shared_bytes: int = 0, min_blocks: int = 0) -> int:
    """Blocks of `threads` threads, each with `shared_bytes` of shared memory, that are surely
    resident at once on the whole GPU (`resident_per_sm` on every SM). A cooperative launch of
    more fails.

    >>> from panamera.model import H100
    >>> co_resident(H100, 256) // H100.sms, co_resident(H100, 256, shared_bytes=60 * 1024) // H100.sms
    (4, 3)
    """
    return gpu.sms * resident_per_sm(gpu, threads, shared_bytes, min_blocks)


def exchanges(group: KernelGroup, lv: tuple[int, ...]) -> int:
    """Grid-wide exchanges of a split stitched group: one after each pass that has reductions."""
    return len({v for s, v in zip(group.statements, lv) if s.kind == StatementKind.REDUCE})


DISCARD_MIN_BYTES = 1 << 20  # column partials that pay a second grid-wide wait to skip their write-back


def discards_partials(nbytes: int, consumed: bool, own_lines: bool = False) -> bool:
    """Whether a PARTIALS_GRID merge drops its column partials' L2 lines once every block has read
    them (discard.global.L2: never written back; model/workspace.py `discarded`). Where the
    columns' consumers wait a second time (poly/column_stitch.py) the drop follows that wait, free;
    where every line is read by one block only (`own_lines`, `combine_owns_lines`) that block drops
    it after a barrier of its own, free too; otherwise it needs a second grid-wide wait (two L2
    round trips, 0.27 us on an H100), which pays from 1 MiB of partials (their write-back at the
    H100's 2.9 TB/s write rate: 0.36 us).

    >>> discards_partials(264 * 1024 * 2 * 4, False), discards_partials(8 * 1024 * 4, False), discards_partials(64, True)
    (True, False, True)
    >>> discards_partials(8 * 1024 * 4, False, own_lines=True)
    True
    """
    return consumed or own_lines or nbytes >= DISCARD_MIN_BYTES


LINE_BYTES = 128  # an L2 line: the unit discard.global.L2 drops


def combine_columns(blocks: int, threads: int, columns: int) -> int:
    """Consecutive columns one block sums in each sweep of a PARTIALS_GRID combine
    (codegen/column_partials.py `_grid_combine`): its threads over `combine_lanes` lanes each.

    >>> combine_columns(132, 1024, 1024), combine_columns(132, 256, 16384)
    (32, 128)
    """
    return threads // combine_lanes(blocks, threads, columns)


def combine_owns_lines(group: KernelGroup, d: Decision) -> bool:
    """Whether every 128-byte line of a PARTIALS_GRID combine's partials is read by one block only:
    a block's columns of a sweep (`combine_columns`) and a block's row of partials (`N` columns) are
    whole lines of every column accumulator. Then each block drops the lines it read after a barrier
    of its own, with no second grid-wide wait (codegen/column_partials.py `_drop_own`); a drop never
    reaches past the block's own columns, so where a buffer is not line-aligned (the emulator's
    64-byte allocations) only fewer lines are dropped.

    LayerNorm backward 4096 x 1024 on 132 blocks of 1024 threads: 32 lanes per column, 32 float32
    columns per block: one line per block's partials row."""
    owners = [k for k in group.columns if group.accumulator_of[k] == k]
    W = combine_columns(d.blocks, d.threads, group.N)
    return all(
        (W * group.statements[k].acc.itemsize) % LINE_BYTES == 0
        and (group.N * group.statements[k].acc.itemsize) % LINE_BYTES == 0
        for k in owners
    )


def column_partial_bytes(group: KernelGroup, d: Decision) -> int:
    """The bytes of a joined group's column partials: every block's, of every column
    accumulator, at the widest accumulator (schedule/cost.py `joined_cost`'s workspace)."""
    owners = [k for k in group.columns if group.accumulator_of[k] == k]
    acc = max((group.statements[k].acc.itemsize for k in owners), default=0)
    return d.blocks * group.N * len(owners) * acc


def group_columns(group: KernelGroup, d: Decision) -> int:
    """The columns a joined group's threads span at once: N, or with column groups
    (`Decision.cgroups`, a consumed column stitch: BatchNorm backward NHWC) N / cgroups, the group
    run in turn."""
    return group.N // d.cgroups


def drops_column_partials(group: KernelGroup, d: Decision) -> bool:
    """Whether decision `d` of a joined group drops its column partials once read: a
    PARTIALS_GRID merge of a column accumulator (`discards_partials` on `column_partial_bytes`).
    The one rule the cost (schedule/cost.py) and the kernel (codegen/column_partials.py) follow.
    Never with column groups: a block dropping every line after one group's wait could drop the
    next group's partials, already written by a faster block (and they are a few hundred KB)."""
    owners = [k for k in group.columns if group.accumulator_of[k] == k]
    grid = any(d.merges[k] == MergeMode.PARTIALS_GRID for k in owners)
    if not grid or d.cgroups > 1:
        return False
    return discards_partials(column_partial_bytes(group, d), group.consumed, combine_owns_lines(group, d))
