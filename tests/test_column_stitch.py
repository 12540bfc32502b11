"""COLUMN reductions stitched with the consumers of their final values (poly/column_stitch.py,
schedule/row_columns.py `consider_stitch`, codegen/column_stitch.py): BatchNorm backward in NHWC,
the per-channel sums and dx in one cooperative launch. Against numpy float64 in both merges
(atomics read back after a grid-wide wait; deterministic partials, bit-identical across thread
orders), through a replayed persistent grid of several blocks each looping over several row tiles;
one negative test per legality precondition and per replay rule; the model's verdicts."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from conftest import tolerance
from test_batch_norm_backward import bn_backward, check, inputs

import panamera as pn
from panamera.compiler import lower
from panamera.errors import ScheduleError
from panamera.model.gpu import H100
from panamera.poly.column_stitch import column_stitches
from panamera.schedule.decision import MergeMode
from panamera.schedule.hold import with_hold

# one launch at the emulator's small shapes: planned for an H100 whose every launch pays the floor
pytestmark = pytest.mark.usefixtures("launches_pay_the_floor")


def stitches(outputs) -> list[tuple[str, ...]]:
    p = lower(list(outputs), stop_after="program", target="emulator").program
    return [c.names for c in column_stitches(p.statements, p.statement_graph)]


def _with(k, **changes):
    """`k`'s schedule with its stitched decision changed; the tiles it holds restate their dynamic shared
    memory for the new shape (schedule/dynsmem.py precondition 1)."""
    s = k.schedule
    d = dataclasses.replace(s.kernels[0], **changes)
    return dataclasses.replace(s, kernels=(with_hold(k.groups[0], d, d.hold),))


SHAPE = (4, 8, 9, 16)  # N·H·W = 288 rows of 16 channels


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_nhwc_batch_norm_backward_in_one_launch(deterministic, rng):
    """The sums and dx in 1 kernel: 3 blocks looping over the row tiles (replayed), the columns
    merged by atomics or by partials in block order, against numpy float64; deterministic
    results bit-identical across the emulator's thread orders and calls (resident state reset)."""
    outs, _ = bn_backward(SHAPE, "nhwc", "float64")
    k = pn.compile(list(outs), target="emulator", deterministic=deterministic)
    (m,) = k.mappings
    assert len(k.plan.per_call) == 1 and m.stitched and m.grid[0] > 3, k.explain()
    mode = MergeMode.PARTIALS_GRID if deterministic else MergeMode.ATOMIC_GRID
    assert set(m.merges) == {mode, MergeMode.STORE}, m.describe()
    r = pn.compile(list(outs), target="emulator", deterministic=deterministic, schedule=_with(k, persistent=3))
    (launch,) = r.plan.per_call
    assert launch.grid[0] == 3 and launch.cooperative and "pn_tile += gridDim.x" in r.source
    arrays = inputs(SHAPE, "nhwc", "float64", rng)
    runs = [check(r, arrays, "nhwc", "float64", order=o, seed=3) for o in ("reverse", "shuffled", "forward")]
    if deterministic:
        for got in runs[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(runs[0], got))
    assert (
        pn.compile(list(outs), target="emulator", deterministic=deterministic, schedule=r.schedule).source == r.source
    )


def test_bfloat16_and_a_partial_last_tile(rng):
    """bfloat16 in and out (float32 sums), 105 rows in 7 tiles of 16 (the last one partial), 2 blocks."""
    shape = (3, 5, 7, 8)
    outs, _ = bn_backward(shape, "nhwc", "bfloat16")
    k = pn.compile(list(outs), target="emulator")
    assert len(k.plan.per_call) == 1, k.explain()
    r = pn.compile(list(outs), target="emulator", schedule=_with(k, ty=16, grid=(7, 1), persistent=2))
    assert r.plan.per_call[0].grid[0] == 2, r.explain()
    check(r, inputs(shape, "nhwc", "bfloat16", rng), "nhwc", "bfloat16", order="shuffled", seed=5)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_a_mean_and_a_max_column(deterministic, rng):
    """(x - mean_0 x) * max_0 x: a column merged through the sum's finish (1 / M) and one through
    float max's integer images under atomics; 1 launch, against numpy float64."""
    x = pn.placeholder((300, 24), name="x")
    y = (x - pn.mean(x, axis=0, keepdims=True)) * pn.max(x, axis=0, keepdims=True)
    k = pn.compile(y, target="emulator", deterministic=deterministic)
    assert len(k.plan.per_call) == 1 and k.plan.per_call[0].cooperative, k.explain()
    a = rng.normal(size=(300, 24)).astype(np.float32)
    a64 = a.astype(np.float64)
    ref = (a64 - a64.mean(0)) * a64.max(0)
    scale = (np.abs(a64) + np.abs(a64).mean(0)) * np.abs(a64).max(0)
    got = k(a, order="shuffled", seed=2)
    np.testing.assert_array_less(np.abs(got - ref), tolerance("float32", 300) * scale + 1e-30)


def test_dependent_columns_do_not_stitch():
    """Softmax along axis 0: the sum reads the max, so both cannot run in pass 0 (precondition 1),
    and the max alone would close a cycle through the sum's kernel (4)."""
    x = pn.placeholder((30, 8), name="x")
    e = pn.exp(x - pn.max(x, axis=0, keepdims=True))
    assert stitches([e / pn.sum(e, axis=0, keepdims=True)]) == []


def test_the_model_weighs_one_launch_against_two():
    """[32, 14, 14, 256] float32 (12.8 MB of x and dy, under half the L2): dx's re-read hits L2,
    one launch pays. [256, 56, 56, 256] (1.6 GB): every schedule re-reads x and dy from DRAM;
    one launch re-reads backwards, so only the last half-L2 of it hits (the planner's line says so)."""
    from panamera.bench.train_suite import batch_norm_backward

    small = pn.compile(batch_norm_backward((32, 14, 14, 256), True), target="emulator", gpu=H100, use_database=False)
    assert len(small.plan.per_call) == 1 and "bytes not re-read -> pays, one launch" in small.explain()
    big = pn.compile(batch_norm_backward((256, 56, 56, 256), True), target="emulator", gpu=H100, use_database=False)
    line = next(ln for ln in big.explain().splitlines() if "planner: S0+S1+S2" in ln)
    assert f" {int(H100.l2_size // 2)} bytes not re-read" in line, line


def test_nchw_is_not_a_column_stitch():
    """NCHW coalesces to strided ROW sums (stitched rows, tests/test_batch_norm_backward.py)."""
    outs, _ = bn_backward((2, 4, 5, 6), "nchw", "float64")
    assert stitches(outs) == []


# --- one negative test per precondition of poly/column_stitch.py ---


def test_precondition_1_independent_columns_of_one_domain():
    x = pn.placeholder((6, 8), name="x")
    assert stitches([x - pn.sum(x, axis=0, keepdims=True)]) == [("S0", "S1")]
    assert stitches([x - pn.sum(x, axis=1, keepdims=True)]) == []  # a ROW sum: stitched rows
    y = x - pn.sum(x, axis=0, keepdims=True)
    assert stitches([x * pn.sum(x * x, axis=0, keepdims=True), y]) == [("S0", "S2", "S1", "S3")]
    # the second sum reads y, so the first: not in pass 0 beside it (and it reads a consumer)
    assert stitches([x * pn.sum(y, axis=0, keepdims=True), y]) == [("S0", "S1")]


def test_precondition_2_a_consumer_over_the_same_domain():
    x, y = pn.placeholder((6, 8), name="x"), pn.placeholder((8,), name="y")
    assert stitches([y * pn.sum(x, axis=0)]) == []  # over the result space: a column epilogue


def test_precondition_3_column_local_reads():
    x = pn.placeholder((8, 8), name="x")
    s = pn.sum(x, axis=0)
    assert stitches([x - s.reshape((1, 8))]) == [("S0", "S1")]
    assert stitches([x - s.reshape((8, 1))]) == []  # (i, j) reads column i


def test_precondition_4_acyclic():
    x = pn.placeholder((6, 8), name="x")
    s = pn.sum(x, axis=0, keepdims=True)
    other = pn.sum(x, axis=1, keepdims=True) * pn.max(s)  # a kernel between the column and dx
    assert stitches([x - s - other]) == []


# --- replay rules of schedule/persistent.py for a stitch ---


def test_replay_rules_of_a_stitch(rng):
    outs, _ = bn_backward(SHAPE, "nhwc", "float64")
    k = pn.compile(list(outs), target="emulator")
    (m,) = k.mappings
    last_block = tuple(MergeMode.PARTIALS if x != MergeMode.STORE else x for x in m.merges)
    with pytest.raises(ScheduleError, match=re.escape("(4)")):  # the consumers need every block's merge
        pn.compile(list(outs), target="emulator", schedule=_with(k, merges=last_block))
    with pytest.raises(ScheduleError, match=re.escape("(4)")):  # atomics where deterministic asks partials
        pn.compile(list(outs), target="emulator", deterministic=True, schedule=k.schedule)
    one_sm = dataclasses.replace(H100, sms=1, queued_launch_s=-1.0)  # 2 co-resident blocks of 512 threads
    k1 = pn.compile(list(outs), target="emulator", gpu=one_sm)
    wide = _with(k1, ty=64, grid=(5, 1), persistent=5, per_sm=5)  # 5 row tiles of 64 rows, 5 blocks
    with pytest.raises(ScheduleError, match=re.escape("(5)")):
        pn.compile(list(outs), target="emulator", gpu=one_sm, schedule=wide)
