"""The mapping of a stitched row group with column partials (poly/row_columns.py): LayerNorm /
RMSNorm backward's dx, dgamma and dbeta in one launch.

The rows are bound as in every stitched kernel (a row tile of `ty` rows per block, `tx` threads
along each row, whole rows: split 1), but the grid is persistent: `persistent` blocks are
launched and block b loops over the row tiles b, b + persistent, ... of the logical `grid`. A
thread strides over the same columns of every row it owns, so it keeps one register partial per
column it touches per COLUMN statement: ceil(N / (vec * tx)) * vec of them, the column pass's
steps fully unrolled so that every partial is a register (codegen/column_partials.py). After the
last row tile the block reduces its partials over its rows (ty) and merges one partial per
column: an atomic into a resident workspace whose values the last block to arrive stores and
resets (ATOMIC_WS), or (deterministic) its partials to ws[b * N + j], which the last block sums
in block order (PARTIALS), or, after a grid-wide wait, every block sums its share of the columns
with `derived.combine_lanes` threads per column (PARTIALS_GRID: a cooperative launch, every block
resident; one fixed order, so bit-identical run to run, though not to PARTIALS' bits). Columns
the group's own statements read (poly/column_stitch.py) merge after a grid-wide wait only:
PARTIALS_GRID, or (not deterministic) ATOMIC_GRID, atomics that every block reads back. The
blocks, threads and merge are the model's pick (schedule/cost.py `joined_cost`).

Preconditions the mapping holds (`check`, also for a replayed decision), each a ScheduleError:
  1. whole rows (split 1), no register tile, direct loads (stages 1);
  2. 1 <= persistent <= the row tiles (grid[0]);
  3. the column partials are at most `MAX_PARTIALS` per thread, and with two steps of the column
     pass's vector loads they fit the registers the launch bounds leave (`column_registers`;
     the bounds ask for room for `per_sm` = ceil(persistent / SMs) blocks per SM);
  4. every column statement merges (atomics, or partials where `deterministic` or a struct
     accumulator asks), every host statement stores;
  5. a grid-wide combine (PARTIALS_GRID) only with every block co-resident; columns the group's
     own statements read (poly/column_stitch.py) merge only that way (checked as 4);
  6. column groups (`cgroups` > 1: the columns in groups run one at a time, codegen/column_stitch.py)
     only where the group's own statements read its columns, each group whole `vec` vectors and
     whole 128-byte lines of every M x N tensor (`column_groups_ok`);
  7. row tiles held in shared memory (`hold` > 0, schedule/hold.py) only in a column stitch whose two
     passes read an M x N input, at most the tiles a block owns, in dynamic shared memory within one
     block's opt-in maximum beside the column tree (schedule/dynsmem.py's preconditions), every block
     still co-resident (`check_hold`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..errors import ScheduleError
from ..model.gpu import GPUSpec
from ..poly.access import AccessKind, choose_vec
from ..poly.program import KernelGroup
from .cost import complete, joined_cost
from .decision import Decision, Mapping, MergeMode, pow2ceil
from .derived import (
    LINE_BYTES,
    access_for,
    co_resident,
    group_columns,
    levels_for,
    merges_for,
    resident_per_sm,
    struct_accumulators,
    unroll_for,
)
from .hold import block_bytes, check_hold, joined_static_bytes, most_held, with_hold
from .rtile import register_budget

# column partials a thread keeps in registers, all COLUMN statements together: the register rule
# (`column_registers`) decides within it. LayerNorm backward at 4096 x 16384 float32 keeps 64 at 512
# threads, one block per SM (128 registers under the launch bounds; nvcc: 128 used, 0 spills), where
# 1024 threads with 32 spilled under 64.
MAX_PARTIALS = 64


def partials_per_thread(group: KernelGroup, tx: int, vec: int, cgroups: int = 1) -> int:
    """Register partials of one thread: per column statement that owns its accumulator, one per
    column it touches (ceil(N / (vec * tx)) steps of `vec` lanes).

    >>> import panamera as pn
    >>> from panamera.poly.program import KernelGroup
    >>> from panamera.compiler import lower
    >>> x = pn.placeholder((8, 64))
    >>> outs = [x - pn.sum(x, axis=1, keepdims=True), pn.sum(x, axis=0)]
    >>> c = lower(outs, stop_after="program", target="emulator").program.column_candidates[0]
    >>> partials_per_thread(KernelGroup(c.group + c.columns, True), 8, 4)
    8
    """
    owners = [k for k in group.columns if group.accumulator_of[k] == k]
    return math.ceil(group.N // cgroups / (vec * tx)) * vec * len(owners)


def column_registers(group: KernelGroup, d: Decision) -> int:
    """4-byte registers the column pass holds: its partials, two unrolled steps of its distinct
    contiguous vector loads (nvcc hoists the unrolled steps' loads), and 24 for indices, the
    row values and the 16-bit loads' conversions (LayerNorm backward at 4096 x 16384 float32,
    1024 threads: 32 partials and 12 float4 loads spilled under the 64-register bound; in
    bfloat16, 32 partials and 6 loads of 8 bytes spilled 12 stores with 16 counted)."""
    here = [k for k, v in enumerate(d.levels) if v == max(d.levels[c] for c in group.columns)]
    loads = {
        (r.tensor.uid, str(r.addr)): r.tensor.dtype.itemsize
        for k in here
        for ri, r in enumerate(group.statements[k].reads)
        if r.memory and d.access and d.access[k][ri] == AccessKind.CONTIG
    }
    steps = min(2, math.ceil(group_columns(group, d) / (d.vec * d.tx)))
    return (
        partials_per_thread(group, d.tx, d.vec, d.cgroups)
        + steps * sum(math.ceil(b * d.vec / 4) for b in loads.values())
        + 24
    )


def block_counts(tiles: int, gpu: GPUSpec, threads: int) -> list[int]:
    """Persistent grids of k blocks per SM (k = 1, 2, 4, ... up to the blocks an SM holds when the
    launch bounds ask for as many as its threads allow: `derived.resident_per_sm`), and one block
    per row tile, never more blocks than row tiles."""
    most = min(tiles, gpu.sms * resident_per_sm(gpu, threads, 0, gpu.max_threads_sm // max(threads, 1)))
    return sorted({min(most, gpu.sms * k) for k in (1, 2, 4, 8, 16, 32)} | {most})


def joined_counts(tiles: int, gpu: GPUSpec, threads: int) -> list[int]:
    """A joined group's persistent grids: `block_counts`, and for each the fewest blocks that loop
    over the row tiles in as many rounds (ceil(tiles / ceil(tiles / b))): the same rounds, fewer
    partials to combine, no block a round behind the others. LayerNorm backward 4096 x 1024 at
    8 rows per block: 512 tiles, 128 blocks of 4 tiles each, not 132 of which 16 run 3. They come
    last, so the 3 % chain runs as before; `_no_more` takes one where faster at all.

    >>> from panamera.model.gpu import H100
    >>> joined_counts(512, H100, 1024), joined_counts(264, H100, 1024)
    ([132, 264, 128, 256], [132, 264])
    """
    counts = block_counts(tiles, gpu, threads)
    return counts + sorted({math.ceil(tiles / math.ceil(tiles / b)) for b in counts} - set(counts))


def merge_options(group: KernelGroup, partials_only: bool, resident: bool) -> list[tuple[MergeMode, ...]]:
    """The merges of a joined group: the host stores, the columns merge by atomics (unless
    `partials_only`), partials and the last block, or (every block `resident`) partials
    combined by every block after a grid-wide wait: the only merge when the group's own
    statements read the columns (`consumed`, poly/column_stitch.py)."""
    grid = tuple(MergeMode.PARTIALS_GRID if k in group.columns else m for k, m in enumerate(merges_for(group, 1, True)))
    if group.consumed:  # every block reads the merged columns: after a grid-wide wait only
        atomic = tuple(MergeMode.ATOMIC_GRID if k in group.columns else m for k, m in enumerate(grid))
        return ([] if partials_only else [atomic]) + [grid] if resident else []
    return (
        ([] if partials_only else [merges_for(group, 1, False)])
        + [merges_for(group, 1, True)]
        + ([grid] if resident else [])
    )


def map_joined(group: KernelGroup, gpu: GPUSpec, name: str = "", deterministic: bool = False) -> Mapping | None:
    """The model's best persistent mapping of a joined group, or None when no block shape keeps
    the column partials in registers (precondition 3)."""
    M, N = group.M, group.N
    vec = choose_vec(group.statements, "j", N)
    G = N // vec
    base = dict(
        statements=group.names, form=group.form, M=M, N=N, stitched=True, vec=vec,
        access=access_for(group, vec), levels=levels_for(group), atomic_vec=(1,) * len(group.statements),
    )  # fmt: skip
    partials_only = deterministic or struct_accumulators(group)
    best, seen = None, []
    # blocks of at most 32 partials per thread first: more only where clearly faster (the model
    # does not price the register pressure; RMSNorm backward 4096 x 8192 keeps 512 threads).
    # Blocks of 256 threads first, then more
    # rows per block (512, 1024 threads) where clearly faster: fewer blocks' partials to merge
    # (LayerNorm backward 4096 x 1024 bf16: 132 blocks of 128 x 8, 17.1 -> 15.6 us modeled).
    # column groups (a consumed column stitch, `column_group_options`) after every column at once:
    # they replace it only where clearly faster
    for C in (1, *column_group_options(group, vec)):
        Gc = G // C
        widths = {min(t, pow2ceil(Gc)) for t in (128, 256, 512, 1024)}
        shapes = [
            (tx, ty)
            for tx in sorted(widths, key=lambda t: (partials_per_thread(group, t, vec, C) > 32, t))
            for ty in sorted({max(1, min(n // tx, pow2ceil(M))) for n in (256, 512, 1024)})
        ]
        for tx, ty in shapes:
            if partials_per_thread(group, tx, vec, C) > MAX_PARTIALS:
                continue
            tiles, steps = math.ceil(M / ty), math.ceil(Gc / tx)
            tree = joined_static_bytes(group, tx, ty, vec, C)  # the flag counted: merges not yet chosen
            for blocks in joined_counts(tiles, gpu, tx * ty):
                per_sm = math.ceil(blocks / gpu.sms)  # the launch bounds ask for room for that many (3)
                fits = blocks <= co_resident(gpu, tx * ty, tree, per_sm)
                for merges in merge_options(group, partials_only, fits):
                    d = Decision(
                        **base, tx=tx, ty=ty, split=1, chunk=steps * tx, grid=(tiles, 1),
                        unroll=unroll_for(vec, steps), merges=merges, persistent=blocks,
                        per_sm=per_sm, cgroups=C,
                    )  # fmt: skip
                    if column_registers(group, d) > register_budget(d):
                        continue
                    cost, d = _with_hold(group, gpu, d)
                    if best is None or cost.total_s < best[0].total_s * 0.97:  # fewer blocks, atomics first
                        best = (cost, d)
                    seen.append((cost, d))
    if best is None:
        return None
    # then fewer blocks and no more threads, then the same grid and merges with fewer partials per
    # thread, each where faster at all
    best = smaller_if_faster(seen, best, _no_more)
    best = smaller_if_faster(seen, best, lambda d, than: _lighter(group, d, than))
    return complete(group, best[1], gpu, name, best[0])


def _with_hold(group: KernelGroup, gpu: GPUSpec, d: Decision) -> tuple:
    """`d` and its cost, or (where faster) the same with the most row tiles its blocks can hold in
    shared memory (schedule/hold.py, precondition 7)."""
    cost = joined_cost(group, gpu, d)
    if MergeMode.PARTIALS_GRID not in d.merges and MergeMode.ATOMIC_GRID not in d.merges:
        return cost, d
    n = most_held(group, gpu, d)
    if n:
        held = with_hold(group, d, n)
        held_cost = joined_cost(group, gpu, held)
        if held_cost.total_s < cost.total_s:
            return held_cost, held
    return cost, d


def column_groups_ok(group: KernelGroup, cgroups: int, vec: int) -> bool:
    """Precondition 6: columns run in `cgroups` groups, one at a time, only where the group's own
    statements read its columns (`consumed`, poly/column_stitch.py: the groups then hold less on chip
    than all columns at once, schedule/cost.py `joined_cost`), each group `vec`-wide vectors and
    whole `LINE_BYTES` lines of every row of every M x N tensor the group reads or writes (the
    line-granular streams every measured rate read).

    >>> import panamera as pn
    >>> from panamera.bench.train_suite import batch_norm_backward
    >>> k = pn.compile(batch_norm_backward((256, 56, 56, 256), True), target="emulator", gpu="h100")
    >>> [c for c in (2, 4, 8, 16) if column_groups_ok(k.groups[0], c, 4)]  # 32 float32 channels: one line
    [2, 4, 8]
    """
    N = group.N
    if cgroups < 1 or N % cgroups or (N // cgroups) % vec or not (group.consumed or cgroups == 1):
        return False
    sizes = {
        t.dtype.itemsize
        for s in group.statements
        for t in (*(r.tensor for r in s.reads if r.memory), s.result)
        if t.size >= group.M * N
    }
    return all((N // cgroups) * b % LINE_BYTES == 0 for b in sizes)


def column_group_options(group: KernelGroup, vec: int) -> list[int]:
    """The column groups `map_joined` tries beyond one: 2, 4, 8, ... while `column_groups_ok`."""
    out, C = [], 2
    while column_groups_ok(group, C, vec):
        out.append(C)
        C *= 2
    return out


def smaller_if_faster(seen: list, best: tuple | None, smaller: Callable[[Decision, Decision], bool]) -> tuple | None:
    """After the 3 % choice (`best`, a (cost, decision) pair): the fastest of the `seen` pairs
    whose decision is `smaller(d, best's)` and that is faster at all, else `best` (never a slower
    one). The one rule of this module's `_no_more` and search.py's `_fewer_merges`.

    >>> from types import SimpleNamespace as N
    >>> pick = lambda s: smaller_if_faster(s, s[0], lambda d, than: d < than)
    >>> pick([(N(total_s=2.0), 4), (N(total_s=1.9), 2), (N(total_s=1.8), 8), (N(total_s=2.1), 1)])[1]
    2
    """
    if best is None:
        return None
    faster = [c for c in seen if smaller(c[1], best[1]) and c[0].total_s < best[0].total_s]
    return min(faster, key=lambda c: c[0].total_s) if faster else best


def _no_more(d: Decision, than: Decision) -> bool:
    """`d` runs fewer blocks (fewer partials to merge) and no more threads than `than`: the
    preference for the earlier candidate (the 3 % rule) does not hold it back, as search.py's
    `_no_larger` for stitched rows; the same grid in another merge still needs 3 % (atomics
    first). RMSNorm backward 4096 x 1024 bf16: 132 blocks of 128 x 8 (14.9 us modeled) after 528
    of 128 x 2 (15.3), the same threads with a quarter of the partials."""
    return (
        d.cgroups == than.cgroups
        and d.persistent < than.persistent
        and d.persistent * d.threads <= than.persistent * than.threads
    )


# [measured, nvcc 13 sm_80/sm_90] registers `_lighter` leaves free beyond `column_registers`: RMSNorm
# backward 4096 x 8192 fp32 at 1024 x 1 threads (56 estimated) spilled 4 stores under 64, and
# 4096 x 16384 (64 estimated) 12; LayerNorm backward 4096 x 2048 bf16 at 256 x 4 (52) does not.
LIGHTER_MARGIN = 12


def _lighter(group: KernelGroup, d: Decision, than: Decision) -> bool:
    """`d` is `than`'s grid and merges with fewer column partials per thread (wider rows of
    threads): less register pressure, which the model does not price, so the 3 % margin that
    keeps earlier candidates does not hold it back. LayerNorm backward 4096 x 2048 bf16: 132
    blocks of 256 x 4 (22.9 us modeled) after 128 x 4 (23.2): 16 partials per thread, not 32,
    and 32 columns per block in the grid-wide combine, whose lines it drops without a second
    wait (schedule/derived.py `combine_owns_lines`). Only with `LIGHTER_MARGIN` registers of
    the launch bounds' budget to spare: a wider block has fewer registers per thread."""
    return (
        d.persistent == than.persistent
        and d.merges == than.merges
        and d.cgroups == than.cgroups
        and partials_per_thread(group, d.tx, d.vec, d.cgroups)
        < partials_per_thread(group, than.tx, than.vec, than.cgroups)
        and column_registers(group, d) + LIGHTER_MARGIN <= register_budget(d)
    )


def row_grids(tiles: int, gpu: GPUSpec, threads: int, tile_bytes: float) -> list[int]:
    """Persistent grids for a stitched group WITHOUT column partials whose later passes re-read
    the row (softmax backward: sum(dy * y), then dx reads y and dy again; `tile_bytes`: the input
    bytes of one block's row tile): the most blocks, k per SM, whose row tiles in flight fit in
    half the L2 (schedule/cost.py `stitched_cost`: then the re-read hits L2), where one block per
    row tile keeps every resident block's tile in flight (4096 x 16384 float32 at 512 threads, two
    blocks per SM under their launch bounds: 264 rows of 128 KiB, 33 MiB, re-read from DRAM; at
    1024 threads one block per SM, 16.5 MiB, fits). Empty when one block per row tile fits
    already, or no grid does.

    >>> from panamera.model.gpu import H100
    >>> row_grids(4096, H100, 512, 16384 * 8), row_grids(4096, H100, 1024, 16384 * 8)
    ([132], [])
    """
    half = gpu.l2_reach
    if min(tiles, gpu.sms * resident_per_sm(gpu, threads)) * tile_bytes <= half:
        return []
    return [b for b in block_counts(tiles, gpu, threads) if b * tile_bytes <= half and b < tiles][-1:]


def check_rows(group: KernelGroup, d: Decision, gpu: GPUSpec, at: str) -> None:
    """A persistent grid of a stitched group without column partials (a replayed decision):
    preconditions 1 and 2 (whole rows, no register tile, direct loads; 1 <= blocks <= row tiles,
    `per_sm` consistent), else a ScheduleError."""
    if not group.stitched:
        raise ScheduleError(f"{at}: a persistent grid of {d.persistent} blocks, but no stitched rows to loop over")
    if d.split != 1 or d.rtile * d.ctile != 1 or d.stages != 1:
        raise ScheduleError(f"{at}: a persistent row loop needs whole rows, no register tile and direct loads (1)")
    if not 1 <= d.persistent <= d.grid[0] or d.per_sm != math.ceil(d.persistent / gpu.sms):
        raise ScheduleError(
            f"{at}: persistent grid of {d.persistent} blocks ({d.per_sm} per SM) for {d.grid[0]} row tiles (2)"
        )


def check(group: KernelGroup, d: Decision, gpu: GPUSpec, deterministic: bool, at: str) -> None:
    """Preconditions 1 to 4 of a joined group's decision (a replayed one: ScheduleError)."""
    if d.split != 1 or d.rtile * d.ctile != 1 or d.stages != 1:
        raise ScheduleError(f"{at}: column partials need whole rows, no register tile and direct loads (1)")
    if not 1 <= d.persistent <= d.grid[0]:
        raise ScheduleError(f"{at}: persistent grid of {d.persistent} blocks for {d.grid[0]} row tiles (2)")
    if d.per_sm != math.ceil(d.persistent / gpu.sms):
        raise ScheduleError(f"{at}: {d.per_sm} blocks per SM for {d.persistent} blocks on {gpu.sms} SMs (2)")
    grid = MergeMode.PARTIALS_GRID in d.merges or MergeMode.ATOMIC_GRID in d.merges
    at_once = co_resident(gpu, d.threads, block_bytes(group, d), d.per_sm)
    if grid and d.blocks > at_once:
        raise ScheduleError(
            f"{at}: a grid-wide combine of {d.blocks} blocks of {d.threads} threads, not all co-resident on "
            f"{gpu.name} (at most {at_once}) (5)"
        )
    if d.cgroups > 1 and not column_groups_ok(group, d.cgroups, d.vec):
        raise ScheduleError(
            f"{at}: {d.cgroups} column groups need columns the group's own statements read, and groups of whole "
            f"{LINE_BYTES}-byte lines of every tensor of {group.M} x {group.N} (6)"
        )
    check_hold(group, gpu, d, at)
    if partials_per_thread(group, d.tx, d.vec, d.cgroups) > MAX_PARTIALS or column_registers(
        group, d
    ) > register_budget(d):
        raise ScheduleError(
            f"{at}: {partials_per_thread(group, d.tx, d.vec, d.cgroups)} column partials per thread (at most {MAX_PARTIALS}), "
            f"{column_registers(group, d)} registers with the loads, {register_budget(d)} under the launch bounds (3)"
        )
    legal = merge_options(group, deterministic or struct_accumulators(group), True)
    if d.merges not in legal:
        raise ScheduleError(
            f"{at}: merge modes {[str(m) for m in d.merges]} are not legal for column partials "
            f"(legal: {[[str(m) for m in w] for w in legal]}) (4)"
        )
