"""Which contractions tensor cores may run, and their operands: the legality half of issue 25's
tensor-core path (the tiling, its cost and its merge are schedule/tc_tiling.py's, which imports
this module; nothing here knows a tile).

A contraction statement (frontend/contract.py) is a ROW sum over k of `mul(a, b)`, its outputs
i = r * P + c (r the rows of the first operand, c the P columns of the second). `analyse` finds
its rows' factor `a` and its columns' factor `b` (each with its fused producers: a dequantized
weight `w.astype(float32) * scale`) and the MMA operand type they are staged as (`Mma`).

Preconditions (`analyse` returns the first that fails, by number; one negative test each in
tests/test_tensor_core.py):
  1. the group is one contraction (a SUM of a product, ROW form), possibly followed by
     element-wise consumers of its outputs at their own index (poly/epilogue.py's `joins`: an
     epilogue group, or a stitched group of that shape), applied where an output is final;
  2. its outputs are rows x columns of the second operand's extent P (ContractionInfo.N), and
     isl proves one factor of the product reads the same address for the P columns of a row and
     the other the same address for every row (a plain `x @ W.T`, no batch axis both operands
     vary with), without gathers;
  3. the operand types fit an MMA: both int8 with an int32 accumulator (s8), or one 16-bit float
     type (float16 or bfloat16) that the other factor has too or that the other factor is
     dequantized into (an expression of 1-byte integer weights and at most 16-bit scales; the
     dequantized value is rounded to the 16-bit type before the MMA, as Marlin does).

The choice between tensor cores and CUDA cores is the model's (schedule/search.py compares the
two best candidates) and is carried as data on the decision (`Decision.mma`, `mma_tile` and
`mma_land`: schedule/tc_tiling.py).

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> x, w = pn.placeholder((32, 64), "float16", name="x"), pn.placeholder((48, 64), "float16", name="w")
>>> a = lower(x @ w.T, stop_after="groups", target="emulator")
>>> ops = analyse(a.groups[0])
>>> ops.kind, ops.rows, ops.cols, ops.K
(<Mma.F16: 'f16'>, 32, 48, 64)
>>> analyse(lower(pn.placeholder((4, 8)) @ pn.placeholder((16, 8)).T, stop_after="groups", target="emulator").groups[0])
'3: operand types float32 x float32 have no MMA (16-bit floats, or int8 x int8)'
"""

from __future__ import annotations

from dataclasses import dataclass

from ..algebra import SUM
from ..enums import StrEnum
from ..poly.epilogue import joins
from ..poly.expr import Expr
from ..poly.program import KernelGroup
from ..poly.statement import Form, StatementKind
from .contraction import contraction_info, is_contraction, shared_along_rows

FRAG = 16  # an MMA's K step and fragment side (wmma m16n16k16; wgmma's k16 and core-matrix pairs)


class Mma(StrEnum):
    """The MMA's operand type: its C type and the accumulator's."""

    F16 = "f16"
    BF16 = "bf16"
    S8 = "s8"

    @property
    def ctype(self) -> str:
        return {"f16": "__half", "bf16": "__nv_bfloat16", "s8": "signed char"}[self.value]

    @property
    def acc_ctype(self) -> str:
        return "int" if self is Mma.S8 else "float"

    @property
    def itemsize(self) -> int:
        return 1 if self is Mma.S8 else 2

    @property
    def dtype(self) -> str:
        """The name model/library.py's tensor-core peaks use."""
        return {"f16": "float16", "bf16": "bfloat16", "s8": "int8"}[self.value]


@dataclass(frozen=True)
class Operands:
    """A contraction that tensor cores can run: `a` the rows' factor (r), `b` the columns' (c),
    each the expression before its conversion to the accumulator."""

    kind: Mma
    a: Expr
    b: Expr
    rows: int
    cols: int
    K: int


def _strip(e: Expr, acc) -> Expr:
    while e.op == "cast" and e.dtype == acc and e.args:
        e = e.args[0]
    return e


def operand_reads(e: Expr) -> list[int]:
    """The statement's read indices an operand expression loads, in order."""
    return sorted({n.read for n in e.walk() if n.op == "load"})


def analyse(group: KernelGroup) -> Operands | str:
    """The operands of a contraction tensor cores can run, or the precondition (module
    docstring) it fails, as "N: why"."""
    reds = [s for s in group.statements if s.kind == StatementKind.REDUCE]
    if len(reds) != 1 or group.statements[0] is not reds[0] or not _joiners_only(group):
        return "1: not one contraction with at most element-wise consumers of its outputs"
    st = reds[0]
    if not is_contraction(st) or st.combiner is not SUM or st.body.op != "mul" or group.form != Form.ROW:
        return "1: not a ROW sum of a product"
    info = contraction_info(group)
    P = info.N
    if P < 1 or st.M % P:
        return f"2: {st.M} outputs are not rows of {P} columns"
    Q = st.M // P
    factors = [_strip(x, st.acc) for x in st.body.args]
    if any(st.reads[r].indirect is not None for r in range(len(st.reads))):
        return "2: a gathered read"

    def along_columns(e: Expr) -> bool:  # the same address for the P columns of a row
        return P == 1 or all(shared_along_rows(st, r, 1, within=P) for r in operand_reads(e))

    def along_rows(e: Expr) -> bool:  # the same address for every row
        return Q == 1 or all(shared_along_rows(st, r, P) for r in operand_reads(e))

    order = next(((a, b) for a, b in (factors, factors[::-1]) if along_columns(a) and along_rows(b)), None)
    if order is None:
        return "2: isl does not prove the factors are a rows' operand and a columns' operand (x @ W.T)"
    a, b = order
    kind = _kind(st, a, b)
    if not isinstance(kind, Mma):  # the failed precondition
        return kind
    return Operands(kind, a, b, Q, P, st.N)


def _joiners_only(group: KernelGroup) -> bool:
    """Every statement after the head is an element-wise consumer of its outputs at their own
    index (poly/epilogue.py's `joins`): an epilogue group, or a stitched group that is one (a
    bias, an activation, numpy's int8 wrap of an int32 sum)."""
    head = group.statements[0]
    members = {head.result.uid: head}
    for st in group.statements[1:]:
        if not joins(st, head, members, {head.result.uid}):
            return False
        members[st.result.uid] = st
    return True


def _kind(st, a: Expr, b: Expr) -> Mma | str:
    da, db = a.dtype, b.dtype
    if st.acc.name == "int32" and da.name == db.name == "int8":
        return Mma.S8
    halves = {d.name for d in (da, db) if d.is_16bit_float}
    if st.acc.name == "float32" and len(halves) == 1:
        half = halves.pop()
        other = b if da.is_16bit_float and da.name == half else a
        if other.dtype.name == half or _dequantized(other, st):
            return Mma.F16 if half == "float16" else Mma.BF16
    return f"3: operand types {da.name} x {db.name} have no MMA (16-bit floats, or int8 x int8)"


def _dequantized(e: Expr, st) -> bool:
    """An expression of 1-byte integer weights (and at most 16-bit scales or constants)."""
    loads = [st.reads[n.read].tensor.dtype for n in e.walk() if n.op == "load" and st.reads[n.read].memory]
    return any(d.itemsize == 1 and not d.is_float for d in loads) and all(d.itemsize <= 2 for d in loads)
