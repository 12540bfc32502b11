"""Element-wise epilogues applied by the CPU's register-tiled contraction at its store (issue 24 item 1).

Before (what `split_for_blas` S1 runs: two kernels, the product through memory)::

    C = A @ B                                  # the tile kernel (codegen/cpu_tile.py)
    for e: out[e] = gelu(C[e] + bias[e % N])   # a MAP kernel: one more pass over C

After (`tile_epilogue`: the group stays whole; the tile kernel applies the consumer to each C tile
once its last K block is summed, or to each row after the K split's merge, while the tile is in L1)::

    for each MR x NR tile: acc = A[rows, :] @ B[:, cols]; out[tile] = gelu(acc + bias[cols])

Preconditions, each checked by `check_tile_epilogue` (`LegalityError` naming it; negative tests in
tests/test_cpu_epilogue.py):
  1. the group is an epilogue group (poly/epilogue.py) or a stitched one (poly/stitch.py) of two
     statements: one contraction, then one element-wise (MAP) consumer (`split_for_blas` S1's
     groups); a consumer that reduces over the product (a row sum, a softmax row) or several
     consumers stay separate kernels;
  2. the contraction alone is one schedule/cpu_blas.py accepts (`blas_call`) and is gemm calls
     from C (`Gemm`), each call writing its own C block (no call accumulates into another's):
     every element is final once, after its call's last K block;
  3. the consumer reads the product once, at its own element (the identity address): the tile
     holds exactly the values the consumer needs;
  4. every other value the consumer reads is a stored tensor (a bias broadcast along the rows, a
     residual): read-only memory, no value of the group.

Where the CPU model finds the tile faster than the BLAS, the grouping keeps such a group whole
(schedule/cpu_contraction.py `cpu_groups`) and its `GemmPlan` carries the `TileEpilogue`; under
the BLAS the consumer stays a MAP kernel over the stored product.

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> x, w, b = pn.placeholder((64, 128)), pn.placeholder((32, 128)), pn.placeholder((32,))
>>> g = lower(pn.maximum(x @ w.T + b, 0.0), stop_after="groups", target="emulator").groups[0]
>>> tile_epilogue(g).elements
2048
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import LegalityError
from ..poly.program import KernelGroup
from ..poly.statement import Form, Statement, StatementKind
from .cpu_blas import blas_call

if TYPE_CHECKING:
    from ..model.cpu import CpuModel


@dataclass(frozen=True)
class TileEpilogue:
    """The element-wise `consumer` (statement 1 of its group) of the product `product_uid`,
    applied by the tile kernel to each of the product's `elements` before it leaves the cache."""

    consumer: Statement
    product_uid: int
    elements: int

    def compute_us(self, m: CpuModel, threads: int, itemsize: int) -> float:
        """The consumer's modeled arithmetic over every element on `threads` threads: what the fused
        kernel adds to the tile's time (the MAP kernel's pass over memory and its fork are saved)."""
        from ..model.cpu import element_ns
        from .cpu_cost import work

        lanes = max(1, m.simd_bytes // itemsize)
        return element_ns(work(KernelGroup((self.consumer,))), m.rates, lanes) * self.elements / max(1, threads) / 1e3

    def describe(self) -> str:
        return f"epilogue {self.consumer.name} at the tile's store"


def check_tile_epilogue(group: KernelGroup) -> TileEpilogue:
    """The epilogue the tile kernel applies for `group`; `LegalityError` naming the precondition
    (module docstring) that fails."""
    sts = group.statements
    if not (group.epilogue or group.stitched) or len(sts) != 2 or sts[1].kind != StatementKind.MAP:
        raise LegalityError(f"tile epilogue precondition 1: {group.names} is not a contraction and one consumer")
    if sts[1].form != Form.MAP:
        raise LegalityError(f"tile epilogue precondition 1: {sts[1].name} is not element-wise")
    product, consumer = sts
    call = blas_call(KernelGroup((product,)))
    if call is None or call.gemm is None or any(c[3] for c in call.gemm.calls):
        raise LegalityError(f"tile epilogue precondition 2: {product.name} is not gemm calls writing their own C")
    uid = product.result.uid
    mine = [r for r in consumer.reads if r.tensor.uid == uid]
    identity = consumer.write
    if len(mine) != 1 or identity is None or not mine[0].addr.is_equal(identity):
        raise LegalityError(f"tile epilogue precondition 3: {consumer.name} reads {product.name} off its element")
    others = [r for r in consumer.reads if r.tensor.uid != uid]
    if any(not r.memory or r.tensor.uid in group.on_chip for r in others):
        raise LegalityError(f"tile epilogue precondition 4: {consumer.name} reads a value that is not a stored input")
    return TileEpilogue(consumer, uid, math.prod(product.result.shape))


def tile_epilogue(group: KernelGroup) -> TileEpilogue | None:
    """`check_tile_epilogue`, or None where a precondition fails."""
    try:
        return check_tile_epilogue(group)
    except LegalityError:
        return None
