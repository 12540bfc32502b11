"""Stitched ROW groups of a parametric program (issue 22): reductions and their consumer in one kernel.

A MAP statement that reads ROW reductions of its own box at their rows (softmax's
`exp(x - max) / sum`, LayerNorm's `(x - mean) * rsqrt(var + eps)`) runs in the kernel of those
reductions: each block reduces its rows, keeps the finished values in registers (broadcast
through shared memory) and then computes the MAP over the same rows, so no reduction result makes
a round trip through memory before its consumer reads it, and one launch does the work of three.
Reductions of one source share one accumulator (`PStatement.accumulator_key`).

Reductions of one accumulator left unstitched (softmax's max and sum over scores a later
reduction reads) are siblings: one kernel, one pass, each output its own finish; the group runs
where its first member did (the members share their source, ready there).

An epilogue group is one reduction and a MAP over its result (`sqrt(mean(x * x))`): the MAP is
evaluated wherever an output becomes final (the row leader without a split, the last block with
one), so the reduction may still be split across blocks. Preconditions: E1 the MAP's shape is the
reduction's result shape; E2 it reads the result at its own element only; E3 as 3 below.

Preconditions of stitching a MAP statement S with the reductions R it reads (each checked here;
a group that fails one stays unstitched, never wrong; one negative test each):
1. Every R is ROW, over S's box (the same shape), with the same row axes: S's flat index is
   row * N + j for every size.
2. S reads each R at its own row only (the read varies along R's row axes and nothing else), so
   the value S needs is the one the block finished.
3. No statement between the first R and S reads an R, and S reads no statement in between (the
   group runs at S's place in the launch order).
4. The group is mapped without a split (schedule/param_mapping.py): a row's final value must be
   in the block that consumes it (no grid-wide barrier).

>>> import panamera as pn
>>> from panamera.poly.params import build
>>> p = build((pn.nn.softmax(pn.placeholder(("B", 64), name="x"), method="multipass"),))
>>> p.groups, p.kinds
(((0, 1, 2),), ('stitched',))
"""

from __future__ import annotations

from .params import PStatement
from .statement import Form, StatementKind


def _row_read(s: PStatement, r_index: int, red: PStatement) -> bool:
    """Precondition 2: S's read r_index is red's result varying along red's row axes only."""
    r = s.reads[r_index]
    rows = tuple(a for a in red.i_axes if not (s.shape[a] == 1))
    return r.tensor.uid == red.result.uid and r.axes == rows


def stitchable(members: list[PStatement]) -> bool:
    """Preconditions 1 and 2 for reductions members[:-1] (in launch order) and the MAP members[-1]:
    each member reads the earlier members at its own rows only (a later reduction may read an
    earlier one: multipass softmax's sum reads the max)."""
    *reds, s = members
    if s.kind != StatementKind.MAP or not reds:
        return False
    first = reds[0]
    for m in members:
        if m.shape != first.shape:
            return False  # precondition 1
    for red in reds:
        if (
            red.kind != StatementKind.REDUCE
            or red.form != Form.ROW
            or (red.i_axes, red.j_axes) != (first.i_axes, first.j_axes)
        ):
            return False  # precondition 1
    for m in members:
        for red in reds:
            reads = [k for k, r in enumerate(m.reads) if r.tensor.uid == red.result.uid]
            if not all(_row_read(m, k, red) for k in reads):
                return False  # precondition 2
    return True


def kernel_groups(statements: tuple[PStatement, ...]) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    """The statements of each kernel in launch order (stitched, epilogue and sibling groups where
    legal, else one each) and each kernel's kind: "single", "stitched", "epilogue" or "siblings"."""
    index = {s.result.uid: k for k, s in enumerate(statements)}
    taken: set[int] = set()
    groups: dict[int, tuple[int, ...]] = {}
    epilogues: set[int] = set()
    for k, s in enumerate(statements):
        if s.kind != StatementKind.MAP:
            continue
        reds, todo = set(), [k]
        while todo:  # the reductions S reads, and those they read (one box, checked below)
            for r in statements[todo.pop()].reads:
                j = index.get(r.tensor.uid)
                if j is not None and statements[j].kind == StatementKind.REDUCE and j not in reds:
                    reds.add(j)
                    todo.append(j)
        reds = sorted(reds)
        if not reds or reds[0] in taken or any(j in taken for j in reds):
            continue
        members = [statements[j] for j in reds] + [s]
        if not stitchable(members):
            continue
        between = [j for j in range(reds[0], k) if j not in reds]
        uids = {statements[j].result.uid for j in reds}
        if any(r.tensor.uid in uids for j in between for r in statements[j].reads):
            continue  # precondition 3: a statement in between reads a member
        if any(index.get(r.tensor.uid) in between for m in members for r in m.reads):
            continue  # precondition 3: a member reads a statement in between
        groups[k] = (*reds, k)
        taken |= set(reds) | {k}
    for k, s in enumerate(statements):  # epilogues: a MAP over a reduction's result, in its kernel
        if s.kind != StatementKind.MAP or k in taken:
            continue
        reds = sorted({index[r.tensor.uid] for r in s.reads if r.tensor.uid in index})
        if len(reds) != 1 or reds[0] in taken or not epilogue_of(statements[reds[0]], s):
            continue
        between = range(reds[0] + 1, k)
        red = statements[reds[0]]
        if any(r.tensor.uid == red.result.uid for j in between for r in statements[j].reads):
            continue  # E3: a statement in between reads the reduction
        if any(index.get(r.tensor.uid) in between for r in s.reads):
            continue  # E3: the epilogue reads a statement in between
        groups[k] = (reds[0], k)
        epilogues.add(k)
        taken |= {reds[0], k}
    siblings: dict[tuple, list[int]] = {}  # reductions of one accumulator: one kernel, one pass
    for k, s in enumerate(statements):
        if s.kind == StatementKind.REDUCE and k not in taken:
            siblings.setdefault(s.accumulator_key(), []).append(k)
    at: dict[int, tuple[int, ...]] = {k: g for k, g in groups.items()}  # each group at its launch position
    kinds = {k: ("epilogue" if k in epilogues else "stitched") for k in groups}
    for ks in siblings.values():
        if len(ks) > 1:  # one source, one body: legal where the first runs (its inputs are ready)
            at[ks[0]] = tuple(ks)
            kinds[ks[0]] = "siblings"
            taken |= set(ks)
    for k in range(len(statements)):
        if k not in taken:
            at[k] = (k,)
            kinds[k] = "single"
    order = sorted(at)
    return tuple(at[k] for k in order), tuple(kinds[k] for k in order)


def epilogue_of(red: PStatement, s: PStatement) -> bool:
    """E1: S iterates the reduction's result (the same shape); E2: S reads that result at its
    own element only (so the value is the one the kernel just finished)."""
    if red.kind != StatementKind.REDUCE or s.kind != StatementKind.MAP or s.shape != red.result.shape:
        return False
    full = tuple(a for a, e in enumerate(s.shape) if not (e == 1))
    return all(r.axes == full and r.shape == s.shape for r in s.reads if r.tensor.uid == red.result.uid)
