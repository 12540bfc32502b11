"""The fusion planner: among legal plans, the one the performance model prefers.

For every legal stitched group (poly/stitch.py) it compares, with model/gpu.py, the stitched
kernel against the unfused kernels of the same statements (each mapped freely, multi-block where
that pays, plus its init launch). It keeps the stitched group when it is cheaper, as
FusionStitching does, and records what it considered for `explain()`. The stitched kernel is
itself the model's best over its splits: whole rows per block, or rows too few to fill the GPU
split across co-resident blocks (one cooperative launch); `explain()` gives both figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ScheduleError
from ..model.gpu import GPUSpec
from ..poly.program import KernelGroup, Program, external_results, group_statements
from .mapping import map_group


@dataclass(frozen=True)
class Considered:
    statements: tuple[str, ...]
    stitched_us: float
    unfused_us: float
    unfused_kernels: int
    chosen: bool
    split: int = 1  # blocks per row of the stitched kernel
    whole_rows_us: float = 0.0  # the stitched kernel with whole rows per block, when split > 1

    def describe(self) -> str:
        verdict = "stitched" if self.chosen else "left unfused"
        how = ""
        if self.split > 1:
            how = (
                f" (each row split across {self.split} co-resident blocks, one cooperative launch; "
                f"whole rows per block {self.whole_rows_us:.1f} us)"
            )
        return (
            f"{'+'.join(self.statements)}: 1 stitched kernel {self.stitched_us:.1f} us{how} vs "
            f"{self.unfused_kernels} kernels {self.unfused_us:.1f} us (modeled) -> {verdict}"
        )


def plan_groups(prog: Program, gpu: GPUSpec, allow_stitch: bool = True, replay=None, stitch_split: bool = True):
    """Kernel groups for the program and the stitching decisions the model made.

    stitch_split: let a stitched kernel split rows across blocks (False: whole rows per block).

    replay: stitched groups (tuples of statement names) to take instead of asking the model;
    each must be a legal candidate (a saved schedule that no longer fits is refused)."""
    considered, chosen = [], []
    by_name = {s.name: s for s in prog.statements}
    if replay is not None:
        legal = {tuple(s.name for s in cand): tuple(cand) for cand in prog.stitch_candidates}
        for names in replay:
            if tuple(names) not in legal:
                raise ScheduleError(
                    f"schedule stitches {'+'.join(names)}, which is not a legal stitched group of this program "
                    f"(legal: {['+'.join(n) for n in legal] or 'none'})"
                )
            chosen.append(legal[tuple(names)])
    for cand in prog.stitch_candidates if allow_stitch and replay is None else ():
        names = tuple(s.name for s in cand)
        stitched = KernelGroup(tuple(cand), True, external_results(cand, prog.statements, prog.outputs))
        best = map_group(stitched, gpu, split=None if stitch_split else 1)
        fused = best.cost.total_s
        whole = map_group(stitched, gpu, split=1).cost.total_s if best.split > 1 else fused
        unfused, kernels = 0.0, 0
        for name in names:
            m = map_group(KernelGroup((by_name[name],)), gpu)
            unfused += m.cost.total_s
            kernels += 1
        take = fused < unfused
        considered.append(Considered(names, fused * 1e6, unfused * 1e6, kernels, take, best.split, whole * 1e6))
        if take:
            chosen.append(tuple(cand))
    if not chosen:
        return prog.groups, tuple(considered)
    groups = group_statements(list(prog.statements), prog.statement_graph, prog.outputs, tuple(chosen))
    return groups, tuple(considered)
