"""The parametric polyhedral model of a symbolic program (issue 22): extents are isl parameters.

Every materialized tensor (an output or a reduction's result) is one statement, as in
poly/statement.py, but its extents are symbols (frontend/symbolic.py) and its canonical form is
decided from the symbolic shape, exactly, for every value of the symbols. A canonical extent
that is a product of symbols (M = B*S) is a derived parameter of its own, bound at call time.
The statement's domain `[pn_M, pn_N] -> { S[i, j] : 0 <= i < pn_M and 0 <= j < pn_N }` is an isl
set over those parameters (looked up by name); the kernels' loop nests are isl's AST of it.

Reads are kept as the tensor and the set of statement axes it varies along; codegen prints the
address from the symbolic strides, so broadcasts (a bias, a row statistic) stay exact.

Preconditions (each a clear error naming the op, one negative test each):
1. A statement's cone is element-wise ops, casts, broadcasts, transposes (index permutations),
   constants and reshapes of a stored tensor (no reshape of a computed value, movement, gather,
   iota or contraction): else `Unsupported`. Where the target asks for them (`gathers`: the CPU's
   schedule/onehot.py rewrite), a take_along_axis of a stored tensor is one too: an indirect read
   (`PRead.indirect`), its index an element-wise value, its other extents the data's; and an
   iota is a read that loads nothing (`PRead.memory` False: argmax's index, printed from the
   statement's coordinates by codegen/cpu_param_kernel.py).
2. A reduction reduces at least one axis: else `Unsupported`. Its form follows from the axes,
   for every size: all of them ALL, a suffix ROW (threads along the contiguous row), any other
   set COLUMN (threads along the kept axes, whose last is innermost); a read whose axes are not
   contiguous in the canonical index is addressed through the symbolic strides (no vectors).
3. A vector width V is used only where the class proves the contiguous extent a multiple of V
   (`Condition`, checked by `SizeClass.holds`): else the class maps with V = 1 and handles tails.

>>> import panamera as pn
>>> x = pn.placeholder(("B", "S", 8), name="x")
>>> p = build((pn.sum(x, axis=-1),))
>>> s = p.statements[0]
>>> s.form, s.M, s.N, p.parameters
(<Form.ROW: 'ROW'>, B*S, 8, ('B', 'S'))
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import islpy as isl

from ..algebra import Combiner, Finish
from ..dtypes import DType
from ..errors import Unsupported
from ..frontend import symbolic
from ..frontend.symbolic import Dim
from ..frontend.tensor import BINARY_ARITH, BITWISE, COMPARE, LOGICAL, UNARY, Tensor, topological
from .expr import Expr
from .statement import Form, StatementKind

ELEMENTWISE = frozenset(
    UNARY + BINARY_ARITH + LOGICAL + COMPARE + BITWISE + ("where", "cast", "argkey_max", "argkey_min")
)
Extent = int | Dim


@dataclass(frozen=True, eq=False)
class PRead:
    """A read of `tensor` (a placeholder or a statement's result; `shape` the view it is read
    through) varying along the statement axes `axes` (the others broadcast)."""

    tensor: Tensor
    shape: tuple[Extent, ...]
    axes: tuple[int, ...]  # statement axes this read varies along, aligned with `shape`'s trailing axes
    indirect: tuple[Extent, Extent] | None = None  # a gather: (stride, extent) of the axis its loaded index
    # addresses (the axis's entry in `axes` is -1: no statement axis); the index wrapped if negative, clamped

    @property
    def memory(self) -> bool:
        """False for an iota (precondition 1): its value is the index, nothing is loaded."""
        return self.tensor.op != "iota"

    def rises_with_j(self, s: PStatement) -> bool:
        """Whether this read is an iota whose value is statement s's row index j (so it grows with j,
        one per step: schedule/cpu_lane_kind.py LaneKind.ARG, as poly/statement.py `Read.rises_with_j`
        for a static statement): the flat index where every kept axis is 1, or the coordinate along
        the iota's axis where that axis is s's only reduced one."""
        if self.memory:
            return False
        axis = self.tensor.attr("axis")
        if axis is None:  # the flat index: j where every axis is reduced
            return tuple(self.shape) == tuple(s.shape) and all(_one(s.shape[a]) for a in s.i_axes)
        live = iter(self.axes)
        at = [None if _one(e) else next(live) for e in self.shape]
        return at[axis] is not None and s.j_axes == (at[axis],)


@dataclass(frozen=True)
class Condition:
    """A fact a decision needs for every size of a class: `extent` is a multiple of `multiple`."""

    extent: Extent
    multiple: int
    why: str

    def __str__(self) -> str:
        return f"{self.extent} % {self.multiple} == 0 ({self.why})"


@dataclass(frozen=True)
class PStatement:
    """One statement over a symbolic box; `split` axes: [0, split) are i, [split, rank) are j
    (ROW: i kept, j reduced; COLUMN: j reduced, i kept; MAP: everything is i)."""

    name: str
    result: Tensor
    kind: StatementKind
    form: Form
    shape: tuple[Extent, ...]  # the iteration box (the reduction's input, or the result)
    i_axes: tuple[int, ...]  # axes flattened into the canonical i
    j_axes: tuple[int, ...]  # axes flattened into j
    reads: tuple[PRead, ...]
    body: Expr
    combiner: Combiner | None = None
    acc: DType | None = None
    post: Finish | None = None
    mean: bool = False
    mean_count: int = 0  # thread_loop.post's static divisor: never used here (`mean` divides at run time)
    source: int = -1  # a reduction's input tensor (uid): reductions of one source share an accumulator

    def accumulator_key(self) -> tuple:
        """Reductions with equal keys accumulate the same values (LayerNorm's mean and variance,
        softmax's max and sum of the online formulation): one accumulator serves them all."""
        return (self.source, self.i_axes, self.j_axes, self.combiner.name, self.acc.name)

    def as_rows_of(self, other: PStatement) -> PStatement:
        """This MAP statement iterated as `other`'s ROW form (same box: i its rows, j the row)."""
        return dataclasses.replace(self, form=Form.ROW, i_axes=other.i_axes, j_axes=other.j_axes)

    @property
    def M(self) -> Extent:  # noqa: N802 - the paper's name
        return symbolic.prod(self.shape[a] for a in self.i_axes)

    @property
    def N(self) -> Extent:  # noqa: N802
        return symbolic.prod(self.shape[a] for a in self.j_axes)

    def domain(self, ctx: isl.Context) -> isl.Set:
        """`[pn_M, pn_N] -> { S[i, j] : 0 <= i < pn_M and 0 <= j < pn_N }` (a constant extent
        stays a constant)."""
        return isl.Set.read_from_str(ctx, f"[pn_M, pn_N] -> {{ {self.name}[i, j] : {box_constraints(self)} }}")

    def vector_condition(self, vec: int) -> Condition | None:
        """What a vector width `vec` needs (precondition 3): the contiguous extent a multiple of it."""
        if vec == 1:
            return None
        along = self.N if self.form in (Form.ROW, Form.ALL) else self.M
        return Condition(along, vec, f"{self.name}: vectors of {vec} along the contiguous extent")


def _one(e: Extent) -> bool:
    return isinstance(e, int) and e == 1


def box_constraints(s: PStatement) -> str:
    m = "pn_M" if isinstance(s.M, Dim) else str(s.M)
    n = "pn_N" if isinstance(s.N, Dim) else str(s.N)
    return f"0 <= i < {m} and 0 <= j < {n}"


@dataclass(frozen=True)
class ParamProgram:
    statements: tuple[PStatement, ...]  # in launch order (producers first)
    inputs: tuple[Tensor, ...]  # placeholders in creation order
    outputs: tuple[Tensor, ...]  # as given (a reshape of a stored tensor is a view of it)
    formulations: tuple[str, ...] = ()  # "op=choice" per alternative chosen
    groups: tuple[tuple[int, ...], ...] = ()  # statement indices of each kernel, in launch order (param_stitch.py)
    kinds: tuple[str, ...] = ()  # each kernel's: "single", "stitched" or "epilogue"

    @property
    def parameters(self) -> tuple[str, ...]:
        """Every symbol of the program, sorted (isl parameters are looked up by these names)."""
        names = set()
        for t in self.inputs:
            names |= symbolic.symbols_of(t.shape)
        return tuple(sorted(names))


def storage(t: Tensor) -> Tensor:
    """The tensor whose buffer holds `t` (a reshape is a view in C order)."""
    while t.op == "reshape":
        t = t.inputs[0]
    return t


def _choose(
    outputs: tuple[Tensor, ...], cost=None, gathers: bool = False
) -> tuple[tuple[Tensor, ...], tuple[str, ...]]:
    """Each `choose` node replaced by its formulation with the fewest reductions (the fewest
    passes over memory, the model's first-order term), or the least `cost((alternative,))` where
    a target's model gives one (dynamic_cpu.py); the choices recorded."""
    memo: dict[int, Tensor] = {}
    chosen = []
    for t in topological(outputs):
        ins = tuple(memo[a.uid] for a in t.inputs)
        if t.op == "choose":
            costs = [
                (
                    not _supported(o, gathers),
                    cost((o,)) if cost else sum(1 for u in topological((o,)) if u.op == "reduce"),
                )
                for o in ins
            ]
            k = costs.index(min(costs))  # one this path compiles, with the fewest passes
            chosen.append(f"{t.attr('formulation')}={t.attr('names')[k]}")
            memo[t.uid] = ins[k]
        elif any(a is not b for a, b in zip(ins, t.inputs)):  # identity: == on Tensors builds a comparison
            memo[t.uid] = Tensor(t.op, ins, t.shape, t.dtype, t.attrs, t.name)
        else:
            memo[t.uid] = t
    return tuple(memo[o.uid] for o in outputs), tuple(chosen)


VIEWS = frozenset(("reshape", "transpose", "placeholder", "const", "reduce", "choose"))


def _supported(t: Tensor, gathers: bool = False) -> bool:
    """Whether every op of `t`'s graph is one a symbolic program compiles (precondition 1)."""
    return all(
        u.op in ELEMENTWISE or u.op in VIEWS or (gathers and (_gather(u) or u.op == "iota")) for u in topological((t,))
    )


def _gather(t: Tensor) -> bool:
    """A take_along_axis (frontend/movement.py): the gathers `gathers=True` reads indirectly."""
    return t.op == "gather" and bool(t.attr("elements"))


def unsqueeze(t: Tensor) -> bool:
    """A reshape that only inserts or drops extent-1 axes: an index map, whatever its input."""
    keep = [e for e in t.shape if not (isinstance(e, int) and e == 1)]
    return keep == [e for e in t.inputs[0].shape if not (isinstance(e, int) and e == 1)]


def build(outputs: tuple[Tensor, ...], cost=None, gathers: bool = False) -> ParamProgram:
    """The parametric program of symbolic `outputs`: one statement per output and per reduction;
    `cost` ranks the formulations of a `choose` (default: the fewest reductions); `gathers`: a
    take_along_axis of a stored tensor is an indirect read (a target whose codegen prints them)."""
    graph, chosen = _choose(tuple(outputs), cost, gathers)
    stored = {storage(o).uid for o in graph}
    order = topological(graph)
    stored |= {t.uid for t in order if t.op == "reduce"}
    # A reshape that regroups axes of a computed value reads it from memory: its input is stored.
    stored |= {
        storage(t).uid for t in order if t.op == "reshape" and not unsqueeze(t) and storage(t).op != "placeholder"
    }
    statements = []
    for t in order:
        if t.uid in stored and t.op not in ("placeholder", "const"):
            statements.append(_statement(f"S{len(statements)}", t, stored, gathers))
    inputs = tuple(sorted((t for t in order if t.op == "placeholder"), key=lambda t: t.uid))
    for t in inputs:
        if t.attr("bound") is not None:
            raise Unsupported(f"constant array {t.label!r}: a symbolic program reads only arrays passed at call time")
    from .param_stitch import kernel_groups

    groups, kinds = kernel_groups(tuple(statements))
    return ParamProgram(tuple(statements), inputs, tuple(graph), chosen, groups, kinds)


def _statement(name: str, t: Tensor, stored: set[int], gathers: bool = False) -> PStatement:
    if t.op == "reduce":
        src = t.inputs[0]
        shape, axes = src.shape, tuple(t.attr("axes"))
        rank = len(shape)
        if not axes:
            raise Unsupported(f"reduce {t.label!r}: a reduction over no axes of {shape} (precondition 2)")
        kept = tuple(a for a in range(rank) if a not in axes)
        if len(axes) == rank:
            form, i_axes, j_axes = Form.ALL, (), tuple(range(rank))
        elif list(axes) == list(range(rank - len(axes), rank)):
            form, i_axes, j_axes = Form.ROW, kept, axes
        else:  # a prefix, middle or scattered axes: threads along the kept axes (the last one innermost)
            form, i_axes, j_axes = Form.COLUMN, kept, axes
        b = _Body(shape, stored, gathers)
        body = b.expr(src, tuple(range(rank)))
        return PStatement(
            name, t, StatementKind.REDUCE, form, shape, i_axes, j_axes, tuple(b.reads), body,
            t.attr("combiner"), t.attr("acc"), t.attr("post"), bool(t.attr("mean")), source=src.uid,
        )  # fmt: skip
    b = _Body(t.shape, stored, gathers)
    body = b.compute(t, tuple(range(len(t.shape))))
    return PStatement(
        name, t, StatementKind.MAP, Form.MAP, t.shape, tuple(range(len(t.shape))), (), tuple(b.reads), body
    )


class _Body:
    """The element-wise cone of one statement as an Expr; every leaf a read (precondition 1)."""

    def __init__(self, shape, stored: set[int], gathers: bool = False):
        self.shape, self.stored, self.gathers = tuple(shape), stored, gathers
        self.reads: list[PRead] = []
        self.memo: dict = {}

    def _axes(self, view_shape, axes) -> tuple[int, ...]:
        """The statement axes a tensor of `view_shape` read at `axes` varies along: numpy's
        broadcasting drops its extent-1 axes."""
        return tuple(a for a, e in zip(axes[len(axes) - len(view_shape) :], view_shape) if not (e == 1))

    def read(self, t: Tensor, view_shape, axes, index: Expr | None = None, indirect=None) -> Expr:
        r = PRead(storage(t), tuple(view_shape), self._axes(view_shape, axes), indirect)
        keys = [(x.tensor.uid, x.shape, x.axes, x.indirect) for x in self.reads]  # (Tensor's == builds a graph node)
        key = (r.tensor.uid, r.shape, r.axes, r.indirect)
        if index is not None or key not in keys:  # a gather's load is its own (its index differs)
            self.reads.append(r)
            keys.append(key)
        k = len(keys) - 1 if index is not None else keys.index(key)
        return Expr("load", (index,) if index is not None else (), t.dtype, read=k)

    def gather(self, t: Tensor, axes) -> Expr:
        """take_along_axis(x, index, a) at `axes`: x (stored) read at the statement's index with
        axis a's subscript the index's value (precondition 1)."""
        x, index, a = t.inputs[0], t.inputs[1], t.attr("axis")
        if not (storage(x).op == "placeholder" or storage(x).uid in self.stored) or any(
            k != a and not (i == n) for k, (i, n) in enumerate(zip(index.shape, x.shape))
        ):
            raise Unsupported(
                f"gather {t.label!r}: a symbolic program gathers a stored tensor by an index of its extents "
                f"(index {index.shape}, data {x.shape}; precondition 1)"
            )
        axes = tuple(axes[len(axes) - len(t.shape) :])
        q = self.expr(index, axes)
        at = tuple(-1 if k == a else ax for k, ax in enumerate(axes))
        stride = symbolic.prod(x.shape[k] for k in range(a + 1, len(x.shape)))
        return self.read(x, x.shape, at, q, (stride, x.shape[a]))

    def expr(self, t: Tensor, axes) -> Expr:
        """The value of `t` (aligned with the statement's trailing `axes`) at the iteration point."""
        key = (t.uid, axes)
        if key in self.memo:
            return self.memo[key]
        if t.op == "const":
            e = Expr("const", (), t.dtype, value=t.attr("value"))
        elif storage(t).op == "placeholder" or storage(t).uid in self.stored:
            e = self.read(t, t.shape, axes)
        else:
            e = self.compute(t, axes)
        self.memo[key] = e
        return e

    def compute(self, t: Tensor, axes) -> Expr:
        if t.op == "reshape" and unsqueeze(t):  # extent-1 axes inserted or dropped: the same index
            src = t.inputs[0]
            live = iter(
                a for a, e in zip(axes[len(axes) - len(t.shape) :], t.shape) if not (isinstance(e, int) and e == 1)
            )
            return self.expr(src, tuple(-1 if isinstance(e, int) and e == 1 else next(live) for e in src.shape))
        if t.op == "transpose":  # an index permutation: t's axis k is its input's axis perm[k]
            perm, inner = t.attr("perm"), [0] * len(t.shape)
            for k, a in enumerate(tuple(axes[len(axes) - len(t.shape) :])):
                inner[perm[k]] = a
            return self.expr(t.inputs[0], tuple(inner))
        if self.gathers and t.op == "iota":  # its value is the index: a read that loads nothing
            return self.read(t, t.shape, tuple(axes[len(axes) - len(t.shape) :]))
        if self.gathers and _gather(t):
            return self.gather(t, axes)
        if t.op not in ELEMENTWISE:
            raise Unsupported(
                f"{t.op} {t.label!r} of shape {t.shape}: a symbolic program fuses element-wise ops, casts, "
                "broadcasts, transposes and reshapes of stored tensors only (precondition 1); compile it at concrete sizes "
                "(panamera.dynamic.specialize)"
            )
        axes = tuple(axes[len(axes) - len(t.shape) :])
        args = []
        for a in t.inputs:
            sub = axes[len(axes) - len(a.shape) :] if a.shape else ()
            args.append(self.expr(a, sub))
        return Expr(t.op, tuple(args), t.dtype)
