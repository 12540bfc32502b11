"""An inference graph's input mutations, written back in place.

The backend keeps an inference graph's input mutations in the graph (AOTAutograd's
`keep_inference_input_mutations`): the graph computes the new values functionally and ends in one
`copy_(input, new)` per mutated input, where AOTAutograd would otherwise copy them back after the
call. torch_backend/foreach_map.py makes an optimizer step's kernel write its lists in place and
drops their copies; `write_back` rewrites the copies left (ops that stay eager):

1. a functional `_foreach_*` op whose every result item k is only copied back into item k of
   its first list, whose items are graph inputs, becomes the op's in-place overload on that list
   (clip_grad_norm_'s `_foreach_mul` of the gradients: `_foreach_mul_`, as eager runs it);
2. the other copies into graph inputs, two or more, where they end the graph, become one
   `_foreach_copy_` (one multi-tensor launch, where AOTAutograd's epilogue copies each tensor on
   its own).
"""

from __future__ import annotations

import operator

import torch

aten = torch.ops.aten


def _copies(gm: torch.fx.GraphModule) -> list:
    return [
        n
        for n in gm.graph.nodes
        if n.target is aten.copy_.default and not n.users and isinstance(n.args[0], torch.fx.Node)
        and n.args[0].op == "placeholder"
    ]  # fmt: skip


def _in_place_overload(target):
    """`aten._foreach_mul.Tensor` -> `aten._foreach_mul_.Tensor`, or None."""
    name = target.overloadpacket.__name__
    if not name.startswith("_foreach_") or name.endswith("_"):
        return None
    packet = getattr(aten, name + "_", None)
    return getattr(packet, target._overloadname, None) if packet is not None else None


def _foreach_in_place(gm: torch.fx.GraphModule) -> None:
    """Rule 1, where nothing reads the list's inputs after the op (they change there, not at the end)."""
    order = {n: k for k, n in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not hasattr(node.target, "overloadpacket"):
            continue
        inplace = _in_place_overload(node.target)
        first = node.args[0] if node.args else None
        if inplace is None or not isinstance(first, (list, tuple)) or not node.users:
            continue
        copies = []
        for item in node.users:
            ok = item.target is operator.getitem and len(item.users) == 1
            c = next(iter(item.users)) if ok else None
            if c is None or c.target is not aten.copy_.default or c.args[1] is not item or c.users:
                break
            if not 0 <= item.args[1] < len(first) or c.args[0] is not first[item.args[1]]:
                break
            copies.append((item, c))
        else:
            if len(copies) != len(first) or not all(getattr(a, "op", "") == "placeholder" for a in first):
                continue
            mine = {node} | {c for _, c in copies}
            if any(u not in mine and order[u] > order[node] for a in first for u in a.users):
                continue
            with gm.graph.inserting_before(node):
                gm.graph.call_function(inplace, node.args, dict(node.kwargs))
            for item, c in copies:
                gm.graph.erase_node(c)
                gm.graph.erase_node(item)
            gm.graph.erase_node(node)


def write_back(gm: torch.fx.GraphModule) -> None:
    """Rules 1 and 2 of the module docstring, in place on `gm`.

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def step(a, b):
    ...     new = torch.ops.aten._foreach_mul.Scalar([a, b], 0.5)
    ...     a.copy_(new[0]), b.copy_(new[1])
    >>> gm = make_fx(step)(torch.ones(2), torch.ones(3))
    >>> write_back(gm)
    >>> [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    ['aten._foreach_mul_.Scalar']
    """
    _foreach_in_place(gm)
    copies = _copies(gm)
    nodes = list(gm.graph.nodes)
    tail = nodes[nodes.index(copies[0]) :] if copies else []
    if len(copies) >= 2 and all(n in copies or n.op == "output" for n in tail):  # nothing runs between them
        with gm.graph.inserting_after(copies[-1]):
            gm.graph.call_function(
                aten._foreach_copy_.default, ([c.args[0] for c in copies], [c.args[1] for c in copies])
            )
        for c in copies:
            gm.graph.erase_node(c)
    gm.graph.lint()
    gm.recompile()
