"""Rows kept on chip (schedule/onchip.py): a stitched group's later passes read the vectors pass 0
loaded, from registers or shared memory, and give the re-reading plan's values."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import need_nvcc
from test_stitched_split import assert_close, case

import panamera as pn
from panamera.errors import ScheduleError
from panamera.model import H100
from panamera.runtime import nvcc
from panamera.schedule.cost import stitched_cost
from panamera.schedule.decision import Residence
from panamera.schedule.mapping import map_group
from panamera.schedule.onchip import kept_bytes, kept_reads, problem

ORDERS = ("forward", "reverse", "shuffled")


def compile_with(outputs, split: int, res: Residence, cluster: bool | None = None, **kw):
    """The model's plan with its stitched group split `split` ways (`cluster`: forced one
    thread-block cluster per row, or none) and its rows kept in `res` (a replayed schedule:
    validated as any saved one)."""
    k = pn.compile(outputs, target="emulator", use_database=False)
    kernels = tuple(
        dataclasses.replace(map_group(g, k.gpu, split=split, cluster=cluster).decision, onchip=res, **kw)
        if g.stitched
        else m.decision
        for g, m in zip(k.groups, k.mappings)
    )
    return pn.compile(outputs, target="emulator", schedule=dataclasses.replace(k.schedule, kernels=kernels))


CASES = [
    ("softmax", (2, 4096), "float32", 1, Residence.REGISTERS),
    ("log_softmax", (3, 2048), "float16", 1, Residence.SHARED),
    ("softmax", (2, 8192), "float32", 4, Residence.SHARED),  # blocks interleave at the grid-wide waits
    ("rms_norm", (2, 8192), "bfloat16", 4, Residence.REGISTERS),
    ("layer_norm", (1, 8192), "float32", 2, Residence.SHARED),
    ("cross_entropy_multipass", (2, 8192), "float32", 2, Residence.REGISTERS),  # online: one pass, nothing kept
]


@pytest.mark.parametrize("op,shape,dtype,split,res", CASES, ids=[f"{c[0]}-{c[2]}-s{c[3]}-{c[4]}" for c in CASES])
def test_rows_on_chip_equal_the_rereading_plan(op, shape, dtype, split, res, rng):
    outputs, arrays, ref = case(op, shape, dtype, rng)
    kept = compile_with(outputs, split, res)
    reread = compile_with(outputs, split, Residence.MEMORY)
    (m,) = [m for m in kept.mappings if m.stitched]
    assert m.onchip == res and m.split == split
    assert "pn_row" in kept.source and "pn_row" not in reread.source
    expect = reread(*arrays)
    assert_close(expect, ref, dtype, shape[1])
    for order in ORDERS:
        out = kept(*arrays, order=order, seed=7)
        assert_close(out, ref, dtype, shape[1])
        np.testing.assert_array_equal(out, expect)  # same loads, same order of accumulation


def test_the_model_counts_only_the_bytes_really_reread():
    x = pn.placeholder((64, 8192), "float32", name="x")
    k = pn.compile(pn.nn.softmax(x), target="emulator", use_database=False)
    (g,) = [g for g in k.groups if g.stitched]
    d = map_group(g, H100, split=1).decision
    assert kept_bytes(g, d.vec) == 64 * 8192 * 4  # x, read in both passes
    costs = {r: stitched_cost(g, H100, dataclasses.replace(d, onchip=r)) for r in Residence}
    reread = dict(costs[Residence.MEMORY].features)
    for r in (Residence.REGISTERS, Residence.SHARED):
        f = dict(costs[r].features)
        assert f["dram_bytes"] + f["l2_bytes"] == reread["dram_bytes"] + reread["l2_bytes"] - 64 * 8192 * 4


def test_the_mapper_keeps_long_rows_on_chip():
    k = pn.compile(pn.nn.softmax(pn.placeholder((8, 128256), "float32")), target="emulator", use_database=False)
    (m,) = k.mappings
    assert m.onchip != Residence.MEMORY and "rows in" in k.explain()


@pytest.mark.parametrize("res", [Residence.REGISTERS, Residence.SHARED])
def test_kept_rows_compile_for_sm80_and_sm90_without_spills(res, rng):
    need_nvcc()
    outputs, _, _ = case("rms_norm", (2, 8192), "bfloat16", rng)
    k = compile_with(outputs, 4, res)
    for r in nvcc.compile_cuda(k.source):
        assert r.spill_stores == 0 and r.spill_loads == 0, r


# -- one negative test per precondition (schedule/onchip.py) ------------------------------------
def test_precondition_1_only_a_stitched_group_keeps_rows():
    y = pn.sum(pn.placeholder((2, 4096), "float32", name="x"), axis=1)
    k = pn.compile(y, target="emulator", use_database=False)
    kernels = tuple(dataclasses.replace(m.decision, onchip=Residence.REGISTERS) for m in k.mappings)
    with pytest.raises(ScheduleError, match="precondition 1"):
        pn.compile(y, target="emulator", schedule=dataclasses.replace(k.schedule, kernels=kernels))


def test_precondition_2_scalar_loads_are_not_kept(rng):
    outputs, _, _ = case("softmax", (2, 1023), "float32", rng)  # an odd row: vec 1
    with pytest.raises(ScheduleError, match="precondition 2"):
        compile_with(outputs, 1, Residence.REGISTERS)


def test_precondition_3_a_later_pass_must_reread_a_pass_0_load():
    x = pn.placeholder((2, 4096), "float32", name="x")
    y = pn.placeholder((2, 4096), "float32", name="y")
    s = pn.sum(x, axis=1, keepdims=True)
    k = pn.compile(y / s, target="emulator", use_database=False)
    (g,) = [g for g in k.groups if g.stitched]
    assert kept_reads(g, 4) == ()
    with pytest.raises(ScheduleError, match="precondition 3"):
        compile_with(y / s, 1, Residence.SHARED)


def test_precondition_4_the_row_must_fit(rng):
    outputs, _, _ = case("softmax", (2, 65536), "float32", rng)
    with pytest.raises(ScheduleError, match="precondition 4"):
        compile_with(outputs, 1, Residence.REGISTERS)
    with pytest.raises(ScheduleError, match="precondition 4"):
        compile_with(outputs, 1, Residence.SHARED)


def test_precondition_5_a_cooperative_split_stays_co_resident(rng):
    """150 x 2 blocks of 256 threads: 4 per SM under the launch bounds, 2 with the row kept in
    registers (264 on an H100). A replayed schedule meets the launch rule first (mapping.replay 2),
    which counts the same residency (`derived.resident_per_sm`)."""
    outputs, _, _ = case("softmax", (300, 8192), "float32", rng)
    k = pn.compile(outputs, target="emulator", use_database=False)
    g = next(g for g in k.groups if g.stitched)
    d = map_group(g, H100, split=2, cluster=False).decision  # a cooperative split, not a cluster
    assert d.blocks == 300 and problem(g, d, H100, Residence.MEMORY) == ""
    assert problem(g, d, H100, Residence.REGISTERS).startswith("5: the split's 300 blocks are not co-resident")
    with pytest.raises(ScheduleError, match="not all co-resident on H100-SXM5 \\(at most 264\\)"):
        compile_with(outputs, 2, Residence.REGISTERS, cluster=False)


def test_precondition_1_column_partials_keep_no_row(rng):
    """A joined LayerNorm backward (column partials on a persistent row loop) replayed with its rows
    kept on chip: refused, not a kernel that reads a kept row outside its loop."""
    from test_row_columns import FLOORED, _with, layer_norm_backward

    outs = layer_norm_backward(64, 64)  # one launch on an H100 whose launches all pay the floor (test_row_columns)
    k = pn.compile(outs, target="emulator", cache=False, use_database=False, gpu=FLOORED)
    assert k.groups[0].columns, "the join is the model's plan at this size"
    with pytest.raises(ScheduleError, match="precondition 1"):
        pn.compile(outs, target="emulator", schedule=_with(k, onchip=Residence.REGISTERS), use_database=False)
