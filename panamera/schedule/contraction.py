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

import islpy as isl

from ..poly.access import AccessKind, access_kind
from ..poly.bounded import proven_empty
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
    reading one address share the request; a register tile's rows share the load of every read
    the mapping marks shared along them (`d.rshared` along its rtile rows, `d.cshared` along
    its ctile consecutive rows): one request per tile."""
    total = 0.0
    for n, st in enumerate(group.statements):
        if not is_contraction(st):
            continue
        share = d.ty if d.form in (Form.ROW, Form.ALL) else d.tx * d.vec
        for k, r in enumerate(st.reads):
            if not r.memory:
                continue
            item = r.tensor.dtype.itemsize
            requested = st.M * st.N * item / (share if _uniform(st, k, "i", share) else 1)
            if d.rshared and d.rshared[n][k]:
                requested /= d.rtile
            if d.cshared and d.cshared[n][k]:
                requested /= d.ctile
            total += max(0.0, requested - r.tensor.size * item)
    return total


def row_strides(st: Statement) -> tuple[int, ...]:
    """Candidate distances between the rows of a register tile, smallest first: the products of
    the result's trailing extents (for `x @ W.T`, N: the rows (m, n) and (m + 1, n) read the
    same weight row) that divide the statement's rows and leave at least two tile rows.

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> a = lower(pn.placeholder((4, 64), name="x") @ pn.placeholder((32, 64), name="w").T,
    ...           stop_after="groups", target="emulator")
    >>> row_strides(a.groups[0].statements[0])
    (32,)
    """
    out, p = [], 1
    for e in reversed(st.result.shape[1:]):
        p *= e
        if 1 < p < st.M and st.M % p == 0:
            out.append(p)
    return tuple(dict.fromkeys(out))


def shared_along_rows(st: Statement, k: int, stride: int, within: int = 0) -> bool:
    """Whether read k of `st` is UNIFORM along the rows of a register tile of this stride: rows
    i and i + stride of the domain always read one address (isl decides), so one load serves
    every row of the tile (an index read, iota, is computed once; not shared when isl cannot tell
    within its bounded work, poly/bounded.py). `within` > 0 asks it only of
    the aligned groups of `within` consecutive rows (a tile of consecutive rows, stride 1: the
    rows (m, n) and (m, n + 1) of `x @ W.T` read one activation). A gathered (indirect) read is
    never shared."""
    r = st.reads[k]
    if r.indirect is not None or stride <= 0 or stride >= st.M:
        return False
    key = ("rows", st.name, k, st.M, st.N, stride, within, str(r.addr))
    if key not in _CACHE:
        dom = st.domain.reset_tuple_id()
        ctx = dom.get_ctx()
        v = isl.make_zero_and_vars(["i", "j"], [], ctx=ctx)
        sp = isl.Space.create_from_names(ctx, in_=["i", "j"], out=["i", "j"])
        ma = isl.MultiAff.identity(sp)
        ma = ma.set_aff(0, ma.get_aff(0).add_constant_val(isl.Val.int_from_si(ctx, stride)))
        inside = dom & v["i"].lt_set(v[0] + (st.M - stride))
        if within > 1:
            inside = inside & v["i"].mod_val(isl.Val.int_from_si(ctx, within)).ne_set(v[0] + (within - 1))
        # isl's work is capped (poly/bounded.py): not shared when it cannot tell
        _CACHE[key] = proven_empty(ctx, lambda: (r.addr.pullback_multi_aff(ma) - r.addr).ne_set(v[0]) & inside)
    return _CACHE[key]
