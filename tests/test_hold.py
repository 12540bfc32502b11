"""Row tiles held in shared memory by a column stitch (Decision.hold, schedule/hold.py, precondition 7):
BatchNorm backward NHWC's blocks keep their first row tiles of x and dy (each column group's) from the
sums' pass and read them back in dx's pass. Against numpy float64 in both merges (deterministic
partials bit-identical across thread orders, and to the same plan without the hold), replayed at a small
shape; one negative test per part of precondition 7; the model's bytes at the bench shape."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_batch_norm_backward import bn_backward, check, inputs
from test_column_groups import SHAPE, _grouped, _with

import panamera as pn
from panamera.bench.train_suite import batch_norm_backward
from panamera.errors import ScheduleError
from panamera.model.gpu import H100
from panamera.schedule.cost import joined_cost
from panamera.schedule.hold import check_hold, held_bytes, hold_bytes, most_held
from panamera.schedule.persistent import map_joined
from panamera.schedule.saved import Schedule

pytestmark = pytest.mark.usefixtures("launches_pay_the_floor")


def _held(s, hold: int):
    return dataclasses.replace(s, kernels=(dataclasses.replace(s.kernels[0], hold=hold),))


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("cgroups", [1, 2])
def test_held_tiles_read_back_from_shared_memory(deterministic, cgroups, rng):
    """40 rows in 5 tiles of 8 on 3 blocks (2, 2, 1 tiles each): each holds its first, so the blocks
    with two re-read their second from memory; the values as without the hold."""
    outs, _ = bn_backward(SHAPE, "nhwc", "float32")
    k = pn.compile(list(outs), target="emulator", deterministic=deterministic)
    plain = _grouped(k, cgroups)
    r = pn.compile(list(outs), target="emulator", deterministic=deterministic, schedule=_held(plain, 1))
    (m,) = r.mappings
    assert m.hold == 1 and "hold=1" in m.describe()
    assert "PN_BLOCK_SHARED(float, pn_hold0," in r.source and "pn_k < 1" in r.source, r.source
    arrays = inputs(SHAPE, "nhwc", "float32", rng)
    runs = [check(r, arrays, "nhwc", "float32", order=o, seed=7) for o in ("reverse", "shuffled", "forward")]
    if deterministic:  # the same bits whatever the order, and as the plan that re-reads every tile
        base = pn.compile(list(outs), target="emulator", deterministic=True, schedule=plain)
        for got in [*runs[1:], base(*arrays)]:
            assert all(np.array_equal(a, b) for a, b in zip(runs[0], got))
    saved = Schedule.from_json(r.schedule.to_json())  # hold saved and read back
    again = pn.compile(list(outs), target="emulator", deterministic=deterministic, schedule=saved)
    assert again.source == r.source and again.mappings[0].hold == 1


def test_precondition_7_only_a_column_stitch_holds_tiles():
    """LayerNorm backward's dx pass reads x and dy again, but its columns feed no statement: no hold."""
    from test_row_columns import layer_norm_backward

    k = pn.compile(layer_norm_backward(64, 64), target="emulator", deterministic=True)
    with pytest.raises(ScheduleError, match=r"hold=1 row tiles .*column stitch.*\(7\)"):
        pn.compile(layer_norm_backward(64, 64), target="emulator", schedule=_with(k, hold=1))


def test_precondition_7_at_most_the_tiles_a_block_owns():
    """3 blocks over 5 tiles own at most 2 each: a third held tile is refused."""
    outs, _ = bn_backward(SHAPE, "nhwc", "float32")
    k = pn.compile(list(outs), target="emulator", deterministic=True)
    with pytest.raises(ScheduleError, match=r"hold=3 row tiles .*at most 2 .*2 tiles per block \(7\)"):
        pn.compile(list(outs), target="emulator", deterministic=True, schedule=_held(_grouped(k, 2), 3))


def _bench():
    """The mapper's plan of BatchNorm backward NHWC [256, 56, 56, 256] float32 on an H100 (modeled)."""
    group = pn.compile(batch_norm_backward((256, 56, 56, 256), True), target="emulator", gpu=H100).groups[0]
    return group, map_joined(group, H100)


def test_precondition_7_within_one_blocks_static_shared_memory():
    """At the bench shape, 8 groups of 32 channels on 8 x 32 threads: 8 KiB a tile (x and dy), 4 KiB of
    column tree, so at most 5 tiles in 48 KiB (4 such blocks an SM); 6 are refused."""
    group, m = _bench()
    d = m.decision
    assert (d.cgroups, d.tx, d.ty, d.hold) == (8, 8, 32, 5) and hold_bytes(group, d) == 5 * 8192
    assert most_held(group, H100, d) == 5 < 25088 // d.blocks
    with pytest.raises(ScheduleError, match=r"hold=6 row tiles of 8192 bytes each: at most 5 fit 49152 bytes.*\(7\)"):
        check_hold(group, H100, dataclasses.replace(d, hold=6), "bench")


def test_the_model_counts_the_bytes_held():
    """Modeled, H100, the bench shape: the held bytes come off the re-read's DRAM, exactly `held_bytes`
    (8 groups x 528 blocks x 5 tiles x 32 rows x 32 channels x 2 tensors x 4 bytes: 173 MB); the plan
    with the hold beats every channel at once by more than the mapper's 3 %, the same without by less."""
    group, m = _bench()
    held, plain = m.decision, dataclasses.replace(m.decision, hold=0)
    a, b = joined_cost(group, H100, plain), joined_cost(group, H100, held)
    assert held_bytes(group, held) == 8 * 528 * 5 * 32 * 32 * 2 * 4
    assert dict(a.features)["dram_bytes"] - dict(b.features)["dram_bytes"] == pytest.approx(held_bytes(group, held))
    at_once = dataclasses.replace(
        plain, cgroups=1, tx=64, ty=4, chunk=64, grid=(200704 // 4, 1), persistent=528, per_sm=4
    )
    base = joined_cost(group, H100, at_once).total_s
    assert b.total_s < 0.97 * base and a.total_s > 0.97 * base


def test_bfloat16_inputs_held_as_float(rng):
    """bf16 x and dy are held as the float32 values the sums' pass computed with: the same bits as
    the plan that re-reads them from memory."""
    outs, _ = bn_backward(SHAPE, "nhwc", "bfloat16")
    k = pn.compile(list(outs), target="emulator", deterministic=True)
    plain = _grouped(k, 1)
    r = pn.compile(list(outs), target="emulator", deterministic=True, schedule=_held(plain, 2))
    assert "PN_BLOCK_SHARED(float, pn_hold0, [1024])" in r.source, r.source
    arrays = inputs(SHAPE, "nhwc", "bfloat16", rng)
    got = check(r, arrays, "nhwc", "bfloat16", order="shuffled", seed=3)
    base = pn.compile(list(outs), target="emulator", deterministic=True, schedule=plain)(*arrays)
    assert all(np.array_equal(a, b) for a, b in zip(got, base))


@pytest.mark.parametrize("gpu", ["h100", "a100"])
def test_the_bench_plans_hold_tiles(gpu):
    """The deterministic bench plans (mapped afresh: the shipped database answers only the default
    compile) hold row tiles on both GPUs; their sources go through nvcc (tests/conftest.py)."""
    k = pn.compile(batch_norm_backward((256, 56, 56, 256), True), target="emulator", gpu=gpu, deterministic=True)
    (m,) = k.mappings
    assert m.hold > 0 and "PN_BLOCK_SHARED(float, pn_hold1," in k.source, m.describe()
