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
from panamera.schedule.hold import check_hold, held_bytes, hold_bytes, most_held, static_bytes, with_hold
from panamera.schedule.persistent import map_joined
from panamera.schedule.saved import Schedule

pytestmark = pytest.mark.usefixtures("launches_pay_the_floor")


def _held(outs, s, hold: int, deterministic: bool):
    """Schedule `s` of `outs` holding `hold` row tiles in its one stitched kernel, with the dynamic
    shared memory they carve (the group is the one `s` compiles to: the stitched one)."""
    group = pn.compile(list(outs), target="emulator", deterministic=deterministic, schedule=s).groups[0]
    return dataclasses.replace(s, kernels=(with_hold(group, s.kernels[0], hold),))


def _launch(k):
    """The plan's launch of `k`'s one kernel."""
    return next(ln for ln in k.plan.launches if ln.kernel == k.mappings[0].name)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("cgroups", [1, 2])
def test_held_tiles_read_back_from_shared_memory(deterministic, cgroups, rng):
    """40 rows in 5 tiles of 8 on 3 blocks (2, 2, 1 tiles each): each holds its first, so the blocks
    with two re-read their second from memory; the values as without the hold."""
    outs, _ = bn_backward(SHAPE, "nhwc", "float32")
    k = pn.compile(list(outs), target="emulator", deterministic=deterministic)
    plain = _grouped(k, cgroups)
    r = pn.compile(
        list(outs), target="emulator", deterministic=deterministic, schedule=_held(outs, plain, 1, deterministic)
    )
    (m,) = r.mappings
    assert m.hold == 1 and "hold=1" in m.describe() and m.dynamic_smem == hold_bytes(k.groups[0], m) > 0
    assert "PN_DYNAMIC_SHARED(pn_dsmem)" in r.source and "pn_k < 1" in r.source, r.source
    assert "float* const pn_hold1 = reinterpret_cast<float*>(pn_dsmem + " in r.source, r.source
    assert _launch(r).dynamic_smem_bytes == m.dynamic_smem  # the plan passes the bytes at launch
    arrays = inputs(SHAPE, "nhwc", "float32", rng)
    runs = [check(r, arrays, "nhwc", "float32", order=o, seed=7) for o in ("reverse", "shuffled", "forward")]
    if deterministic:  # the same bits whatever the order, and as the plan that re-reads every tile
        base = pn.compile(list(outs), target="emulator", deterministic=True, schedule=plain)
        for got in [*runs[1:], base(*arrays)]:
            assert all(np.array_equal(a, b) for a, b in zip(runs[0], got))
    saved = Schedule.from_json(r.schedule.to_json())  # hold saved and read back
    again = pn.compile(list(outs), target="emulator", deterministic=deterministic, schedule=saved)
    assert again.source == r.source and again.mappings[0].hold == 1
    assert again.mappings[0].dynamic_smem == m.dynamic_smem


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
        pn.compile(list(outs), target="emulator", deterministic=True, schedule=_held(outs, _grouped(k, 2), 3, True))


def _bench():
    """The mapper's plan of BatchNorm backward NHWC [256, 56, 56, 256] float32 on an H100 (modeled)."""
    k = pn.compile(batch_norm_backward((256, 56, 56, 256), True), target="emulator", gpu=H100, use_database=False)
    return k.groups[0], map_joined(k.groups[0], H100)


def test_precondition_7_within_the_opt_in_shared_memory_every_block_co_resident():
    """At the bench shape the mapper takes 8 groups of 32 channels on 8 x 128 threads, one block an SM:
    32 KiB a tile (x and dy), 16 KiB of static column tree (and a flag), so 6 tiles (192 KiB) of dynamic shared memory
    within the H100's 227 KiB opt-in; a 7th is over it (dynsmem.py (2)). Blocks of 8 x 32 threads (8 KiB a
    tile, 4 KiB of tree), 4 an SM: 6 tiles (52 KiB, past the 48 KiB of static shared memory) leave 4 blocks
    an SM in its 228 KiB; 7 fit one block's opt-in, but then not 4 blocks an SM (7)."""
    group, m = _bench()
    d = m.decision
    assert (d.cgroups, d.tx, d.ty, d.blocks, d.hold) == (8, 8, 128, 132, 6), d.describe()
    assert d.dynamic_smem == hold_bytes(group, d) == 6 * 32768 > 48 * 1024
    assert most_held(group, H100, d) == 6 < 6272 // d.blocks
    with pytest.raises(
        ScheduleError, match=r"dynamic_smem=229376 bytes .* beside 16400 static: over the 232448 .*\(2\)"
    ):
        check_hold(group, H100, with_hold(group, d, 7), "bench")
    small = dataclasses.replace(d, hold=0, dynamic_smem=0, ty=32, grid=(25088, 1), persistent=528, per_sm=4)
    assert most_held(group, H100, small) == 6  # 4 x (6 x 8 KiB + 4 KiB of tree + 1 KiB reserved) <= 228 KiB
    with pytest.raises(ScheduleError, match=r"hold=7 row tiles of 8192 bytes each: at most 6 fit .*528 blocks .*\(7\)"):
        check_hold(group, H100, with_hold(group, small, 7), "bench")


def test_the_model_counts_the_bytes_held():
    """Modeled, H100, the bench shape: the held bytes come off the re-read's DRAM, exactly `held_bytes`
    (8 groups x 132 blocks x 6 tiles x 128 rows x 32 channels x 2 tensors x 4 bytes: 208 MB), and the
    dynamic shared memory is the block's shared memory to occupancy; the plan with the hold beats every
    channel at once by more than the mapper's 3 %, the same without by less."""
    group, m = _bench()
    held, plain = m.decision, dataclasses.replace(m.decision, hold=0, dynamic_smem=0)
    a, b = joined_cost(group, H100, plain), joined_cost(group, H100, held)
    assert held_bytes(group, held) == 8 * 132 * 6 * 128 * 32 * 2 * 4
    assert dict(a.features)["dram_bytes"] - dict(b.features)["dram_bytes"] == pytest.approx(held_bytes(group, held))
    # the static bytes (schedule/hold.py `static_bytes`) to the dynamic buffer's 16-byte boundary, then the tiles
    assert dict(a.features)["shared_bytes"] == static_bytes(group, plain) == 16384 + 4
    assert dict(b.features)["shared_bytes"] == static_bytes(group, held) + held.dynamic_smem == 16400 + 196608
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
    r = pn.compile(list(outs), target="emulator", deterministic=True, schedule=_held(outs, plain, 2, True))
    assert "float* const pn_hold0 = reinterpret_cast<float*>(pn_dsmem + 0);" in r.source, r.source
    assert r.mappings[0].dynamic_smem == 2 * 1024 * 4  # x and dy: 2 tiles of 8 rows x 64 channels each, as float
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
    assert m.hold > 0 and "reinterpret_cast<float*>(pn_dsmem + " in k.source, m.describe()
    assert _launch(k).dynamic_smem_bytes == m.dynamic_smem > 48 * 1024  # past static shared memory
