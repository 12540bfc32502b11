"""What the model must know of a contraction (frontend/contract.py) that other reductions lack:
its operands are re-read, and it may be compute-bound.

A reduction's rows read their own data once; a contraction's rows share an operand (the rows
m = 0..M-1 of `x @ W.T` all read W). DRAM moves each operand once (the re-reads hit L2), but the
re-reads are L2 traffic the model must count: `l2_bytes` is the bytes every block requests
beyond the distinct bytes, where the rows or lanes of one block that read one address (isl's
UNIFORM access over the block's extent along i) share a single request.

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> x, w = pn.placeholder((4, 256), name="x"), pn.placeholder((64, 256), name="w")
>>> a = lower(x @ w.T, stop_after="mappings", target="emulator")
>>> info = contraction_info(a.groups[0])
>>> (info.M, info.N, info.K, info.flops), l2_bytes(a.groups[0], a.mappings[0]) > 0
((4, 64, 256, 131072), True)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..poly.access import AccessKind, access_kind
from ..poly.program import KernelGroup
from ..poly.statement import Form, Statement

_CACHE: dict = {}


@dataclass(frozen=True)
class ContractionInfo:
    """A contraction statement's sizes: outputs M x N (M the rows, N the rest), K contracted."""

    subscripts: str
    M: int
    N: int
    K: int
    dtype: str  # the operands' promoted dtype (the library's tensor-core path)
    out_itemsize: int

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K


def is_contraction(st: Statement) -> bool:
    return st.result.attr("contraction") is not None


def contraction_info(group: KernelGroup) -> ContractionInfo | None:
    """The first contraction of the group, its outputs split as (rows of the first operand, the
    rest) from the reduce's kept extents; None without one."""
    for st in group.statements:
        if not is_contraction(st):
            continue
        sub = st.result.attr("contraction")
        loads = [r.tensor for r in st.reads if r.memory]
        dt = max((t.dtype for t in loads), key=lambda d: d.itemsize).name if loads else "float32"
        outputs = st.M
        K = st.N
        lhs, _, out = sub.partition("->")
        first = lhs.split(",")[0]
        n_labels = [c for c in out if c not in first] or [""]
        # N: the output extent of the labels only the second operand has (the weights' rows)
        shape = st.result.shape
        n = 1
        for c, e in zip(out, shape):
            if c in n_labels:
                n *= e
        n = max(1, n)
        return ContractionInfo(sub, max(1, outputs // n), n, K, dt, st.result.dtype.itemsize)
    return None


def _uniform(st: Statement, k: int, along: str, width: int) -> bool:
    key = (st.name, k, st.M, st.N, along, width, str(st.reads[k].addr))
    if key not in _CACHE:
        extent = st.M if along == "i" else st.N
        ok = width > 1 and extent % width == 0
        _CACHE[key] = ok and access_kind(st.reads[k], along, width, st.domain) == AccessKind.UNIFORM
    return _CACHE[key]


def l2_bytes(group: KernelGroup, d) -> float:
    """Bytes the group's contractions request beyond each operand's distinct bytes (re-reads
    served by L2). Rows of one block (ROW: its ty rows; COLUMN: its tx x vec lanes along i)
    reading one address share the request."""
    total = 0.0
    for st in group.statements:
        if not is_contraction(st):
            continue
        share = d.ty if d.form in (Form.ROW, Form.ALL) else d.tx * d.vec
        for k, r in enumerate(st.reads):
            if not r.memory:
                continue
            item = r.tensor.dtype.itemsize
            requested = st.M * st.N * item / (share if _uniform(st, k, "i", share) else 1)
            total += max(0.0, requested - r.tensor.size * item)
    return total
