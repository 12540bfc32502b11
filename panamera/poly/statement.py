"""Statements of the polyhedral model: iteration domains and access relations built with isl.

Every materialized tensor (an output or a reduction result) is computed by one statement. Its
iteration domain is the box of the tensor it iterates over, with dimensions named `d0, d1, ...`;
every read of a placeholder or of another statement's result is an access relation, kept as the
quasi-affine *linear element offset* of the element read (a `PwAff` over the domain), which is
what broadcasting (constant 0 subscripts) and reshape (div/mod of the linear index) produce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from ..algebra import Combiner, Finish
from ..dtypes import DType
from ..enums import StrEnum
from ..frontend.tensor import Tensor
from ..frontend.walk import evaluate
from .expr import Expr
from .movement import Indirect, gather_source, gather_subscripts, remap_index


class Form(StrEnum):
    """The canonical form of a statement after loop coalescing (poly/coalesce.py)."""

    ROW = "ROW"  # reduce the inner, contiguous extent j of each row i
    COLUMN = "COLUMN"  # reduce the outer extent j; the kept extent i is contiguous
    ALL = "ALL"  # reduce everything: M = 1
    MAP = "MAP"  # element-wise: i is the flat index, N = 1


class StatementKind(StrEnum):
    REDUCE = "reduce"
    MAP = "map"


@dataclass(frozen=True)
class Read:
    tensor: Tensor  # a placeholder, the result of another statement, or an iota
    addr: isl.PwAff  # linear element offset as a function of the statement's domain
    indirect: Indirect | None = None  # a gather: `index * stride` added at run time (non-affine)

    @property
    def memory(self) -> bool:
        """False for an iota: its "address" is the value itself, nothing is loaded."""
        return self.tensor.op != "iota"

    def rises_with_j(self, s: Statement) -> bool:  # noqa: ARG002 - the symbolic PRead's rule needs s
        """Whether this read is an iota whose value grows with statement s's canonical j, one per
        step (an argmax's index its scan's lanes keep, schedule/cpu_lane_kind.py LaneKind.ARG): its
        address is already over s's canonical domain. poly/params.py `PRead.rises_with_j` is the
        symbolic statement's answer."""
        if self.memory:
            return False
        pos = self.addr.get_space().find_dim_by_name(isl.dim_type.in_, "j")
        return pos >= 0 and all(
            aff.get_coefficient_val(isl.dim_type.in_, pos).is_one() for _, aff in self.addr.get_pieces()
        )


@dataclass(frozen=True)
class Statement:
    """One statement; `form` is None until `coalesce` puts it in canonical form."""

    name: str
    result: Tensor  # the tensor this statement writes
    kind: StatementKind
    dims: tuple[str, ...]  # names of the domain dimensions
    extents: tuple[int, ...]
    reduced: frozenset[str]  # names of the reduction dimensions
    domain: isl.Set
    reads: tuple[Read, ...]
    write: isl.PwAff  # linear offset of the element written
    body: Expr
    combiner: Combiner | None = None
    acc: DType | None = None
    mean_count: int = 0  # the reduction's extent when the result is a mean, else 0
    post: Finish | None = None  # what is stored from the accumulator (None: the accumulator itself)
    form: Form | None = None  # set by coalescing
    M: int = 0
    N: int = 0
    origin: Statement | None = None  # the statement before coalescing
    # An indirect write (a scatter-add): the element written is `write + index * scatter.stride`,
    # index the value of `scatter_index` (a row id; outside [0, scatter.extent) nothing is
    # written), merged by an atomic add into an output zeroed every call.
    scatter: Indirect | None = None
    scatter_index: Expr | None = None

    def dim(self, name: str) -> int:
        return self.dims.index(name)


def box(ctx: isl.Context, names, extents) -> tuple[isl.Set, dict]:
    """The set { [names] : 0 <= name < extent } and the PwAff variables of its dims."""
    v = isl.make_zero_and_vars(list(names), [], ctx=ctx)
    s = isl.Set.universe(v[0].domain().space)
    for n, e in zip(names, extents):
        s = s & v[n].ge_set(v[0]) & v[n].lt_set(v[0] + e)
    return s, v


def strides(shape) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


def linear(idx, shape, zero: isl.PwAff) -> isl.PwAff:
    """The C-order offset sum(idx[k] * stride[k]). Scaled with `scale_val`: islpy's `i * st`
    first turns st into a piecewise constant with every piece of i (seconds for the many-piece
    subscripts of a strided, clamped window view)."""
    total = zero
    for i, st in zip(idx, strides(shape)):
        total = total + (i.scale_val(isl.Val.int_from_si(i.get_ctx(), st)) if st != 1 else i)
    return total


def delinearize(lin: isl.PwAff, shape, ctx: isl.Context) -> list[isl.PwAff]:
    """Subscripts of the element at linear offset `lin` in a C-order array of `shape`.
    (A shape with a zero extent has stride 0 and an empty domain: any subscript will do.)"""
    out = []
    for s, st in zip(shape, strides(shape)):
        q = lin.scale_down_val(isl.Val.int_from_si(ctx, st)).floor() if st > 1 else lin
        out.append(q.mod_val(isl.Val.int_from_si(ctx, s)) if s > 0 else q)
    return out


class _Builder:
    """Walks the elementwise cone of a statement, composing access relations on the way down."""

    def __init__(self, ctx, zero, materialized, domain: isl.Set | None = None):
        self.ctx, self.zero, self.materialized = ctx, zero, materialized
        self.domain = domain  # the statement's box: remaps are checked to stay inside their input
        self.reads: list[Read] = []
        self.memo: dict = {}

    def read(self, t: Tensor, idx) -> int:
        addr = linear(idx, t.shape, self.zero).coalesce()
        for k, r in enumerate(self.reads):
            if r.tensor is t and r.addr.is_equal(addr):
                return k
        self.reads.append(Read(t, addr))
        return len(self.reads) - 1

    def read_index(self, t: Tensor, index: isl.PwAff) -> int:
        self.reads.append(Read(t, index.coalesce()))
        return len(self.reads) - 1

    # The cone is walked without recursion (walk.evaluate: chains of any depth), in the order of
    # the recursive walk: a node's arguments left to right, each finished before the next, so the
    # reads are numbered as they are met. A node is (tensor, subscripts, computed): `computed`
    # asks for the value of a materialized root rather than its load.
    def expr(self, t: Tensor, idx) -> Expr:
        """The value of `t` at the subscripts `idx`: a load of a leaf, else computed."""
        return evaluate((t, list(idx), False), self._key, self._args, self._value, self.memo)

    def compute(self, t: Tensor, idx) -> Expr:
        """The value of a non-leaf `t` at `idx`: through a view's or a remap's access, a gather's
        non-affine read, or the element-wise op of its arguments."""
        return evaluate((t, list(idx), True), self._key, self._args, self._value, self.memo)

    @staticmethod
    def _key(node) -> tuple:
        t, idx, computed = node
        return (t.uid, tuple(str(i) for i in idx), computed)

    def _leaf(self, t: Tensor) -> bool:
        return t.op in ("const", "iota", "placeholder") or t in self.materialized

    def _args(self, node) -> list:
        """The (tensor, subscripts) a node's value is made of."""
        t, idx, computed = node
        if self._leaf(t) and not computed:
            return []
        if t.op in VIEWS:
            return [(t.inputs[0], view_index(t, idx, self), False)]
        if t.op == "movement":
            return [(t.inputs[0], remap_index(t, idx, self.zero, self.domain), False)]
        if t.op == "gather":
            return [(t.inputs[1], gather_subscripts(t, list(idx), self.zero)[0], False)]
        return [(a, broadcast_index(idx, t.shape, a.shape, self.zero), False) for a in t.inputs]

    def _value(self, node, args: list[Expr]) -> Expr:
        t, idx, computed = node
        if self._leaf(t) and not computed:
            if t.op == "const":
                return Expr("const", (), t.dtype, value=t.attr("value"))
            if t.op == "iota":
                axis = t.attr("axis")
                index = linear(idx, t.shape, self.zero) if axis is None else idx[axis]
                return Expr("load", (), t.dtype, read=self.read_index(t, index))
            return Expr("load", (), t.dtype, read=self.read(t, idx))
        if t.op in VIEWS or t.op == "movement":
            return args[0]
        if t.op == "gather":
            return self.gather(t, idx, args[0])
        return Expr(t.op, tuple(args), t.dtype)

    def gather(self, t: Tensor, idx, index: Expr) -> Expr:
        """A load of the gathered tensor (a placeholder or a statement's result) whose address is
        affine plus a loaded `index` times the axis' stride: a non-affine read of its own."""
        data, _ = t.inputs
        _, dsub, a = gather_subscripts(t, list(idx), self.zero)
        addr = linear(dsub, data.shape, self.zero).coalesce()  # the source's offset too (reshapes)
        self.reads.append(Read(gather_source(t), addr, Indirect(strides(data.shape)[a], data.shape[a])))
        return Expr("load", (index,), data.dtype, read=len(self.reads) - 1)


VIEWS = ("reshape", "transpose")  # a new index of the same elements: an access, never a statement


def view_index(t: Tensor, idx, b: _Builder) -> list:
    """The subscripts of `t.inputs[0]` that view `t` reads at `idx`: reshape delinearizes the
    linear index, transpose permutes the subscripts (numpy's `perm`: t's axis k is axis perm[k])."""
    src = t.inputs[0]
    if t.op == "reshape":
        return delinearize(linear(idx, t.shape, b.zero), src.shape, b.ctx)
    perm = t.attr("perm")
    return [idx[perm.index(k)] for k in range(src.ndim)]


def broadcast_index(idx, shape, arg_shape, zero):
    """numpy broadcasting: trailing dims align, extent-1 dims of the argument read index 0."""
    lead = len(shape) - len(arg_shape)
    return [zero if s == 1 else idx[lead + k] for k, s in enumerate(arg_shape)]


def build_statement(ctx: isl.Context, name: str, t: Tensor, materialized: set) -> Statement:
    """The statement computing tensor `t`, reading `materialized` tensors and placeholders."""
    if t.op == "scatter_add":
        return _scatter_statement(ctx, name, t, materialized)
    if t.op == "reduce":
        src = t.inputs[0]
        shape = src.shape
        axes = t.attr("axes")
    else:
        src, shape, axes = t, t.shape, ()
    dims = tuple(f"d{k}" for k in range(len(shape)))
    domain, v = box(ctx, dims, shape)
    domain = domain.set_tuple_name(name)
    zero = v[0]
    b = _Builder(ctx, zero, materialized - {t}, domain.reset_tuple_id())
    idx = [v[d] for d in dims]
    if t.op == "reduce":
        body = b.expr(src, idx)
        kept = [v[d] for k, d in enumerate(dims) if k not in axes]
        write = linear(kept, [s for k, s in enumerate(shape) if k not in axes], zero)
        comb = t.attr("combiner")
        n = math.prod(shape[a] for a in axes)
        extra = dict(combiner=comb, acc=t.attr("acc"), mean_count=n if t.attr("mean") else 0, post=t.attr("post"))
    else:
        body = b.expr(src, idx) if src.op in ("placeholder", "const") else _map_body(b, src, idx)
        write = linear(idx, shape, zero)
        extra = {}
    return Statement(
        name=name,
        result=t,
        kind=StatementKind.REDUCE if t.op == "reduce" else StatementKind.MAP,
        dims=dims,
        extents=tuple(shape),
        reduced=frozenset(dims[a] for a in axes),
        domain=domain,
        reads=tuple(b.reads),
        write=write.coalesce(),
        body=body,
        **extra,
    )


def _scatter_statement(ctx: isl.Context, name: str, t: Tensor, materialized: set) -> Statement:
    """`out[idx with axis a replaced by ids[idx]] += vals[idx]` over the domain of `vals`
    (frontend/scatter.py's indirect writes; `ids` broadcasts to `vals`: one id per row of a
    scatter of rows, one per element of a scatter along an axis): an element-wise statement whose
    write goes through the index. Its affine part is the element's offset with subscript a set
    to 0; the id is an expression of its own, evaluated per iteration."""
    ids, vals = t.inputs
    a = t.attr("axis")
    dims = tuple(f"d{k}" for k in range(vals.ndim))
    domain, v = box(ctx, dims, vals.shape)
    domain = domain.set_tuple_name(name)
    zero = v[0]
    b = _Builder(ctx, zero, materialized - {t}, domain.reset_tuple_id())
    idx = [v[d] for d in dims]
    body = b.expr(vals, idx)
    index = b.expr(ids, broadcast_index(idx, vals.shape, ids.shape, zero))
    written = idx[:a] + [zero] + idx[a + 1 :]
    return Statement(
        name=name,
        result=t,
        kind=StatementKind.MAP,
        dims=dims,
        extents=tuple(vals.shape),
        reduced=frozenset(),
        domain=domain,
        reads=tuple(b.reads),
        write=linear(written, t.shape, zero).coalesce(),
        body=body,
        scatter=Indirect(strides(t.shape)[a], t.shape[a]),
        scatter_index=index,
    )


def _map_body(b: _Builder, t: Tensor, idx) -> Expr:
    # The root of a map statement is computed, never loaded, even though it is materialized.
    return b.compute(t, idx)
