"""Column partials in a stitched row kernel: the two reduction directions of LayerNorm backward.

Before (two launches; both read x and dy from DRAM)::

    # stitched ROW kernel (poly/stitch.py): a block owns whole rows
    c1[i] = sum_j w[j] dy[i, j] xhat[i, j];   c2[i] = sum_j w[j] dy[i, j]
    dx[i, j] = (w[j] dy[i, j] - xhat[i, j] c1[i] / N - c2[i] / N) rstd[i]
    # COLUMN kernel, split across blocks
    dw[j] = sum_i dy[i, j] xhat[i, j];        db[j] = sum_i dy[i, j]

After (`column_candidates`; one launch, x and dy read once). The COLUMN reductions join the row
kernel's pass that reads what they read; each block sums its own rows' contributions to every
column it touches into one partial per column, and merges it with one atomic per block per
column (or writes it to a partials workspace that the last block to arrive sums in a fixed
order, bit-identical across runs)::

    for each row i owned by this block:
        pass 0: c1, c2 = allreduce_j ...
        pass 1: dx[i, j] = ...;  part_w[j] += dy[i, j] xhat[i, j];  part_b[j] += dy[i, j]
    block-reduce part_w, part_b over the block's rows;  atomicAdd(dw[j], part_w[j]) ...

Preconditions for a COLUMN reduction to join a stitched ROW group, each checked:
  1. the host is a stitched group of ROW reductions (an ALL group has one row: nothing to merge);
  2. the joiner is a reduction over the host's row space that reduces exactly the dimensions the
     host keeps (isl: placed in the row space (i, j), its write is `j`: output o of the joiner is
     column o of the rows the block owns, and it reduces along i, the dimension blocks split);
  3. every read of a host member is row-local (at (i, j) it reads the member's element i, isl:
     the read's access relation equals the member's write), and only of a reduction: an
     element-wise member or a row epilogue lives in no register of a later pass;
  4. no host member reads the joiner (isl: no flow dependence from the joiner into the group):
     a column's value is final only once every block has merged, after the kernel;
  5. joining keeps the kernel graph acyclic (no dependence path leaves the group and comes back).
The joiner's earliest pass is one more than the latest host reduction it reads (0 if none); it
runs in the latest pass from there on whose statements load every tensor it loads from memory
(`column_levels`: the loads are shared; LayerNorm's dgamma and dbeta run in dx's pass), else in
its earliest. Whether it joins is the cost model's call (schedule/row_columns.py: the bytes it
saves); the kernel is schedule/persistent.py's mapping and codegen/column_partials.py's code.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import islpy as isl
import networkx as nx

from .coalesce import coalesce
from .statement import Form, Statement, StatementKind
from .stitch import acyclic_after_contraction, is_epilogue, levels, row_local


@dataclass(frozen=True)
class ColumnJoin:
    """A stitched ROW group and the COLUMN reductions that may run in its kernel.

    `columns` are placed in the row space (i: the row, j: the column, reduced along i) and
    `passes[k]` is the earliest pass of columns[k]."""

    group: tuple[Statement, ...]
    columns: tuple[Statement, ...]
    passes: tuple[int, ...]
    epilogues: tuple[Statement, ...] = ()  # columns' element-wise consumers (`with_epilogues`)

    @property
    def statements(self) -> tuple[Statement, ...]:
        return self.group + self.columns + self.epilogues

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.statements)


def _var(st: Statement, name: str):
    v = isl.make_zero_and_vars(["i", "j"], [], ctx=st.domain.get_ctx())
    return v[name].intersect_domain(st.domain.reset_tuple_id())


def host_ok(group) -> bool:
    """Precondition 1: every reduction of the group is a ROW reduction."""
    reds = [s for s in group if s.kind == StatementKind.REDUCE]
    return bool(reds) and all(s.form == Form.ROW for s in reds)


def place(st: Statement, group) -> Statement | None:
    """Precondition 2: `st` placed in the host's row space, reduced along i; None if it is not a
    reduction there of the dimensions the host keeps."""
    head = group[0].origin
    if st.kind != StatementKind.REDUCE or st.origin is None or st.origin.extents != head.extents:
        return None
    if st.origin.dims != head.dims or st.origin.reduced != frozenset(head.dims) - head.reduced:
        return None
    placed = coalesce(st.origin, roles=head.reduced)
    placed = replace(placed, reduced=frozenset({"i"}), form=Form.COLUMN)
    if not placed.write.intersect_domain(placed.domain.reset_tuple_id()).is_equal(_var(placed, "j")):
        return None
    return placed


def joins(st: Statement, group, sg: nx.DiGraph) -> Statement | None:
    """Preconditions 2 to 5 for `st` joining `group`: the placed joiner, or None."""
    placed = place(st, group)
    if placed is None:
        return None  # 2
    regs = {m.result.uid: m for m in group if m.kind == StatementKind.REDUCE}
    maps = {m.result.uid for m in group if m.kind == StatementKind.MAP or is_epilogue(m)}
    if any(r.tensor.uid in maps for r in placed.reads) or not row_local(placed, regs):
        return None  # 3
    names = {m.name for m in group}
    if any(b in names for b in sg.successors(st.name)):
        return None  # 4
    if not acyclic_after_contraction(sg, names | {st.name}):
        return None  # 5
    return placed


def column_candidates(stmts, sg: nx.DiGraph, stitched) -> tuple[ColumnJoin, ...]:
    """For each legal stitched group (`stitched`, from poly/stitch.py), the COLUMN reductions of
    the program that may join its kernel (statements in topological order, `sg` their isl
    dependence graph).

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> x = pn.placeholder((8, 4))
    >>> y = x - pn.sum(x, axis=1, keepdims=True)
    >>> p = lower([y, pn.sum(x, axis=0)], stop_after="program", target="emulator").program
    >>> [c.names for c in column_candidates(p.statements, p.statement_graph, p.stitch_candidates)]
    [('S1', 'S2', 'S0')]
    """
    out = []
    for group in stitched:
        if not host_ok(group):
            continue
        lv = levels(group)
        joined, passes, current = [], [], list(group)
        for st in stmts:
            if st.name in {m.name for m in current} or st.M * st.N == 0:
                continue
            placed = joins(st, tuple(current), sg)
            if placed is None:
                continue
            read = [
                m
                for m in group
                if m.kind == StatementKind.REDUCE and any(r.tensor.uid == m.result.uid for r in placed.reads)
            ]
            passes.append(1 + max(lv[m.name] for m in read) if read else 0)
            joined.append(placed)
            current.append(st)
        if joined:
            out.append(ColumnJoin(tuple(group), tuple(joined), tuple(passes)))
    return tuple(out)


def with_epilogues(join: ColumnJoin, epilogue_groups, sg: nx.DiGraph) -> ColumnJoin | None:
    """`join` carrying the element-wise consumers of its columns (torch's cast of dgamma and dbeta
    back to bf16): each of `epilogue_groups` (poly/epilogue.py's legal groups, head first) whose
    head is one of the columns joins whole, applied where the column's value becomes final (the
    merge's last block, or each block's share after a grid-wide wait). None when no group's head
    is a column, or when joining them would close a cycle through another kernel (precondition 5).
    The epilogue group's own preconditions (element-wise at the column's index, reading no other
    reduction) hold for the joined kernel: a column's final value is at hand where it is stored.

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> x = pn.placeholder((8, 4))
    >>> outs = [x - pn.sum(x, axis=1, keepdims=True), pn.sum(x, axis=0).astype("bfloat16")]
    >>> p = lower(outs, stop_after="program", target="emulator").program
    >>> with_epilogues(p.column_candidates[0], p.epilogue_candidates, p.statement_graph).names
    ('S1', 'S3', 'S0', 'S2')
    """
    heads = {c.name for c in join.columns}
    epis = tuple(s for grp in epilogue_groups if grp[0].name in heads for s in grp[1:])
    if not epis or not acyclic_after_contraction(sg, set(join.names) | {s.name for s in epis}):
        return None
    return replace(join, epilogues=epis)


def column_epilogues(statements) -> tuple[int, ...]:
    """Indices of the element-wise statements of a joined group that read a COLUMN statement's
    result (or an earlier such statement's): they run where the columns become final, never as
    row epilogues.

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> x = pn.placeholder((8, 4))
    >>> outs = [x - pn.sum(x, axis=1, keepdims=True), pn.sum(x, axis=0).astype("bfloat16")]
    >>> p = lower(outs, stop_after="program", target="emulator").program
    >>> j = with_epilogues(p.column_candidates[0], p.epilogue_candidates, p.statement_graph)
    >>> column_epilogues(j.statements)
    (3,)
    """
    after = {s.result.uid for s in statements if s.form == Form.COLUMN}
    out = []
    for k, s in enumerate(statements):
        if is_epilogue(s) and any(r.tensor.uid in after for r in s.reads):  # a row-space consumer: column_stitch.py
            out.append(k)
            after.add(s.result.uid)
    return tuple(out)


def column_levels(statements, lv: dict[str, int]) -> dict[str, int]:
    """The pass of every statement of a joined group (host and COLUMN statements, `lv` their
    `stitch.levels`, which for a column is its earliest pass): a column moves to the latest
    pass at or after its earliest whose host statements load every tensor it loads from memory.
    A host statement that reads a column (poly/column_stitch.py: it runs after the grid-wide
    merge) shares no loads: the columns stay in their earliest pass.

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> x = pn.placeholder((8, 4))
    >>> p = lower([x - pn.sum(x, axis=1, keepdims=True), pn.sum(x, axis=0)], stop_after="program", target="emulator")
    >>> c = p.program.column_candidates[0]
    >>> st = c.group + c.columns
    >>> column_levels(st, levels(st))
    {'S1': 0, 'S2': 1, 'S0': 1}
    """
    out = dict(lv)
    cols = {s.result.uid for s in statements if s.form == Form.COLUMN}
    host = [
        s
        for s in statements
        if s.form != Form.COLUMN and not is_epilogue(s) and not any(r.tensor.uid in cols for r in s.reads)
    ]
    for s in statements:
        if s.form != Form.COLUMN:
            continue
        mine = {r.tensor.uid for r in s.reads if r.memory}
        shared = [
            lv[h.name] for h in host if lv[h.name] >= lv[s.name] and mine <= {r.tensor.uid for r in h.reads if r.memory}
        ]
        out[s.name] = max(shared, default=lv[s.name])
    return out
