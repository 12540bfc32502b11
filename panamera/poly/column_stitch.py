"""Stitched COLUMN reductions: a column's final value read by element-wise consumers in the same
kernel. BatchNorm backward in channels-last layout (NHWC, i = n·H·W + h·W + w, j = c).

Before (two launches; x and dy are read twice from DRAM and once more from the MAP kernel)::

    # COLUMN kernel, split across blocks, one atomic per block per column
    sdy[j] = sum_i dy[i, j];     sdx[j] = sum_i dy[i, j] xhat[i, j]
    # MAP kernel
    dx[i, j] = g[j] rstd[j] / M (M dy[i, j] - sdy[j] - xhat[i, j] sdx[j])

After (`column_stitches`; one cooperative launch, schedule/persistent.py's persistent row loop and
codegen/column_partials.py's code). A block owns row tiles; pass 0 accumulates one register
partial per column it touches; the partials are merged across the grid (written, a grid-wide
wait, every block sums its share of the columns in block order, a second wait); pass 1 loads the
final columns once into registers and computes the consumers over the block's own rows::

    for each row tile of this block:  pass 0: part_dy[j] += dy[i, j]; part_dx[j] += dy xhat
    grid-wide merge (partials in block order: bit-identical);  sdy[j], sdx[j] in registers
    for each row tile of this block:  pass 1: dx[i, j] = ...

Whether the re-read of pass 1 hits L2 is the cost model's (schedule/cost.py `joined_cost`): only
when all of the input fits in half the L2, since every row is read before any is re-read.

Preconditions for a group of COLUMN reductions and their consumers, each checked:
  1. the columns are COLUMN reductions over one domain (same dimensions, extents and reduced
     dimensions), at most `MAX_HORIZONTAL` of them, placed in the row space (i: the reduced
     dimensions, j: the kept ones; isl: the write is `j`), independent of each other (isl: no
     dependence path between two of them; they all run in pass 0);
  2. a consumer is an element-wise statement (no indirect write) over that same domain,
     re-coalesced into the row space;
  3. every read of a column by a consumer is column-local (isl: at (i, j) the read's access
     relation equals the column's write, `j`), and no consumer reads another consumer (an
     element-wise result lives in no register of the kernel);
  4. the stitch keeps the kernel graph acyclic (no dependence path leaves it and comes back).
No column reads a consumer (the consumers run after the grid-wide merge, the columns before it):
a consumer reads a column, so that would be a path between two columns, refused by 1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import islpy as isl
import networkx as nx

from .coalesce import coalesce
from .statement import Form, Statement, StatementKind
from .stitch import MAX_HORIZONTAL, acyclic_after_contraction


@dataclass(frozen=True)
class ColumnStitch:
    """COLUMN reductions placed in their row space and the element-wise consumers of their
    final values (each placed likewise): one kernel, columns in pass 0, consumers in pass 1."""

    columns: tuple[Statement, ...]
    consumers: tuple[Statement, ...]

    @property
    def statements(self) -> tuple[Statement, ...]:
        return self.columns + self.consumers

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.statements)


def _space(st: Statement) -> tuple:
    o = st.origin
    return o.dims, o.extents, o.reduced


def _j(st: Statement):
    v = isl.make_zero_and_vars(["i", "j"], [], ctx=st.domain.get_ctx())
    return v["j"].intersect_domain(st.domain.reset_tuple_id())


def place_column(st: Statement) -> Statement | None:
    """Precondition 1: a COLUMN reduction placed in its row space (i reduced, j kept), or None."""
    if st.kind != StatementKind.REDUCE or st.form != Form.COLUMN or st.origin is None or st.scatter is not None:
        return None
    kept = frozenset(st.origin.dims) - st.origin.reduced
    placed = replace(coalesce(st.origin, roles=kept), reduced=frozenset({"i"}), form=Form.COLUMN)
    if not placed.write.intersect_domain(placed.domain.reset_tuple_id()).is_equal(_j(placed)):
        return None
    return placed


def place_consumer(st: Statement, columns: tuple[Statement, ...]) -> Statement | None:
    """Preconditions 2 and 3: `st` re-coalesced into the columns' row space, reading each column
    it reads at its own column j; None otherwise."""
    head = columns[0].origin
    if st.kind != StatementKind.MAP or st.scatter is not None or st.origin is None:
        return None
    if st.origin.dims != head.dims or st.origin.extents != head.extents:
        return None  # 2
    placed = coalesce(st.origin, roles=frozenset(head.dims) - head.reduced)
    mine = {c.result.uid: c for c in columns}
    dom = placed.domain.reset_tuple_id()
    for r in placed.reads:
        c = mine.get(r.tensor.uid)
        if c is not None and (r.indirect is not None or not r.addr.intersect_domain(dom).is_equal(_j(c))):
            return None  # 3
    return placed


def column_stitches(stmts, sg: nx.DiGraph) -> tuple[ColumnStitch, ...]:
    """The legal stitches of the program's COLUMN reductions with their consumers (statements in
    topological order, `sg` their isl dependence graph).

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> x = pn.placeholder((8, 4))
    >>> p = lower([x - pn.sum(x, axis=0, keepdims=True)], stop_after="program", target="emulator").program
    >>> [c.names for c in column_stitches(p.statements, p.statement_graph)]
    [('S0', 'S1')]
    """
    spaces: dict[tuple, list[Statement]] = {}
    for st in stmts:
        placed = place_column(st) if st.M * st.N else None
        if placed is None:
            continue
        here = spaces.setdefault(_space(st), [])
        if len(here) < MAX_HORIZONTAL and not any(nx.has_path(sg, c.name, st.name) for c in here):  # 1
            here.append(placed)
    out = []
    for cols in spaces.values():
        uids = {c.result.uid for c in cols}
        consumers: list[Statement] = []
        for st in stmts:
            if st.kind != StatementKind.MAP or not any(r.tensor.uid in uids for r in st.reads):
                continue
            placed = place_consumer(st, tuple(cols))
            if placed is None or any(r.tensor.uid in {c.result.uid for c in consumers} for r in st.reads):
                continue  # 2, 3
            consumers.append(placed)
        found = _legal(tuple(cols), tuple(consumers), sg)
        if found is not None:
            out.append(found)
    return tuple(out)


def _legal(columns, consumers, sg: nx.DiGraph) -> ColumnStitch | None:
    """Precondition 4 for the whole stitch, dropping the columns no consumer reads."""
    read = {r.tensor.uid for s in consumers for r in s.reads}
    columns = tuple(c for c in columns if c.result.uid in read)
    if not columns or not consumers:
        return None
    if not acyclic_after_contraction(sg, {s.name for s in columns + consumers}):
        return None  # 4
    return ColumnStitch(columns, consumers)
