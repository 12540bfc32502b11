"""A deterministic scatter-add of rows too large for owner computes gets a partition of its own,
so that Panamera's sorted-segment scatter-add (frontend/scatter.py `scatter_add_sorted`, whose
index and source must be the compiled computation's inputs: segments.py precondition 2) takes
it instead of its whole partition falling back to eager PyTorch. The partition is split at the
scatter: the nodes it does not reach, the scatter alone, and the nodes that read it (a tied
embedding's gradient `mm + embedding_dense_backward`, `x + scatter`), three compiled partitions.

`canonical_scatters` first writes a large deterministic `index_put(x, [idx], v, accumulate=True)`
or `index_add(x, 0, idx, v, alpha)` as `x + alpha * embedding_dense_backward(v, idx', rows)`
(torch's own scatter-add of rows into zeros; for index_put `idx' = where(idx < 0, idx + rows, idx)`
wraps negative ids as index_put does; index_add never wraps one (eager torch refuses it), so its
ids go as they are, and a negative one adds nothing, as backward.py's `index_add` translation).
Preconditions of the rewrite (else the node is left as it is): (R1) the compile is deterministic
(or its target is the CPU, which has no atomic form: partition.py passes `deterministic` so);
(R2) one integer index tensor on axis 0, values of exactly `idx.shape + x.shape[1:]` and x's dtype
(floating point, int32 or int64: the dtypes sorted segments take), static shapes; (R3) owner
computes cannot take it (rows x ids x row size over frontend/scatter.py's MAX_TERMS).

A large deterministic scatter **along an axis**, `x.scatter_add(dim, idx, src)` (the backward of
gather) or `x.scatter_reduce(dim, idx, src, "sum")` with include_self, is written the same way as
a scatter of one-element rows keyed by output position: `x + reshape(embedding_dense_backward(
src as [n, 1], p, x.numel()), x.shape)`, where p is the flat position in x that each element of idx
names (its coordinates off `dim`, idx's value on it; -1, which adds nothing, for an id outside
[0, x.shape[dim]), which bounds.py refuses first wherever idx crosses a partition boundary). Each
output element's terms are then summed in source position order, whatever the thread order.
Preconditions (else the node is left as it is): (A1) = R1; (A2) idx and src of one shape, equal
to x's off `dim`, idx an integer tensor, src of x's dtype, a dtype sorted segments take, static
shapes, x under 2^31 elements; (A3) owner computes cannot take it (x.shape[dim] x idx.numel() over
MAX_TERMS, frontend/scatter.py `scatter_add_along`'s bound).

Preconditions of moving node n out of partition p (else p is left as it is, and compiles or
stays eager with its reason): (1) the compile is deterministic (or targets the CPU); (2) n is
`aten.embedding_dense_backward` without scale_grad_by_freq; (3) owner computes cannot take it.
p less n is cut in two, U (the nodes of p that do not depend on n) and D (those that do): each
is convex (a path between two nodes of U through D or n would make its end depend on n; one
from D back into U likewise), and U runs before n before D. Each keeps the nodes p kept
(`anchored` over p, n included): a piece is worth compiling when p was.

>>> canonical_scatters.__name__, isolate_sorted_scatters.__name__
('canonical_scatters', 'isolate_sorted_scatters')
"""

from __future__ import annotations

import math

import torch
from torch.fx.passes.infra.partitioner import Partition

from ..frontend.scatter import MAX_TERMS
from .aten import meta
from .backward import POSITIONS

aten = torch.ops.aten
EMBEDDING_BACKWARD = aten.embedding_dense_backward.default
SORTABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64)


def movable(n: torch.fx.Node) -> bool:
    """Preconditions 2-3 for node n."""
    if n.target is not EMBEDDING_BACKWARD or (len(n.args) > 4 and n.args[4]):
        return False
    g, ids, rows = meta(n.args[0]), meta(n.args[1]), int(n.args[2])
    width = g.shape[-1] if g.dim() else 1
    return rows * math.prod(ids.shape) * width > MAX_TERMS


def _rows_scatter(n: torch.fx.Node):
    """(x, idx, values, alpha, wraps) of an index_put(accumulate) / index_add node meeting R2, else
    None; `wraps`: negative ids count from the end (index_put's, not index_add's)."""
    if n.op != "call_function":
        return None
    if n.target is aten.index_put.default:
        accumulate = n.args[3] if len(n.args) > 3 else n.kwargs.get("accumulate", False)
        given = [(k, i) for k, i in enumerate(n.args[1]) if i is not None]
        if not accumulate or len(given) != 1 or given[0][0] != 0:
            return None
        x, idx, values, alpha, wraps = n.args[0], given[0][1], n.args[2], 1, True
    elif n.target is aten.index_add.default:
        if len(n.args) < 4 or n.args[1] not in (0, -meta(n.args[0]).dim()):
            return None
        x, idx, values, alpha, wraps = n.args[0], n.args[2], n.args[3], n.kwargs.get("alpha", 1), False
    else:
        return None
    xv, iv, vv = meta(x), meta(idx), meta(values)
    shapes = (*xv.shape, *iv.shape, *vv.shape)
    if not all(isinstance(s, int) for s in shapes) or xv.dim() == 0 or xv.dtype not in SORTABLE:
        return None
    if iv.dtype not in (torch.int64, torch.int32) or vv.dtype != xv.dtype or vv.shape != (*iv.shape, *xv.shape[1:]):
        return None
    return x, idx, values, alpha, wraps


def _axis_scatter(n: torch.fx.Node):
    """(x, dim, idx, src) of a scatter_add / scatter_reduce("sum", include_self) node meeting A2, else None."""
    if n.op != "call_function" or n.target not in (aten.scatter_add.default, aten.scatter_reduce.two):
        return None
    if n.target is aten.scatter_reduce.two:
        include_self = n.kwargs.get("include_self", n.args[5] if len(n.args) > 5 else True)
        if n.args[4] != "sum" or not include_self:
            return None
    x, dim, idx, src = n.args[:4]
    xv, iv, sv = meta(x), meta(idx), meta(src)
    if not all(isinstance(s, int) for s in (*xv.shape, *iv.shape, *sv.shape)) or xv.dim() == 0:
        return None
    dim %= xv.dim()
    same_off_dim = all(i == k for a, (i, k) in enumerate(zip(iv.shape, xv.shape)) if a != dim)
    if xv.dtype not in SORTABLE or sv.dtype != xv.dtype or iv.dtype not in (torch.int64, torch.int32):
        return None
    if iv.shape != sv.shape or iv.dim() != xv.dim() or not same_off_dim or xv.numel() >= 2**31:
        return None
    return x, dim, idx, src


def _positions(g: torch.fx.Graph, idx: torch.fx.Node, dim: int, out_shape: tuple[int, ...]) -> torch.fx.Node:
    """The flat position in the output (of `out_shape`) that each element of `idx` names along `dim`
    (int64), -1 where the id is outside [0, out_shape[dim]) (the sorted form drops it)."""
    iv = meta(idx)
    strides = [math.prod(out_shape[a + 1 :]) for a in range(len(out_shape))]
    wide = _node(g, aten._to_copy.default, (idx,), {"dtype": torch.int64})
    key = _node(g, aten.mul.Tensor, (wide, strides[dim]))
    for a, extent in enumerate(iv.shape):
        if a == dim or extent == 1:
            continue
        with iv.fake_mode:
            val = aten.arange.default(extent, dtype=torch.int64, device=iv.device)
        line = g.call_function(aten.arange.default, (extent,), {"dtype": torch.int64, "device": iv.device})
        line.meta["val"], line.meta["panamera"] = val, POSITIONS
        along = [1] * iv.dim()
        along[a] = extent
        line = _node(g, aten.view.default, (line, along))
        key = _node(g, aten.add.Tensor, (key, _node(g, aten.mul.Tensor, (line, strides[a]))))
    inside = _node(g, aten.logical_and.default, (_node(g, aten.ge.Scalar, (idx, 0)),
                                                 _node(g, aten.lt.Scalar, (idx, out_shape[dim]))))  # fmt: skip
    inside = _node(g, aten._to_copy.default, (inside,), {"dtype": torch.int64})
    return _node(g, aten.sub.Tensor, (_node(g, aten.mul.Tensor, (_node(g, aten.add.Tensor, (key, 1)), inside)), 1))


def _node(graph: torch.fx.Graph, target, args: tuple, kwargs: dict | None = None) -> torch.fx.Node:
    """A call of `target` with its FakeTensor value (`meta["val"]`) computed from its arguments'."""
    node = graph.call_function(target, args, kwargs or {})
    fake = next(meta(a) for a in args if isinstance(a, torch.fx.Node))
    vals = [meta(a) if isinstance(a, torch.fx.Node) else a for a in args]
    with fake.fake_mode:
        node.meta["val"] = target(*vals, **(kwargs or {}))
    return node


def canonical_scatters(gm: torch.fx.GraphModule, deterministic: bool) -> int:
    """Rewrite `gm`'s large deterministic index_put(accumulate) / index_add nodes (R1-R3) as
    `x + alpha * embedding_dense_backward(...)`, in place; returns how many."""
    if not deterministic:
        return 0
    done = 0
    for n in list(gm.graph.nodes):
        along = _axis_scatter(n)
        if along is not None:
            done += _rewrite_axis_scatter(gm.graph, n, *along)
            continue
        found = _rows_scatter(n)
        if found is None:
            continue
        x, idx, values, alpha, wraps = found
        xv, iv = meta(x), meta(idx)
        rows, width = xv.shape[0], math.prod(xv.shape[1:])
        if rows * iv.numel() * width <= MAX_TERMS:
            continue
        g = gm.graph
        with g.inserting_before(n):
            wrapped = idx
            if wraps:  # x[-1] is the last row
                negative = _node(g, aten.lt.Scalar, (idx, 0))
                wrapped = _node(g, aten.where.self, (negative, _node(g, aten.add.Tensor, (idx, rows)), idx))
            flat = _node(g, aten.reshape.default, (values, [*iv.shape, width]))
            table = _node(g, EMBEDDING_BACKWARD, (flat, wrapped, rows, -1, False))
            table = _node(g, aten.reshape.default, (table, list(xv.shape)))
            if alpha != 1:
                table = _node(g, aten.mul.Tensor, (table, alpha))
            out = _node(g, aten.add.Tensor, (x, table))
        n.replace_all_uses_with(out)
        g.erase_node(n)
        done += 1
    if done:
        gm.recompile()
    return done


def _rewrite_axis_scatter(g: torch.fx.Graph, n: torch.fx.Node, x, dim: int, idx, src) -> int:
    """Rewrite axis scatter `n` (A2 checked) as a sorted scatter of rows keyed by output position:
    rows of x's extents after `dim` when idx is constant along them (C1-C2), else one-element
    rows; 1 if rewritten, 0 if owner computes takes it (A3)."""
    xv, iv = meta(x), meta(idx)
    if xv.shape[dim] * iv.numel() <= MAX_TERMS:
        return 0
    base = constant_after(idx, dim)
    inner = math.prod(xv.shape[dim + 1 :]) if base is not None else 1
    lead = tuple(xv.shape[: dim + 1]) if base is not None else tuple(xv.shape)
    with g.inserting_before(n):
        ids = idx
        if base is not None:  # one id per row: idx's values at position 0 after dim
            ids = _node(g, aten.expand.default, (base, [*iv.shape[: dim + 1], *meta(base).shape[dim + 1 :]]))
        n_rows = iv.numel() // inner
        keys = _node(g, aten.reshape.default, (_positions(g, ids, dim, lead + (1,) * (xv.dim() - len(lead))), [n_rows]))
        flat = _node(g, aten.reshape.default, (src, [n_rows, inner]))
        table = _node(g, EMBEDDING_BACKWARD, (flat, keys, xv.numel() // inner, -1, False))
        out = _node(g, aten.add.Tensor, (x, _node(g, aten.reshape.default, (table, list(xv.shape)))))
    n.replace_all_uses_with(out)
    g.erase_node(n)
    return 1


def constant_after(idx: torch.fx.Node, dim: int) -> torch.fx.Node | None:
    """The node idx expands (`aten.expand`) when its extents after `dim` are all 1 there and some is
    not in idx (C2: idx is constant along those axes by construction, as `ids[..., None].expand(...)`
    makes a gather's index), else None.

    Preconditions, each else None: (C1) idx is an `aten.expand` of a node of the same rank; (C2)
    that node's extents after `dim` are 1, and idx's product after `dim` is over 1."""
    iv = meta(idx)
    if not isinstance(idx, torch.fx.Node) or idx.target is not aten.expand.default:
        return None
    base = idx.args[0]
    bv = meta(base) if isinstance(base, torch.fx.Node) else None
    if bv is None or bv.dim() != iv.dim():  # (C1)
        return None
    if any(e != 1 for e in bv.shape[dim + 1 :]) or math.prod(iv.shape[dim + 1 :]) <= 1:  # (C2)
        return None
    return base


def _descendants(n: torch.fx.Node) -> set:
    seen, stack = set(), list(n.users)
    while stack:
        m = stack.pop()
        if m not in seen:
            seen.add(m)
            stack.extend(m.users)
    return seen


def isolate_sorted_scatters(parts: list, deterministic: bool, anchored) -> list:
    """`parts` with every movable embedding gradient (preconditions 1-3) in a partition of its
    own, the rest of its partition cut into the nodes before it and those after it (each keeping
    what `anchored` kept of the whole; empty pieces dropped)."""
    if not deterministic:
        return parts
    out = []
    for p in parts:
        keep = anchored(p.nodes)
        moved = [n for n in p.nodes if n in keep and movable(n)]
        if not moved:
            out.append(p)
            continue
        order = {m: k for k, m in enumerate(moved[0].graph.nodes)}
        pieces = [[n for n in p.nodes if n in keep]]
        for n in moved:
            piece = next(s for s in pieces if n in s)
            later = _descendants(n)
            pieces.remove(piece)
            pieces += [[m for m in piece if m is not n and m not in later], [n], [m for m in piece if m in later]]
        out += [Partition(nodes=sorted(s, key=order.__getitem__)) for s in pieces if s]
    for k, p in enumerate(out):
        p.id = k
    return out
