"""Whether a CPU row scan prefetches its first pass's input rows ahead of the loads (the decision's
`prefetch`; the code: codegen/cpu_lanes.py `prefetch_lines`). A row scan whose data come from L3 or
beyond (each call sweeps more than L2 holds) runs at the rate the hardware prefetcher streams lines
into L1; software prefetches PREFETCH_BYTES ahead of the loads, one a cache line, keep more lines in
flight. Measured at 1 thread, thread CPU time, interleaved rounds (2026-11-25, load 1.5; kernel level,
the generated source with and without the prefetches): argmax [64x30522] 295 -> 277 us (numpy 286),
softmax [64x30522] 1325 -> 1257 us (the max pass only), softmax [6144x128] at 2 rows a scan 419 -> 397
us (ORT 401). The model charges the first pass's stream PREFETCH_GAIN faster while the L3 serves part of
it and PREFETCH_DRAM (slower: sums over 25-67 MB measured 0.82-0.89) once it streams wholly from DRAM
(model/cpu.py `prefetch_gain`).

Preconditions (else no prefetch), each with a negative test in tests/test_cpu_prefetch.py:
1. the group is a ROW or ALL group (a row scan; a COLUMN scan walks many rows at once);
2. every reduction of its first pass has SIMD lanes (LaneKind PLAIN, FLAGGED or ARG: codegen/cpu_lanes.py's
   main loop, where the prefetches go, one row's or, rows > 1, each row's; a Welford or log-sum-exp scan
   has no such loop);
3. the first pass reads at least one input tensor of at least M x N elements with unit stride along j
   (the rows it streams; a row broadcast to every row, say a weight, stays in L1);
4. the group's bytes do not fit L2 (`CpuModel.level`): from L2 the hardware keeps up.

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> from panamera.model.cpu import CpuModel
>>> m = CpuModel.nominal(cores=2, simd_bytes=64)
>>> lowered = lambda shape: lower(pn.argmax(pn.placeholder(shape), axis=1), stop_after="groups", target="cpu").groups[0]
>>> choose_prefetch(lowered((64, 30522)), m).reads, choose_prefetch(lowered((64, 1000)), m)
(((0, 0),), None)
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from ..model.cpu import CpuModel
from ..poly.program import KernelGroup
from ..poly.statement import Form, StatementKind
from ..poly.stitch import levels
from .cpu_lane_kind import LaneKind, lane_kind

PREFETCH_BYTES = 4096  # how far ahead of the loads (argmax [64x30522]: 1 KiB 280 us, 4 KiB 277)


@dataclass(frozen=True)
class Prefetch:
    """The reads a row scan's first pass prefetches: (statement, read) pairs of unit stride along j,
    each `ahead` bytes beyond the current step, one prefetch a cache line of the step."""

    reads: tuple[tuple[int, int], ...]
    ahead: int = PREFETCH_BYTES


def unit_stride(addr: isl.PwAff) -> bool:
    """Whether an address moves one element per step of j (a row read in order)."""
    pos = addr.get_space().find_dim_by_name(isl.dim_type.in_, "j")
    if pos < 0:
        return False
    return all(aff.get_coefficient_val(isl.dim_type.in_, pos).is_one() for _, aff in addr.get_pieces())


def choose_prefetch(g: KernelGroup, model: CpuModel, threads: int = 1) -> Prefetch | None:
    """The prefetches of group `g`'s first pass on `threads` threads (module docstring:
    preconditions); None: none."""
    from .cpu_cost import work  # cpu_cost imports the mapper's types

    if g.form not in (Form.ROW, Form.ALL):  # 1
        return None
    lv = levels(g.statements) if g.stitched else {}
    first = [k for k, s in enumerate(g.statements) if lv.get(s.name, 0) == 0 and s.kind == StatementKind.REDUCE]
    if not first or any(lane_kind(g.statements[k]) == LaneKind.NONE for k in first):  # 2
        return None
    on_chip, seen, reads = g.on_chip, set(), []
    for k in first:
        for n, r in enumerate(g.statements[k].reads):
            key = (r.tensor.uid, str(r.addr))
            streams = r.tensor.size >= g.M * g.N and unit_stride(r.addr)
            if r.memory and r.indirect is None and r.tensor.uid not in on_chip and streams:
                if key not in seen:
                    seen.add(key)
                    reads.append((k, n))
    if not reads:  # 3
        return None
    if model.level(work(g).bytes, threads) == "L2":  # 4
        return None
    return Prefetch(tuple(reads))
