"""Registers a reduction kernel's thread holds beyond `rtile.registers` (its contiguous vector
loads and tile accumulators): the scalar loads in flight of each unrolled step and a COLUMN
thread's per-lane accumulators, and the unroll the mapper lowers until they fit the launch
bounds (ptxas would spill them otherwise; tests/conftest.py fails a spill).
"""

from __future__ import annotations

import dataclasses

from ..poly.access import AccessKind
from ..poly.program import KernelGroup
from ..poly.statement import Form, StatementKind
from .decision import Decision
from .rtile import register_budget, registers


def scalar_registers(group: KernelGroup, d: Decision) -> int:
    """4-byte registers of one unrolled step's scalar loads of the reductions, each distinct
    read once: a GATHER read one per vector lane and tile row, a UNIFORM one once per tile row.
    `rtile.registers` counts the contiguous vector loads; a contraction with a fused prologue
    (ViT's and BERT's LayerNorm before their MatMuls: ten per-row parameters and statistics per
    step) has many of these, and nvcc hoists all of the unrolled steps' loads."""
    seen, regs = set(), 0
    lanes = {AccessKind.GATHER: d.vec, AccessKind.UNIFORM: 1}
    for k, st in enumerate(group.statements):
        if st.kind != StatementKind.REDUCE or not d.access:
            continue
        for ri, r in enumerate(st.reads):
            key = (r.tensor.uid, str(r.addr))
            if r.memory and d.access[k][ri] in lanes and key not in seen:
                seen.add(key)
                regs += lanes[d.access[k][ri]] * d.rtile * d.ctile * max(1, r.tensor.dtype.itemsize // 4)
    return regs


def loaded_registers(group: KernelGroup, d: Decision) -> int:
    """`rtile.registers` plus the scalar loads in flight and a COLUMN thread's `vec` lanes of
    accumulators (that estimate counts one per reduction)."""
    lanes = (d.vec - 1) * len(group.accumulators) if group.form == Form.COLUMN else 0
    return registers(group, d) + d.unroll * scalar_registers(group, d) + lanes


def fit_unroll(group: KernelGroup, d: Decision) -> Decision:
    """Halve the unroll while the loads in flight would not fit the registers the kernel's launch
    bounds leave (ptxas would spill them): a COLUMN thread's scalar loads (every lane of its vector
    holds its own copy of a gathered value and its own accumulator: where fused prologues spilled),
    and any untiled kernel's vector loads (a split dot product, two float4 reads per step at
    unroll 4 under a 64-register bound, spilled on sm_80 and sm_90). A register tile's candidates
    are `rtile.registers`' to weigh (the search drops those that do not fit)."""
    tiled = d.rtile * d.ctile > 1
    while d.unroll > 1 and not tiled and loaded_registers(group, d) > register_budget(d):
        d = dataclasses.replace(d, unroll=d.unroll // 2)
    return d
