"""Stitching: a reduction and the statements that consume its final value, in one kernel.

Before (three kernels; x is read from DRAM three times, m and s round-trip through DRAM)::

    m[i] = max_j x[i, j]                      # ROW reduction
    s[i] = sum_j exp(x[i, j] - m[i])          # ROW reduction reading m (broadcast along j)
    y[i, j] = exp(x[i, j] - m[i]) / s[i]      # element-wise consumer

After (`stitch_candidates` + the ROW stitched kernel of codegen/kernel.py; a block owns whole
rows and makes one pass over them per level, re-reading x from L2; m and s stay on chip)::

    for each row i owned by this block:
        pass 0: m = allreduce_max_j x[i, j]
        pass 1: s = allreduce_sum_j exp(x[i, j] - m)
        pass 2: y[i, j] = exp(x[i, j] - m) / s

Preconditions for a statement to join a reduction's stitched group, each checked:
  1. the group's reductions are ROW or ALL reductions over the same domain and reduced dims
     (one row space: the same (i, j) names the same element everywhere);
  2. an element-wise joiner iterates over that domain (it is re-coalesced into the row space),
     or over the result space, one instance per row (a *row epilogue*, e.g. sqrt(var) or the
     ddof scale: it runs on the row's leader thread once the values it reads are final, and no
     other member may read it);
  3. every read of a group member is row-local: at (i, j) it reads the member's element i
     (isl: the read's access relation equals the member's write, `i`). A block owns whole rows
     (split = 1), so the value is final and on chip when read; there is no grid-wide barrier.
     Only reductions are read that way: an element-wise member or an epilogue exists in no
     register of a later pass, so a statement reading one does not join;
  4. stitching keeps the kernel graph acyclic (no path leaves the group and comes back);
  5. at most `MAX_HORIZONTAL` reductions share the group (registers: one accumulator each).
Whether a legal candidate is actually stitched is the cost model's call (schedule/planner.py).
"""

from __future__ import annotations

import islpy as isl
import networkx as nx

from .coalesce import coalesce
from .statement import Form, Statement, StatementKind

# At most this many independent statements share a kernel side by side (horizontal fusion, here
# and in poly/program.py's grouping): each keeps its accumulator and its unrolled loads in
# registers, and 75 float32 sums in one kernel (GPT-2 small's 768-element gradients, normed
# together) spilled 676 stores on sm_80.
MAX_HORIZONTAL = 8


def row_space(st: Statement):
    """(domain extents, reduced dims) of a ROW/ALL reduction, before coalescing."""
    o = st.origin
    return o.extents, o.reduced


def row_local(st: Statement, members: dict[int, Statement]) -> bool:
    """Precondition 3: every read of a member at (i, j) is the member's element i."""
    for r in st.reads:
        m = members.get(r.tensor.uid)
        if m is not None and (r.indirect is not None or not r.addr.is_equal(m.write)):
            return False  # a gather's element is known at run time only: never proven row-local
    return True


def is_epilogue(st: Statement) -> bool:
    """A row epilogue: an element-wise statement of a stitched group over the result space."""
    return st.kind == StatementKind.MAP and st.form == Form.MAP


def _row_index(st: Statement):
    v = isl.make_zero_and_vars(["i", "j"], [], ctx=st.domain.get_ctx())
    return v["i"].intersect_domain(st.domain.reset_tuple_id())


def reads_row(st: Statement, members: dict[int, Statement]) -> bool:
    """An epilogue at row i reads element i of every member it reads."""
    i, dom = _row_index(st), st.domain.reset_tuple_id()
    mine = [r for r in st.reads if r.tensor.uid in members]
    return all(r.indirect is None and r.addr.intersect_domain(dom).is_equal(i) for r in mine)


def _writes_row(st: Statement) -> bool:
    return st.write.intersect_domain(st.domain.reset_tuple_id()).is_equal(_row_index(st))


def _reads_unregistered(st: Statement, grp: list[Statement]) -> bool:
    """Precondition 3: does st read an element-wise member or an epilogue of the group?"""
    maps = {m.result.uid for m in grp if m.kind == StatementKind.MAP}
    return any(r.tensor.uid in maps for r in st.reads)


def stitch_candidates(stmts: list[Statement], sg: nx.DiGraph) -> list[list[Statement]]:
    """Groups of statements (in program order) that may run as one stitched ROW kernel.

    `stmts` are the program's coalesced statements in topological order and `sg` their
    dependence graph (statement names, from isl flow dependences)."""
    groups: list[list[Statement]] = []
    open_groups: dict = {}
    for st in stmts:
        if st.M * st.N == 0:
            continue
        if st.kind == StatementKind.REDUCE and st.form in (Form.ROW, Form.ALL):
            key = row_space(st)
            grp = open_groups.get(key)
            members = {m.result.uid: m for m in grp} if grp else {}
            # A reduction over the same rows joins: after the ones it reads (row-locally), or
            # beside them when it reads none (horizontal fusion, same pass).
            beside = sum(1 for m in grp if m.kind == StatementKind.REDUCE) if grp else 0
            if grp and beside < MAX_HORIZONTAL and row_local(st, members) and not _reads_unregistered(st, grp):
                grp.append(st)
            else:
                open_groups[key] = [st]
                groups.append(open_groups[key])
        elif st.kind == StatementKind.MAP and st.scatter is None:  # an indirect write joins nothing
            for (extents, reduced), grp in open_groups.items():
                members = {m.result.uid: m for m in grp if not is_epilogue(m)}
                if not any(r.tensor.uid in members for r in st.reads) or _reads_unregistered(st, grp):
                    continue
                if st.origin.extents == extents:  # precondition 2: the row space
                    placed = coalesce(st.origin, roles=reduced)
                    ok = row_local(placed, members)
                else:  # precondition 2: the result space, one instance per row
                    placed = st
                    ok = st.M == grp[0].M and st.N == 1 and reads_row(st, members) and _writes_row(st)
                if ok:  # precondition 3
                    grp.append(placed)
                    break
    out = []
    for grp in groups:
        names = {s.name for s in grp}
        consumers = [s for s in grp[1:] if any(r.tensor.uid in {m.result.uid for m in grp} for r in s.reads)]
        if len(grp) > 1 and consumers and acyclic_after_contraction(sg, names):
            out.append(grp)
    return out


def acyclic_after_contraction(sg: nx.DiGraph, names: set[str]) -> bool:
    """Precondition 4: no dependence path leaves the group and re-enters it."""
    outside = sg.subgraph(n for n in sg if n not in names)
    leaving = {b for a, b in sg.edges if a in names and b not in names}
    entering = {a for a, b in sg.edges if b in names and a not in names}
    return not any(nx.has_path(outside, a, b) for a in leaving for b in entering)


def levels(group: list[Statement] | tuple[Statement, ...]) -> dict[str, int]:
    """The pass of each statement of a stitched group: 0 if it reads no reduction of the group,
    else one more than the latest reduction it reads (whose value is final after that pass)."""
    members: dict[int, Statement] = {}
    lv: dict[str, int] = {}
    for s in group:
        read = [members[r.tensor.uid] for r in s.reads if r.tensor.uid in members]
        lv[s.name] = 1 + max(lv[m.name] for m in read) if read else 0
        members[s.result.uid] = s
    return lv
