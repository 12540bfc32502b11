"""A Program: the statements of a graph, coalesced, with their dependences and kernel groups.

`build_program(outputs)` is the entry of the polyhedral stage; it returns an immutable value.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import islpy as isl
import networkx as nx

from ..frontend.tensor import Tensor
from ..frontend.walk import postorder
from .coalesce import coalesce
from .column_stitch import ColumnStitch, column_stitches
from .dependences import Dependences, compute_dependences, schedule
from .epilogue import epilogue_candidates
from .expr import Expr
from .fusion import Fusion, fuse_producers
from .movement import must_materialize
from .row_columns import ColumnJoin, column_candidates, column_epilogues
from .statement import Form, Statement, StatementKind, build_statement
from .stitch import MAX_HORIZONTAL, stitch_candidates


@dataclass(frozen=True)
class KernelGroup:
    """Statements that run in one kernel: same canonical form and extents, independent, or a
    stitched group (poly/stitch.py): reductions and their consumers over one row space, or an
    epilogue group (poly/epilogue.py): one reduction and its element-wise consumers, applied
    by the threads that finish each output."""

    statements: tuple[Statement, ...]
    stitched: bool = False
    external: frozenset[int] = frozenset()  # uids of stitched / epilogue results also stored to memory
    epilogue: bool = False

    @property
    def on_chip(self) -> frozenset[int]:
        """Results of the group its own statements read from registers, not memory."""
        if self.stitched or self.epilogue:
            return frozenset(s.result.uid for s in self.statements)
        return frozenset()

    @property
    def form(self) -> Form:
        if self.stitched and self.statements[0].form == Form.COLUMN:  # poly/column_stitch.py: the row space
            return Form.ROW
        return self.statements[0].form

    @cached_property
    def columns(self) -> tuple[int, ...]:
        """A stitched ROW group's COLUMN reductions (poly/row_columns.py: column partials of the
        rows each block owns, merged across blocks), by index."""
        if not self.stitched:
            return ()
        return tuple(k for k, s in enumerate(self.statements) if s.form == Form.COLUMN)

    @cached_property
    def consumed(self) -> bool:
        """Row-space statements of the group read its columns' final values (poly/column_stitch.py:
        a grid-wide merge between the columns' pass and theirs)."""
        cols = {self.statements[k].result.uid for k in self.columns}
        return any(
            k not in self.columns and any(r.tensor.uid in cols for r in s.reads)
            for k, s in enumerate(self.statements)
            if s.form != Form.MAP
        )

    @cached_property
    def column_epilogues(self) -> tuple[int, ...]:
        """The element-wise consumers of the columns (poly/row_columns.py `with_epilogues`), by
        index: applied where each column's value becomes final, not as row epilogues."""
        return column_epilogues(self.statements) if self.columns else ()

    @property
    def M(self) -> int:
        return self.statements[0].M

    @property
    def N(self) -> int:
        return self.statements[0].N

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.statements)

    @cached_property
    def accumulator_of(self) -> tuple[int, ...]:
        """Per statement, the statement whose accumulator it finishes: itself, or an earlier
        reduction of the group that folds the same values (same reduced dims, body and reads)
        with the same combiner into the same accumulator dtype. LayerNorm's mean and variance
        are then one Welford accumulator with two finishes, and a sum and a mean of the same
        values one sum: the kernel accumulates, reduces and merges it once."""
        owners: dict[tuple, int] = {}
        out = []
        for k, s in enumerate(self.statements):
            if s.kind != StatementKind.REDUCE:
                out.append(k)
                continue
            key = (s.combiner.name, s.acc.name, s.reduced, _body_key(s.body, s.reads))
            out.append(owners.setdefault(key, k))
        return tuple(out)

    @cached_property
    def accumulators(self) -> tuple[int, ...]:
        """The statements whose accumulators the kernel keeps and merges (an epilogue group's
        element-wise statements have none; a shared accumulator is its owner's)."""
        return tuple(
            k for k, st in enumerate(self.statements) if self.accumulator_of[k] == k and st.kind == StatementKind.REDUCE
        )


def _body_key(e: Expr, reads) -> tuple:
    """A structural key of a statement body: equal keys compute equal values per iteration. Flat,
    built without recursion: the distinct subexpressions in post order, each naming its
    arguments by position in that list (bodies of any depth; shared subexpressions once). A
    gather's load has the loaded index as its argument: two gathers of one table at different
    indices differ (EmbeddingBag's bags: one Gather per bag, each of its own slice of the ids)."""
    records: dict[tuple, int] = {}
    at: dict[int, int] = {}
    for n in postorder([e], lambda n: n.args):
        args = tuple(at[id(a)] for a in n.args)
        if n.op == "load":
            r = reads[n.read]
            rec = ("load", r.tensor.uid, str(r.addr), r.indirect, args)  # anonymous domains [i, j]: comparable
        else:
            rec = (n.op, n.dtype.name, repr(n.value), args)
        at[id(n)] = records.setdefault(rec, len(records))
    return tuple(records)


@dataclass(frozen=True)
class Program:
    outputs: tuple[Tensor, ...]
    inputs: tuple[Tensor, ...]  # placeholders, in creation order
    statements: tuple[Statement, ...]
    groups: tuple[KernelGroup, ...]
    deps: Dependences
    graph: nx.DiGraph  # tensors, edges producer -> consumer
    fusions: tuple[Fusion, ...] = ()  # isl's verdict on fusing each statement's producers
    statement_graph: nx.DiGraph | None = None  # statement names, edges from isl flow dependences
    stitch_candidates: tuple[tuple[Statement, ...], ...] = ()  # legal stitched groups
    epilogue_candidates: tuple[tuple[Statement, ...], ...] = ()  # legal epilogue groups

    @cached_property
    def column_candidates(self) -> tuple[ColumnJoin, ...]:
        """COLUMN reductions legal in a stitched row kernel (poly/row_columns.py); asked for only by
        the model's one- vs two-launch comparison, so isl answers it on demand, not for every program."""
        return column_candidates(list(self.statements), self.statement_graph, self.stitch_candidates)

    @cached_property
    def column_stitches(self) -> tuple[ColumnStitch, ...]:
        """COLUMN reductions stitched with the consumers of their final values
        (poly/column_stitch.py); on demand, as `column_candidates`."""
        return column_stitches(list(self.statements), self.statement_graph)

    @cached_property
    def schedule(self) -> isl.Schedule | None:
        """isl's schedule of the whole program (validity: non-relaxed flow dependences). Only
        informational, so computed on first use: on large element-wise statements with modulo
        accesses isl's scheduler can take tens of seconds."""
        live = [s for s in self.statements if s.M * s.N > 0]
        return schedule(live, self.deps) if live else None


def tensor_graph(outputs) -> nx.DiGraph:
    g = nx.DiGraph()
    stack = list(outputs)
    while stack:
        t = stack.pop()
        if t in g and g.nodes[t].get("seen"):
            continue
        g.add_node(t, seen=True)
        for a in t.inputs:
            g.add_edge(a, t)
            stack.append(a)
    return g


def build_program(outputs: tuple[Tensor, ...], stored: frozenset[Tensor] = frozenset()) -> Program:
    """Statements for every output and reduction, coalesced, dependences, kernel groups.

    Element-wise producers are inlined into their consumer statement (reduction propagation);
    a statement boundary (a tensor written to global memory) is placed at every output and at
    every reduction result, since a reduction's final value exists only after its last block,
    and at the tensors of `stored` (a target's choice: schedule/cpu_operands.py).
    """
    g = tensor_graph(outputs)
    order = list(nx.topological_sort(g))
    materialized = {t for t in order if t.op in ("reduce", "scatter_add")} | {
        t for t in outputs if t.op != "placeholder"
    }
    materialized |= must_materialize(order)  # what a gather reads exists in memory first
    materialized |= {t for t in order if t in stored}
    inputs = tuple(sorted((t for t in order if t.op == "placeholder"), key=lambda t: t.uid))
    ctx = isl.Context()
    stmts = []
    for t in order:
        if t in materialized:
            stmts.append(coalesce(build_statement(ctx, f"S{len(stmts)}", t, materialized)))
    if not stmts:
        return Program(tuple(outputs), inputs, (), (), None, g)
    live = [s for s in stmts if s.M * s.N > 0]
    deps = compute_dependences(live) if live else None
    fusions = tuple(fuse_producers(s) for s in live)
    sg = statement_graph(stmts, deps)
    cands = tuple(tuple(c) for c in stitch_candidates(stmts, sg))
    epis = tuple(epilogue_candidates(stmts, sg))
    groups = group_statements(stmts, sg, outputs)
    return Program(tuple(outputs), inputs, tuple(stmts), groups, deps, g, fusions, sg, cands, epis)


def statement_graph(stmts: list[Statement], deps: Dependences | None) -> nx.DiGraph:
    """Statement names with an edge a -> b when isl finds a flow dependence from a to b."""
    sg = nx.DiGraph()
    sg.add_nodes_from(s.name for s in stmts)
    for a in stmts:
        for b in stmts:
            if a is not b and deps is not None and a.M * a.N and b.M * b.N and not deps.between(a, b).is_empty():
                sg.add_edge(a.name, b.name)
    return sg


def group_statements(
    stmts: list[Statement],
    sg: nx.DiGraph,
    outputs,
    stitched: tuple[tuple[Statement, ...], ...] = (),
    epilogues: tuple[tuple[Statement, ...], ...] = (),
) -> tuple[KernelGroup, ...]:
    """Kernel groups: the chosen stitched groups and epilogue groups, then horizontal fusion of
    the rest: statements with the same form and extents and no dependence path between them
    share a kernel (the paper's fusion of independent reductions, §4), at most `MAX_HORIZONTAL`
    of them, and never an indirect write. Groups are ordered by their dependences."""
    by_name = {s.name: s for s in stmts}
    chosen = tuple(stitched) + tuple(epilogues)
    taken = {s.name for grp in chosen for s in grp}
    groups: list[list[Statement]] = [list(grp) for grp in chosen]
    for name in nx.topological_sort(sg):
        if name in taken:
            continue
        s = by_name[name]
        for grp in groups[len(chosen) :]:
            h = grp[0]
            same = (h.form, h.M, h.N) == (s.form, s.M, s.N) and (h.kind == s.kind) and s.M * s.N > 0
            same = same and h.scatter is None and s.scatter is None  # an indirect write has a kernel of its own
            same = same and len(grp) < MAX_HORIZONTAL
            if same and not any(nx.has_path(sg, m.name, s.name) or nx.has_path(sg, s.name, m.name) for m in grp):
                grp.append(s)
                break
        else:
            groups.append([s])
    # Groups run in an order consistent with the dependences between their members.
    cg = nx.DiGraph()
    cg.add_nodes_from(range(len(groups)))
    where = {s.name: k for k, grp in enumerate(groups) for s in grp}
    for a, b in sg.edges:
        if where[a] != where[b]:
            cg.add_edge(where[a], where[b])
    out = []
    for k in nx.topological_sort(cg):
        if k < len(stitched):
            out.append(KernelGroup(tuple(groups[k]), True, external_results(groups[k], stmts, outputs)))
        elif k < len(chosen):
            out.append(
                KernelGroup(tuple(groups[k]), external=external_results(groups[k], stmts, outputs), epilogue=True)
            )
        else:
            out.append(KernelGroup(tuple(groups[k])))
    return tuple(out)


def external_results(grp, stmts, outputs) -> frozenset[int]:
    """Results of a stitched or epilogue group that must reach memory: outputs, or read by other kernels."""
    inside = {s.name for s in grp}
    out_ids = {t.uid for t in outputs}
    read_outside = {r.tensor.uid for s in stmts if s.name not in inside for r in s.reads}
    return frozenset(s.result.uid for s in grp if s.result.uid in out_ids or s.result.uid in read_outside)
