"""A parametric kernel at bound sizes as the static cost sees it (issue 22): one cost model.

A size class's candidates (schedule/param_mapping.py) are weighed by schedule/cost.py, the terms a
static compile weighs its own candidates by (the split's merge terms, the block reduction and the
last block's combine, the stitched passes and their L2 re-reads, the arithmetic), so a term the
static model gains (clusters did) is one the class plan sees too, and the class plan's figure at
a size compares with the static plan's for that size term by term. `bound` gives the static
cost the kernel group it reads, with every extent evaluated at the bound sizes; `as_decision`
gives it the `Decision` of a class decision.

The view holds what the parametric kernels (codegen/param_kernel.py, param_stitched.py) do:
they unroll their innermost loop `d.unroll` times (islast's unguarded copies, as the static
kernels), no more than a thread's steps at the size; they store every member's result
(a stitched group's reductions too), finish a stitched group's reductions in one pass per
accumulator, and never split a stitched group. Contractions' L2 re-reads are not counted here
(the contraction's isl access analysis needs concrete domains).

>>> import panamera as pn
>>> from panamera.poly.params import build
>>> p = build((pn.sum(pn.placeholder(("B", 768), name="x"), axis=1),))
>>> g = bound((p.statements[0],), "single", {"B": 8})
>>> g.M, g.N, g.statements[0].reads[0].tensor.size
(8, 768, 6144)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from ..algebra import Combiner
from ..dtypes import DType
from ..frontend import symbolic
from ..poly.expr import Expr
from ..poly.params import PStatement
from ..poly.program import KernelGroup
from ..poly.statement import Form, StatementKind
from .decision import Decision, MergeMode


@dataclass(frozen=True)
class BoundTensor:
    """A tensor at bound sizes: what the cost reads of it."""

    uid: int
    dtype: DType
    size: int
    op: str = ""

    def attr(self, key, default=None):
        return default  # no contraction attribute: see the module's note


@dataclass(frozen=True)
class BoundRead:
    tensor: BoundTensor
    indirect: None = None

    @property
    def memory(self) -> bool:
        return True


@dataclass(frozen=True)
class BoundStatement:
    """A parametric statement at bound sizes, in the static kernel group's canonical form."""

    name: str
    result: BoundTensor
    kind: StatementKind
    form: Form
    M: int
    N: int
    reads: tuple[BoundRead, ...]
    body: Expr
    combiner: Combiner | None = None
    acc: DType | None = None
    scatter: None = None


@dataclass(frozen=True)
class BoundGroup(KernelGroup):
    """A KernelGroup of BoundStatements whose shared accumulators are the parametric program's
    (`PStatement.accumulator_key`: reductions of one source), given as `owners`."""

    owners: tuple[int, ...] = field(default=())

    @cached_property
    def accumulator_of(self) -> tuple[int, ...]:
        return self.owners


def _tensor(t, sizes: dict[str, int]) -> BoundTensor:
    return BoundTensor(t.uid, t.dtype, symbolic.evaluate((t.size,), sizes)[0], t.op)


def _at(extent, sizes: dict[str, int]) -> int:
    return symbolic.evaluate((extent,), sizes)[0]


def _statement(s: PStatement, sizes: dict[str, int], form: Form, M: int, N: int) -> BoundStatement:  # noqa: N803
    reads = tuple(BoundRead(_tensor(r.tensor, sizes)) for r in s.reads)
    return BoundStatement(s.name, _tensor(s.result, sizes), s.kind, form, M, N, reads, s.body, s.combiner, s.acc)


def bound(members: tuple[PStatement, ...], kind: str, sizes: dict[str, int]) -> BoundGroup:
    """The static view of one parametric kernel (`kind`: "single", "siblings", "epilogue" or
    "stitched", poly/param_stitch.py) at `sizes`."""
    red = members[0]
    M, N = _at(red.M, sizes), _at(red.N, sizes)  # noqa: N806
    if kind == "stitched":  # every member over the reductions' box; the MAP last, in the rows' form
        stmts = tuple(_statement(m, sizes, Form.ROW, M, N) for m in members)
        keys: dict[tuple, int] = {}
        owners = tuple(
            keys.setdefault(m.accumulator_key(), k) if m.kind == StatementKind.REDUCE else k
            for k, m in enumerate(members)
        )
        external = frozenset(m.result.uid for m in members[:-1])  # the reductions' results are stored
        return BoundGroup(stmts, stitched=True, external=external, owners=owners)
    if kind == "epilogue":  # the reduction, then its MAP at each output (one element per output)
        stmts = (_statement(red, sizes, red.form, M, N), _statement(members[1], sizes, Form.MAP, M, 1))
        return BoundGroup(stmts, external=frozenset({red.result.uid}), epilogue=True, owners=(0, 1))
    stmts = tuple(_statement(m, sizes, m.form, M, N) for m in members)
    owners = (0,) * len(members) if kind == "siblings" else tuple(range(len(members)))
    return BoundGroup(stmts, owners=owners)


def passes_of(members: tuple[PStatement, ...]) -> tuple[int, ...]:
    """A stitched group's pass per member (codegen/param_stitched.py): one per accumulator, in
    order, then the MAP's."""
    keys: dict[tuple, int] = {}
    lv = [keys.setdefault(m.accumulator_key(), len(keys)) for m in members[:-1]]
    return (*lv, len(keys))


def as_decision(group: BoundGroup, members: tuple[PStatement, ...], d, kind: str) -> Decision:
    """The static Decision of class decision `d` (a ParamDecision) on `group` (`bound`): its
    block, grid, split, chunk (the steps each split block's threads take), vector, unroll and
    merges; no register tile, cluster or on-chip rows."""
    gx, gy = d.grid(group.M)
    merges = tuple(
        MergeMode.STORE if st.kind == StatementKind.MAP or kind == "stitched" else d.merge for st in group.statements
    )
    widths = tuple(d.atomic_vec if m == MergeMode.ATOMIC_WS else 1 for m in merges)
    levels = passes_of(members) if kind == "stitched" else (0,) * len(members)
    steps = d.iterations(group.M, group.N)  # a thread's serial steps at this size, each split block's share
    unroll = max(1, min(d.unroll, steps))  # the unrolled steps a thread has at this size
    chunk = steps * {Form.MAP: 1, Form.COLUMN: d.ty}.get(Form(d.form), d.tx)  # Decision.tasks' serial extent
    return Decision(
        statements=group.names, form=Form(d.form), M=group.M, N=group.N, stitched=kind == "stitched", vec=d.vec,
        tx=d.tx, ty=d.ty, split=d.split, chunk=chunk, grid=(gx, gy), unroll=unroll, merges=merges, access=(), levels=levels,
        atomic_vec=widths, epilogue=kind == "epilogue",
    )  # fmt: skip
