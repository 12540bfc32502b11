"""The CPU model's cost of a struct accumulator whose combine does not vectorize (online
softmax's log-sum-exp): each element's combine runs one lane at a time with its own instructions
and exps (algebra.ONLINE_LSE: 8 and 2), not one scalar add. Costed as one add, the online
formulation looked as cheap as the two passes, and vit's second softmax took it: 17-wide rows,
~3x slower than max + sum passes (measured here: 34x17 19 vs 6 us, 256x64 350 vs 17 us)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import panamera as pn
from panamera.algebra import ONLINE_LSE
from panamera.compiler import lower
from panamera.model.cpu import CpuModel, CpuWork, element_ns
from panamera.schedule.cpu_cost import work


def _lse_group(m: int, n: int):
    x = pn.placeholder((m, n), "float32")
    outs = lower(pn.nn.softmax(x, method="online"), stop_after="groups", target="cpu").groups
    return next(g for g in outs if any(s.acc is not None and s.acc.is_struct for s in g.statements if s.acc))


def test_online_lse_combine_costed_per_lane_with_its_exps():
    w = work(_lse_group(34, 17))
    assert w.struct and w.struct_ops == (float(ONLINE_LSE.merge_instructions), float(ONLINE_LSE.merge_transcendentals))
    r = CpuModel.nominal(cores=1, simd_bytes=64).rates
    plain = replace(w, struct_ops=(1.0, 0.0))  # the former cost: one scalar add a lane
    extra = (r.add_ns * (ONLINE_LSE.merge_instructions - 1) + r.exp_ns * ONLINE_LSE.merge_transcendentals) * 16
    assert element_ns(w, r, 16) == pytest.approx(element_ns(plain, r, 16) + extra)
    assert element_ns(CpuWork(M=1, N=8, elements=8, read_bytes=32, write_bytes=4), r, 16) == r.add_ns  # no struct


@pytest.mark.parametrize("shape", [(34, 17), (256, 64)])
def test_softmax_on_short_rows_takes_the_two_passes(shape):
    k = pn.compile(pn.nn.softmax(pn.placeholder(shape, "float32")), target="cpu")
    (f,) = k.formulations
    online, multipass = (f.costs_us[f.names.index(n)] for n in ("online", "multipass"))
    assert f.chosen == "multipass" and online > 1.5 * multipass, f.describe()


@pytest.mark.parametrize("split", [None, 1])
def test_formulation_cost_is_the_rendered_plans_modeled_time(split):
    """The formulation stage stages each alternative with the options the plan renders with (cpu_target.py
    `compile_cpu`): under split= (no stitching) the chosen form's cost is the 3-kernel plan's time, not
    the emulator grouping's one stitched kernel (131 vs 79 us modeled for [64x3000] before)."""
    k = pn.compile(pn.nn.softmax(pn.placeholder((64, 3000), "float32")), target="cpu", cache=False, split=split)
    (f,) = k.formulations
    assert f.costs_us[f.names.index(f.chosen)] == pytest.approx(k.modeled().total_us, rel=1e-9)
