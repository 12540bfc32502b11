"""Split-reduction epilogues: a reduction's element-wise consumers in the reduction's own kernel.

Before (two launches; when the reduction is split across blocks, the consumer waits for the
kernel boundary, the only grid-wide barrier)::

    y[o] = sum_j A[o, j] * x[j]               # a reduction (ROW, ALL or COLUMN), maybe split
    z[o] = max(y[o] + b[o], 0) + r[o]         # element-wise in y's output space

After (`epilogue_candidates` + the reduce template of codegen/reduce_kernel.py: one launch).
Whichever thread finishes output o — the block's leader without a split, the last block to
arrive on the output tile's counter with a split (after combining the partials, or after
reading the atomically merged workspace back with `__ldcg` behind a `__threadfence`) — applies
the epilogue to the final value in registers before storing::

    ... reduce y[o] across threads / blocks as the merge mode says ...
    if this thread finishes o:
        t = y_final(o)                        # registers; stored only if read elsewhere
        z[o] = max(t + b[o], 0) + r[o]

Preconditions for a statement to join a reduction's epilogue group, each checked:
  1. the head is one REDUCE statement in canonical form (ROW, ALL or COLUMN) whose write is its
     output index (`i`), so output o of the kernel is element o of the result;
  2. a joiner is element-wise in the head's output space: a MAP statement with one instance
     per output (M equal to the head's, N = 1) that writes element i;
  3. it reads the head (or an earlier joiner) only at its own index i (isl: the read's access
     relation equals `i`); a read of another output index needs a value another block
     finishes, and a gather's index is known at run time only;
  4. it reads no other reduction's result: one kernel finishes one tiling of outputs (two
     reductions of different tilings have different last blocks);
  5. it reads the head at all (directly or through an earlier joiner);
  6. joining keeps the kernel graph acyclic (no dependence path leaves the group and comes back).
A consumer that re-reads the reduced row (its domain is the row space, not the output space)
fails precondition 2 and is left to the stitched paths (poly/stitch.py). Whether a legal
candidate is fused is the model's call (schedule/planner.py).
"""

from __future__ import annotations

import islpy as isl
import networkx as nx

from .statement import Form, Statement, StatementKind
from .stitch import acyclic_after_contraction


def _index(st: Statement):
    """The affine function `i` over st's domain: the output index of a one-per-output instance."""
    v = isl.make_zero_and_vars(["i", "j"], [], ctx=st.domain.get_ctx())
    return v["i"].intersect_domain(st.domain.reset_tuple_id())


def writes_index(st: Statement) -> bool:
    """Preconditions 1 and 2: st writes element i at instance (i, j)."""
    return st.write.intersect_domain(st.domain.reset_tuple_id()).is_equal(_index(st))


def is_head(st: Statement) -> bool:
    """Precondition 1: a canonical reduction whose output o is element o of its result.

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> p = lower(pn.sum(pn.placeholder((4, 8)), axis=1) + 1.0, stop_after="program", target="emulator").program
    >>> [is_head(s) for s in p.statements]
    [True, False]
    """
    return st.kind == StatementKind.REDUCE and st.form in (Form.ROW, Form.ALL, Form.COLUMN) and writes_index(st)


def joins(st: Statement, head: Statement, members: dict[int, Statement], reductions: set[int]) -> bool:
    """Preconditions 2 to 5 for `st` joining the group whose results are `members` (by uid)."""
    if st.kind != StatementKind.MAP or st.M != head.M or st.N != 1 or not writes_index(st) or st.scatter is not None:
        return False  # 2 (an indirect write's element is no row's own)
    mine = [r for r in st.reads if r.tensor.uid in members]
    if not mine:
        return False  # 5
    i, dom = _index(st), st.domain.reset_tuple_id()
    if any(r.indirect is not None or not r.addr.intersect_domain(dom).is_equal(i) for r in mine):
        return False  # 3
    return not any(r.tensor.uid in reductions and r.tensor.uid not in members for r in st.reads)  # 4


def epilogue_candidates(stmts: list[Statement], sg: nx.DiGraph) -> list[tuple[Statement, ...]]:
    """Groups (head reduction, joiners...) in program order that may run as one reduce kernel
    whose finishing threads apply the joiners: the largest legal group per head.

    `stmts` are the program's coalesced statements in topological order and `sg` their
    dependence graph (statement names, from isl flow dependences).

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> s = pn.sum(pn.placeholder((64, 8)), axis=0)
    >>> p = lower([s, s * 2.0 + 1.0], stop_after="program", target="emulator").program
    >>> [[st.name for st in c] for c in epilogue_candidates(list(p.statements), p.statement_graph)]
    [['S0', 'S1']]
    """
    reductions = {s.result.uid for s in stmts if s.kind == StatementKind.REDUCE}
    out = []
    for h, head in enumerate(stmts):
        if head.M * head.N == 0 or not is_head(head):
            continue
        group, members = [head], {head.result.uid: head}
        for st in stmts[h + 1 :]:
            if joins(st, head, members, reductions) and acyclic_after_contraction(
                sg, {s.name for s in group} | {st.name}
            ):  # 6
                group.append(st)
                members[st.result.uid] = st
        if len(group) > 1:
            out.append(tuple(group))
    return out
