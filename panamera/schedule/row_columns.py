"""The model's verdict on column partials in a stitched row kernel (poly/row_columns.py).

Two launches: the stitched ROW kernel as the mapper maps it, plus each COLUMN reduction mapped
on its own (split across blocks, merged as the mapper prefers). Both read x and dy.

One launch: the mapper's persistent kernel of the joined group (schedule/persistent.py, its
cost schedule/cost.py `joined_cost`). The column partials live in registers: a thread strides
over the same columns of every row its block owns, so it keeps one partial per column it
touches per joiner; a block owns a chunk of rows (a persistent grid of k blocks per SM, as
Liger's dW partials) and merges its partials with one atomic per block per column, or
(deterministic) writes them to a partials workspace that the last block to arrive sums in a
fixed order. What it saves: the column kernels' DRAM reads of tensors the row kernel reads
anyway, and their launches. The planner (schedule/planner.py) takes the join where it `pays`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..model.gpu import GPUSpec
from ..model.kernel_cost import sequence_s
from ..poly.column_stitch import ColumnStitch
from ..poly.program import KernelGroup, Program, external_results
from ..poly.row_columns import ColumnJoin
from .mapping import MergeMode, map_group
from .persistent import map_joined


@dataclass(frozen=True)
class ColumnConsidered:
    """Modeled figures for one stitched group and the COLUMN reductions that may join it."""

    statements: tuple[str, ...]
    one_launch_us: float
    two_launch_us: float
    kernels: int  # kernels today: the stitched kernel and the column reductions' (horizontally fused)
    bytes_saved: int  # DRAM bytes the column kernels read that the row kernel reads anyway
    blocks: int  # blocks of the one-launch kernel: one partial per block per column
    merges: int  # atomics (or partials written) to merge the columns
    deterministic: bool  # the one launch merges by partials and the last block (else atomics)
    chosen: bool = False  # the planner took it (schedule/planner.py)
    merge: str = ""  # the one launch's column merge (a MergeMode)

    @property
    def pays(self) -> bool:
        return self.one_launch_us < self.two_launch_us

    def describe(self) -> str:
        if not self.blocks:
            return (
                f"{'+'.join(self.statements)}: no block keeps the column partials in registers; "
                f"{self.kernels} kernels {self.two_launch_us:.1f} us (modeled) -> does not pay"
            )
        how = _HOW.get(self.merge, self.merge)
        return (
            f"{'+'.join(self.statements)}: 1 kernel with column partials ({self.blocks} blocks, {how}) "
            f"{self.one_launch_us:.1f} us vs {self.kernels} kernels {self.two_launch_us:.1f} us (modeled), "
            f"{self.bytes_saved} bytes not re-read -> {'pays' if self.pays else 'does not pay'}"
            + (", one launch" if self.chosen else "")
        )


_HOW = {
    MergeMode.ATOMIC_WS: "one atomic per block per column",
    MergeMode.PARTIALS: "partials, the last block sums each column in block order",
    MergeMode.PARTIALS_GRID: "partials, after a grid-wide wait every block sums its columns in block order",
    MergeMode.ATOMIC_GRID: "one atomic per block per column, read back by every block after a grid-wide wait",
}


def _bytes(t) -> int:
    return t.size * t.dtype.itemsize


def bytes_saved(join: ColumnJoin) -> int:
    """DRAM bytes of the tensors both the columns and the row group read (each counted once).

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> x = pn.placeholder((8, 4))
    >>> p = lower([x - pn.sum(x, axis=1, keepdims=True), pn.sum(x, axis=0)], stop_after="program", target="emulator")
    >>> bytes_saved(p.program.column_candidates[0])
    128
    """
    row = {r.tensor.uid: r.tensor for s in join.group for r in s.reads if r.memory}
    col = {r.tensor.uid for s in join.columns for r in s.reads if r.memory}
    return sum(_bytes(t) for uid, t in row.items() if uid in col)


def joined_group(join: ColumnJoin, prog: Program) -> KernelGroup:
    """The one-launch kernel group of `join`: the host rows, then the columns placed in them."""
    stmts = join.statements
    return KernelGroup(stmts, True, external_results(stmts, prog.statements, prog.outputs))


def consider(
    join: ColumnJoin,
    prog: Program,
    gpu: GPUSpec,
    deterministic: bool = False,
    split: int | None = None,
    epilogues: tuple = (),
) -> ColumnConsidered:
    """One launch against two for `join`, by the model (figures in microseconds, modeled): the
    mapper's persistent kernel (schedule/persistent.py) against the stitched kernel as the
    planner maps it (`split`: forced blocks per row, None: the model's) plus the columns' kernels
    (`epilogues`: the epilogue groups the planner chose for columns, each one reduce kernel)."""
    ext = external_results(join.group, prog.statements, prog.outputs)
    row = map_group(KernelGroup(join.group, True, ext), gpu, split=split)
    cols = [map_group(g, gpu, deterministic=deterministic) for g in _column_kernels(join, prog, epilogues)]
    two = sequence_s([row.cost, *(c.cost for c in cols)], gpu)
    one = map_joined(joined_group(join, prog), gpu, deterministic=deterministic)
    if one is None:  # the partials fit no block's registers: never pays
        return ColumnConsidered(join.names, math.inf, two * 1e6, 1 + len(cols), bytes_saved(join), 0, 0, deterministic)
    group = joined_group(join, prog)
    blocks, owners = one.blocks, sum(1 for k in group.columns if group.accumulator_of[k] == k)
    return ColumnConsidered(
        join.names, one.cost.total_s * 1e6, two * 1e6, 1 + len(cols), bytes_saved(join), blocks,
        blocks * join.group[0].N * owners, any(m in (MergeMode.PARTIALS, MergeMode.PARTIALS_GRID) for m in one.merges),
        merge=str(one.merges[group.columns[0]]),
    )  # fmt: skip


def _column_kernels(join: ColumnJoin, prog: Program, epilogues: tuple = ()) -> list[KernelGroup]:
    """The kernels the columns run in today: their chosen epilogue groups (one reduce kernel
    each), the program's horizontally fused groups that hold only joiners, and a kernel of its
    own for any other joiner or column epilogue."""
    names = {c.name for c in join.columns + join.epilogues}
    epis = [
        KernelGroup(tuple(e), external=external_results(e, prog.statements, prog.outputs), epilogue=True)
        for e in epilogues
    ]
    names -= {s.name for e in epilogues for s in e}
    fused = epis + [g for g in prog.groups if {s.name for s in g.statements} <= names]
    inside = {s.name for g in fused for s in g.statements}
    by_name = {s.name: s for s in prog.statements}
    return fused + [KernelGroup((by_name[n],)) for n in sorted(names - inside)]


def consider_stitch(stitch: ColumnStitch, prog: Program, gpu: GPUSpec, deterministic: bool = False) -> ColumnConsidered:
    """One cooperative launch of COLUMN reductions and their consumers (poly/column_stitch.py)
    against the kernels they run in today (the program's groups that hold only its statements,
    and a kernel of its own for any other), by the model (microseconds, modeled)."""
    names = set(stitch.names)
    today = [g for g in prog.groups if {s.name for s in g.statements} <= names]
    inside = {s.name for g in today for s in g.statements}
    by_name = {s.name: s for s in prog.statements}
    today += [KernelGroup((by_name[n],)) for n in sorted(names - inside)]
    two = sequence_s((map_group(g, gpu, deterministic=deterministic).cost for g in today), gpu)
    group = KernelGroup(stitch.statements, True, external_results(stitch.statements, prog.statements, prog.outputs))
    one = map_joined(group, gpu, deterministic=deterministic)
    width, owners = group.N, sum(1 for k in group.columns if group.accumulator_of[k] == k)
    if one is None:  # no block shape keeps the partials, or no grid is co-resident: never pays
        return ColumnConsidered(stitch.names, math.inf, two * 1e6, len(today), 0, 0, 0, True)
    cols = {r.tensor.uid: r.tensor for s in stitch.columns for r in s.reads if r.memory}
    both = {r.tensor.uid: r.tensor for s in stitch.consumers for r in s.reads if r.memory and r.tensor.uid in cols}
    reads = {r.tensor.uid: r.tensor for s in stitch.statements for r in s.reads if r.memory}
    # the consumers' re-read (cost.py `joined_cost`): all from L2 where it fits in half of it, else that half
    hits = min(sum(_bytes(t) for t in reads.values()), gpu.l2_reach)
    saved = int(min(sum(_bytes(t) for t in both.values()), hits))
    return ColumnConsidered(
        stitch.names, one.cost.total_s * 1e6, two * 1e6, len(today), saved, one.blocks, one.blocks * width * owners,
        one.merges[group.columns[0]] == MergeMode.PARTIALS_GRID, merge=str(one.merges[group.columns[0]]),
    )  # fmt: skip


def plan_columns(prog: Program, gpu: GPUSpec, deterministic: bool = False) -> tuple[ColumnConsidered, ...]:
    """The model's figures for every legal column join of the program."""
    return tuple(consider(j, prog, gpu, deterministic) for j in prog.column_candidates)
