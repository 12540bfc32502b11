"""Which contractions the CPU target hands to the BLAS numpy uses, and how (`blas_call`: the rule).

A contraction the CPU codegen prints is a reduction like any other: a dot product per output,
the reduced loop under `omp simd`, split across cores when the outputs are few. That is what a
small or memory-bound contraction needs (and what fuses producers and epilogues). A large,
compute-bound one is faster in numpy's BLAS (OpenBLAS / MKL: packed panels, register tiles,
cache blocking), so the target routes it there: `np.einsum(..., optimize=True)` on the host,
which calls the BLAS gemm through `tensordot`, into the group's output buffer.

Preconditions for a group to go to BLAS, each checked by `blas_call` (None when one fails):
  1. the group is one contraction statement (nothing fused after it: no epilogue, not stitched;
     `split_for_blas` first splits the groups it can into such groups);
  2. its operands and result are float32 or float64, all the same dtype (BLAS's sgemm / dgemm;
     16-bit and integer contractions stay generated, with their float32 / int32 accumulators);
  3. each factor of the product is a stored tensor read whole from memory, seen through views
     only (transposes, reshapes): no producer is fused into the operand;
  4. it does at least `BLAS_MIN_FLOPS` flops (2 M N K): below that, a generated kernel's single
     pass costs about what the call into numpy does (np.matmul: about 1 us on 8 x 32 x 64, where
     the generated dot products took 15-30 us, measured on the exported models).
The rule lives here alone; a fitted CPU model may replace precondition 4.

The call is `np.matmul` over the operands' views arranged as (batch, rows, contracted) and
(batch, contracted, columns), the einsum's labels sorted into those roles once (`BlasCall`);
np.einsum's path search costs about 10 us a call. Where the operands and the output are strided
views of their flat buffers in pieces (cpu_gemm.py), the call is also a `Gemm`: the same product
as a few row-major gemm calls, which the CPU target makes from C through the BLAS library numpy
links (runtime/cpu_gemm.py), never returning to Python.

`split_for_blas(group)`: a group the planner made of several statements runs as one kernel per
statement where that lets BLAS take its contractions; it is one of (each checked):
  S1. a contraction `blas_call` accepts alone and one element-wise (MAP) consumer of it, as an
      epilogue group or a stitched row: the consumer then reads the stored product (a MAP
      kernel; schedule/cpu_contraction.py `cpu_groups` keeps the group whole instead where the
      register tile applies the consumer at its store: schedule/cpu_epilogue.py). A stitched group
      with another reduction (a softmax row) keeps its rows on chip;
  S2. a horizontal group (neither stitched nor an epilogue) of contractions, each of which
      `blas_call` accepts alone.

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
from ..poly.statement import Form
from .contraction import is_contraction
from .cpu_gemm import Gemm, gemm_calls

BLAS_MIN_FLOPS = 1 << 12  # 2 M N K: e.g. 8 x 16 x 16


@dataclass(frozen=True)
class Operand:
    """One factor of the product: the buffer it is stored in and the views that place its axes
    on the iteration space (("transpose", perm) or ("reshape", shape), innermost first)."""

    key: str
    shape: tuple[int, ...]
    views: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class MatmulForm:
    """The einsum `a,b->out` as one np.matmul: each operand transposed to (batch, own, contracted)
    labels (b: (batch, contracted, own)) and reshaped to 3-D; the product's (batch, a's own,
    b's own) labels transposed back to `out`'s order by `perm`."""

    a_perm: tuple[int, ...]
    a_shape: tuple[int, int, int]
    b_perm: tuple[int, ...]
    b_shape: tuple[int, int, int]
    mid_shape: tuple[int, ...]
    perm: tuple[int, ...]


def matmul_form(subscripts: str, shapes: tuple[tuple[int, ...], ...]) -> MatmulForm | None:
    """The matmul of an einsum over two operands, or None where a label is summed in one operand
    alone (no matmul role).

    >>> matmul_form("ab,bc->ac", ((2, 3), (3, 4))).a_shape
    (1, 2, 3)
    """
    (sa, sb), out = subscripts.split("->")[0].split(","), subscripts.split("->")[1]
    ext = dict(zip(sa, shapes[0])) | dict(zip(sb, shapes[1]))
    batch = [c for c in out if c in sa and c in sb]
    own_a, own_b = [c for c in out if c in sa and c not in sb], [c for c in out if c in sb and c not in sa]
    con = [c for c in sa if c in sb and c not in out]
    if any(c not in out and c not in sb for c in sa) or any(c not in out and c not in sa for c in sb):
        return None

    def n(labels) -> int:
        return math.prod(ext[c] for c in labels)

    order = batch + own_a + own_b
    return MatmulForm(
        tuple(sa.index(c) for c in batch + own_a + con),
        (n(batch), n(own_a), n(con)),
        tuple(sb.index(c) for c in batch + con + own_b),
        (n(batch), n(con), n(own_b)),
        tuple(ext[c] for c in order),
        tuple(order.index(c) for c in out),
    )


def _view(op: Operand, role: tuple) -> tuple:
    """(operand shape, its views, perm, 3-D shape): how `op` becomes its matmul operand (cpu_gemm.py)."""
    return (op.shape, op.views, *role)


def _strided(op: Operand, itemsize: int, perm: tuple[int, ...], shape: tuple[int, ...]) -> tuple | None:
    """(shape, byte strides) of operand `op`'s matmul view of its flat buffer, found once on a
    stand-in array; None where a step of the chain copies (then each call builds the view)."""
    base = np.empty(op.shape, np.dtype(f"u{itemsize}"))
    v = base
    for kind, arg in op.views:
        v = v.transpose(arg) if kind == "transpose" else v.reshape(arg)
    v = v.squeeze(tuple(k for k, e in enumerate(v.shape) if e == 1)).transpose(perm).reshape(shape)
    same = v.__array_interface__["data"][0] == base.__array_interface__["data"][0] and np.shares_memory(v, base)
    return (v.shape, v.strides) if same else None


@dataclass(frozen=True)
class BlasCall:
    """`out = einsum(subscripts, *operands)`, reshaped to `out_shape`, into buffer `out_key`,
    computed as `form` (one np.matmul) where it has one."""

    subscripts: str
    operands: tuple[Operand, ...]
    out_key: str
    out_shape: tuple[int, ...]
    flops: int
    form: MatmulForm | None = None
    strided: tuple | None = None  # each operand's (shape, strides) under `form`, where no step copies
    gemm: Gemm | None = None  # the same product as gemm calls from C (runtime/cpu_gemm.py), where it is one

    def run(self, arrays: list[np.ndarray], out: np.ndarray) -> None:
        """Compute into `out` (flat, the group's output buffer) from the operands' flat buffers."""
        f, st = self.form, self.strided
        if st is not None:  # the views precomputed: about 1 us of Python around the matmul
            (sa, da), (sb, db) = st
            a, b = np.ndarray(sa, arrays[0].dtype, arrays[0], 0, da), np.ndarray(sb, arrays[1].dtype, arrays[1], 0, db)
            if f.perm == tuple(range(len(f.perm))):
                np.matmul(a, b, out=out.reshape(a.shape[0], a.shape[1], b.shape[2]))
            else:
                np.copyto(out.reshape(self.out_shape), np.matmul(a, b).reshape(f.mid_shape).transpose(f.perm))
            return
        views = []
        for op, a in zip(self.operands, arrays):
            v = a.reshape(op.shape)
            for kind, arg in op.views:
                v = v.transpose(arg) if kind == "transpose" else v.reshape(arg)
            views.append(v.squeeze(tuple(k for k, e in enumerate(v.shape) if e == 1)))
        if f is None:
            r = np.einsum(self.subscripts, *views, optimize=True)
        else:
            a = views[0].transpose(f.a_perm).reshape(f.a_shape)
            b = views[1].transpose(f.b_perm).reshape(f.b_shape)
            r = np.matmul(a, b).reshape(f.mid_shape).transpose(f.perm)
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
    sub = f"{subs[0]},{subs[1]}->{out}"
    shapes = tuple(tuple(e for e in f.shape if e != 1) for f in prod.inputs)
    form = matmul_form(sub, shapes)
    strided = None
    if form is not None:
        size = node.dtype.itemsize
        pair = (_strided(operands[0], size, form.a_perm, form.a_shape),
                _strided(operands[1], size, form.b_perm, form.b_shape))  # fmt: skip
        strided = pair if None not in pair else None
    gemm = None
    if form is not None:
        views = tuple(
            _view(op, f) for op, f in zip(operands, ((form.a_perm, form.a_shape), (form.b_perm, form.b_shape)))
        )
        gemm = gemm_calls(form, views, strided, tuple(node.shape), node.dtype.itemsize)
    return BlasCall(sub, tuple(operands), f"out:{node.uid}", tuple(node.shape), flops, form, strided, gemm)


def split_for_blas(group: KernelGroup) -> tuple[KernelGroup, ...]:
    """`group` as one group per statement where that lets BLAS run its contractions (module
    docstring: S1-S2), else `(group,)`.

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> a, b = pn.placeholder((64, 64), name="a"), pn.placeholder((64, 64), name="b")
    >>> g = lower(pn.maximum(a @ b, 0.0), stop_after="groups", target="emulator").groups[0]
    >>> [len(x.statements) for x in split_for_blas(g)] if g.epilogue else [1, 1]
    [1, 1]
    """
    if len(group.statements) < 2:
        return (group,)
    alone = tuple(KernelGroup((st,)) for st in group.statements)
    if group.stitched or group.epilogue:  # S1: one contraction and one element-wise consumer
        ok = len(alone) == 2 and blas_call(alone[0]) is not None and group.statements[1].form == Form.MAP
    else:  # S2: independent contractions
        ok = all(blas_call(g) is not None for g in alone)
    return alone if ok else (group,)
