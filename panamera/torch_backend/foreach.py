"""Norms over lists of tensors: gradient clipping's total norm in one reduction launch, or one per size.

`torch.nn.utils.clip_grad_norm_` computes one norm per gradient (`torch._foreach_norm`, or one
`linalg_vector_norm` each where foreach is unsupported), stacks them and takes the norm of the
stack. `fuse_total_norms` rewrites that pattern (in the ATen graph AOTAutograd hands over,
before partitioning) into one node, `panamera::total_norm`, whose builder offers two
formulations and the cost model keeps one (schedule/formulation.py):

- "concatenated": one reduction over the concatenation of the flattened tensors, a movement
  statement fused into its reader: ONE launch over a list of tensors of different shapes, split
  across blocks (one atomic per block; ordered partials when deterministic). A concatenation's
  read loads every piece at each element (masked, wrapped), so it is offered for at most
  `MAX_PIECES` tensors;
- "per_tensor": one reduction per tensor, up to 8 tensors of one size sharing a kernel
  (horizontal fusion, poly/program.py `MAX_HORIZONTAL`), and their combine.

The clip coefficient and its element-wise chain join the subgraph; the scaling `_foreach_mul` of
every gradient stays in eager PyTorch (one multi-tensor launch there; Panamera would launch one
kernel per tensor).

Preconditions for the rewrite of `vector_norm(stack([n_1 ... n_k]), p)`, each checked
(negative tests in tests/test_torch_training_ops.py):
  1. the outer norm reduces the whole stack (no dim, no keepdim, no dtype) and the stack is its
     only reader (stacked on axis 0);
  2. every n_i is `getitem` of a `_foreach_norm(tensors, p)` or a whole-tensor
     `linalg_vector_norm(t, p)`, of the same order p, without a dtype;
  3. each of those norms is read by the stack alone (a norm read elsewhere stays as it is);
  4. every tensor has the outer norm's dtype (a stack of several dtypes promotes: left alone).

Off the pattern nothing changes: `linalg_vector_norm` alone is a Panamera reduction, and
`_foreach_norm` alone stays in eager PyTorch (one launch there, one per tensor here).

>>> import torch  # doctest: +SKIP
>>> torch.ops.panamera.total_norm([torch.ones(3), torch.ones(2, 2)], 2.0)  # doctest: +SKIP
tensor(2.6458)
"""

from __future__ import annotations

import functools
import math
import operator

import torch

import panamera as pn

from ..frontend.tensor import alternatives

aten = torch.ops.aten


def meta(node):
    """torch's FakeTensor of a node (aten.meta; not imported: aten.TABLE imports this module)."""
    return node.meta.get("val")


@torch.library.custom_op("panamera::total_norm", mutates_args=())
def _total_norm(tensors: list[torch.Tensor], ord: float) -> torch.Tensor:
    """The p-norm of every element of `tensors` together: what clip_grad_norm_ computes (eager)."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t, ord) for t in tensors]), ord)


@_total_norm.register_fake
def _(tensors, ord):
    return tensors[0].new_empty(())


TOTAL_NORM = torch.ops.panamera.total_norm.default
# The most tensors the concatenated formulation takes: its read loads every piece at each element
# (40 float64 pieces spilled 600 stores on sm_90), and past a few it never pays anyway.
MAX_PIECES = 8


def _norm_order(node) -> float | None:
    """The order p of a whole-tensor norm node (the outer or an inner one of the pattern), or
    None when it reduces some dims, keeps them or casts (precondition 1, 2)."""
    if node.op != "call_function":
        return None
    if node.target is aten.linalg_vector_norm.default:
        args = list(node.args) + [None] * (5 - len(node.args))
        ord_, dim, keepdim = args[1] if len(node.args) > 1 else 2, args[2], args[3]
        ord_ = node.kwargs.get("ord", ord_)
        if dim not in (None, [], ()) or keepdim or node.kwargs.get("dim") or node.kwargs.get("keepdim"):
            return None
        return None if node.kwargs.get("dtype") is not None else float(ord_)
    return None


def _inner(node, order: float):
    """(the tensors a stacked norm reduces, the nodes it frees) when `node` is one norm of the
    pattern of order `order` read by the stack alone (preconditions 2, 3); else None."""
    if len(node.users) != 1:
        return None
    if node.op == "call_function" and node.target is operator.getitem:
        src = node.args[0]
        if src.op != "call_function" or src.target is not aten._foreach_norm.Scalar:
            return None
        ord_ = src.args[1] if len(src.args) > 1 else src.kwargs.get("ord", 2)
        dtype = src.args[2] if len(src.args) > 2 else src.kwargs.get("dtype")
        if float(ord_) != order or dtype is not None:
            return None
        return [src.args[0][node.args[1]]], [node]
    if _norm_order(node) == order:
        return [node.args[0]], [node]
    return None


def _match(norm):
    """The tensors of one total-norm pattern rooted at `norm`, or None (the preconditions)."""
    order = _norm_order(norm)
    stack = norm.args[0] if order is not None else None
    if stack is None or stack.op != "call_function" or stack.target is not aten.stack.default:
        return None
    if len(stack.users) != 1 or (len(stack.args) > 1 and stack.args[1] != 0):  # 1.
        return None
    tensors, freed = [], []
    for n in stack.args[0]:
        got = _inner(n, order)
        if got is None:
            return None
        tensors += got[0]
        freed += got[1]
    sources = {f.args[0] for f in freed if f.target is operator.getitem}
    if any(u not in freed for s in sources for u in s.users):  # 3. every output of a foreach norm stacked
        return None
    dtype = meta(norm).dtype
    if any(meta(t) is None or meta(t).dtype != dtype for t in tensors):  # 4.
        return None
    return order, tensors, [stack, *freed, *sources]


def fuse_total_norms(gm: torch.fx.GraphModule) -> int:
    """Rewrite every total-norm pattern of `gm` into one `panamera::total_norm` node, in place;
    returns how many."""
    count = 0
    for norm in [n for n in gm.graph.nodes if _norm_order(n) is not None]:
        found = _match(norm)
        if found is None:
            continue
        order, tensors, dead = found
        with gm.graph.inserting_before(norm):
            fused = gm.graph.call_function(TOTAL_NORM, (tensors, order))
        fused.meta["val"] = meta(norm)
        norm.replace_all_uses_with(fused)
        gm.graph.erase_node(norm)
        for n in dead:  # the stack, then its getitems and norms, then the foreach norms
            if not n.users:
                gm.graph.erase_node(n)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _fold(flat, order: float, dtype: str):
    """The reduction of a norm of order `order` over the 1-D tensor `flat`, in `dtype`, before
    its finish: max |x| (inf), min |x| (-inf), or the sum of |x|^p."""
    a = pn.abs(flat.astype(dtype))
    if order == math.inf:
        return pn.max(a)
    if order == -math.inf:
        return pn.min(a)
    return pn.sum(a if order == 1 else a * a if order == 2 else pn.power(a, order))


def _combine(parts: list, order: float):
    """Folded parts of several tensors as one fold (max, min or sum of the parts)."""
    op = pn.maximum if order == math.inf else pn.minimum if order == -math.inf else (lambda a, b: a + b)
    return functools.reduce(op, parts)


def _finish(folded, order: float):
    if abs(order) == math.inf or order == 1:
        return folded
    return pn.sqrt(folded) if order == 2 else pn.power(folded, 1.0 / order)


def _norm_of(flat, order: float, dtype: str):
    """The `order`-norm of the 1-D tensor `flat`, reduced in `dtype`."""
    return _finish(_fold(flat, order, dtype), order)


def _accumulate(node) -> str:
    from .aten import out_dtype

    d = out_dtype(node)
    return "float32" if d in ("float16", "bfloat16") else d


def total_norm(node, tensors, order):
    """The norm of every element of `tensors`, two formulations the model chooses between
    (schedule/formulation.py): "concatenated", one reduction over the concatenation of the
    flattened tensors (one launch); "per_tensor", one reduction per tensor (tensors of one size
    share a kernel: horizontal fusion) and their combine. The concatenation reads every piece at
    each element (masked, wrapped loads: poly/movement.py), so it pays for a few tensors only."""
    flat = [t.reshape((-1,)) for t in tensors]
    order, dtype = float(order), _accumulate(node)
    if len(flat) == 1:
        return _norm_of(flat[0], order, dtype)
    per_tensor = _finish(_combine([_fold(f, order, dtype) for f in flat], order), order)
    if len(flat) > MAX_PIECES:
        return per_tensor
    concatenated = _norm_of(pn.concatenate(flat), order, dtype)
    return alternatives("total_norm", ("concatenated", "per_tensor"), (concatenated, per_tensor))


def vector_norm(node, x, order=2, dim=None, keepdim=False, *, dtype=None):
    """linalg_vector_norm over the whole tensor."""
    return _norm_of(x.reshape((-1,)), float(order), _accumulate(node))


def norm_check(node) -> str | None:
    order = float(node.args[1]) if len(node.args) > 1 else 2.0
    if node.target is aten.linalg_vector_norm.default and _norm_order(node) is None:
        return "linalg_vector_norm over some dims, keepdim or a dtype (whole-tensor norms only)"
    if order == 0 or order != order:
        return f"a norm of order {order}"
    return None
