"""Column partials in a stitched row kernel (poly/row_columns.py, schedule/row_columns.py,
schedule/persistent.py, codegen/column_partials.py): the LayerNorm / RMSNorm backward's dgamma /
dbeta (COLUMN reductions) legal in dx's stitched ROW kernel; one negative test per precondition;
the model's figures; the one-launch kernel against numpy float64 in both merge modes, bit-identical
in deterministic mode, and its persistent row loop through a replayed schedule."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from conftest import np_dtype, tolerance

import panamera as pn
from panamera.errors import ScheduleError
from panamera.model import estimate
from panamera.model.gpu import H100
from panamera.poly.program import build_program
from panamera.poly.row_columns import host_ok
from panamera.schedule import derived
from panamera.schedule.cost import joined_cost
from panamera.schedule.decision import MergeMode, Residence
from panamera.schedule.derived import combine_lanes, tree_chunk
from panamera.schedule.mapping import map_group
from panamera.schedule.persistent import column_registers, map_joined
from panamera.schedule.row_columns import joined_group, plan_columns
from panamera.schedule.rtile import register_budget
from panamera.schedule.saved import Schedule

# H100 on which every launch pays the per-kernel floor (no queued-launch gap): there one launch
# beats two already at the small shapes the emulator runs quickly, so the one-launch kernel is
# what these tests check (on H100 the second launch costs 0.1 us and small shapes take two).
FLOORED = dataclasses.replace(H100, queued_launch_s=-1.0)


def layer_norm_backward(M: int, N: int, dtype: str = "float32"):
    """(dx, dgamma, dbeta) of LayerNorm from the saved mean and rstd, as torch's decomposition."""
    x, dy = pn.placeholder((M, N), dtype, name="x"), pn.placeholder((M, N), dtype, name="dy")
    g = pn.placeholder((N,), dtype, name="g")
    mean, rstd = pn.placeholder((M, 1), name="mean"), pn.placeholder((M, 1), name="rstd")
    xhat = (x - mean) * rstd
    wdy = dy * g
    c1 = pn.sum(wdy * xhat, axis=1, keepdims=True) / N
    c2 = pn.sum(wdy, axis=1, keepdims=True) / N
    dx = (wdy - xhat * c1 - c2) * rstd
    return [dx, pn.sum(dy * xhat, axis=0), pn.sum(dy, axis=0)]


def rms_norm_backward(M: int, N: int, dtype: str = "float32"):
    """(dx, dgamma) of RMSNorm from the saved rstd."""
    x, dy = pn.placeholder((M, N), dtype, name="x"), pn.placeholder((M, N), dtype, name="dy")
    g, rstd = pn.placeholder((N,), dtype, name="g"), pn.placeholder((M, 1), name="rstd")
    c = pn.sum(g * dy * x, axis=1, keepdims=True) / N
    dx = rstd * (g * dy - x * rstd * rstd * c)
    return [dx, pn.sum(dy * x * rstd, axis=0)]


def joins(outputs):
    return [c.names for c in build_program(tuple(outputs)).column_candidates]


def test_layer_norm_backward_columns_join_the_row_kernel():
    p = build_program(tuple(layer_norm_backward(64, 32)))
    (c,) = p.column_candidates
    rows = [s.name for s in c.group]
    assert c.names == (*rows, "S0", "S2") and c.passes == (0, 0)  # dbeta, dgamma: they read inputs only
    assert all(s.extents == (64, 32) and s.reduced == frozenset({"i"}) for s in c.columns)


def test_rms_norm_backward_column_joins_the_row_kernel():
    (c,) = build_program(tuple(rms_norm_backward(64, 32))).column_candidates
    assert len(c.columns) == 1 and len(c.group) == 2


def test_a_column_reading_a_row_sum_joins_the_pass_after_it():
    x = pn.placeholder((16, 8), name="x")
    r = pn.sum(x, axis=1, keepdims=True)
    (c,) = build_program((x - r, pn.sum(x * r, axis=0))).column_candidates
    assert c.passes == (1,)


def test_precondition_1_the_host_reduces_rows():
    x = pn.placeholder((16, 8), name="x")
    p = build_program((x - pn.sum(x), pn.sum(x, axis=0)))
    (grp,) = p.stitch_candidates
    assert not host_ok(grp) and p.column_candidates == ()


def test_precondition_2_the_column_reduces_what_the_rows_keep():
    x = pn.placeholder((4, 8, 16), name="x")
    y = x - pn.sum(x, axis=2, keepdims=True)
    assert joins([y, pn.sum(x, axis=(0, 1))])  # the rows (d0, d1): joins
    assert joins([y, pn.sum(x, axis=0)]) == []  # keeps d1 too: not the row kernel's column
    z = pn.placeholder((8, 4, 16), name="z")
    assert joins([y, pn.sum(z, axis=(0, 1))]) == []  # another domain


def test_precondition_3_reads_are_row_local_registers():
    x = pn.placeholder((16, 16), name="x")
    r = pn.sum(x, axis=1, keepdims=True)
    y = x - r
    assert joins([y, pn.sum(x * r.reshape(1, 16), axis=0)]) == []  # reads the row sum of row j
    assert joins([y, pn.sum(y, axis=0)]) == []  # reads an element-wise member: in no register


def test_precondition_4_no_member_reads_the_column():
    x, dy = pn.placeholder((16, 8), name="x"), pn.placeholder((16, 8), name="dy")
    db = pn.sum(dy, axis=0)
    c = pn.sum(x - db, axis=1, keepdims=True)
    p = build_program((x * c, db))
    assert p.stitch_candidates and p.column_candidates == ()


def test_precondition_5_no_cycle_through_another_kernel():
    x = pn.placeholder((16, 8), name="x")
    r = pn.sum(x, axis=1, keepdims=True)
    t = pn.sum(r)  # another kernel, after the row sums
    p = build_program((x - r, pn.sum(x * t, axis=0)))
    assert p.stitch_candidates and p.column_candidates == ()


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("N", [1024, 16384])
def test_the_model_weighs_one_launch_at_liger_shapes(N, deterministic):
    (c,) = plan_columns(build_program(tuple(rms_norm_backward(4096, N))), H100, deterministic)
    assert c.bytes_saved >= 2 * 4096 * N * 4  # x and dy read once instead of twice
    assert c.pays and c.kernels == 2, c.describe()  # else: dx stitched, dgamma its own kernel
    assert c.merges == c.blocks * N and "modeled" in c.describe()
    assert c.deterministic or not deterministic  # deterministic: partials summed in block order


def test_the_model_refuses_partials_that_do_not_fit_registers():
    """LayerNorm backward at 4096 x 32768 float32: 64 partials per thread at 1024 threads and the
    loads do not fit the 64-register bound, and 512 threads would keep 128 (over `MAX_PARTIALS`):
    no mapping fits, so two launches."""
    (c,) = plan_columns(build_program(tuple(layer_norm_backward(4096, 32768))), H100)
    assert not c.pays and c.blocks == 0, c.describe()


def test_wide_rows_keep_their_partials_at_fewer_threads():
    """LayerNorm backward at 4096 x 16384 float32 (1024 threads: 32 partials and the loads spill
    under 64 registers): one launch at fewer threads per block, one block per SM, the launch
    bounds leaving the registers its 64 partials need (the kernel is rendered, so the suite's nvcc
    check sees it compile without spills)."""
    k = pn.compile(layer_norm_backward(4096, 16384), target="emulator")
    (m,) = k.mappings
    assert len(k.plan.per_call) == 1 and m.persistent and m.tx * m.ty < 1024, k.explain()
    assert column_registers(k.groups[0], m) <= register_budget(m) and m.per_sm == 1


def _layer_norm64(a, d, g, mean, rstd):
    n = a.shape[1]
    xhat = (a - mean) * rstd
    wdy = d * g
    c1 = (wdy * xhat).sum(1, keepdims=True) / n
    c2 = wdy.sum(1, keepdims=True) / n
    dx = (wdy - xhat * c1 - c2) * rstd
    scale = (np.abs(wdy) + np.abs(xhat * c1) + np.abs(c2)) * rstd  # magnitudes of dx's terms
    return [dx, (d * xhat).sum(0), d.sum(0)], [scale, np.abs(d * xhat).sum(0), np.abs(d).sum(0)]


def _rms_norm64(a, d, g, rstd):
    n = a.shape[1]
    c = (g * d * a).sum(1, keepdims=True) / n
    dx = rstd * (g * d - a * rstd * rstd * c)
    scale = rstd * (np.abs(g * d) + np.abs(a * rstd * rstd * c))
    return [dx, (d * a * rstd).sum(0)], [scale, np.abs(d * a * rstd).sum(0)]


def _inputs(rng, M, N, dtype):
    a = (rng.standard_normal((M, N)) * 2 + 0.5).astype(np_dtype(dtype))
    d = rng.standard_normal((M, N)).astype(np_dtype(dtype))
    g = rng.standard_normal(N).astype(np_dtype(dtype))
    a64 = a.astype(np.float64)
    mean = a64.mean(1, keepdims=True).astype(np.float32)
    rstd = (1 / np.sqrt(a64.var(1, keepdims=True) + 1e-5)).astype(np.float32)
    return a, d, g, mean, rstd


@pytest.mark.parametrize(
    "op, dtype, deterministic",
    [("layer_norm", "float32", False), ("layer_norm", "bfloat16", True), ("rms_norm", "float32", True),
     ("rms_norm", "bfloat16", False)],
)  # fmt: skip
def test_backward_programs_match_numpy_float64(op, dtype, deterministic, rng):
    M, N = 48, 40
    a = (rng.standard_normal((M, N)) * 2 + 0.5).astype(np_dtype(dtype))
    d = rng.standard_normal((M, N)).astype(np_dtype(dtype))
    g = rng.standard_normal(N).astype(np_dtype(dtype))
    a64, d64, g64 = (v.astype(np.float64) for v in (a, d, g))
    mean = a64.mean(1, keepdims=True).astype(np.float32)
    rstd = (1 / np.sqrt(a64.var(1, keepdims=True) + 1e-5)).astype(np.float32)
    if op == "layer_norm":
        k = pn.compile(layer_norm_backward(M, N, dtype), target="emulator", deterministic=deterministic, gpu=FLOORED)
        outs = k(a, d, g, mean, rstd)
        refs, scales = _layer_norm64(a64, d64, g64, mean.astype(np.float64), rstd.astype(np.float64))
    else:
        k = pn.compile(rms_norm_backward(M, N, dtype), target="emulator", deterministic=deterministic, gpu=FLOORED)
        outs = k(a, d, g, rstd)
        refs, scales = _rms_norm64(a64, d64, g64, rstd.astype(np.float64))
    lengths = [N] + [M] * (len(refs) - 1)  # dx: row sums of N; dgamma, dbeta: column sums of M
    for out, ref, scale, n in zip(outs, refs, scales, lengths):
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0, atol=tolerance(dtype, n) * scale.max())
    (m,) = k.mappings  # dx, dgamma and dbeta in one launch: column partials, merged as asked
    assert len(k.plan.per_call) == 1 and m.persistent, k.explain()
    # deterministic: partials only; else the model's pick (at 48 x 40 the two merges are within 0.01 us,
    # modeled; every merge is replayed by test_the_persistent_row_loop_replayed)
    want = [MergeMode.PARTIALS] if deterministic else [MergeMode.ATOMIC_WS, MergeMode.PARTIALS]
    picked = {x for x in m.merges if x != MergeMode.STORE}
    assert len(picked) == 1 and picked <= set(want), m.merges


def _with(k, **changes) -> Schedule:
    """`k`'s schedule with its one kernel's decision changed."""
    s = k.schedule
    return dataclasses.replace(s, kernels=(dataclasses.replace(s.kernels[0], **changes),))


def test_the_persistent_row_loop_replayed(rng):
    """Fewer blocks than row tiles (each block loops over several), in each merge: a replayed
    schedule. The atomic merge within float32 rounding; the two partials merges (the last block,
    or every block after a grid-wide wait; 2 blocks: one partial per shuffle lane, so the same
    bits as the last block's sum) bit-identical to each other, across calls and the
    emulator's thread orders. The replay reproduces the source; the workspaces and counters are
    reset for the next call."""
    M, N = 100, 24  # 4 row tiles of 32 rows, the last one partial
    a, d, g, mean, rstd = _inputs(rng, M, N, "float32")
    outs = layer_norm_backward(M, N)
    k = pn.compile(outs, target="emulator", gpu=FLOORED)  # 4 row tiles of 8 x 32 threads (the model takes 2 of 64)
    k = pn.compile(outs, target="emulator", gpu=FLOORED, schedule=_with(k, ty=32, grid=(4, 1), persistent=4, per_sm=1))
    (m,) = k.mappings
    assert m.grid[0] == 4, m.describe()
    refs, scales = _layer_norm64(*(v.astype(np.float64) for v in (a, d, g, mean, rstd)))
    runs = {}
    for mode in (MergeMode.ATOMIC_WS, MergeMode.PARTIALS, MergeMode.PARTIALS_GRID):
        merges = tuple(MergeMode.STORE if x == MergeMode.STORE else mode for x in m.merges)
        r = pn.compile(outs, target="emulator", schedule=_with(k, persistent=2, merges=merges))
        assert r.plan.per_call[0].grid[0] == 2 and "pn_tile += gridDim.x" in r.source
        assert r.plan.per_call[0].cooperative == (mode == MergeMode.PARTIALS_GRID)
        runs[mode] = [r(a, d, g, mean, rstd, order=o) for o in ("forward", "reverse", "shuffled", "forward")]
        for got in runs[mode]:
            for out, ref, scale, n in zip(got, refs, scales, [N, M, M]):
                np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance("float32", n) * scale.max())
        assert pn.compile(outs, target="emulator", schedule=r.schedule).source == r.source
    first = runs[MergeMode.PARTIALS][0]
    for got in runs[MergeMode.PARTIALS] + runs[MergeMode.PARTIALS_GRID]:
        assert all(np.array_equal(x, y) for x, y in zip(first, got))


def test_the_grid_combine_sums_each_column_with_several_lanes(rng, launches_pay_the_floor):
    """PARTIALS_GRID with 8 blocks of 1024 columns: 2 lanes per column (derived.combine_lanes), each
    summing 4 blocks' partials, then a shuffle: within float32 rounding of numpy float64 and
    bit-identical across the emulator's thread orders."""
    M, N = 64, 1024
    a, d, g, mean, rstd = _inputs(rng, M, N, "float32")
    outs = layer_norm_backward(M, N)
    k = pn.compile(outs, target="emulator", deterministic=True)
    (m,) = k.mappings
    merges = tuple(MergeMode.STORE if x == MergeMode.STORE else MergeMode.PARTIALS_GRID for x in m.merges)
    r = pn.compile(
        outs, target="emulator", deterministic=True, schedule=_with(k, persistent=8, per_sm=1, merges=merges)
    )
    assert 1 < combine_lanes(8, r.mappings[0].threads, N) < 8 and "pn_shfl_down(pn_f" in r.source
    refs, scales = _layer_norm64(*(v.astype(np.float64) for v in (a, d, g, mean, rstd)))
    runs = [r(a, d, g, mean, rstd, order=o, seed=9) for o in ("forward", "reverse", "shuffled")]
    for out, ref, scale, n in zip(runs[0], refs, scales, [N, M, M]):
        np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance("float32", n) * scale.max())
    for got in runs[1:]:
        assert all(np.array_equal(x, y) for x, y in zip(runs[0], got))


def test_the_grid_combine_loads_every_owner_in_one_batch(rng):
    """LayerNorm backward bf16 (dgamma and dbeta, each cast back to bf16 where it becomes final),
    PARTIALS_GRID on 8 blocks with several lanes per column: both owners' partial loads in one
    unrolled loop and their shuffle trees in one loop (codegen/column_partials.py `_in_lanes`),
    within bf16 rounding of numpy float64 and bit-identical across the emulator's thread orders.
    The model charges the two owners' loads as one batch where they fit in flight together."""
    from panamera.bench.train_suite import layer_norm_backward as ln_bf16

    M, N = 64, 1024
    a, d, g, mean, rstd = _inputs(rng, M, N, "bfloat16")
    outs = ln_bf16(M, N, "bfloat16")
    k = pn.compile(outs, target="emulator", deterministic=True)
    merges = tuple(MergeMode.STORE if x == MergeMode.STORE else MergeMode.PARTIALS_GRID for x in k.mappings[0].merges)
    r = pn.compile(
        outs, target="emulator", deterministic=True, schedule=_with(k, persistent=8, per_sm=1, merges=merges)
    )
    lanes = combine_lanes(8, r.mappings[0].threads, N)
    assert lanes > 1
    loop = r.source[r.source.index("for (int pn_b = 0;") :]
    loop = loop[: loop.index("pn_shfl_down")]
    assert len(re.findall(r"pn_ldcg\(&ws\d+\[b \* 1024 \+ j\]\)", loop)) == 2, loop  # one loop, both owners
    refs, scales = _layer_norm64(*(v.astype(np.float64) for v in (a, d, g, mean, rstd)))
    runs = [r(a, d, g, mean, rstd, order=o, seed=5) for o in ("forward", "reverse", "shuffled")]
    for out, ref, scale, n in zip(runs[0], refs, scales, [N, M, M]):
        assert out.dtype == np_dtype("bfloat16")
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0, atol=tolerance("bfloat16", n) * scale.max())
    for got in runs[1:]:
        assert all(np.array_equal(x, y) for x, y in zip(runs[0], got))
    # the model: 4096 x 1024 on 128 blocks (32 lanes of 4 loads per owner: 8 in flight, one batch) pays
    # one round trip of combine loads, on 132 (5 each: 10) two; one shuffle tree either way
    prog = build_program(tuple(ln_bf16(4096, 1024, "bfloat16")))
    group = joined_group(prog.column_candidates[0], prog)
    m = map_joined(group, H100)
    cycles = {b: dict(joined_cost(group, H100, dataclasses.replace(m.decision, persistent=b)).features)["sync_cycles"]
              for b in (128, 132)}  # fmt: skip
    assert cycles[132] - cycles[128] == H100.l2_latency_cycles


def test_replay_preconditions_of_the_persistent_grid(rng):
    """One negative test per precondition of schedule/persistent.py (and a persistent grid
    without column partials)."""
    outs = layer_norm_backward(40, 40)
    k = pn.compile(outs, target="emulator", gpu=FLOORED)
    (m,) = k.mappings
    bad = {
        "(1)": dict(split=2, grid=(m.grid[0], 2)),  # whole rows
        "(2)": dict(persistent=m.grid[0] + 1),  # more blocks than row tiles
        "(3)": dict(tx=1, chunk=m.chunk * m.tx),  # one thread per row: every column's partial, 80
        "(4)": dict(merges=(MergeMode.STORE,) * len(m.merges)),  # the columns never merge
    }
    grid = tuple(MergeMode.STORE if x == MergeMode.STORE else MergeMode.PARTIALS_GRID for x in m.merges)
    # 8 co-resident blocks of 256 threads (the thread rule; the launch bounds ask for per_sm)
    one_sm = dataclasses.replace(FLOORED, sms=1)
    with pytest.raises(ScheduleError, match=re.escape("(5)")):  # a grid-wide wait of 9 blocks on 1 SM
        pn.compile(
            layer_norm_backward(288, 24), target="emulator", gpu=one_sm,
            schedule=_with(pn.compile(layer_norm_backward(288, 24), target="emulator", gpu=one_sm), ty=32,
                           grid=(9, 1), persistent=9, per_sm=9, merges=grid),
        )  # fmt: skip
    for rule, change in bad.items():
        with pytest.raises(ScheduleError, match=re.escape(rule)):
            pn.compile(outs, target="emulator", schedule=_with(k, **change))
    with pytest.raises(ScheduleError, match="merge modes"):  # 4: atomics where partials are asked
        pn.compile(outs, target="emulator", deterministic=True, schedule=k.schedule)
    x = pn.placeholder((16, 8), name="x")
    plain = pn.compile(x - pn.sum(x, axis=1, keepdims=True), target="emulator")
    with pytest.raises(ScheduleError, match=re.escape("(2)")):  # a persistent row loop's blocks per SM
        pn.compile(x - pn.sum(x, axis=1, keepdims=True), target="emulator", schedule=_with(plain, persistent=1))


@pytest.mark.parametrize("deterministic", [False, True])
def test_columns_reading_a_row_sum_max_and_mean(deterministic, rng):
    """Columns in the pass after the row sum they read, a max (merged through integer images in
    atomic mode) and a mean, in one launch against numpy float64."""
    x = pn.placeholder((70, 12), name="x")
    r = pn.sum(x, axis=1, keepdims=True)
    k = pn.compile([x - r, pn.sum(x * r, axis=0), pn.max(x, axis=0), pn.mean(x, axis=0)], target="emulator",
                   deterministic=deterministic, gpu=FLOORED)  # fmt: skip
    assert len(k.plan.per_call) == 1 and k.mappings[0].persistent, k.explain()
    a = rng.standard_normal((70, 12)).astype(np.float32)
    a64 = a.astype(np.float64)
    r64 = a64.sum(1, keepdims=True)
    refs = [a64 - r64, (a64 * r64).sum(0), a64.max(0), a64.mean(0)]
    scales = [np.abs(a64).sum(1, keepdims=True) * 2, (np.abs(a64) * np.abs(r64)).sum(0), np.abs(a64), np.abs(a64)]
    for out, ref, scale, n in zip(k(a), refs, scales, [12, 70, 1, 70]):
        np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance("float32", n) * scale.max())


@pytest.mark.parametrize(
    "op, deterministic", [("layer_norm", False), ("layer_norm", True), ("rms_norm", True)]
)  # fmt: skip
def test_columns_carry_their_cast_back_to_bf16(op, deterministic, rng):
    """torch's decomposition casts dgamma / dbeta back to bf16 (bench/train_suite.py): the cast is
    the column's epilogue, applied where each column becomes final, so dx, dgamma and dbeta are
    still one launch (poly/row_columns.py `with_epilogues`), against numpy float64."""
    from panamera.bench.train_suite import layer_norm_backward as ln_bf16
    from panamera.bench.train_suite import rms_norm_backward as rms_bf16

    M, N = 48, 40
    a, d, g, mean, rstd = _inputs(rng, M, N, "bfloat16")
    a64, d64, g64 = (v.astype(np.float64) for v in (a, d, g))
    if op == "layer_norm":
        k = pn.compile(ln_bf16(M, N, "bfloat16"), target="emulator", deterministic=deterministic)
        outs = k(a, d, g, mean, rstd)
        refs, scales = _layer_norm64(a64, d64, g64, mean.astype(np.float64), rstd.astype(np.float64))
    else:
        k = pn.compile(rms_bf16(M, N, "bfloat16"), target="emulator", deterministic=deterministic)
        outs = k(a, d, g, rstd)
        refs, scales = _rms_norm64(a64, d64, g64, rstd.astype(np.float64))
    assert len(k.plan.per_call) == 1 and k.mappings[0].persistent, k.explain()
    assert "pays, one launch" in k.explain()
    build = ln_bf16 if op == "layer_norm" else rms_bf16  # the saved schedule names the joined group
    again = pn.compile(build(M, N, "bfloat16"), target="emulator", deterministic=deterministic, schedule=k.schedule)
    assert again.source == k.source
    for out, ref, scale, n in zip(outs, refs, scales, [N] + [M] * (len(refs) - 1)):
        assert out.dtype == np_dtype("bfloat16")
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0, atol=tolerance("bfloat16", n) * scale.max())


def test_a_column_carries_an_elementwise_epilogue(rng):
    """Any element-wise consumer of a column in its output space joins with it (not only a cast):
    the column stored too where it is read outside the kernel."""
    x = pn.placeholder((70, 12), name="x")
    b = pn.placeholder((12,), name="b")
    s = pn.sum(x, axis=0)
    k = pn.compile([x - pn.sum(x, axis=1, keepdims=True), s, pn.sqrt(s * s + b)], target="emulator")
    assert len(k.plan.per_call) == 1 and k.mappings[0].persistent, k.explain()
    a = rng.standard_normal((70, 12)).astype(np.float32)
    bb = np.abs(rng.standard_normal(12)).astype(np.float32)
    a64 = a.astype(np.float64)
    s64 = a64.sum(0)
    refs = [a64 - a64.sum(1, keepdims=True), s64, np.sqrt(s64 * s64 + bb)]
    scales = [np.abs(a64).sum(1) * 2, np.abs(a64).sum(0), np.abs(a64).sum(0)]
    for out, ref, scale, n in zip(k(a, bb), refs, scales, [12, 70, 70]):
        np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance("float32", n) * scale.max())


def _softmax_backward(M: int, N: int):
    y, dy = pn.placeholder((M, N), name="y"), pn.placeholder((M, N), name="dy")
    return y * (dy - pn.sum(dy * y, axis=1, keepdims=True))


def test_rows_reread_from_l2_through_a_persistent_row_loop(rng):
    """Softmax backward reads y and dy in both passes. At 4096 x 16384 float32 one block per row
    tile keeps more rows in flight than half the L2 holds, so the second pass re-read DRAM
    (modeled 436 us, 1.65x the limit); the model takes a persistent row loop of one block per SM
    (schedule/persistent.py `row_grids`) whose re-read hits L2. The loop, replayed at a small
    size (4 blocks over 10 row tiles), against numpy float64; its preconditions refused."""
    big = pn.compile(_softmax_backward(4096, 16384), target="emulator", use_database=False)
    b = map_group(big.groups[0], H100, cluster=False)  # with clusters, the model keeps each row on chip instead
    assert b.persistent == H100.sms and b.per_sm == 1 and set(b.merges) == {MergeMode.STORE}, b.describe()
    assert b.cost.total_s * 1e6 < 1.1 * estimate(big.plan, H100).limit_us  # modeled
    M, N = 40, 256
    plain = pn.compile(_softmax_backward(M, N), target="emulator")
    (m,) = plain.mappings
    k = pn.compile(
        _softmax_backward(M, N),
        target="emulator",
        schedule=_with(plain, persistent=4, per_sm=1, onchip=Residence.MEMORY),
    )
    assert k.mappings[0].persistent == 4 < m.grid[0] and k.plan.per_call[0].grid[0] == 4, k.explain()
    y = rng.random((M, N)).astype(np.float32)
    d = rng.standard_normal((M, N)).astype(np.float32)
    y64, d64 = y.astype(np.float64), d.astype(np.float64)
    s64 = (d64 * y64).sum(1, keepdims=True)
    scale = np.abs(y64) * (np.abs(d64) + (np.abs(d64) * y64).sum(1, keepdims=True))
    np.testing.assert_allclose(k(y, d), y64 * (d64 - s64), rtol=0, atol=tolerance("float32", N) * scale.max())
    with pytest.raises(ScheduleError, match=re.escape("(1)")):  # whole rows only
        pn.compile(_softmax_backward(M, N), target="emulator", schedule=_with(k, split=2, grid=(m.grid[0], 2)))
    y1 = pn.placeholder((M, N), name="y")
    red = pn.compile(pn.sum(y1, axis=1), target="emulator")
    with pytest.raises(ScheduleError, match="no stitched rows"):
        pn.compile(pn.sum(y1, axis=1), target="emulator", schedule=_with(red, persistent=1, per_sm=1))


@pytest.mark.parametrize("mode", [MergeMode.ATOMIC_WS, MergeMode.PARTIALS])
def test_partials_reduced_over_the_rows_in_chunks(mode, rng, monkeypatch):
    """A block of 8 x 32 threads keeps 3 steps x 4 lanes = 12 partials per column statement: with
    the tree's shared memory held to 8 KiB its rows reduce them 8 at a time (`tree_chunk` over 256
    threads), a full chunk then a partial one (`pn_reduce_y_all`), against numpy float64 (a
    replayed schedule; M = 64 leaves 2 row tiles of 32). At the shipped 32 KiB: one chunk of 12."""
    assert tree_chunk(256, 12, 4) == 12
    monkeypatch.setattr(derived, "COLUMN_TREE_BYTES", 8192)
    M, N = 64, 96
    a, d, g, mean, rstd = _inputs(rng, M, N, "float32")
    outs = layer_norm_backward(M, N)
    k = pn.compile(outs, target="emulator", gpu=FLOORED)
    merges = tuple(MergeMode.STORE if x == MergeMode.STORE else mode for x in k.mappings[0].merges)
    change = dict(tx=8, ty=32, chunk=24, grid=(2, 1), persistent=2, per_sm=1, unroll=1, merges=merges)
    r = pn.compile(outs, target="emulator", gpu=FLOORED, schedule=_with(k, **change), cache=False)
    assert tree_chunk(256, 12, 4) == 8 and "pn_reduce_y_all<pn_op_sum, 8, 32, 12, 8>" in r.source
    refs, scales = _layer_norm64(*(v.astype(np.float64) for v in (a, d, g, mean, rstd)))
    for order in ("forward", "reverse"):
        for out, ref, scale, n in zip(r(a, d, g, mean, rstd, order=order), refs, scales, [N, M, M]):
            np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance("float32", n) * scale.max())


def test_more_rows_per_block_where_the_model_says_so():
    """LayerNorm backward 4096 x 1024 bf16 (16-byte loads, 128 threads per row): 8 rows per block
    and at most one block per SM, 128 blocks' partials to merge (4 row tiles each: as many rounds
    as 132 blocks, `joined_counts`) where blocks of 256 threads leave 264: the 256-thread plan
    first, the larger block only where clearly (3 %) faster (modeled)."""
    from panamera.bench.train_suite import layer_norm_backward as ln_bf16

    prog = build_program(tuple(ln_bf16(4096, 1024, "bfloat16")))
    group = joined_group(prog.column_candidates[0], prog)
    m = map_joined(group, H100)
    assert (m.vec, m.tx, m.ty, m.persistent) == (8, 128, 8, 128), m.describe()
    small = dataclasses.replace(m.decision, ty=2, grid=(2048, 1), persistent=264, per_sm=2)
    assert m.cost.total_s < joined_cost(group, H100, small).total_s * 0.97
