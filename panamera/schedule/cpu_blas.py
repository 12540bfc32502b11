"""Which contractions the CPU target hands to the BLAS numpy uses, and how (`blas_call`: the rule).

A contraction the CPU codegen prints is a reduction like any other: a dot product per output,
the reduced loop under `omp simd`, split across cores when the outputs are few. That is what a
small or memory-bound contraction needs (and what fuses producers and epilogues). A large,
compute-bound one is faster in numpy's BLAS (OpenBLAS / MKL: packed panels, register tiles,
cache blocking), so the target routes it there: `np.einsum(..., optimize=True)` on the host,
which calls the BLAS gemm through `tensordot`, into the group's output buffer.

Preconditions for a group to go to BLAS, each checked by `blas_call` (None when one fails):
  1. the group is one contraction statement (nothing fused after it: no epilogue, not stitched);
  2. its operands and result are float32 or float64, all the same dtype (BLAS's sgemm / dgemm;
     16-bit and integer contractions stay generated, with their float32 / int32 accumulators);
  3. each factor of the product is a stored tensor read whole from memory, seen through views
     only (transposes, reshapes): no producer is fused into the operand;
  4. it does at least `BLAS_MIN_FLOPS` flops (2 M N K): below that, a generated kernel's single
     pass costs about what the call into numpy does.
The rule lives here alone; a fitted CPU model may replace precondition 4.

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> a, b = pn.placeholder((256, 256), name="a"), pn.placeholder((256, 256), name="b")
>>> blas_call(lower(a @ b, stop_after="groups", target="emulator").groups[0]).subscripts
'ab,bc->ac'
>>> blas_call(lower(a[:8] @ b, stop_after="groups", target="emulator").groups[0]) is None  # 4: too small
True
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass

import numpy as np

from ..frontend.tensor import Tensor
from ..poly.program import KernelGroup
from .contraction import is_contraction

BLAS_MIN_FLOPS = 1 << 24  # 2 M N K: e.g. 256 x 256 x 256


@dataclass(frozen=True)
class Operand:
    """One factor of the product: the buffer it is stored in and the views that place its axes
    on the iteration space (("transpose", perm) or ("reshape", shape), innermost first)."""

    key: str
    shape: tuple[int, ...]
    views: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class BlasCall:
    """`out = einsum(subscripts, *operands)`, reshaped to `out_shape`, into buffer `out_key`."""

    subscripts: str
    operands: tuple[Operand, ...]
    out_key: str
    out_shape: tuple[int, ...]
    flops: int

    def run(self, arrays: list[np.ndarray], out: np.ndarray) -> None:
        """Compute into `out` (flat, the group's output buffer) from the operands' flat buffers."""
        views = []
        for op, a in zip(self.operands, arrays):
            v = a.reshape(op.shape)
            for kind, arg in op.views:
                v = v.transpose(arg) if kind == "transpose" else v.reshape(arg)
            views.append(v.squeeze(tuple(k for k, e in enumerate(v.shape) if e == 1)))
        r = np.einsum(self.subscripts, *views, optimize=True)
        np.copyto(out.reshape(self.out_shape), r.reshape(self.out_shape), casting="same_kind")

    def describe(self) -> str:
        return f"BLAS (numpy einsum {self.subscripts!r}, {self.flops / 1e6:.1f} MFLOP)"


def _operand(t: Tensor, stored: dict[int, Tensor]) -> Operand | None:
    """The stored tensor under `t` through views, or None (precondition 3)."""
    views = []
    while t.uid not in stored:
        if t.op == "transpose":
            views.append(("transpose", tuple(t.attr("perm"))))
        elif t.op == "reshape":
            views.append(("reshape", tuple(t.shape)))
        elif not (t.op == "cast" and t.dtype == t.inputs[0].dtype):
            return None
        if len(t.inputs) != 1:
            return None
        t = t.inputs[0]
    key = f"in:{t.uid}" if t.op == "placeholder" else f"out:{t.uid}"
    return Operand(key, tuple(t.shape), tuple(reversed(views)))


def blas_call(group: KernelGroup) -> BlasCall | None:
    """The BLAS call of a contraction group, or None where a precondition (module docstring)
    fails: the one routing rule of the CPU target."""
    if len(group.statements) != 1 or group.stitched or group.epilogue:  # precondition 1
        return None
    st = group.statements[0]
    node = st.result
    if not is_contraction(st) or node.op != "reduce" or node.inputs[0].op != "mul":
        return None
    prod = node.inputs[0]
    dtypes = {node.dtype.name} | {r.tensor.dtype.name for r in st.reads if r.memory}
    if len(dtypes) != 1 or dtypes & {"float32", "float64"} != dtypes:  # precondition 2
        return None
    stored = {r.tensor.uid: r.tensor for r in st.reads if r.memory}
    operands = [_operand(f, stored) for f in prod.inputs]
    if len(operands) != 2 or any(o is None for o in operands):  # precondition 3
        return None
    flops = 2 * math.prod(prod.shape)
    if flops < BLAS_MIN_FLOPS:  # precondition 4
        return None
    letters = string.ascii_letters[: len(prod.shape)]
    axes = set(node.attr("axes"))
    subs = ["".join(c for c, e in zip(letters, f.shape) if e != 1) for f in prod.inputs]
    out = "".join(c for k, c in enumerate(letters) if k not in axes and prod.shape[k] != 1)
    return BlasCall(f"{subs[0]},{subs[1]}->{out}", tuple(operands), f"out:{node.uid}", tuple(node.shape), flops)
