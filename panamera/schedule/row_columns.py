"""The model's verdict on column partials in a stitched row kernel (poly/row_columns.py).

Two launches: the stitched ROW kernel as the mapper maps it, plus each COLUMN reduction mapped
on its own (split across blocks, merged as the mapper prefers). Both read x and dy.

One launch: the stitched kernel re-modeled with the columns' work folded in. The column
partials live in registers: a thread strides over the same columns of every row its block owns,
so it keeps one partial per column it touches per joiner; a block owns a chunk of rows (a
persistent grid of at most `resident` blocks per SM, as Liger's dW partials) and merges its
partials with one atomic per block per column, or (deterministic) writes them to a partials
workspace that the last block to arrive sums in a fixed order. What it saves: the column
kernels' DRAM reads of tensors the row kernel reads anyway, and their launches.

Only figures here: the row kernel with column partials is not generated yet, so `pays` is the
model's verdict and the planner keeps the two launches (see the report of issue 23).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.gpu import GPUSpec, kernel_time
from ..poly.program import KernelGroup, Program, external_results
from ..poly.row_columns import ColumnJoin
from .mapping import map_group


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
    deterministic: bool

    @property
    def pays(self) -> bool:
        return self.one_launch_us < self.two_launch_us

    def describe(self) -> str:
        how = "partials + last block" if self.deterministic else "one atomic per block per column"
        return (
            f"{'+'.join(self.statements)}: 1 kernel with column partials ({self.blocks} blocks, {how}) "
            f"{self.one_launch_us:.1f} us vs {self.kernels} kernels {self.two_launch_us:.1f} us (modeled), "
            f"{self.bytes_saved} bytes not re-read -> {'pays' if self.pays else 'does not pay'}"
        )


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


def consider(join: ColumnJoin, prog: Program, gpu: GPUSpec, deterministic: bool = False) -> ColumnConsidered:
    """One launch against two for `join`, by the model (figures in microseconds, modeled)."""
    ext = external_results(join.group, prog.statements, prog.outputs)
    row = map_group(KernelGroup(join.group, True, ext), gpu, split=1)
    cols = [map_group(g, gpu, deterministic=deterministic) for g in _column_kernels(join, prog)]
    two = row.cost.total_s + sum(c.cost.total_s for c in cols)
    best = min((_one_launch(join, row, gpu, b, deterministic) for b in _block_counts(row, gpu)), key=lambda t: t[0])
    one, blocks, merges = best
    return ColumnConsidered(
        join.names, one * 1e6, two * 1e6, 1 + len(cols), bytes_saved(join), blocks, merges, deterministic
    )


def _column_kernels(join: ColumnJoin, prog: Program) -> list[KernelGroup]:
    """The kernels the columns run in today: the program's horizontally fused groups that hold
    only joiners, and a kernel of its own for any other joiner."""
    names = {c.name for c in join.columns}
    fused = [g for g in prog.groups if {s.name for s in g.statements} <= names]
    inside = {s.name for g in fused for s in g.statements}
    by_name = {s.name: s for s in prog.statements}
    return fused + [KernelGroup((by_name[n],)) for n in sorted(names - inside)]


def _block_counts(row, gpu: GPUSpec) -> list[int]:
    """Persistent grids of k blocks per SM, and the row kernel's own grid (one block per row tile)."""
    most = min(row.blocks, gpu.sms * gpu.resident_blocks(row.tx * row.ty))
    return sorted({min(most, gpu.sms * k) for k in (1, 2, 4, 8, 16, 32)} | {most})


def _one_launch(join: ColumnJoin, row, gpu: GPUSpec, blocks: int, deterministic: bool) -> tuple[float, int, int]:
    """(seconds, blocks, merges) of the row kernel with column partials over `blocks` blocks."""
    f = dict(row.cost.features)
    width = join.group[0].N  # columns of the row space
    merges = blocks * width * len(join.columns)
    f["blocks"] = blocks
    f["dram_bytes"] += sum(_bytes(c.result) for c in join.columns)
    if deterministic:  # partials written, read back by the last block; one counter arrival per block
        f["dram_bytes"] += 2 * merges * max(c.acc.itemsize for c in join.columns)
        f["atomics"] += blocks
    else:
        f["atomics"] += merges
    f["fp32_ops"] += sum(2 * c.M * c.N for c in join.columns)  # body and combine per element
    return kernel_time(gpu, **f).total_s, blocks, merges


def plan_columns(prog: Program, gpu: GPUSpec, deterministic: bool = False) -> tuple[ColumnConsidered, ...]:
    """The model's figures for every legal column join of the program."""
    return tuple(consider(j, prog, gpu, deterministic) for j in prog.column_candidates)
