"""Row tiles held in shared memory by a joined column stitch (Decision.hold; BatchNorm backward NHWC).

In a column stitch (poly/column_stitch.py, codegen/column_stitch.py) every block streams its row
tiles twice: the columns' pass (the sums), then, after the grid-wide merge, the consumers' pass
(dx) backwards. The last tiles the first pass read are still in L2; the first ones are not. A
block that keeps its first `hold` row tiles (of each column group, `Decision.cgroups`) of every
input both passes read in shared memory re-reads those from chip: each thread stores the vectors
it loaded and loads them back itself (the same thread reads the same element in both passes), so
no barrier. The tiles live in the block's dynamic shared memory (schedule/dynsmem.py: one region
per held tensor, carved by `dynsmem.layout`; the decision states the bytes, `Decision.dynamic_smem`),
so a block holds up to the device's opt-in maximum (227 KiB on an H100) beside its static column
tree, not the 48 KiB of static shared memory. The mapper picks `hold` (`most_held`): the most tiles
that fit, with every block still co-resident; the cost (schedule/cost.py `joined_cost`) moves
exactly `held_bytes` of the re-read off DRAM.

Precondition 7 (`check_hold`): hold > 0 only in a column stitch (the group's own statements read
its columns) with inputs both passes read, at most the row tiles a block owns, within the opt-in
shared memory of one block beside the column tree (`dynsmem.opt_in`), every block still
co-resident; the decision's `dynamic_smem` is the held tiles' bytes (dynsmem.py's preconditions).
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..errors import ScheduleError
from ..frontend.tensor import Tensor
from ..model.gpu import GPUSpec
from ..poly.access import AccessKind
from ..poly.program import KernelGroup
from ..poly.statement import StatementKind
from . import dynsmem
from .decision import Decision, MergeMode
from .derived import co_resident, column_tree_bytes

COMPUTE_BYTES = {"float": 4, "double": 8}  # a held value's bytes in shared memory: its compute type's
FLAG_BYTES = 4  # the last block's flag, `__shared__ int pn_is_last` (codegen/column_partials.py)


def held_tensors(group: KernelGroup, d: Decision) -> list[Tensor]:
    """The M x N inputs a column stitch holds: read as contiguous vectors (`d.vec` > 1) by both its
    passes (`d.levels` 0 and 1), computed in float or double, in first-read order; none unless the
    group's own statements read its columns (`consumed`)."""
    levels, access = d.levels, d.access
    if not group.consumed or d.vec == 1:
        return []
    by_pass: list[dict[int, Tensor]] = [{}, {}]
    for k, s in enumerate(group.statements):
        if group.accumulator_of[k] != k or levels[k] not in (0, 1):
            continue
        for ri, r in enumerate(s.reads):
            big = r.memory and r.indirect is None and r.tensor.size >= group.M * group.N
            kind = r.tensor.dtype.compute in COMPUTE_BYTES and access[k][ri] == AccessKind.CONTIG
            if big and kind and r.tensor.uid not in group.on_chip:
                by_pass[levels[k]].setdefault(r.tensor.uid, r.tensor)
    return [t for uid, t in by_pass[0].items() if uid in by_pass[1]]


def tile_bytes(group: KernelGroup, d: Decision) -> int:
    """Shared memory of one held row tile: every thread's S steps of V lanes of each held tensor
    (S * tx * V >= the group's N / cgroups columns)."""
    return sum(region_bytes(group, d, 1))


def region_bytes(group: KernelGroup, d: Decision, hold: int | None = None) -> list[int]:
    """The dynamic shared memory of each held tensor (first-read order): `hold` (default `d.hold`)
    row tiles of every thread's S steps of V lanes."""
    width = math.ceil(group.N // d.cgroups / (d.vec * d.tx)) * d.vec * d.tx
    n = d.hold if hold is None else hold
    return [n * d.ty * width * COMPUTE_BYTES[t.dtype.compute] for t in held_tensors(group, d)]


def hold_bytes(group: KernelGroup, d: Decision) -> int:
    """A block's shared memory for its `d.hold` held row tiles.

    >>> import panamera as pn
    >>> from panamera.bench.train_suite import batch_norm_backward
    >>> k = pn.compile(batch_norm_backward((256, 56, 56, 256), True), target="emulator", gpu="h100", use_database=False)
    >>> from panamera.model.gpu import H100
    >>> from panamera.schedule.persistent import map_joined
    >>> m = map_joined(k.groups[0], H100)  # the mapper's pick (the shipped plan may predate it)
    >>> m.cgroups, m.ty, m.hold, hold_bytes(k.groups[0], m)  # 6 tiles x 128 rows x 32 channels x (x, dy) x 4 B
    (8, 128, 6, 196608)
    """
    return dynsmem.layout(region_bytes(group, d))[1]


def tiles_per_block(d: Decision) -> int:
    """The most row tiles one block of the persistent grid owns."""
    return math.ceil(d.grid[0] / max(d.blocks, 1))


def joined_static_bytes(
    group: KernelGroup,
    tx: int,
    ty: int,
    vec: int,
    cgroups: int = 1,
    merges: tuple[MergeMode, ...] = (),
    dynamic: bool = False,
) -> int:
    """The static shared memory a joined-row kernel (schedule/persistent.py) of tx x ty threads
    declares: the one count the residency checks (`persistent.check`, the mapper's co-residency,
    `most_held`), the held tiles' opt-in check (`check_hold`) and the cost's `shared_bytes` (cost.py
    `joined_cost`) all take, and the bytes of the `__shared__` arrays its source declares
    (tests/test_joined_smem.py):
      - the column tree (`column_tree_bytes`, codegen/column_partials.py `pn_csmem_*`);
      - per accumulator type of the row reductions (the REDUCE statements that are not columns),
        the warp partials and the broadcast (codegen/stitched_kernel.py `pn_smem_*`, `pn_bcast_*`):
        ty x max(1, tx / 32) and ty values;
      - the last block's flag (`pn_is_last`, an int), declared unless the merge is a grid-wide
        combine of partials with no atomic workspace to reset (codegen/column_partials.py `merge`,
        `departure`). Before the merges are chosen (`merges` empty) it is counted: the mapper's
        bound is never below the check's.
    With `dynamic` (held tiles follow, `Decision.dynamic_smem`), up to the 16-byte boundary where
    the dynamic buffer starts (`dynsmem.ALIGN`). ptxas reports these bytes, less any array the
    kernel never reads (one of a row reduction's two for rows of at most a warp).

    >>> import panamera as pn
    >>> from panamera.bench.train_suite import layer_norm_backward
    >>> g = pn.compile(layer_norm_backward(4096, 1024, "bfloat16"), target="emulator", use_database=False).groups[0]
    >>> joined_static_bytes(g, 128, 8, 8, 1, (MergeMode.PARTIALS_GRID,))  # tree 32768 + 32 x 4 + 8 x 4 B
    32928
    """
    total = column_tree_bytes(group, tx, ty, vec, cgroups)
    rows = [s.acc for k, s in enumerate(group.statements) if s.kind == StatementKind.REDUCE and k not in group.columns]
    for acc in {a.compute: a for a in rows}.values():
        total += (ty * max(1, tx // 32) + ty) * acc.itemsize
    if MergeMode.ATOMIC_GRID in merges or MergeMode.PARTIALS_GRID not in merges:
        total += FLAG_BYTES
    return -(-total // dynsmem.ALIGN) * dynsmem.ALIGN if dynamic else total


def static_bytes(group: KernelGroup, d: Decision) -> int:
    """`joined_static_bytes` of `d`'s kernel: its static shared memory beside the held tiles."""
    return joined_static_bytes(group, d.tx, d.ty, d.vec, d.cgroups, d.merges, d.dynamic_smem > 0)


def block_bytes(group: KernelGroup, d: Decision) -> int:
    """A block of `d`'s joined kernel's shared memory, static and dynamic (the held tiles,
    `Decision.dynamic_smem`): what bounds the blocks an SM holds."""
    return static_bytes(group, d) + max(d.dynamic_smem, 0)


def most_held(group: KernelGroup, gpu: GPUSpec, d: Decision) -> int:
    """The most row tiles `d`'s blocks can hold (precondition 7): in dynamic shared memory within
    the block's opt-in maximum beside its static column tree, every block of the grid still
    co-resident, at most the tiles a block owns; 0 where nothing is held."""
    per = tile_bytes(group, d)
    if not per:
        return 0
    tree = joined_static_bytes(group, d.tx, d.ty, d.vec, d.cgroups, d.merges, True)  # the tiles: dynamic
    n = min(tiles_per_block(d), (dynsmem.opt_in(gpu) - tree) // per)
    while n > 0 and co_resident(gpu, d.threads, tree + n * per, d.per_sm) < d.blocks:
        n -= 1
    return max(n, 0)


def held_bytes(group: KernelGroup, d: Decision) -> int:
    """The bytes of the consumers' re-read that come from shared memory, every block and column
    group together: each block's first `hold` tiles (the last ones partial or absent)."""
    if not d.hold:
        return 0
    rows = min(min(d.hold * d.blocks, d.grid[0]) * d.ty, group.M)  # tiles 0 .. hold x blocks - 1 (the last partial)
    return d.cgroups * rows * (group.N // d.cgroups) * sum(t.dtype.itemsize for t in held_tensors(group, d))


def with_hold(group: KernelGroup, d: Decision, hold: int) -> Decision:
    """`d` holding `hold` row tiles, its dynamic shared memory stated (the held tiles' bytes)."""
    held = replace(d, hold=hold)
    return replace(held, dynamic_smem=hold_bytes(group, held))


def check_hold(group: KernelGroup, gpu: GPUSpec, d: Decision, at: str) -> None:
    """Precondition 7 of a replayed decision, else a ScheduleError naming the decision."""
    tree = static_bytes(group, d)
    if d.hold < 0 or (d.hold and not held_tensors(group, d)):
        raise ScheduleError(
            f"{at}: hold={d.hold} row tiles in shared memory need a column stitch whose two passes both read "
            "an M x N input (7)"
        )
    dynsmem.check(gpu, d, hold_bytes(group, d), tree, at)  # the held tiles are its dynamic shared memory
    if d.hold == 0:
        return
    if d.hold > most_held(group, gpu, d):
        raise ScheduleError(
            f"{at}: hold={d.hold} row tiles of {tile_bytes(group, d)} bytes each: at most {most_held(group, gpu, d)} "
            f"fit {dynsmem.opt_in(gpu)} bytes of shared memory (the opt-in maximum) beside the column tree with "
            f"{d.blocks} blocks co-resident and {tiles_per_block(d)} tiles per block (7)"
        )
