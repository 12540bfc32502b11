"""One-hot selections written as reductions, rewritten as gathers (the CPU target's graph).

cross_entropy and torch's nll_loss pick the target's logit as a sum over the class axis of a
one-hot select: `sum(where(j == t[i], x[i, j], 0), axis=j)` (frontend/nn.py, torch_backend/aten.py).
On the GPU that sum rides the row kernel that reads x anyway; on the CPU it costs a 64-bit compare,
a select and an add per element of the row scan to keep one value. `gathers` rewrites it as
`where(0 <= t[i] < C, x[i, t[i]], 0)`: one read per row (frontend/movement.py's take_along_axis),
the same value bit for bit (a sum of zeros and one value is that value; +0.0 for -0.0 only, which
the loss's subtraction cannot tell apart), the same answer for targets outside [0, C) (nothing
selected: 0), and the same NaN semantics (a NaN off the target column is not read by either).
Symbolic extents (dynamic_cpu.py) are rewritten alike: C a symbol is a constant of that extent
(poly/params.py reads a gather of a stored tensor as an indirect load; its codegen prints C).

Preconditions (each checked; the tensor is left as it is when one fails):
 1. A `reduce` with the sum combiner over exactly one axis `a`, not a mean.
 2. Its input is `where(eq(I, T), X, 0)` (or `eq(T, I)`) with a +0.0 or 0 constant as the third operand.
 3. `I` is the index along `a`: an iota over axis `a` of the where's rank, or a reshape of a 1-D
    iota (torch's `arange(C).reshape(1, C)`) to extent C on axis `a` and 1 elsewhere.
 4. `T` is an integer tensor of the where's rank, extent 1 on `a` and the where's extents elsewhere
    (one target per row, no broadcast target).
 5. `X` is an element-wise function (poly/fusion.py's ELEMENTWISE) of float placeholders of the
    where's shape and of tensors constant along `a` (row statistics, scalars): the gather reads
    memory that exists and X is recomputed at one element per row (nll_loss of log_softmax:
    x[i, t[i]] - m[i] - log s[i]); a gather of a computed tensor would materialize it
    (frontend/movement.py `take`).
 6. The reduce's dtype is X's dtype (the sum is then exactly the picked value).
 7. The class axis is not a static 0: a sum over no class is 0 with no read, a gather from it has no
    element to read (frontend/gather.py `refuse_empty_axis`). A symbolic C bound to 0 leaves the
    rewrite's load unexecuted (codegen/cpu_param_kernel.py tests C > 0 before it).

>>> import panamera as pn
>>> x, t = pn.placeholder((4, 10), name="x"), pn.placeholder((4,), "int64", name="t")
>>> picked = pn.sum(pn.where(pn.arange(10).reshape((1, 10)) == t.reshape((4, 1)), x, 0.0), axis=1)
>>> [u.op for u in gathers((picked,))[0].inputs]
['where']
"""

from __future__ import annotations

import dataclasses

from ..dtypes import as_dtype
from ..frontend.gather import take_along_axis
from ..frontend.symbolic import Dim
from ..frontend.tensor import Tensor, _ids, constant, topological, where
from ..poly.fusion import ELEMENTWISE
from .formulation import substitute


def _index_axis(i: Tensor, rank: int) -> int | None:
    """The axis along which `i` is the index (precondition 3), else None."""
    if i.op == "iota" and i.ndim == rank and i.attr("axis") is not None:
        return i.attr("axis")
    if i.op == "reshape" and i.ndim == rank:
        src = i.inputs[0]
        if src.op == "iota" and src.ndim == 1 and src.attr("axis") == 0:
            big = [k for k, s in enumerate(i.shape) if s != 1]
            if len(big) == 1 and i.shape[big[0]] == src.shape[0]:
                return big[0]
    return None


def _zero(z: Tensor) -> bool:
    if z.op != "const" or z.ndim != 0:
        return False
    v = z.attr("value")
    return v == 0 and str(v)[0] != "-"  # +0.0 (a -0.0 would differ from the sum's +0.0 identity)


def _at_target(x: Tensor, t: Tensor, a: int, shape: tuple) -> Tensor | None:
    """`x` (of the where's `shape`) read at the target of each row, shaped as `t`; None where x
    is not an element-wise function of placeholders and per-row tensors (precondition 5)."""
    memo: dict[int, Tensor | None] = {}

    def at(u: Tensor) -> Tensor | None:
        if u.uid not in memo:
            memo[u.uid] = one(u)
        return memo[u.uid]

    def one(u: Tensor) -> Tensor | None:
        if u.ndim == 0 or (u.ndim == len(shape) and u.shape[a] == 1):
            return u  # constant along the axis: read as it is, per row
        if u.shape != shape or not u.dtype.is_float:
            return None
        if u.op == "placeholder":
            return take_along_axis(u, t, a)
        if u.op not in ELEMENTWISE:
            return None
        new = [at(v) for v in u.inputs]
        if any(v is None for v in new):
            return None
        return dataclasses.replace(u, inputs=tuple(new), shape=t.shape, uid=next(_ids))

    return at(x)


def match(r: Tensor) -> Tensor | None:
    """The gather that `r` is (preconditions 1-6), or None."""
    if r.op != "reduce" or r.attr("combiner").name != "sum" or r.attr("mean") or len(r.attr("axes")) != 1:
        return None  # 1
    w = r.inputs[0]
    if w.op != "where" or w.inputs[0].op != "eq" or not _zero(w.inputs[2]):
        return None  # 2
    (a,), rank, x = r.attr("axes"), w.ndim, w.inputs[1]
    for i, t in (w.inputs[0].inputs, reversed(w.inputs[0].inputs)):
        if _index_axis(i, rank) != a or i.shape[a] != w.shape[a]:
            continue  # 3
        row = tuple(1 if k == a else s for k, s in enumerate(w.shape))
        if t.dtype.is_float or t.dtype.name == "bool" or t.shape != row:
            return None  # 4
        c = w.shape[a]
        if isinstance(c, int) and c == 0:
            return None  # 7 (before 5: the gather is not built)
        picked = _at_target(x, t, a, w.shape)
        if picked is None or r.dtype != x.dtype:
            return None  # 5, 6
        bound = constant(c, as_dtype("int64")) if isinstance(c, Dim) else c  # a symbol: its extent's value
        return where((t >= 0) & (t < bound), picked, 0.0).reshape(r.shape)
    return None  # 3


def gathers(outputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """The graph with every one-hot selection summed over its axis read as a gather (`match`)."""
    by = {r.uid: g for r in topological(outputs) if (g := match(r)) is not None}
    return substitute(outputs, by) if by else outputs
