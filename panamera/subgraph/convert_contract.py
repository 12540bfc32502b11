"""ONNX contractions and dequantization as Panamera tensor programs: MatMul, Gemm, MatMulInteger
and DequantizeLinear.

MatMul is numpy's matmul (`pn.matmul`: 1-D operands, batch broadcast); Gemm is
`alpha * A' B' + beta * C` with A' = A or Aᵀ (transA), B' = B or Bᵀ (transB), written as one
`pn.einsum` whose subscripts carry the transposes (no data moves for them) and C broadcast to
(M, N) unidirectionally. DequantizeLinear is `(x - zero_point) * scale` with a per-tensor,
per-axis (`axis`) or blocked (`block_size` along `axis`) scale: an element-wise producer, so a
dequantized operand fuses into the contraction's operand read. Whether a contraction runs here
or in the array library is the partitioner's decision (partition.py, routed by the model); the
converters only say what it computes.

>>> import numpy as np, panamera as pn
>>> from panamera.subgraph.model import Node
>>> from panamera.subgraph.convert import Ctx
>>> n = Node(0, "g", "Gemm", "", ("a", "b"), ("y",), {"transB": 1, "alpha": 0.5}, 13)
>>> y, = _gemm(n, [pn.placeholder((4, 8), name="a"), pn.placeholder((3, 8), name="b")], Ctx(None))
>>> y.shape, y.attr("contraction") if y.op == "reduce" else y.inputs[0].attr("contraction")
((4, 3), 'mk,nk->mn')
"""

from __future__ import annotations

import math

from .. import dtypes
from ..errors import ShapeError, Unsupported
from ..frontend.contract import einsum, matmul
from ..frontend.tensor import Tensor, broadcast_to, constant
from .model import Node


def _float(x: Tensor) -> Tensor:
    return x if x.dtype.is_float else x.astype(dtypes.float32)


def _matmul(node: Node, args, ctx):
    a, b = ctx.tensor(args[0]), ctx.tensor(args[1])
    return [matmul(a, b)]


def _gemm(node: Node, args, ctx):
    a, b = ctx.tensor(args[0]), ctx.tensor(args[1])
    for t, what in ((a, "A"), (b, "B")):
        if t.ndim != 2:
            raise ShapeError(f"Gemm {node.label!r}: input {what} {t.label!r} must be 2-D, it has shape {t.shape}")
    sa = "km" if node.attrs.get("transA", 0) else "mk"
    sb = "nk" if node.attrs.get("transB", 0) else "kn"
    y = einsum(f"{sa},{sb}->mn", a, b)
    alpha = float(node.attrs.get("alpha", 1.0))
    if alpha != 1.0:
        y = y * constant(alpha, y.dtype)
    c = args[2] if len(args) > 2 else None
    if c is not None:
        c = ctx.tensor(c)
        if c.ndim > 2 or any(s not in (1, t) for s, t in zip(c.shape[::-1], y.shape[::-1])):
            raise ShapeError(
                f"Gemm {node.label!r}: input C {c.label!r} of shape {c.shape} does not broadcast to {y.shape}"
            )
        beta = float(node.attrs.get("beta", 1.0))
        c = c.astype(y.dtype) if c.dtype != y.dtype else c
        y = y + (c if beta == 1.0 else c * constant(beta, y.dtype))
    return [y]


def _matmul_integer(node: Node, args, ctx):
    """(a - a_zero_point) @ (b - b_zero_point) in int32 (a's zero point per row or per tensor,
    b's per column or per tensor)."""
    a, b = (ctx.tensor(args[k]).astype(dtypes.int32) for k in (0, 1))
    za = args[2] if len(args) > 2 else None
    zb = args[3] if len(args) > 3 else None
    if za is not None:
        za = ctx.tensor(za).astype(dtypes.int32)
        a = a - (za.reshape((*za.shape, 1)) if za.ndim == 1 and za.size > 1 else za)
    if zb is not None:
        b = b - ctx.tensor(zb).astype(dtypes.int32)
    return [matmul(a, b)]


def _per_axis(node: Node, s: Tensor, x: Tensor) -> Tensor:
    """The scale (or zero point) `s` laid out to broadcast against `x`: per tensor as it is,
    per axis along `axis`, blocked (`block_size`) repeated along `axis`."""
    if s.ndim == 0 or s.size == 1 and s.ndim <= 1 and not node.attrs.get("block_size"):
        return s.reshape(()) if s.ndim else s
    axis = node.attrs.get("axis", 1) % x.ndim
    block = int(node.attrs.get("block_size", 0))
    if not block:
        if s.ndim != 1 or s.shape[0] != x.shape[axis]:
            raise ShapeError(
                f"DequantizeLinear {node.label!r}: per-axis scale {s.label!r} of shape {s.shape} does not "
                f"match axis {axis} of {x.label!r} ({x.shape[axis]})"
            )
        return s.reshape(tuple(x.shape[axis] if k == axis else 1 for k in range(x.ndim)))
    if s.ndim != x.ndim or s.shape[axis] != math.ceil(x.shape[axis] / block):
        raise ShapeError(
            f"DequantizeLinear {node.label!r}: blocked scale {s.label!r} of shape {s.shape} does not fit "
            f"{x.label!r} {x.shape} with block_size {block} along axis {axis}"
        )
    if x.shape[axis] % block:
        raise Unsupported(
            f"DequantizeLinear {node.label!r}: axis {axis} ({x.shape[axis]}) is not a multiple of block_size {block}"
        )
    # s[..., j, ...] repeated `block` times along axis: a broadcast view of shape (..., j, block, ...)
    nb = s.shape[axis]
    split = (*s.shape[:axis], nb, 1, *s.shape[axis + 1 :])
    full = (*s.shape[:axis], nb, block, *s.shape[axis + 1 :])
    return broadcast_to(s.reshape(split), full).reshape(x.shape)


def _dequantize(node: Node, args, ctx):
    x, scale = ctx.tensor(args[0]), ctx.tensor(args[1])
    zp = args[2] if len(args) > 2 else None
    y = x.astype(dtypes.int32) if zp is not None else x
    if zp is not None:
        y = y - _per_axis(node, ctx.tensor(zp).astype(dtypes.int32), x)
    return [y.astype(scale.dtype) * _per_axis(node, scale, x)]


def refuse_dequantize(node: Node) -> str | None:
    """DequantizeLinear into a dtype other than its scale's (opset 23's output_dtype) stays put."""
    if node.attrs.get("output_dtype", 0):
        return "DequantizeLinear's output_dtype attribute is not supported"
    return None


# op -> (converter, constant inputs, refuse): registered by convert.py.
CONTRACT_CONVERTERS = {
    "MatMul": (_matmul, (), None),
    "Gemm": (_gemm, (), None),
    "MatMulInteger": (_matmul_integer, (), None),
    "DequantizeLinear": (_dequantize, (), refuse_dequantize),
}
