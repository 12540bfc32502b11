"""A host convolution's epilogue: the element-wise nodes after a library Conv on the CPU target
(a residual Add, an activation) taken into the Conv's own step, applied to its output rows while
they are in cache (conv_kernels.py), instead of a Panamera subgraph call of their own after it.

The partitioner decides it once (`fuse_epilogues`, with `host`): the nodes it takes become
library nodes whose reason names the Conv, and the Conv's `LibraryNode` carries the `FusedConv`
(its epilogue as data, the residual operands by name). A chain grows from the Conv's output one
link at a time while every precondition holds:

1. the Conv is one the CPU target's library runs (the host convolution), float32 in and out;
2. the chain's value so far has exactly one consumer, the next link, or two that make a Swish
   pair (s = Sigmoid(v) and Mul(v, s), s read by that Mul alone: one SILU step) or begin the erf
   GELU chain (Div(v, sqrt 2), Erf, Add 1, Mul by v, Mul by 0.5, as PyTorch exports GELU; each
   inner value read by the next link alone, the constants float32 scalars: one GELU step), and is
   no graph output (it is never materialized);
3. the link is an epilogue op (`EPILOGUE_OPS`) of the ONNX standard domain: an activation whose
   parameters are attributes or constants (Clip's bounds), or an Add of the chain's value and one
   other float32 tensor of exactly the output's shape (no broadcasting);
4. the link is in no earlier Conv's epilogue (an Add of two Convs' outputs, each its only consumer,
   joins the first Conv's step, reading the second's output as its residual);
5. after the chain, a MaxPool (`fuse_pool`) joins as the step's last link where its input is the
   chain's value under 2 (one consumer, no graph output) and 4, it is 2-D with one output (no
   Indices), no padding or auto_pad, dilations 1, ceil_mode 0, and the Conv's shapes are static
   and take the direct kernel (conv_direct.direct_geometry), which pools each output plane in cache.

An Add's other operand is then ready when the Conv's step runs, and the fused step is no cycle
in the run order: every path from the Conv runs through the chain (2: each value's one consumer
is the next link), so no operand of a link is made from the Conv's output (an Add reading a
value computed from the Conv's output would be that value's second consumer: refused by 2).

>>> from onnx import helper, TensorProto
>>> from panamera.subgraph.model import load_model
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
...     "g", [v("x", [1, 2, 5, 5]), v("w", [4, 2, 3, 3])], [v("y", [1, 4, 3, 3])])
>>> m = load_model(helper.make_model(g).SerializeToString())
>>> [f.epilogue for f in fuse_epilogues(m, (m.nodes[0],))]
[Epilogue(steps=(EpiStep(op=<EpiOp.RELU: 'Relu'>, params=()),))]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .conv_kernels import Epilogue, EpiOp, EpiStep
from .model import DEFAULT_DOMAINS, Node, OnnxModel

# SILU: a Swish pair, GELU: the erf chain (2)
EPILOGUE_OPS = frozenset(op.value for op in EpiOp) - {EpiOp.SILU.value, EpiOp.GELU.value}
_SQRT2 = float(np.float32(np.sqrt(2)))


@dataclass(frozen=True)
class FusedConv:
    """A library Conv with the nodes of its epilogue (in order), their steps and the residual
    operands the Add steps read (value names, in step order)."""

    conv: Node
    nodes: tuple[Node, ...]
    epilogue: Epilogue
    residuals: tuple[str, ...]
    pool: tuple[int, ...] = ()  # a fused MaxPool's (kh, kw, sh, sw), applied after the epilogue (5)

    @property
    def output(self) -> str:
        """The value the fused step writes: the last link's output."""
        return self.nodes[-1].outputs[0]


def _step(model: OnnxModel, node: Node) -> EpiStep | None:
    """The epilogue step of an activation node (precondition 3), None where it is none."""
    a = node.attrs
    if node.op_type == "Clip":
        bounds = []
        for k, (key, default) in enumerate((("min", -np.inf), ("max", np.inf))):
            name = node.inputs[k + 1] if len(node.inputs) > k + 1 else ""
            if name and name not in model.constants:
                return None  # a computed bound
            bounds.append(float(model.constants[name]) if name else float(a.get(key, default)))
        return EpiStep(EpiOp.CLIP, tuple(bounds))
    if node.op_type == "HardSigmoid":
        return EpiStep(EpiOp.HARDSIGMOID, (float(a.get("alpha", 0.2)), float(a.get("beta", 0.5))))
    if node.op_type == "LeakyRelu":
        return EpiStep(EpiOp.LEAKYRELU, (float(a.get("alpha", 0.01)),))
    if node.op_type in ("Relu", "HardSwish", "Sigmoid") and len(node.inputs) == 1:
        return EpiStep(EpiOp(node.op_type))
    return None


def _is_f32(model: OnnxModel, name: str, shape: tuple | None = None) -> bool:
    v = model.values.get(name)
    return v is not None and v.dtype == "float32" and (shape is None or tuple(v.shape or ()) == shape)


def _swish(model: OnnxModel, value: str, users: dict, shape: tuple) -> tuple[Node, Node] | None:
    """(Sigmoid, Mul) where `value`'s two consumers are s = Sigmoid(value) and Mul(value, s), s
    read by that Mul alone and no graph output (precondition 2's Swish pair), else None."""
    us = users.get(value, ())
    if len(us) != 2 or any(u.domain not in DEFAULT_DOMAINS for u in us):
        return None
    sig, mul = sorted(us, key=lambda u: u.op_type != "Sigmoid")
    if sig.op_type != "Sigmoid" or mul.op_type != "Mul" or tuple(sig.inputs) != (value,) or len(mul.inputs) != 2:
        return None
    s = sig.outputs[0]
    if (
        sorted(mul.inputs) != sorted((value, s))
        or s in model.outputs
        or [u.index for u in users.get(s, ())] != [mul.index]
    ):
        return None
    return (sig, mul) if _is_f32(model, s, shape) and _is_f32(model, mul.outputs[0], shape) else None


def _scalar(model: OnnxModel, name: str) -> float | None:
    """The value of a float32 scalar constant `name` (any shape of one element), else None."""
    c = model.constants.get(name)
    return float(c.reshape(())) if isinstance(c, np.ndarray) and c.size == 1 and c.dtype == np.float32 else None


def _gelu(model: OnnxModel, value: str, users: dict, shape: tuple) -> tuple[Node, ...] | None:
    """(Div, Erf, Add, Mul, Mul) computing 0.5 * value * (1 + erf(value / sqrt 2)) where `value`'s
    two consumers are the Div and the first Mul, each inner value read by the next node alone and
    no graph output, the constants float32 scalars sqrt 2, 1 and 0.5 (precondition 2's erf GELU
    chain), else None."""
    us = users.get(value, ())
    if len(us) != 2 or any(u.domain not in DEFAULT_DOMAINS for u in us):
        return None
    div, mul = sorted(us, key=lambda u: u.op_type != "Div")
    if div.op_type != "Div" or mul.op_type != "Mul" or div.inputs[0] != value or len(div.inputs) != 2:
        return None
    if _scalar(model, div.inputs[1]) != _SQRT2 or not _is_f32(model, div.outputs[0], shape):
        return None
    chain, at = [div], div.outputs[0]
    for op, const in (("Erf", None), ("Add", 1.0), ("Mul", None), ("Mul", 0.5)):
        nxt = users.get(at, ())
        if at in model.outputs or len(nxt) != 1 or nxt[0].op_type != op or nxt[0].domain not in DEFAULT_DOMAINS:
            return None
        node = nxt[0]
        others = [i for i in node.inputs if i != at]
        if op == "Erf":
            ok = len(node.inputs) == 1
        elif const is None:  # v * (1 + erf(...)): the chain's first Mul reads `value`
            ok = node is mul and len(node.inputs) == 2 and others == [value]
        else:
            ok = len(node.inputs) == 2 and len(others) == 1 and _scalar(model, others[0]) == const
        if not (ok and _is_f32(model, node.outputs[0], shape)):
            return None
        chain.append(node)
        at = node.outputs[0]
    return tuple(chain)


def fuse_epilogue(model: OnnxModel, conv: Node, users: dict, taken: frozenset = frozenset()) -> FusedConv | None:
    """The epilogue chain of library Conv `conv` under the module's preconditions (None: no link)."""
    out = conv.outputs[0]
    if not (_is_f32(model, conv.inputs[0]) and _is_f32(model, out)):  # 1
        return None
    shape = tuple(model.values[out].shape)
    nodes: list[Node] = []
    steps: list[EpiStep] = []
    residuals: list[str] = []
    value = out
    while value not in model.outputs:
        pair = _swish(model, value, users, shape)
        if pair and not taken & {n.index for n in pair}:  # 2: the Swish pair x * Sigmoid(x), one step (4)
            nodes += pair
            steps.append(EpiStep(EpiOp.SILU))
            value = pair[1].outputs[0]
            continue
        chain = _gelu(model, value, users, shape)
        if chain and not taken & {n.index for n in chain}:  # 2: the erf GELU chain, one step (4)
            nodes += chain
            steps.append(EpiStep(EpiOp.GELU))
            value = chain[-1].outputs[0]
            continue
        if len(users.get(value, ())) != 1:  # 2
            break
        nxt = users[value][0]
        if nxt.domain not in DEFAULT_DOMAINS or nxt.op_type not in EPILOGUE_OPS or len(nxt.outputs) != 1:  # 3
            break
        if nxt.index in taken:  # 4
            break
        if nxt.op_type == "Add":
            if len(nxt.inputs) != 2 or nxt.inputs.count(value) != 1:
                break
            other = nxt.inputs[1 - nxt.inputs.index(value)]
            if not (_is_f32(model, other, shape) and _is_f32(model, nxt.outputs[0], shape)):  # 3
                break
            step = EpiStep(EpiOp.ADD)
            residuals.append(other)
        else:
            step = _step(model, nxt)
            if step is None or nxt.inputs[0] != value or not _is_f32(model, nxt.outputs[0], shape):  # 3
                break
        nodes.append(nxt)
        steps.append(step)
        value = nxt.outputs[0]
    pooled = fuse_pool(model, conv, value, users, taken)
    if pooled is not None:
        nodes.append(pooled[0])
    if not nodes:
        return None
    return FusedConv(conv, tuple(nodes), Epilogue(tuple(steps)), tuple(residuals), pooled[1] if pooled else ())


def fuse_pool(
    model: OnnxModel, conv: Node, value: str, users: dict, taken: frozenset = frozenset()
) -> tuple[Node, tuple[int, ...]] | None:
    """(MaxPool node, (kh, kw, sh, sw)) where the MaxPool reading the chain's `value` joins Conv
    `conv`'s step under precondition 5, else None."""
    from .conv import geometry
    from .conv_direct import direct_geometry

    us = users.get(value, ())
    if value in model.outputs or len(us) != 1 or us[0].index in taken:  # 2, 4
        return None
    mp, a = us[0], us[0].attrs
    if mp.op_type != "MaxPool" or mp.domain not in DEFAULT_DOMAINS or len([o for o in mp.outputs if o]) != 1:
        return None
    kernel = tuple(a.get("kernel_shape", ()))
    if mp.outputs[0] == "" or len(kernel) != 2 or not _is_f32(model, mp.outputs[0]):
        return None
    auto = a.get("auto_pad", "NOTSET")
    if any(a.get("pads", ())) or (auto.decode() if isinstance(auto, bytes) else str(auto)) != "NOTSET":
        return None
    if any(d != 1 for d in a.get("dilations", ())) or a.get("ceil_mode", 0):
        return None
    x, w = (model.values.get(i) for i in conv.inputs[:2])
    shapes = [tuple(v.shape or ()) if v is not None else () for v in (x, w)]
    if any(len(s) != 4 or not all(isinstance(d, int) and d > 0 for d in s) for s in shapes):
        return None
    win, group = geometry(shapes[0], shapes[1], conv.attrs)
    if direct_geometry(shapes[0], shapes[1], win, group) is None or any(k > o for k, o in zip(kernel, win.out)):
        return None
    return mp, kernel + tuple(a.get("strides", (1, 1)))


def fuse_epilogues(model: OnnxModel, convs: tuple[Node, ...]) -> tuple[FusedConv, ...]:
    """The epilogues of the library Convs `convs` (those with at least one link), in `convs`' order
    (each node in one epilogue at most: precondition 4)."""
    users: dict[str, list[Node]] = {}
    for n in model.nodes:
        for i in dict.fromkeys(n.inputs):
            if i:
                users.setdefault(i, []).append(n)
    out, taken = [], frozenset()
    for c in convs:
        f = fuse_epilogue(model, c, users, taken) if c.op_type == "Conv" else None
        if f is not None:
            out.append(f)
            taken |= {n.index for n in f.nodes}
    return tuple(out)
