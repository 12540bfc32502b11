"""Decode attention as one chain of reductions, fused and split over the keys (issue 13, item 4).

Where it fits. `pn.nn.attention` offers the compiler two formulations of one value (frontend
`alternatives`, chosen by the model in schedule/formulation.py like softmax's): the *chain*
(`nn.attention_chain`: three statements through the ordinary pipeline, the scores written to
DRAM) and the *fused* node `attention(q, k, v[, mask])`. This module owns the legality of the
fused plan (`recognize`) and the way back to the chain where it is not legal (`chain_of`, substituted by the compiler);
schedule/attention.py chooses its split and merge (the model), codegen/attention_kernel.py
lowers it. The fused node is a contraction -> softmax -> contraction over the softmax axis,
whose two reductions run over the same keys l, so one pass over l holds both: the second
contraction folds exp(x_l - m) v_l while m is still growing, rescaling what it holds when m
grows (the online-softmax struct generalized to a vector accumulator (m, s, o[D]),
algebra.ONLINE_SOFTMAX_VEC).

Before (the chain: three kernels; the scores and the statistics round-trip through DRAM)::

    x[b, h, i, l] = scale * sum_d q[b, h, i, d] * k[b, h / G, l, d]  (+ mask[b, h, i, l])
    (m, s)[b, h, i] = online_lse_l x[b, h, i, l]
    out[b, h, i, d] = sum_l exp(x[b, h, i, l] - m) / s * v[b, h / G, l, d]

After (one pass over the keys, split across S blocks; x and (m, s, o) never leave the chip but
for S partials per row)::

    for each (b, kv head c, row tile, chunk z) in parallel:          # a block
        rows r = (g, i): the G query heads of kv head c, times Lq
        acc[r] = identity
        for l in chunk z:  acc[r] = merge(acc[r], lift(scale * q[r] . k[c, l] + mask, v[c, l]))
        partial[z][r] = acc[r]
    out[r] = finish(merge_z partial[z][r])          # the last block (one launch) or a merge kernel

Preconditions for the fused plan, each checked by `recognize` (a failed one keeps the chain,
which is legal everywhere; tests/test_attention.py has one negative test each):
  1. the attention node is the program's only output: its value is final only after the merge
     of the S partials, and no grid-wide barrier lets another statement of the same kernel read
     it (the stitching rule of DESIGN.md section 2);
  2. q, k, v (and the mask) are placeholders: the kernel vector-loads them from memory in their
     own layout, and no producer is fused into those loads;
  3. the head dim fits the on-chip accumulator: D <= MAX_HEAD_DIM (o[D] is held in registers,
     D / lanes per thread and row, and in shared memory for the block merge).
The merge is legal because the vector accumulator's merge is associative and commutative (a
max, then rescaled sums); the Hq / Hkv query heads of one kv head are rows of the same block, so
k and v are read from DRAM once (grouped-query attention).

>>> import panamera as pn
>>> q = pn.placeholder((1, 4, 1, 32), name="q")
>>> k = pn.placeholder((1, 2, 64, 32), name="k")
>>> fused = pn.nn.attention(q, k, k).inputs[0]
>>> c = recognize((fused,))
>>> c.G, c.rows, c.mask_kind
(2, 2, <MaskKind.NONE: 'none'>)
>>> recognize((fused + 1.0,)) is None
True
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DType, float32
from ..enums import StrEnum
from ..frontend.nn import attention_chain
from ..frontend.tensor import Tensor, topological
from .program import Program, tensor_graph
from .statement import strides

MAX_HEAD_DIM = 256


class MaskKind(StrEnum):
    NONE = "none"
    ADDITIVE = "additive"  # a float added to the scores
    BOOLEAN = "boolean"  # True keeps the key, False makes its score -inf


@dataclass(frozen=True)
class AttentionChain:
    """The fused attention node with the facts the mapper and codegen need, as data."""

    node: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    scale: float
    mask_kind: MaskKind
    mask_strides: tuple[int, int, int, int]  # element strides over (b, query head, i, l); 0 where broadcast

    B = property(lambda self: self.q.shape[0])
    Hq = property(lambda self: self.q.shape[1])
    Lq = property(lambda self: self.q.shape[2])
    D = property(lambda self: self.q.shape[3])
    Hkv = property(lambda self: self.k.shape[1])
    Lk = property(lambda self: self.k.shape[2])
    G = property(lambda self: self.Hq // self.Hkv)  # query heads per kv head
    rows = property(lambda self: self.G * self.Lq)  # query rows that share one kv head

    @property
    def dtype(self) -> DType:
        return self.q.dtype

    @property
    def acc(self) -> DType:
        """float32 for 16-bit inputs, else the input dtype."""
        return float32 if self.dtype.is_16bit_float else self.dtype

    @property
    def compulsory_bytes(self) -> int:
        """q, k, v, the mask and the output, each once: the limit's traffic."""
        ts = [self.q, self.k, self.v, self.node] + ([self.mask] if self.mask is not None else [])
        return sum(t.size * t.dtype.itemsize for t in ts)


def _mask_strides(mask: Tensor, full: tuple[int, ...]) -> tuple[int, int, int, int]:
    shape = (1,) * (4 - mask.ndim) + mask.shape
    st = strides(shape)
    return tuple(0 if e == 1 and f != 1 else s for e, f, s in zip(shape, full, st))


def recognize(outputs: tuple[Tensor, ...]) -> AttentionChain | None:
    """The fused attention of a program, or None where a precondition fails (module docstring)."""
    if len(outputs) != 1 or outputs[0].op != "attention":  # precondition 1
        return None
    t = outputs[0]
    if any(i.op != "placeholder" for i in t.inputs):  # precondition 2
        return None
    q, k, v = t.inputs[:3]
    if q.shape[3] > MAX_HEAD_DIM:  # precondition 3
        return None
    mask = t.inputs[3] if len(t.inputs) > 3 else None
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    ms = _mask_strides(mask, full) if mask is not None else (0, 0, 0, 0)
    return AttentionChain(t, q, k, v, mask, t.attr("scale"), MaskKind(t.attr("mask")), ms)


def chains_in(outputs: tuple[Tensor, ...]) -> list[Tensor]:
    """The fused attention nodes reachable from `outputs`."""
    return [t for t in topological(outputs) if t.op == "attention"]


def chain_of(t: Tensor) -> Tensor:
    """The chain of reductions that computes the fused node `t` (legal everywhere)."""
    q, k, v = t.inputs[:3]
    mask = t.inputs[3] if len(t.inputs) > 3 else None
    return attention_chain(q, k, v, t.attr("scale"), mask)


def program_of(c: AttentionChain) -> Program:
    """The Program of a fused attention: its placeholders and tensor graph, no statements (the
    fused node is lowered by its own template, codegen/attention_kernel.py)."""
    inputs = tuple(sorted({t.uid: t for t in c.node.inputs}.values(), key=lambda t: t.uid))
    return Program((c.node,), inputs, (), (), None, tensor_graph((c.node,)))
