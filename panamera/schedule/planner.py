"""The fusion planner: among legal plans, the one the performance model prefers.

For every legal stitched group (poly/stitch.py) it compares, with model/kernel_cost.py, the stitched
kernel against the unfused kernels of the same statements (each mapped freely, multi-block where
that pays, plus its init launch). It keeps the stitched group when it is cheaper, as
FusionStitching does, and records what it considered for `explain()`. The stitched kernel is
itself the model's best over its splits: whole rows per block, or rows too few to fill the GPU
split across co-resident blocks (one cooperative launch) or, on sm_90, across the blocks of one
thread-block cluster per row; `explain()` gives both figures.

For every legal epilogue group (poly/epilogue.py: one reduction and its element-wise consumers
in its output space) it compares one reduce kernel whose finishing threads apply the epilogue
(split or not, merged by atomics or partials as the mapper's model prefers) against the two
launches, and against the stitched kernel of the same statements when there is one; a stitched
group that overlaps a different epilogue group keeps precedence. `explain()` lists every figure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import ScheduleError
from ..model.gpu import GPUSpec
from ..model.kernel_cost import KernelCost, sequence_s
from ..poly.program import KernelGroup, Program, external_results, group_statements
from ..poly.row_columns import with_epilogues
from ..poly.statement import Form, StatementKind
from .mapping import Mapping, MergeMode, map_group
from .row_columns import consider, consider_stitch


@dataclass(frozen=True)
class Considered:
    statements: tuple[str, ...]
    stitched_us: float
    unfused_us: float
    unfused_kernels: int
    chosen: bool
    split: int = 1  # blocks per row of the stitched kernel
    whole_rows_us: float = 0.0  # the stitched kernel with whole rows per block, when split > 1
    superseded: bool = False  # the model preferred the epilogue group of the same statements
    cluster: int = 1  # the split's blocks are one thread-block cluster (schedule/cluster.py)

    def describe(self) -> str:
        verdict = "stitched" if self.chosen else "epilogue group instead" if self.superseded else "left unfused"
        how = ""
        if self.split > 1:
            launch = (
                "blocks of one thread-block cluster"
                if self.cluster > 1
                else "co-resident blocks, one cooperative launch"
            )
            how = f" (each row split across {self.split} {launch}; whole rows per block {self.whole_rows_us:.1f} us)"
        return (
            f"{'+'.join(self.statements)}: 1 stitched kernel {self.stitched_us:.1f} us{how} vs "
            f"{self.unfused_kernels} kernels {self.unfused_us:.1f} us (modeled) -> {verdict}"
        )


@dataclass(frozen=True)
class EpilogueConsidered:
    """The model's figures for one epilogue group: fused in one reduce kernel, unfused, and
    stitched (0.0 when no stitched candidate has the same statements)."""

    statements: tuple[str, ...]
    fused_us: float
    unfused_us: float
    unfused_kernels: int
    chosen: bool
    split: int
    merge: str  # how the fused kernel's split merges: "atomic_ws", "partials" or "store"
    stitched_us: float = 0.0

    def describe(self) -> str:
        verdict = "epilogue fused" if self.chosen else "left as it was"
        where = (
            f"in the last of {self.split} blocks per output ({self.merge})"
            if self.split > 1
            else "in the storing thread"
        )
        stitched = f" vs stitched {self.stitched_us:.1f} us" if self.stitched_us else ""
        return (
            f"{'+'.join(self.statements)}: 1 reduce kernel applying the epilogue {where} {self.fused_us:.1f} us"
            f"{stitched} vs {self.unfused_kernels} kernels {self.unfused_us:.1f} us (modeled) -> {verdict}"
        )


def _merge_of(m: Mapping) -> str:
    return str(next((x for x in m.merges if x != MergeMode.STORE), MergeMode.STORE))


def plan_groups(
    prog: Program,
    gpu: GPUSpec,
    allow_stitch: bool = True,
    replay=None,
    stitch_split: bool = True,
    replay_epilogues=(),
    deterministic: bool = False,
    columns: bool = True,
):
    """Kernel groups for the program and the stitching and epilogue decisions the model made.

    stitch_split: let a stitched kernel split rows across blocks (False: whole rows per block).
    deterministic: an epilogue group and the kernels it replaces are weighed with partials merges.
    columns: let COLUMN reductions join a chosen stitched group as column partials where the
    model prefers one launch (schedule/row_columns.py; a replayed stitched group may hold them).

    replay: stitched groups (tuples of statement names) to take instead of asking the model,
    and replay_epilogues the epilogue groups; each must be a legal candidate (a saved schedule
    that no longer fits is refused)."""
    considered, chosen = [], []
    alone = _Alone(prog, gpu)
    if replay is not None:
        legal = list(prog.stitch_candidates)
        plain = {tuple(s.name for s in c) for c in legal}
        if any(tuple(n) not in plain for n in replay):  # a stitched group with column partials
            legal += [j.statements for j in prog.column_candidates]
            legal += [j.statements for j in _with_epilogues(prog)]
            legal += [c.statements for c in prog.column_stitches]
        chosen = _replayed(legal, replay, "stitches {}, which is not a legal stitched group")
        epilogues = _replayed(
            prog.epilogue_candidates,
            replay_epilogues,
            "applies {} as a reduction's epilogue, which is not a legal epilogue group",
        )
    for cand in prog.stitch_candidates if allow_stitch and replay is None else ():
        names = tuple(s.name for s in cand)
        stitched = KernelGroup(tuple(cand), True, external_results(cand, prog.statements, prog.outputs))
        best = map_group(stitched, gpu, split=None if stitch_split else 1)
        fused = best.cost.total_s
        whole = map_group(stitched, gpu, split=1).cost.total_s if best.split > 1 else fused
        unfused, kernels = sequence_s((alone(name) for name in names), gpu), len(names)
        take = fused < unfused
        considered.append(
            Considered(names, fused * 1e6, unfused * 1e6, kernels, take, best.split, whole * 1e6, cluster=best.cluster)
        )
        if take:
            chosen.append(tuple(cand))
    if replay is None:
        epilogues = _plan_epilogues(prog, gpu, considered, chosen, deterministic, alone) if allow_stitch else []
        if columns and allow_stitch:
            chosen = _plan_columns(prog, gpu, considered, chosen, epilogues, deterministic, stitch_split)
            chosen += _plan_stitches(prog, gpu, considered, chosen, epilogues, deterministic)
    if not chosen and not epilogues:
        return prog.groups, tuple(considered)
    groups = group_statements(
        list(prog.statements), prog.statement_graph, prog.outputs, tuple(chosen), tuple(epilogues)
    )
    return groups, tuple(considered)


def _plan_columns(prog: Program, gpu: GPUSpec, considered: list, chosen: list, epilogues, deterministic, split):
    """The chosen stitched groups, each with the COLUMN reductions that join it where the model
    prefers one launch (appends the figures to `considered`). A column that heads a chosen
    epilogue group (torch's cast of dgamma back to bf16) joins with its epilogue
    (poly/row_columns.py `with_epilogues`), weighed against the epilogue group's kernel, and the
    epilogue group is dropped from `epilogues` (in place) when the join pays. Asks isl for the
    column candidates only when a chosen stitched group and a COLUMN reduction outside it exist."""
    if not chosen or not any(s.form == Form.COLUMN and s.kind == StatementKind.REDUCE for s in prog.statements):
        return chosen
    out = list(chosen)
    for join in prog.column_candidates:
        names = tuple(s.name for s in join.group)
        at = next((k for k, c in enumerate(out) if tuple(s.name for s in c) == names), None)
        heads = {c.name for c in join.columns}
        mine = [e for e in epilogues if e[0].name in heads]
        others = [e for e in epilogues if e[0].name not in heads]
        taken = {s.name for grp in out[:at] + out[at + 1 :] + others for s in grp} if at is not None else set()
        if at is None or any(c.name in taken for c in join.columns):
            continue
        if mine:
            join = with_epilogues(join, mine, prog.statement_graph)
            if join is None or any(e[0].name in taken for e in mine):
                continue
        c = consider(join, prog, gpu, deterministic, None if split else 1, tuple(mine))
        considered.append(replace(c, chosen=c.pays))
        if c.pays:
            out[at] = join.statements
            epilogues[:] = others
    return out


def _plan_stitches(prog: Program, gpu: GPUSpec, considered: list, chosen: list, epilogues, deterministic) -> list:
    """The COLUMN reductions stitched with their consumers (poly/column_stitch.py) where the model
    prefers one cooperative launch, none of whose statements another chosen group holds (appends
    the figures to `considered`). Asks isl only when a COLUMN reduction exists."""
    if not any(s.form == Form.COLUMN and s.kind == StatementKind.REDUCE for s in prog.statements):
        return []
    taken = {s.name for grp in list(chosen) + list(epilogues) for s in grp}
    out = []
    for stitch in prog.column_stitches:
        if taken & set(stitch.names):
            continue
        c = consider_stitch(stitch, prog, gpu, deterministic)
        considered.append(replace(c, chosen=c.pays))
        if c.pays:
            out.append(stitch.statements)
            taken |= set(stitch.names)
    return out


def _with_epilogues(prog: Program) -> list:
    """Every column join with its columns' epilogue groups (a replayed schedule may name one)."""
    joins = (with_epilogues(j, prog.epilogue_candidates, prog.statement_graph) for j in prog.column_candidates)
    return [j for j in joins if j is not None]


class _Alone:
    """The modeled cost of each statement of one program mapped alone (its own kernel), each
    mapped once however many stitched and epilogue candidates hold it."""

    def __init__(self, prog: Program, gpu: GPUSpec):
        self.gpu = gpu
        self.by_name = {s.name: s for s in prog.statements}
        self.memo: dict[tuple[str, bool], KernelCost] = {}

    def __call__(self, name: str, deterministic: bool = False) -> KernelCost:
        key = (name, deterministic)
        if key not in self.memo:
            group = KernelGroup((self.by_name[name],))
            self.memo[key] = map_group(group, self.gpu, deterministic=deterministic).cost
        return self.memo[key]


def _replayed(candidates, names_list, what: str) -> list:
    """The legal groups a schedule names, in its order; a name list that is no legal group is a
    ScheduleError (`what` is the message, `{}` the group)."""
    legal = {tuple(s.name for s in cand): tuple(cand) for cand in candidates}
    out = []
    for names in names_list or ():
        if tuple(names) not in legal:
            raise ScheduleError(
                f"schedule {what.format('+'.join(names))} of this program "
                f"(legal: {['+'.join(n) for n in legal] or 'none'})"
            )
        out.append(legal[tuple(names)])
    return out


def _plan_epilogues(
    prog: Program, gpu: GPUSpec, considered: list, chosen: list, deterministic: bool, alone: _Alone
) -> list:
    """The epilogue groups the model prefers (updates `considered` and `chosen` in place: a
    stitched group of the same statements that loses to its epilogue group is dropped)."""
    out = []
    for cand in prog.epilogue_candidates:
        names = tuple(s.name for s in cand)
        rival = [c for c in chosen if {s.name for s in c} & set(names)]
        if any(tuple(s.name for s in c) != names for c in rival):
            continue  # a different stitched group holds some of its statements
        same = next((k for k, c in enumerate(considered) if c.statements == names), None)
        group = KernelGroup(tuple(cand), external=external_results(cand, prog.statements, prog.outputs), epilogue=True)
        m = map_group(group, gpu, deterministic=deterministic)
        fused = m.cost.total_s
        unfused = sequence_s((alone(n, deterministic) for n in names), gpu)
        stitched = considered[same].stitched_us * 1e-6 if same is not None else 0.0
        take = fused < unfused and (same is None or fused < stitched)
        if take and rival:
            chosen.remove(rival[0])
            considered[same] = replace(considered[same], chosen=False, superseded=True)
        considered.append(
            EpilogueConsidered(
                names, fused * 1e6, unfused * 1e6, len(names), take, m.split, _merge_of(m), stitched * 1e6
            )
        )
        if take:
            out.append(tuple(cand))
    return out
