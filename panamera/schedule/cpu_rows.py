"""How many rows a split-free ROW group's passes scan at once (the decision's `rows`; the code:
codegen/cpu_interleave.py). A short row's passes are chains (softmax: max -> fold -> exp -> sum ->
fold -> reciprocal): each fold of a reduction's W lanes is log2(W) dependent steps (model/cpu.py
`combine_ns`), and with one row a scan the core overlaps about one row at a time. R rows side by
side in one scan give it R independent chains; the model charges each row's combines / R
(`CpuWork.rows`) and the plan takes R when that saves at least GAIN of the kernel's modeled time.

Preconditions (else 1 row), each with a negative test in tests/test_cpu_rows.py:
1. the group is a ROW group not split (one task a row; a split row merges partials instead);
2. it has at least 2 rows;
3. every reduction's lanes are plain or NaN-watched (LaneKind.PLAIN / FLAGGED): a struct accumulator
   (Welford, log-sum-exp) has no lanes to step side by side, and an argmax's (value, index) lanes
   are not interleaved (measured: layer_norm's Welford rows run one after the other, 0.99-1.01x);
4. R x the lane vectors of the widest pass (cpu_lane_kind.py's `pass_vectors` a reduction, twice
   for a NaN watch) fit half the ISA's vector registers (`row_registers`: 16 of AVX-512's 32, 8 of
   AVX2's 16): softmax [6144x128] at 1 thread, CPU time, loaded machine (AVX-512): R = 2 (16
   vectors) 0.97-0.99x of one row, R = 4 (32, spilling) 1.05-1.24x;
5. the model finds R rows at least GAIN faster.

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> from panamera.model.cpu import CpuModel
>>> g = lower(pn.sum(pn.placeholder((1024, 128)), axis=-1), stop_after="groups", target="emulator").groups[0]
>>> choose_rows(g, 1, 16, (), CpuModel.nominal(cores=2, simd_bytes=64))  # 4 rows x 4 vectors of lanes
4
"""

from __future__ import annotations

from ..model.cpu import CpuModel, kernel_time
from ..poly.program import KernelGroup
from ..poly.statement import Form, StatementKind
from ..poly.stitch import levels
from .cpu_lane_kind import LaneKind, group_vectors, lane_kind
from .cpu_reuse import Reuse

GAIN = 0.02  # the modeled saving that makes R rows worth their longer code
CANDIDATES = (4, 3, 2)


def lane_vectors(g: KernelGroup) -> int:
    """The vector registers of accumulator lanes one row's widest pass holds (0: no reduction):
    each reduction's registers of its pass (cpu_lane_kind.py `group_vectors`), twice for a NaN watch."""
    lv = levels(g.statements) if g.stitched else {}
    vectors = group_vectors(g)
    per = [0] * len(vectors)
    for k, s in enumerate(g.statements):
        if k in g.accumulators and not (s.kind == StatementKind.MAP and s.form == Form.MAP):
            p = lv.get(s.name, 0)
            per[p] += vectors[p] * (2 if lane_kind(s) == LaneKind.FLAGGED else 1)
    return max(per, default=0)


def row_registers(model: CpuModel) -> int:
    """The vector registers R rows' lanes may take: half the ISA's (AVX-512: 32 registers of 64
    bytes; AVX2 and narrower: 16), the rest for the bodies (exp's constants and temporaries). On
    AVX2 softmax's NaN-watched max (8 vectors) is then one row a pass: softmax [6144x128] measured
    the same as two rows (AMD EPYC, 1 thread, 2026-11-25, load 11), whose 16 vectors are every
    register AVX2 has."""
    return (32 if model.simd_bytes >= 64 else 16) // 2


def choose_rows(g: KernelGroup, split: int, lanes: int, reuse: tuple[Reuse, ...], model: CpuModel) -> int:
    """The rows a pass of group `g` scans at once under `split` (module docstring: preconditions)."""
    from .cpu_cost import work  # cpu_cost imports the mapper's types

    if g.form != Form.ROW or split != 1 or g.M < 2:  # 1, 2
        return 1
    reductions = [g.statements[k] for k in g.accumulators if g.statements[k].kind == StatementKind.REDUCE]
    if not reductions or any(lane_kind(s) not in (LaneKind.PLAIN, LaneKind.FLAGGED) for s in reductions):  # 3
        return 1
    vectors = lane_vectors(g)
    fits = [r for r in CANDIDATES if r * vectors <= row_registers(model) and r <= g.M]  # 4
    if not fits:
        return 1
    r = fits[0]

    def took(rows: int) -> float:
        return kernel_time(work(g, reuse, rows), model, g.M, 1, 1, lanes).total_us

    return r if took(r) <= took(1) * (1 - GAIN) else 1  # 5
