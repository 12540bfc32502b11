"""Column groups of a column stitch (Decision.cgroups; schedule/persistent.py precondition 6,
codegen/column_stitch.py): BatchNorm backward NHWC's channels run in groups, one at a time, each
over every row tile (its sums' pass, the grid-wide merge, dx's pass backwards), so each group's
re-read starts from the L2 lines its own pass left. Against numpy float64 in both merges (atomics
read back; deterministic partials bit-identical across thread orders), replayed at a small shape;
one negative test per part of precondition 6; the model's figures at the bench shape."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_batch_norm_backward import bn_backward, check, inputs

import panamera as pn
from panamera.bench.train_suite import batch_norm_backward
from panamera.errors import ScheduleError
from panamera.model.gpu import H100
from panamera.schedule.cost import joined_cost
from panamera.schedule.decision import MergeMode
from panamera.schedule.persistent import column_group_options, map_joined
from panamera.schedule.saved import Schedule

pytestmark = pytest.mark.usefixtures("launches_pay_the_floor")

SHAPE = (2, 4, 5, 64)  # N·H·W = 40 rows of 64 float32 channels: 2 groups of 32 (one 128-byte line each)


def _with(k, **changes):
    s = k.schedule
    return dataclasses.replace(s, kernels=(dataclasses.replace(s.kernels[0], **changes),))


def _grouped(k, cgroups: int, blocks: int = 3):
    """`k`'s stitched decision with its columns in `cgroups` groups: 8 threads per row of a group
    (vec 4), 8 rows per block, `blocks` blocks looping over the row tiles (the last one partial), no
    row tiles held (the mapper's hold and its dynamic shared memory are for its own block shape)."""
    m = k.mappings[0]
    tx = m.N // cgroups // m.vec
    tiles = -(-m.M // 8)
    shape = dict(tx=tx, ty=8, chunk=tx, unroll=1, grid=(tiles, 1), persistent=blocks, per_sm=1)
    return _with(k, cgroups=cgroups, **shape, hold=0, dynamic_smem=0)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_two_column_groups_in_one_launch(deterministic, rng):
    outs, _ = bn_backward(SHAPE, "nhwc", "float32")
    k = pn.compile(list(outs), target="emulator", deterministic=deterministic)
    mode = MergeMode.PARTIALS_GRID if deterministic else MergeMode.ATOMIC_GRID
    assert len(k.plan.per_call) == 1 and set(k.mappings[0].merges) == {mode, MergeMode.STORE}, k.explain()
    r = pn.compile(list(outs), target="emulator", deterministic=deterministic, schedule=_grouped(k, 2))
    (m,) = r.mappings
    assert m.cgroups == 2 and "for (int pn_cg = 0; pn_cg < 2; ++pn_cg)" in r.source, r.source
    assert "column-groups=2" in m.describe()
    arrays = inputs(SHAPE, "nhwc", "float32", rng)
    runs = [check(r, arrays, "nhwc", "float32", order=o, seed=7) for o in ("reverse", "shuffled", "forward")]
    if deterministic:  # and the counters and workspaces reset for the next call
        for got in runs[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(runs[0], got))
    saved = Schedule.from_json(r.schedule.to_json())  # cgroups saved and read back
    again = pn.compile(list(outs), target="emulator", deterministic=deterministic, schedule=saved)
    assert again.source == r.source and again.mappings[0].cgroups == 2


def test_precondition_6_only_a_column_stitch_runs_column_groups(rng):
    """LayerNorm backward's columns feed no statement of its kernel: no column groups."""
    from test_row_columns import layer_norm_backward

    k = pn.compile(layer_norm_backward(64, 64), target="emulator", deterministic=True)
    assert k.mappings[0].persistent and k.mappings[0].cgroups == 1
    with pytest.raises(ScheduleError, match=r"2 column groups .*\(6\)"):
        pn.compile(layer_norm_backward(64, 64), target="emulator", schedule=_with(k, cgroups=2))


def test_precondition_6_each_group_whole_lines():
    """4 groups of 16 float32 channels: 64-byte slices of each row, not whole lines."""
    outs, _ = bn_backward(SHAPE, "nhwc", "float32")
    k = pn.compile(list(outs), target="emulator", deterministic=True)
    with pytest.raises(ScheduleError, match=r"4 column groups .*whole 128-byte lines.*\(6\)"):
        pn.compile(list(outs), target="emulator", deterministic=True, schedule=_grouped(k, 4))


def test_the_model_at_the_bench_shape():
    """BatchNorm backward NHWC [256, 56, 56, 256] float32 (modeled, H100): 8 groups of 32 channels
    re-read 8 half-L2s from L2, not one (less DRAM), for 14 more phase restarts and 7 more merges;
    faster, but within the 3 % by which a later candidate must win: alone they would not be picked
    (with row tiles held on chip they are, tests/test_hold.py)."""
    k = pn.compile(batch_norm_backward((256, 56, 56, 256), True), target="emulator", gpu=H100, use_database=False)
    group = k.groups[0]
    assert column_group_options(group, 4) == [2, 4, 8]
    m = map_joined(group, H100)
    assert m.cgroups == 8 and m.hold > 0
    plain = dataclasses.replace(m.decision, hold=0, dynamic_smem=0, persistent=528, per_sm=4, unroll=1)
    at_once = dataclasses.replace(plain, cgroups=1, tx=64, ty=4, chunk=64, grid=(200704 // 4, 1))
    base = joined_cost(group, H100, at_once)
    d = dataclasses.replace(plain, cgroups=8, tx=8, ty=32, chunk=8, grid=(25088, 1))
    grouped = joined_cost(group, H100, d)
    assert grouped.dram_s < base.dram_s - 50e-6
    assert base.total_s * 0.97 < grouped.total_s < base.total_s
