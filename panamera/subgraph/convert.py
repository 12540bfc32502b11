"""ONNX operators as Panamera tensor programs.

Each converter takes the node and its arguments (a Tensor for a live value, an np.ndarray for a
folded constant, None for an omitted optional input) and returns one Tensor per output; the
caller casts each to the ONNX output type, so converters may compute in numpy's promoted types.
Attributes follow the ONNX spec of the model's opset (axes moved from attributes to inputs in
opset 13 for ReduceSum and Squeeze/Unsqueeze and in 18 for the other reductions).

`CONVERTERS` is the one table of the ops Panamera compiles: every other list of ops (views,
inputs needed as constants, what the partitioner takes) is derived from it.

>>> CONVERTERS["Relu"].convert.__name__, CONVERTERS["Reshape"].constant_inputs, "Reshape" in VIEWS
('_relu', (1,), True)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import dtypes, nn
from ..errors import DTypeError, ShapeError, Unsupported
from ..frontend import ops
from ..frontend.tensor import Tensor, binary, constant, iota, reshape, unary, where
from .constants import int_tuple
from .model import DEFAULT_DOMAINS, SUPPORTED_ELEM, ModelSource, Node, decode


class Ctx:
    """What converters need from the subgraph being built: constants turned into tensors."""

    def __init__(self, weight: Callable[[np.ndarray], Tensor]):
        self._weight = weight

    def tensor(self, v) -> Tensor:
        if isinstance(v, Tensor):
            return v
        a = np.asarray(v)
        d = dtypes.as_dtype(a.dtype)
        if a.size == 1:  # scalars are folded into the generated code
            c = constant(a.reshape(()).item(), d)
            return reshape(c, a.shape) if a.ndim else c
        return self._weight(a)


def _full(shape, value, d) -> Tensor:
    """A tensor of `shape` filled with `value` (no memory: iota is computed, never loaded)."""
    c = constant(value, d)
    if not shape:
        return c
    return where(iota(shape) >= 0, c, c)


def _broadcast_to(x: Tensor, shape) -> Tensor:
    shape = tuple(np.broadcast_shapes(x.shape, tuple(shape)))
    if shape == x.shape:
        return x
    return where(iota(shape) >= 0, x, x)


# -- reductions -----------------------------------------------------------------------------
def _reduce_axes(node: Node, args, ctx):
    if node.op_type == "ReduceSum" and node.opset >= 13 or node.op_type != "ReduceSum" and node.opset >= 18:
        axes = int_tuple(node, args[1], "axes") if len(args) > 1 else None
    else:
        axes = node.attrs.get("axes")
    if not axes:
        return () if node.attrs.get("noop_with_empty_axes", 0) else None
    return tuple(int(a) for a in axes)


_PRE = {
    "ReduceSumSquare": lambda x: x * x,
    "ReduceL1": ops.abs,
    "ReduceL2": lambda x: x * x,
}
_POST = {"ReduceL2": ops.sqrt, "ReduceLogSum": ops.log}
_BASE = {
    "ReduceSum": "sum", "ReduceSumSquare": "sum", "ReduceL1": "sum", "ReduceL2": "sum", "ReduceLogSum": "sum",
    "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod", "ReduceLogSumExp": "lse",
}  # fmt: skip


def _reduce(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    axes = _reduce_axes(node, args, ctx)
    keep = bool(node.attrs.get("keepdims", 1))
    kind = _BASE[node.op_type]
    if axes == ():  # noop_with_empty_axes: the element-wise part only
        y = _PRE.get(node.op_type, lambda t: t)(x)
        y = ops.log(ops.exp(y)) if kind == "lse" else y
        return [_POST.get(node.op_type, lambda t: t)(y)]
    norm = ops.normalize_axes(axes, x.ndim, node.label)
    n = math.prod(x.shape[a] for a in norm)
    if kind in ("max", "min") and n == 0:  # ONNX: the reduction of an empty set is -inf / inf
        shape = tuple(1 if k in norm else s for k, s in enumerate(x.shape) if keep or k not in norm)
        if x.dtype.is_float:
            return [_full(shape, -math.inf if kind == "max" else math.inf, x.dtype)]
        info = np.iinfo(x.dtype.np) if x.dtype.name != "bool" else None
        return [_full(shape, (info.min if kind == "max" else info.max) if info else kind == "min", x.dtype)]
    x = _PRE.get(node.op_type, lambda t: t)(x)
    if kind == "lse":
        if n == 0:
            y = ops.log(ops.sum(ops.exp(x), axis=norm, keepdims=keep))
        else:
            y = nn.logsumexp(x if x.dtype.is_float else x.astype(dtypes.float64), axis=norm, keepdims=keep)
    else:
        y = getattr(ops, kind)(x, axis=norm, keepdims=keep)
    return [_POST.get(node.op_type, lambda t: t)(y)]


def _arg(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    kind = "argmax" if node.op_type == "ArgMax" else "argmin"
    axis = node.attrs.get("axis", 0)
    keep = bool(node.attrs.get("keepdims", 1))
    last = bool(node.attrs.get("select_last_index", 0))
    return [getattr(ops, kind)(x, axis=axis, keepdims=keep, last=last)]


# -- normalizations -------------------------------------------------------------------------
def _softmax(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    log = node.op_type == "LogSoftmax"
    f = nn.log_softmax if log else nn.softmax
    if node.opset >= 13:
        return [f(x, axis=node.attrs.get("axis", -1))]
    axis = node.attrs.get("axis", 1) % max(x.ndim, 1)  # opset < 13: coerced to 2-D at axis
    flat = x.reshape((math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    return [f(flat, axis=1).reshape(x.shape)]


def _compute(x: Tensor) -> Tensor:
    return x.astype(dtypes.float32) if x.dtype.is_16bit_float else x


def _layer_norm(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    if not x.dtype.is_float:
        raise DTypeError(f"LayerNormalization {node.label!r}: needs a floating-point input, got {x.dtype}")
    axis = node.attrs.get("axis", -1) % x.ndim
    eps = float(node.attrs.get("epsilon", 1e-5))
    xc = _compute(x)
    axes = tuple(range(axis, x.ndim))
    mean, var = ops.welford(xc, axes, True, "mean"), ops.welford(xc, axes, True, "var")
    inv = ops.rsqrt(var + eps)
    y = (xc - mean) * inv
    if len(args) > 1 and args[1] is not None:
        y = y * _compute(ctx.tensor(args[1]))
    if len(args) > 2 and args[2] is not None:
        y = y + _compute(ctx.tensor(args[2]))
    return [y, mean, inv]


def _channel(ctx, v, x: Tensor) -> Tensor:
    t = _compute(ctx.tensor(v))
    return t.reshape(t.shape + (1,) * (x.ndim - 2)) if t.ndim == 1 else t


def _batch_norm(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    if x.ndim < 2:
        raise ShapeError(f"BatchNormalization {node.label!r}: needs rank >= 2, got {x.shape}")
    eps = float(node.attrs.get("epsilon", 1e-5))
    xc = _compute(x)
    scale, bias, rmean, rvar = (_channel(ctx, args[k], x) for k in (1, 2, 3, 4))
    if not node.attrs.get("training_mode", 0):
        return [(xc - rmean) * ops.rsqrt(rvar + eps) * scale + bias]
    momentum = float(node.attrs.get("momentum", 0.9))
    axes = (0,) + tuple(range(2, x.ndim))
    mean, var = ops.welford(xc, axes, True, "mean"), ops.welford(xc, axes, True, "var")
    y = (xc - mean) * ops.rsqrt(var + eps) * scale + bias
    flat = (x.shape[1],)
    run_mean = (rmean * momentum + mean * (1 - momentum)).reshape(flat)
    run_var = (rvar * momentum + var * (1 - momentum)).reshape(flat)
    return [y, run_mean, run_var][: len(node.outputs)]


def _instance_norm(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    eps = float(node.attrs.get("epsilon", 1e-5))
    xc = _compute(x)
    axes = tuple(range(2, x.ndim))
    mean, var = ops.welford(xc, axes, True, "mean"), ops.welford(xc, axes, True, "var")
    y = (xc - mean) * ops.rsqrt(var + eps)
    return [y * _channel(ctx, args[1], x) + _channel(ctx, args[2], x)]


def _group_norm(node: Node, args, ctx):
    """On the view (N, G, C/G, spatial), like nn.group_norm, so that it stitches into one kernel."""
    x = ctx.tensor(args[0])
    g = int(node.attrs["num_groups"])
    eps = float(node.attrs.get("epsilon", 1e-5))
    n, c = x.shape[0], x.shape[1]
    if g <= 0 or c % g:
        raise ShapeError(f"GroupNormalization {node.label!r}: {c} channels do not split into {g} groups")
    x4 = _compute(x).reshape((n, g, c // g, math.prod(x.shape[2:])))
    mean, var = ops.welford(x4, (2, 3), True, "mean"), ops.welford(x4, (2, 3), True, "var")
    y = (x4 - mean) * ops.rsqrt(var + eps)
    scale, bias = (_compute(ctx.tensor(args[k])) for k in (1, 2))
    shape = (1, g, 1, 1) if scale.size == g and node.opset < 21 else (1, g, c // g, 1)  # opset 18: per group
    return [(y * scale.reshape(shape) + bias.reshape(shape)).reshape(x.shape)]


# -- element-wise ---------------------------------------------------------------------------
def _binary(op: str):
    def conv(node: Node, args, ctx):
        a, b = ctx.tensor(args[0]), ctx.tensor(args[1])
        if op == "div" and not a.dtype.is_float and not b.dtype.is_float:
            return [binary("trunc_div", a, b)]
        return [binary(op, a, b)]

    conv.__name__ = f"_{op}"
    return conv


def _unary(op: str):
    def conv(node: Node, args, ctx):
        return [unary(op, ctx.tensor(args[0]))]

    conv.__name__ = f"_{op}"
    return conv


def _variadic(op: str):
    def conv(node: Node, args, ctx):
        ts = [ctx.tensor(a) for a in args if a is not None]
        y = ts[0]
        for t in ts[1:]:
            y = binary(op, y, t)
        return [_broadcast_to(y, y.shape)]

    conv.__name__ = f"_{op}_n"
    return conv


def _relu(node, args, ctx):
    x = ctx.tensor(args[0])
    return [ops.maximum(x, constant(0, x.dtype))]


def _sigmoid(node, args, ctx):
    x = ctx.tensor(args[0])
    one = constant(1, x.dtype)
    return [one / (one + ops.exp(-x))]


def _reciprocal(node, args, ctx):
    x = ctx.tensor(args[0])
    return [constant(1, x.dtype) / x]


def _pow(node, args, ctx):
    x, y = ctx.tensor(args[0]), ctx.tensor(args[1])
    if x.dtype.is_float and not y.dtype.is_float:
        y = y.astype(x.dtype)
    return [x**y]


def _clip(node, args, ctx):
    x = ctx.tensor(args[0])
    if node.opset < 11:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
    else:
        lo = args[1] if len(args) > 1 else None
        hi = args[2] if len(args) > 2 else None
    y = x
    if lo is not None:
        y = ops.maximum(y, ctx.tensor(np.asarray(lo, x.dtype.np) if not isinstance(lo, Tensor) else lo))
    if hi is not None:
        y = ops.minimum(y, ctx.tensor(np.asarray(hi, x.dtype.np) if not isinstance(hi, Tensor) else hi))
    return [y]


def _cast(node, args, ctx):
    to = node.attrs["to"]
    if to not in SUPPORTED_ELEM:
        raise Unsupported(f"Cast {node.label!r}: target type {to} is not a Panamera dtype")
    return [ctx.tensor(args[0]).astype(SUPPORTED_ELEM[to])]


def _where(node, args, ctx):
    return [where(ctx.tensor(args[0]), ctx.tensor(args[1]), ctx.tensor(args[2]))]


def _not(node, args, ctx):
    return [~ctx.tensor(args[0])]


def _identity(node, args, ctx):
    return [ctx.tensor(args[0])]


# -- views ----------------------------------------------------------------------------------
def _reshape(node, args, ctx):
    x = ctx.tensor(args[0])
    shape = list(int_tuple(node, args[1], "shape"))
    if not node.attrs.get("allowzero", 0):
        shape = [x.shape[k] if s == 0 else s for k, s in enumerate(shape)]
    return [reshape(x, shape)]


def _flatten(node, args, ctx):
    x = ctx.tensor(args[0])
    axis = node.attrs.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return [reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


def _squeeze_axes(node, args):
    if node.opset >= 13:
        return int_tuple(node, args[1], "axes") if len(args) > 1 and args[1] is not None else None
    return node.attrs.get("axes")


def _squeeze(node, args, ctx):
    x = ctx.tensor(args[0])
    axes = _squeeze_axes(node, args)
    axes = [a % x.ndim for a in axes] if axes is not None else [k for k, s in enumerate(x.shape) if s == 1]
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeError(f"Squeeze {node.label!r}: axis {a} of {x.shape} is not 1")
    return [reshape(x, tuple(s for k, s in enumerate(x.shape) if k not in axes))]


def _unsqueeze(node, args, ctx):
    x = ctx.tensor(args[0])
    axes = _squeeze_axes(node, args)
    rank = x.ndim + len(axes)
    axes = sorted(a % rank for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [reshape(x, shape)]


def _expand(node, args, ctx):
    x = ctx.tensor(args[0])
    return [_broadcast_to(x, int_tuple(node, args[1], "shape"))]


_SIMPLE_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Equal": "eq", "Greater": "gt",
                  "Less": "lt", "GreaterOrEqual": "ge", "LessOrEqual": "le", "And": "and", "Or": "or", "Xor": "xor"}  # fmt: skip
_SIMPLE_UNARY = {"Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Tanh": "tanh",
                 "Erf": "erf", "Floor": "floor", "Ceil": "ceil"}  # fmt: skip

ConvertFn = Callable[[Node, list, Ctx], list[Tensor]]


@dataclass(frozen=True)
class OpConverter:
    """How one ONNX op becomes Panamera tensors, and what the rest of the wing needs to know of it."""

    convert: ConvertFn
    constant_inputs: tuple[int, ...] = ()  # inputs the converter needs as constants (axes, target shapes)
    view: bool = False  # moves no data: a subgraph made only of views needs no kernel
    refuse: Callable[[Node], str | None] | None = None  # why a node of this op stays with the library


_AXES = OpConverter(_reduce, constant_inputs=(1,))  # the reductions: axes are input 1 from opset 13 or 18

CONVERTERS: dict[str, OpConverter] = {
    **{op: _AXES for op in _BASE},
    "ArgMax": OpConverter(_arg),
    "ArgMin": OpConverter(_arg),
    "Softmax": OpConverter(_softmax),
    "LogSoftmax": OpConverter(_softmax),
    "LayerNormalization": OpConverter(_layer_norm),
    "BatchNormalization": OpConverter(_batch_norm),
    "InstanceNormalization": OpConverter(_instance_norm),
    "GroupNormalization": OpConverter(_group_norm),
    **{op: OpConverter(_binary(p)) for op, p in _SIMPLE_BINARY.items()},
    **{op: OpConverter(_unary(p)) for op, p in _SIMPLE_UNARY.items()},
    "Max": OpConverter(_variadic("maximum")),
    "Min": OpConverter(_variadic("minimum")),
    "Relu": OpConverter(_relu),
    "Sigmoid": OpConverter(_sigmoid),
    "Reciprocal": OpConverter(_reciprocal),
    "Pow": OpConverter(_pow),
    "Clip": OpConverter(_clip),
    "Cast": OpConverter(_cast),
    "Where": OpConverter(_where),
    "Not": OpConverter(_not),
    "Identity": OpConverter(_identity, view=True),
    "Reshape": OpConverter(_reshape, constant_inputs=(1,), view=True),
    "Flatten": OpConverter(_flatten, view=True),
    "Squeeze": OpConverter(_squeeze, constant_inputs=(1,), view=True),
    "Unsqueeze": OpConverter(_unsqueeze, constant_inputs=(1,), view=True),
    "Expand": OpConverter(_expand, constant_inputs=(1,)),
}


def _net_converters() -> dict[str, OpConverter]:
    """Data movement, pooling and activations (convert_net.py)."""
    from .convert_net import NET_CONVERTERS

    return {op: OpConverter(f, constant_inputs=c, refuse=r) for op, (f, c, r) in NET_CONVERTERS.items()}


def _contract_converters() -> dict[str, OpConverter]:
    """MatMul, Gemm, MatMulInteger and DequantizeLinear (convert_contract.py)."""
    from .convert_contract import CONTRACT_CONVERTERS

    return {op: OpConverter(f, constant_inputs=c, refuse=r) for op, (f, c, r) in CONTRACT_CONVERTERS.items()}


CONVERTERS.update(_net_converters())
CONVERTERS.update(_contract_converters())

# Inputs a converter needs as constants (axes, target shapes), by op.
CONSTANT_INPUTS: dict[str, tuple[int, ...]] = {
    op: c.constant_inputs for op, c in CONVERTERS.items() if c.constant_inputs
}

# Ops that move no data: a subgraph made only of them needs no kernel.
VIEWS = frozenset(op for op, c in CONVERTERS.items() if c.view)


def convert_node(node: Node, args: list, ctx: Ctx) -> list[Tensor]:
    """The Panamera tensors of `node`'s outputs (Unsupported or a PanameraError if it cannot)."""
    if node.domain not in DEFAULT_DOMAINS:
        raise Unsupported(f"{node.op_type} {node.label!r}: domain {node.domain!r} is not the ONNX standard domain")
    conv = CONVERTERS.get(node.op_type)
    if conv is None:
        raise Unsupported(f"{node.op_type} {node.label!r}: not a Panamera op")
    return conv.convert(node, args, ctx)


def shape_inputs(source: ModelSource) -> tuple[str, ...]:
    """Graph inputs that feed an input Panamera needs as a constant (axes, target shapes):
    pass their values to `load_model(specialize=)` to compile for them."""
    _, proto = decode(source)
    inputs = {i.name for i in proto.graph.input} - {i.name for i in proto.graph.initializer}
    producer = {o: n for n in proto.graph.node for o in n.output}
    found = [n.input[k] for n in proto.graph.node for k in CONSTANT_INPUTS.get(n.op_type, ()) if k < len(n.input)]
    # Back through the nodes that compute them (pads from Max/Sub/Concat of a `shape` input), but
    # not through Shape: a shape is known without the values.
    stack, seen = [v for v in found if v], set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        n = producer.get(v)
        if n is not None and n.op_type != "Shape":
            stack += [i for i in n.input if i]
    return tuple(dict.fromkeys(i for i in [*found, *sorted(seen)] if i in inputs))
