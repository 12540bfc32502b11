"""Which computed operands of a contraction the CPU target stores before the contraction reads
them (`stored_operands`: the rule), instead of evaluating them at every use.

A contraction is `reduce[sum](mul(view(a), view(b)))` (frontend/contract.py); build_program
inlines an element-wise producer of `a` into the product, so it runs once per point of the
iteration space. The operand has no axis for the output labels only the other operand has, so
each of its elements is computed once per such output: a GELU before a down-projection of N
outputs computes its erf N times, a LayerNorm before a projection its normalization N times. A
GPU kernel computes such an operand once per tile it stages on chip; the CPU kernels
(codegen/cpu_kernel.py) have no staging, so the CPU target stores the operand once (a MAP
kernel, or the epilogue of the reduction it follows) and the contraction reads it, generated or
in BLAS (schedule/cpu_blas.py: a stored operand meets its precondition 3).

Preconditions for an operand to be stored, each checked by `stored_operands`:
  1. it is a factor of a contraction's product (the reduce node carries `contraction`), seen
     through views only (transposes, reshapes, casts to its own dtype);
  2. the tensor under those views is computed element-wise (a placeholder, a reduction or a
     gather source is stored already);
  3. it would be recomputed: the product has at least `MIN_RECOMPUTE` points per element of the
     operand (the extents of the labels it lacks). A GEMV's weights (M = 1) are read once and
     keep their fused dequantization: storing them would write and re-read every byte;
  4. it has no more elements than the largest stored tensor (placeholder or reduction result)
     its chain reads: a chain that expands its inputs (a convolution's im2col window remap, K
     times its input) would write and read back K times the bytes, and its buffer, fresh at
     every call, costs page faults (the exported EfficientNet ran 7x slower).

Storing costs one write and one read per element of the operand; recomputing re-reads at least
one load per element per extra use, so from 2 uses on storing costs no more memory traffic and
saves the chain's arithmetic.

>>> import panamera as pn
>>> x, w = pn.placeholder((8, 64), name="x"), pn.placeholder((64, 32), name="w")
>>> h = pn.exp(x)
>>> [t.op for t in stored_operands((h @ w,))]
['exp']
>>> stored_operands((x[:1] @ pn.exp(w),))  # one row: each element of exp(w) used once
frozenset()
"""

from __future__ import annotations

import math

from ..frontend.tensor import Tensor
from ..frontend.walk import postorder
from ..poly.fusion import ELEMENTWISE

MIN_RECOMPUTE = 2  # uses per element from which the operand is stored (precondition 3)
VIEWS = ("transpose", "reshape")
STORED = ("placeholder", "reduce", "scatter_add")  # tensors in memory before any kernel reads them


def _under_views(t: Tensor) -> Tensor:
    """The tensor under `t`'s views and same-dtype casts (precondition 1)."""
    while t.op in VIEWS or (t.op == "cast" and t.dtype == t.inputs[0].dtype):
        t = t.inputs[0]
    return t


def _uses(factor: Tensor, prod: Tensor) -> int:
    """Points of the product per element of `factor` (its broadcast axes' extents)."""
    return math.prod(p for f, p in zip(factor.shape, prod.shape) if f == 1 and p != 1)


def _largest_stored(t: Tensor) -> int:
    """The size of the largest stored tensor (placeholder or reduction result) under `t`."""
    best = 0
    for x in postorder((t,), lambda x: () if x.op in STORED else x.inputs):
        if x.op in STORED:
            best = max(best, x.size)
    return best


def stored_operands(outputs: tuple[Tensor, ...]) -> frozenset[Tensor]:
    """The computed contraction operands of the graph under `outputs` that the CPU target stores
    (module docstring: preconditions 1-4)."""
    out = set()
    for t in postorder(outputs, lambda t: t.inputs):
        if t.op != "reduce" or t.attr("contraction") is None or t.inputs[0].op not in ("mul", "and"):
            continue  # precondition 1
        prod = t.inputs[0]
        for factor in prod.inputs:
            src = _under_views(factor)
            if src.op not in ELEMENTWISE:  # precondition 2
                continue
            if _uses(factor, prod) < MIN_RECOMPUTE:  # precondition 3
                continue
            if src.size <= _largest_stored(src):  # precondition 4
                out.add(src)
    return frozenset(out)
