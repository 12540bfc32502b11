"""Fused decode attention over symbolic extents (issue 22): the key length as a kernel argument.

Where it fits. A symbolic `pn.nn.attention` (its `choose` node between the fused node and the
chain, frontend/nn.py) is compiled by its fused plan (poly/attention.py: one pass over the keys,
split across blocks, partials (m, s, o[D]) merged by the last block or a merge kernel) when the
preconditions below hold; otherwise by the chain through poly/params.py, legal everywhere. The
block shape (rows per tile, vector loads, lanes per key) depends only on the static extents, so
one kernel serves every key length of a size class; the class fixes the split
(schedule/param_attention.py), and the kernel divides the keys of a call evenly among its
blocks (codegen/attention_kernel.py, `lk_arg`).

Preconditions for the symbolic fused plan, each checked by `recognize_symbolic` (a failed one
keeps the chain; tests/test_dynamic_attention.py has one negative test each):
  1. the program's only output is the attention `choose` node, and its fused formulation
     passes poly/attention.py's preconditions (2: q, k, v placeholders; 3: the head dim fits);
  2. only the batch and the key length are symbolic: the query heads, kv heads, query length
     and head dim fix the block's rows and vector loads, so they are integers;
  3. there is no mask: its element strides over the keys would depend on the key length.

>>> import panamera as pn
>>> q = pn.placeholder((1, 4, 1, 32), name="q")
>>> kv = pn.placeholder((1, 2, "T", 32), name="k")
>>> s = recognize_symbolic((pn.nn.attention(q, kv, kv),))
>>> s.symbols, s.at({"T": 9}).Lk
(('T',), 9)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..frontend import symbolic
from ..frontend.tensor import Tensor
from .attention import MAX_HEAD_DIM, AttentionChain, recognize


@dataclass(frozen=True)
class SymbolicAttention:
    """The fused attention node of a symbolic program; `at(sizes)` is its chain at concrete sizes."""

    node: Tensor  # the fused "attention" node (inputs q, k, v)

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return self.node.inputs[:3]

    @property
    def symbols(self) -> tuple[str, ...]:
        names: set[str] = set()
        for t in self.inputs:
            names |= symbolic.symbols_of(t.shape)
        return tuple(sorted(names))

    def at(self, sizes: dict[str, int]) -> AttentionChain:
        """The static chain at `sizes` (fresh placeholders of the evaluated shapes)."""
        ins = tuple(Tensor(t.op, (), symbolic.evaluate(t.shape, sizes), t.dtype, t.attrs, t.name) for t in self.inputs)
        n = self.node
        node = Tensor(n.op, ins, symbolic.evaluate(n.shape, sizes), n.dtype, n.attrs, n.name)
        c = recognize((node,))
        assert c is not None, "recognize_symbolic checked every precondition"
        return c


def recognize_symbolic(outputs: tuple[Tensor, ...]) -> SymbolicAttention | None:
    """The symbolic fused attention of `outputs`, or None where a precondition fails (module docstring)."""
    if len(outputs) != 1 or outputs[0].op != "choose" or outputs[0].attr("formulation") != "attention":
        return None  # precondition 1
    fused = outputs[0].inputs[outputs[0].attr("names").index("fused")]
    if len(fused.inputs) != 3:  # precondition 3
        return None
    q, k, v = fused.inputs
    if any(i.op != "placeholder" for i in fused.inputs):  # precondition 1 (poly/attention.py 2)
        return None
    static = (q.shape[1], q.shape[2], q.shape[3], k.shape[1], k.shape[3], v.shape[1], v.shape[3])
    if any(not isinstance(e, int) for e in static):  # precondition 2
        return None
    if q.shape[3] > MAX_HEAD_DIM:  # precondition 1 (poly/attention.py 3)
        return None
    return SymbolicAttention(fused)
