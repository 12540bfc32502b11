"""Norms of tensor lists in ONE multi-tensor launch inside a torch graph (panamera/multitensor.py).

Two patterns of the ATen graph AOTAutograd hands over take the multi-tensor norm kernel:

- `panamera::total_norm(tensors, p)` (clip_grad_norm_'s norm of per-tensor norms, rewritten by
  foreach.fuse_total_norms): the model compares the multi-tensor kernel with the Panamera
  formulations of foreach.total_norm (the concatenation, or one reduction per tensor) and keeps
  the faster; modeled on the compile's GPU;
- `_foreach_norm(tensors, p)` alone (no Panamera formulation: it stayed eager): one launch here
  as in torch, which then finishes each norm in a second kernel.

The node becomes a call of `MultiTensorNorms`, a Panamera kernel in the graph's report. Float32
and float64 lists only (16-bit lists keep their formulations, or stay eager, with the reason).

>>> import torch  # doctest: +SKIP
>>> f = torch.compile(lambda ts: torch._foreach_norm(ts), backend="panamera")  # doctest: +SKIP
"""

from __future__ import annotations

import operator
from types import SimpleNamespace

import torch

import panamera as pn

from ..errors import PanameraError
from ..multitensor import MultiTensorNorm, compile_norms
from . import foreach

PREFIX = "multitensor_"  # not partition.PREFIX: these are not fused partitions
DTYPES = {torch.float32: "float32", torch.float64: "float64"}


class MultiTensorNorms(torch.nn.Module):
    """A multi-tensor norm in the eager graph: each tensor's norm (a tuple), or the total norm
    followed by its epilogues' scalars (a tuple)."""

    def __init__(self, compiled: MultiTensorNorm, each: bool):
        super().__init__()
        self.compiled, self.each = compiled, each

    def forward(self, *tensors):
        total, each, *epilogues = self.compiled(*(t.detach() for t in tensors))
        return tuple(each.unbind(0)) if self.each else (total, *epilogues)


aten = torch.ops.aten


def _c(v, names: dict, c: str) -> str | None:
    """A C operand: an absorbed node's name, or a Python number."""
    if isinstance(v, torch.fx.Node):
        return names.get(v)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return f"(({c}){float(v)!r})"


def _scalar_expr(node, names: dict, c: str) -> str | None:
    """The C expression of a 0-d element-wise op over the total and numbers, or None."""
    t = node.target
    args = list(node.args)
    kw = node.kwargs
    ops = [_c(a, names, c) for a in args if not isinstance(a, type(None))]
    if None in ops or not ops:
        return None
    if t in (aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar) and len(ops) == 2:
        alpha = _c(kw.get("alpha", 1), names, c)
        sign = "+" if t in (aten.add.Tensor, aten.add.Scalar) else "-"
        return f"({ops[0]} {sign} {alpha} * {ops[1]})" if alpha else None
    if t in (aten.mul.Tensor, aten.mul.Scalar) and len(ops) == 2:
        return f"({ops[0]} * {ops[1]})"
    if t in (aten.div.Tensor, aten.div.Scalar) and len(ops) == 2 and not kw:
        return f"({ops[0]} / {ops[1]})"
    if t is aten.reciprocal.default:
        return f"(({c})1 / {ops[0]})"
    if t in (aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default):
        lo = args[1] if len(args) > 1 and t is not aten.clamp_max.default else kw.get("min")
        hi = args[2] if len(args) > 2 else args[1] if len(args) > 1 and t is aten.clamp_max.default else kw.get("max")
        x = ops[0]
        for bound, cmp in ((lo, "<"), (hi, ">")):  # NaN propagates, as torch.clamp
            if bound is not None:
                b = _c(bound, names, c)
                if b is None:
                    return None
                x = f"({x} {cmp} {b} ? {b} : {x})"
        return x
    return None


def _epilogue(node, total_dtype) -> tuple[list, list[str]]:
    """The 0-d element-wise chain that reads the total norm `node` alone (clip_grad_norm_'s
    clip coefficient): its nodes in graph order and their C expressions (`tn` is the total)."""
    c = "float" if total_dtype == torch.float32 else "double"
    names, nodes, exprs = {node: "tn"}, [], []
    for n in node.graph.nodes:
        if (
            n.op != "call_function"
            or n in names
            or not any(isinstance(a, torch.fx.Node) and a in names for a in n.args)
        ):
            continue
        v = foreach.meta(n)
        if not isinstance(v, torch.Tensor) or v.dim() != 0 or v.dtype != total_dtype:
            continue
        e = _scalar_expr(n, names, c)
        if e is None:
            continue
        names[n] = f"e{len(nodes)}"
        nodes.append(n)
        exprs.append(e)
    return nodes, exprs


def _order(node) -> float:
    if node.target is foreach.TOTAL_NORM:
        return float(node.args[1])
    return float(node.args[1] if len(node.args) > 1 else node.kwargs.get("ord", 2))


def _eligible(node) -> list | None:
    """The tensor nodes of a multi-tensor norm node, or None."""
    if node.op != "call_function":
        return None
    if node.target is aten_foreach_norm():
        dtype = node.args[2] if len(node.args) > 2 else node.kwargs.get("dtype")
        if dtype is not None:
            return None
    elif node.target is not foreach.TOTAL_NORM:
        return None
    tensors = list(node.args[0])
    vals = [foreach.meta(t) for t in tensors]
    if any(v is None for v in vals) or len({v.dtype for v in vals}) != 1 or vals[0].dtype not in DTYPES:
        return None
    if any(v.numel() == 0 for v in vals) or len({v.device for v in vals}) != 1:
        return None
    order = _order(node)
    return None if order == 0 or order != order else tensors


def aten_foreach_norm():
    return torch.ops.aten._foreach_norm.Scalar


def _formulation_us(node, tensors, order, target: str, deterministic: bool) -> float:
    """Modeled time of foreach.total_norm's Panamera formulations (the model's choice among them)."""
    ts = [
        pn.placeholder(tuple(foreach.meta(t).shape), DTYPES[foreach.meta(t).dtype], name=f"g{k}")
        for k, t in enumerate(tensors)
    ]
    out = foreach.total_norm(SimpleNamespace(meta=node.meta), ts, order)
    from ..compiler import lower

    return lower(out, target=target, deterministic=deterministic, stop_after="plan").plan.modeled_us


def lower_norms(gm: torch.fx.GraphModule, target: str, deterministic: bool = False) -> list:
    """Replace each eligible norm node of `gm` by a MultiTensorNorms call where the model prefers
    it, in place; returns (module name, ops, kernels, modeled us) per replaced node."""
    done = []
    for node in list(gm.graph.nodes):
        tensors = _eligible(node)
        if tensors is None:
            continue
        order, vals = _order(node), [foreach.meta(t) for t in tensors]
        total = node.target is foreach.TOTAL_NORM
        chain, exprs = _epilogue(node, vals[0].dtype) if total else ([], [])
        try:
            shapes = [tuple(v.shape) for v in vals]
            k = compile_norms(shapes, DTYPES[vals[0].dtype], order, deterministic, target, epilogues=tuple(exprs))
            if total:
                if _formulation_us(node, tensors, order, target, deterministic) <= k.modeled_us:
                    continue  # the model keeps the Panamera formulation
        except PanameraError:
            continue  # off the multi-tensor preconditions: the node stays as it was
        name = f"{PREFIX}{len(done)}"
        gm.add_submodule(name, MultiTensorNorms(k, each=not total))
        with gm.graph.inserting_before(node):
            call = gm.graph.call_module(name, tuple(tensors))
        if not total:  # a tuple of norms, read by getitems as the foreach norm's list was
            call.meta = dict(node.meta)
            node.replace_all_uses_with(call)
        for i, n in enumerate([node, *chain]):  # the total, then its epilogue scalars
            if not n.users:
                continue
            with gm.graph.inserting_before(n):
                item = gm.graph.call_function(operator.getitem, (call, i))
            item.meta = dict(n.meta)
            n.replace_all_uses_with(item)
        for n in reversed([node, *chain]):
            gm.graph.erase_node(n)
        ops = (str(node.target), *(str(n.target) for n in chain))
        done.append((name, ops, k.launches, k.modeled_us))
    if done:
        gm.graph.lint()
        gm.recompile()
    return done
