"""Element-wise `_foreach_*` ops (a foreach optimizer step) as ONE multi-tensor launch.

`torch.compile(opt.step)` of a foreach AdamW / Adam / SGD captures a chain of element-wise
`_foreach_*` ops over aligned lists (params, grads, exp_avg, exp_avg_sq, and the per-parameter
0-d step tensors). `lower_foreach_maps` takes the region of those ops (with their `getitem`s and
the `full_like` constants of `_foreach_addcmul`), finds its input lists (placeholders) and its
output lists (read outside the region: the new params, states and steps that AOTAutograd copies
back into the mutated inputs), and compiles every list's expression into one element-wise
multi-tensor kernel (panamera/multitensor.py `compile_map`): one launch for the whole step,
where torch runs one multi-tensor launch per foreach op (about 15 for AdamW).

Each op computes in its result's dtype (from torch's meta), a Python scalar cast to it, as torch
does for float32/float64. Preconditions (refused: the ops stay eager, as before):
  1. every region op is in FOREACH_OPS and every list has the same length;
  2. a list argument is a whole region list (its items in order) or a list of graph inputs
     (placeholders), or `full_like`s of one region list with one value;
  3. each list is float32/float64, and element lists are aligned with the first (piece k: one
     shape) or scalar (0-d per piece: broadcast);
A list too long for one kernel's parameters (poly/multitensor.py precondition 4) is split into
groups of pieces, one launch each, as torch's multi_tensor_apply does.

In place: the backend keeps an inference graph's input mutations in it (`copy_`s of the new
values into the graph inputs at its end, `keep_inference_input_mutations`). An output list
copied item by item into one input list of element pieces that nothing outside the region
reads is written into that list's memory by the kernel (`MapList.into`; the params and the two
moments of AdamW) and its copies go; the 0-d steps' copies stay (torch_backend/mutations.py
makes them one `_foreach_copy_`).

>>> FOREACH_OPS[torch.ops.aten._foreach_sqrt.default](["a"], {}, "double")
'sqrt(a)'
"""

from __future__ import annotations

import operator

import torch

from ..codegen.multitensor_kernel import MapList
from ..errors import PanameraError
from ..multitensor import MultiTensorMap, compile_map
from .foreach import meta

aten = torch.ops.aten
PREFIX = "multitensor_map_"
CTYPES = {torch.float32: "float", torch.float64: "double"}


def _lit(v, c: str) -> str:
    return f"(({c}){float(v)!r})"


def _f(name: str, c: str) -> str:
    return name + ("f" if c == "float" else "")


def _alpha(kw, c):
    return _lit(kw.get("alpha", 1), c)


def _lerp(a, kw, c):
    w = float(a[2])
    if w < 0.5:
        return f"({a[0]} + {_lit(w, c)} * ({a[1]} - {a[0]}))"
    return f"({a[1]} - ({a[1]} - {a[0]}) * {_lit(1 - w, c)})"


# op -> (operands as C names or Python scalars, kwargs, C type) -> the element's C expression
FOREACH_OPS = {
    aten._foreach_add.Scalar: lambda a, kw, c: f"({a[0]} + {_lit(a[1], c)})",
    aten._foreach_add.List: lambda a, kw, c: f"({a[0]} + {_alpha(kw, c)} * {a[1]})",
    aten._foreach_sub.Scalar: lambda a, kw, c: f"({a[0]} - {_lit(a[1], c)})",
    aten._foreach_sub.List: lambda a, kw, c: f"({a[0]} - {_alpha(kw, c)} * {a[1]})",
    aten._foreach_mul.Scalar: lambda a, kw, c: f"({a[0]} * {_lit(a[1], c)})",
    aten._foreach_mul.List: lambda a, kw, c: f"({a[0]} * {a[1]})",
    aten._foreach_div.Scalar: lambda a, kw, c: f"({a[0]} / {_lit(a[1], c)})",
    aten._foreach_div.List: lambda a, kw, c: f"({a[0]} / {a[1]})",
    aten._foreach_addcmul.Scalar: lambda a, kw, c: (
        f"({a[0]} + {_lit(a[3] if len(a) > 3 else kw.get('value', 1), c)} * {a[1]} * {a[2]})"
    ),
    aten._foreach_addcdiv.Scalar: lambda a, kw, c: (
        f"({a[0]} + {_lit(a[3] if len(a) > 3 else kw.get('value', 1), c)} * {a[1]} / {a[2]})"
    ),
    aten._foreach_pow.ScalarAndTensor: lambda a, kw, c: f"{_f('pow', c)}({_lit(a[0], c)}, {a[1]})",
    aten._foreach_pow.Scalar: lambda a, kw, c: f"{_f('pow', c)}({a[0]}, {_lit(a[1], c)})",
    aten._foreach_sqrt.default: lambda a, kw, c: f"{_f('sqrt', c)}({a[0]})",
    aten._foreach_exp.default: lambda a, kw, c: f"{_f('exp', c)}({a[0]})",
    aten._foreach_abs.default: lambda a, kw, c: f"{_f('fabs', c)}({a[0]})",
    aten._foreach_neg.default: lambda a, kw, c: f"(-{a[0]})",
    aten._foreach_reciprocal.default: lambda a, kw, c: f"(({c})1 / {a[0]})",
    aten._foreach_lerp.Scalar: lambda a, kw, c: _lerp(a, kw, c),
}


class _Refused(Exception):
    pass


class MultiTensorMapModule(torch.nn.Module):
    """The region's launch in the eager graph: the flattened output lists, list by list. `in_place`:
    (output index, argument index) of the outputs the kernel writes into their argument's memory;
    where the backend had to copy that argument (alignment), the result is copied back into it."""

    def __init__(self, compiled: MultiTensorMap, in_place: tuple[tuple[int, int], ...] = ()):
        super().__init__()
        self.compiled, self.in_place = compiled, in_place

    def forward(self, *tensors):
        outs = self.compiled(*(t.detach() for t in tensors))
        for o, a in self.in_place:
            if outs[o].data_ptr() != tensors[a].data_ptr():
                tensors[a].detach().copy_(outs[o])
        return outs


def _region(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in FOREACH_OPS]


def _plan(nodes: list):
    """(MapLists, input lists' nodes, output lists' region nodes, shapes), or raise _Refused."""
    region = set(nodes)
    k_len = {len(meta(n)) for n in nodes}
    if len(k_len) != 1:
        raise _Refused("lists of several lengths")  # 1.
    (k_len,) = k_len
    names: dict = {}  # region node -> its list's C name
    inputs: dict = {}  # tuple of leaf nodes -> its list's C name
    lists, shapes = [], None

    def kind(vals) -> tuple[str, bool]:
        nonlocal shapes
        dts = {v.dtype for v in vals}
        if len(dts) != 1 or next(iter(dts)) not in CTYPES:
            raise _Refused(f"dtypes {dts}")  # 3.
        c = CTYPES[next(iter(dts))]
        if all(v.dim() == 0 for v in vals):
            return c, True
        sh = [tuple(v.shape) for v in vals]
        shapes = shapes or sh
        if sh != shapes:
            raise _Refused("element lists not aligned")  # 3.
        return c, False

    def operand(arg, c_out: str):
        if not isinstance(arg, (list, tuple)):
            if isinstance(arg, torch.fx.Node):
                raise _Refused("a tensor operand that is not a list")
            return arg  # a Python scalar
        if len(arg) != k_len:
            raise _Refused("a list of another length")  # 1.
        srcs = {a.args[0] if a.op == "call_function" and a.target is operator.getitem else None for a in arg}
        if len(srcs) == 1 and next(iter(srcs)) in region:  # 2. a whole region list
            src = next(iter(srcs))
            if [a.args[1] for a in arg] != list(range(k_len)):
                raise _Refused("a region list out of order")
            return f"(({c_out}){names[src]})"
        if all(a.op == "call_function" and a.target is aten.full_like.default for a in arg):
            values = {float(a.args[1]) for a in arg}
            if len(values) != 1:
                raise _Refused("full_likes of several values")
            return _lit(values.pop(), c_out)
        if not all(isinstance(a, torch.fx.Node) and a.op == "placeholder" for a in arg):
            raise _Refused("a list that is neither the region's nor the graph's inputs")  # 2.
        key = tuple(arg)
        if key not in inputs:
            c, scalar = kind([meta(a) for a in arg])
            inputs[key] = f"x{len(inputs)}"
            lists.append(MapList(inputs[key], c, scalar))
        return f"(({c_out}){inputs[key]})"

    outputs = []
    for n in nodes:
        c, scalar = kind(list(meta(n)))
        ops = [operand(a, c) for a in n.args]
        expr = FOREACH_OPS[n.target](ops, dict(n.kwargs), c)
        names[n] = f"v{len(names)}"
        external = any(
            u.op != "call_function"
            or u.target is not operator.getitem
            or any(w not in region and not _is_const(w) for w in u.users)
            for u in n.users
        )
        if external:
            outputs.append(n)
        lists.append(MapList(names[n], c, scalar, expr, external))
    if shapes is None:
        raise _Refused("no element list")
    leaves = [list(key) for key in inputs]
    return _in_place(tuple(lists), leaves, outputs, region), leaves, outputs, shapes


def _copied_into(node, k: int, region: set):
    """The `copy_` node that writes item k of region list `node` back into a graph input (what
    `keep_inference_input_mutations` leaves at the end of an optimizer step), if that is the
    item's only use outside the region, else None."""
    items = [u for u in node.users if u.target is operator.getitem and u.args[1] == k]
    users = [w for u in items for w in u.users if w not in region and not _is_const(w)]
    if len(users) != 1 or users[0].target is not aten.copy_.default or users[0].args[1] not in items:
        return None
    return users[0] if users[0].args[0].op == "placeholder" else None


def _in_place(lists: tuple, leaves: list, outputs: list, region: set) -> tuple:
    """The lists with `into` set where an output list is copied back, item by item, into one
    input list of element pieces that nothing outside the region reads (the graph's functional
    step: the kernel then writes the new values into the inputs' memory, and the copies go)."""
    out_lists = [m for m in lists if m.output]
    by_name = {f"x{i}": leaf for i, leaf in enumerate(leaves)}
    scalar = {m.name for m in lists if m.scalar}
    taken, result = set(), list(lists)
    for n, m in zip(outputs, out_lists):
        copies = [_copied_into(n, k, region) for k in range(len(leaves[0]))]
        if m.scalar or any(c is None for c in copies):
            continue
        targets = [c.args[0] for c in copies]
        src = next((name for name, leaf in by_name.items() if leaf == targets), None)
        if src is None or src in scalar or src in taken:
            continue
        if any(w not in region and not _is_const(w) and w not in copies for t in targets for w in t.users):
            continue  # read outside the step: it must keep its old value
        taken.add(src)
        result[lists.index(m)] = MapList(m.name, m.ctype, m.scalar, m.expr, m.output, into=src)
    return tuple(result)


def _is_const(node) -> bool:
    return node.op == "call_function" and node.target is aten.full_like.default


def lower_foreach_maps(gm: torch.fx.GraphModule, target: str) -> list:
    """Replace the graph's element-wise foreach region by one multi-tensor launch, in place;
    returns (module name, ops, kernels, modeled us) per region (none when refused)."""
    nodes = _region(gm)
    if not nodes:
        return []
    try:
        lists, leaves, outputs, shapes = _plan(nodes)
        k = compile_map(shapes, lists, target)
    except (_Refused, PanameraError):
        return []  # off the preconditions: the foreach ops stay eager, as before
    name = f"{PREFIX}0"
    k_len = len(leaves[0])
    outs = [m for m in lists if m.output]
    in_place = tuple(
        (j * k_len + i, int(m.into[1:]) * k_len + i) for j, m in enumerate(outs) if m.into for i in range(k_len)
    )
    gm.add_submodule(name, MultiTensorMapModule(k, in_place))
    first = nodes[0]
    with gm.graph.inserting_before(first):
        call = gm.graph.call_module(name, tuple(a for leaf in leaves for a in leaf))
    offset = {n: j * k_len for j, n in enumerate(outputs)}
    region = set(nodes)
    for n, m in zip(outputs, outs):
        if m.into:  # written in place: its copies back into the inputs go
            for i in range(k_len):
                gm.graph.erase_node(_copied_into(n, i, region))
            continue
        for u in list(n.users):
            if u.target is operator.getitem and any(w not in region and not _is_const(w) for w in u.users):
                with gm.graph.inserting_before(u):
                    item = gm.graph.call_function(operator.getitem, (call, offset[n] + u.args[1]))
                item.meta = dict(u.meta)
                for w in list(u.users):
                    if w not in region and not _is_const(w):
                        w.replace_input_with(u, item)
    for n in reversed(list(gm.graph.nodes)):
        dead = n in region or (n.op == "call_function" and n.target is operator.getitem and n.args[0] in region)
        if (dead or _is_const(n)) and not n.users:
            gm.graph.erase_node(n)
    gm.graph.lint()
    gm.recompile()
    ops = tuple(str(n.target) for n in nodes)
    return [(name, ops, k.launches, k.modeled_us)]
