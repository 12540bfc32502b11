"""A reduction's element-wise epilogue applied by whoever finishes each output (poly/epilogue.py):
one launch where the split reduction and its consumers were two. Every result against numpy in
float64 within a bound derived from the dtype, the reduction length and the magnitudes; every
kernel also goes through nvcc at session end (tests/conftest.py: no spills)."""

import dataclasses

import numpy as np
import pytest
from conftest import np_dtype, tolerance

import panamera as pn
from panamera.compiler import lower
from panamera.errors import ScheduleError
from panamera.model.gpu import A100
from panamera.poly.epilogue import is_head, joins
from panamera.schedule.mapping import MergeMode
from panamera.schedule.saved import Schedule


def compiled(outputs, **kw):
    """As the model plans it for an A100: no thread-block clusters, so a split's blocks merge
    through memory (the path these tests check; on sm_90 a cluster may combine them on chip
    instead: tests/test_cluster.py)."""
    return pn.compile(outputs, target="emulator", use_database=False, **{"gpu": "a100", **kw})


def only_kernel(k):
    """The plan is one reduce kernel with the epilogue, one launch per call."""
    (m,) = k.mappings
    assert m.epilogue and len(k.plan.per_call) == 1, k.explain()
    assert "applying the epilogue" in k.explain() and "-> epilogue fused" in k.explain()
    return m


def assert_within(got, ref, terms, values, dtype, n, roundings=3):
    """|got - ref| within float32 accumulation over n terms (tolerance("float32", n), relative to
    `terms`: the sum of the summands' magnitudes, |a| @ |b|) plus `roundings` roundings to the
    result dtype (2 ulps each, relative to `values`: a bound of the rounded intermediates, the
    reduction's value and the epilogue's operands)."""
    ulp = {"float16": 2**-10, "float32": 2**-23}[dtype]
    err = np.abs(np.asarray(got, np.float64) - ref)
    bound = tolerance("float32", n) * terms + roundings * 2 * ulp * values
    assert np.all(err <= bound), f"max error {err.max():.3g}, bound there {bound.flat[err.argmax()]:.3g}"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_split_row_gemv_with_bias_relu_and_residual(dtype, deterministic):
    rng = np.random.default_rng(0)
    # 16 outputs cannot fill the GPU: split-K. Rows long enough that merging partials (deterministic)
    # clearly beats 16 whole-row blocks in the calibrated model (fp16: twice as many elements)
    n, k = 16, 1 << (18 if dtype == "float16" else 17)
    xa, wa = rng.standard_normal((1, k)).astype(np_dtype(dtype)), rng.standard_normal((n, k)).astype(np_dtype(dtype))
    ba, ra = rng.standard_normal(n).astype(np_dtype(dtype)), rng.standard_normal((1, n)).astype(np_dtype(dtype))
    x, w = pn.placeholder(xa.shape, dtype, name="x"), pn.placeholder(wa.shape, dtype, name="w")
    b, r = pn.placeholder(ba.shape, dtype, name="b"), pn.placeholder(ra.shape, dtype, name="r")
    y = pn.maximum(pn.matmul(x, w.T) + b, 0.0) + r
    kern = compiled(y, deterministic=deterministic)
    m = only_kernel(kern)
    assert m.form == "ROW" and m.split > 1
    assert m.merges[0] == (MergeMode.PARTIALS if deterministic else MergeMode.ATOMIC_WS)
    x64, w64, b64, r64 = (a.astype(np.float64) for a in (xa, wa, ba, ra))
    ref = np.maximum(x64 @ w64.T + b64, 0) + r64
    outs = [kern(xa, wa, ba, ra, order=order, seed=3) for order in ("forward", "reverse")]
    for got in outs:
        values = np.abs(x64 @ w64.T) + np.abs(b64) + np.abs(r64)
        assert_within(got, ref, np.abs(x64) @ np.abs(w64).T, values, dtype, k)
    if deterministic:  # partials combined in one fixed order: bit-identical whatever the block order
        np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_split_all_sum_times_two_plus_a_scalar(dtype, deterministic):
    rng = np.random.default_rng(1)
    n = 1 << 18
    xa, ca = (rng.standard_normal(n) * 0.25).astype(np_dtype(dtype)), np.array(0.25, np_dtype(dtype))
    x, c = pn.placeholder(xa.shape, dtype, name="x"), pn.placeholder((), dtype, name="c")
    kern = compiled(pn.sum(x) * 2 + c, deterministic=deterministic)
    m = only_kernel(kern)
    assert m.form == "ALL" and m.split > 1
    assert m.merges[0] == (MergeMode.PARTIALS if deterministic else MergeMode.ATOMIC_WS)
    s64 = xa.astype(np.float64).sum()
    ref = s64 * 2 + float(ca)
    assert_within(kern(xa, ca), ref, 2 * np.abs(xa.astype(np.float64)).sum(), 2 * abs(s64) + abs(ref), dtype, n)


@pytest.mark.parametrize("deterministic", [False, True])
def test_split_column_sum_with_two_epilogue_outputs(deterministic):
    """Two consumers of one COLUMN sum (the second reads the first's register), and the sum
    itself an output: stored too, by the same thread."""
    rng = np.random.default_rng(2)
    xa, ca = rng.standard_normal((1 << 14, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    x, c = pn.placeholder(xa.shape, name="x"), pn.placeholder(ca.shape, name="c")
    s = pn.sum(x, axis=0)
    e1 = s * 2 + c
    # an A100 whose every launch pays the floor: there the fused kernel wins in both merge modes (on a
    # real A100 the two tiny element-wise launches queued behind the reduction cost about as much as
    # the last block's epilogue, and the deterministic plan leaves them unfused)
    floored = dataclasses.replace(A100, queued_launch_s=-1.0)
    kern = compiled([s, e1, pn.tanh(e1)], deterministic=deterministic, gpu=floored)
    m = only_kernel(kern)
    assert m.form == "COLUMN" and m.split > 1 and len(m.statements) == 3
    s64 = xa.astype(np.float64).sum(0)
    mag = np.abs(xa.astype(np.float64)).sum(0)
    got_s, got_e1, got_t = kern(xa, ca)
    rows, values = xa.shape[0], 2 * np.abs(s64) + np.abs(ca)
    assert_within(got_s, s64, mag, np.abs(s64), "float32", rows)
    assert_within(got_e1, s64 * 2 + ca, 2 * mag, values, "float32", rows)
    # tanh is 1-Lipschitz; its own error is a few ulps of a value at most 1 (the 4 of `roundings`)
    assert_within(got_t, np.tanh(s64 * 2 + ca), 2 * mag, values + 1, "float32", rows, roundings=4)


def test_gemv_of_an_int8_dequantized_weight_with_its_epilogue():
    rng = np.random.default_rng(3)
    k, n = 4096, 128
    xa = rng.standard_normal((1, k)).astype(np.float32)
    qa = rng.integers(-127, 128, (k, n)).astype(np.int8)
    sa, ba = (rng.random(n) * 0.02).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x, q = pn.placeholder(xa.shape, name="x"), pn.placeholder(qa.shape, "int8", name="q")
    s, b = pn.placeholder(sa.shape, name="s"), pn.placeholder(ba.shape, name="b")
    kern = compiled(pn.maximum(pn.matmul(x, q.astype("float32") * s) + b, 0.0))
    m = only_kernel(kern)
    assert m.form == "COLUMN"
    w64 = qa.astype(np.float64) * sa.astype(np.float64)
    ref = np.maximum(xa.astype(np.float64) @ w64 + ba, 0)
    values = np.abs(xa.astype(np.float64) @ w64) + np.abs(ba)
    assert_within(kern(xa, qa, sa, ba), ref, np.abs(xa.astype(np.float64)) @ np.abs(w64), values, "float32", k)


def test_the_planner_weighs_the_epilogue_against_the_stitched_and_unfused_plans():
    # 12 rows: the stitched kernel beats the two unfused launches (queued: the second pays 0.5 us on
    # an A100) and the split reduce kernel applying the epilogue beats both
    x, c = pn.placeholder((12, 1 << 16), name="x"), pn.placeholder((12,), name="c")
    kern = compiled(pn.sum(x, axis=1) * 2 + c)
    stitched, epi = kern.considered
    assert epi.chosen and not stitched.chosen and stitched.superseded
    assert epi.fused_us < min(epi.stitched_us, epi.unfused_us) and epi.split > 1
    text = kern.explain()
    assert "-> epilogue group instead" in text and f"vs stitched {epi.stitched_us:.1f} us" in text
    assert "1 launch(es) per call" in text


def test_a_schedule_replays_the_epilogue_and_refuses_a_misfit():
    x, c = pn.placeholder((4, 1 << 16), name="x"), pn.placeholder((4,), name="c")
    y = pn.sum(x, axis=1) * 2 + c
    kern = compiled(y)
    sched = Schedule.from_json(kern.schedule.to_json())
    assert sched == kern.schedule and sched.epilogues == (("S0", "S1"),)
    again = pn.compile(y, target="emulator", gpu="a100", schedule=sched)
    assert [k.source for k in again.kernels] == [k.source for k in kern.kernels]
    with pytest.raises(ScheduleError, match="not a legal epilogue group"):
        pn.compile(y, target="emulator", gpu="a100", schedule=dataclasses.replace(sched, epilogues=(("S1",),)))
    plain = dataclasses.replace(kern.schedule.kernels[0], epilogue=False)
    with pytest.raises(ScheduleError, match="epilogue"):
        pn.compile(y, target="emulator", gpu="a100", schedule=dataclasses.replace(sched, kernels=(plain,)))
    assert "epilogue" not in compiled(pn.sum(x, axis=1)).schedule.to_json()  # older files read the same


# -- one negative test per precondition of poly/epilogue.py ---------------------------------------
def _program(outputs):
    return lower(outputs, stop_after="program", target="emulator").program


def test_precondition_1_the_head_is_a_reduction():
    p = _program([pn.placeholder((4, 8), name="a") * 2.0 + 1.0])
    assert not any(is_head(s) for s in p.statements) and p.epilogue_candidates == ()


def test_precondition_2_a_consumer_of_the_row_space_is_left_to_stitching():
    x = pn.placeholder((4, 64), name="x")
    p = _program(x - pn.sum(x, axis=1, keepdims=True))
    assert p.epilogue_candidates == () and p.stitch_candidates


def test_precondition_3_a_consumer_reading_another_output_index():
    y = pn.sum(pn.placeholder((4, 4, 64), name="x"), axis=2)
    assert _program(y + pn.transpose(y, (1, 0))).epilogue_candidates == ()


def test_precondition_4_two_reductions_of_different_tilings():
    y = pn.sum(pn.placeholder((4, 4, 64), name="x"), axis=2)
    z = pn.max(pn.placeholder((64, 16), name="w"), axis=0).reshape((4, 4))
    assert _program(y + z).epilogue_candidates == ()


def test_precondition_5_a_statement_that_does_not_read_the_reduction():
    x, c = pn.placeholder((4, 64), name="x"), pn.placeholder((4,), name="c")
    (cand,) = _program([pn.sum(x, axis=1) + 1.0, c * 2.0]).epilogue_candidates
    assert [s.kind for s in cand] == ["reduce", "map"] and len(cand) == 2


def test_precondition_6_no_path_leaves_the_group_and_comes_back():
    """t reads y transposed (precondition 3: not a joiner); z reads y and t. z alone would join
    (2 to 5 hold), but t depends on y and z on t: the group would wait for a later kernel."""
    y = pn.sum(pn.placeholder((4, 4, 64), name="x"), axis=2)
    t = pn.transpose(y, (1, 0)) * 2.0
    p = _program([t, y + t])
    head, _, z = p.statements
    reductions = {head.result.uid}
    assert joins(z, head, {head.result.uid: head}, reductions) and p.epilogue_candidates == ()
    got = compiled([t, y + t])(np.ones((4, 4, 64), np.float32))
    np.testing.assert_array_equal(got[1], np.full((4, 4), 64 + 128, np.float32))


@pytest.mark.parametrize("deterministic", [False])
def test_a_register_tiled_split_linear_applies_the_epilogue_to_every_tile_row(deterministic):
    """A skinny linear (8 rows of x sharing each weight row: schedule/rtile.py) split over K:
    the finishing block applies bias + relu to each row of its register tile. (Deterministic: the
    calibrated model keeps whole rows here, the last block's combine of every tile row's partials
    costing more than the split saves; the deterministic epilogue is the GEMV test's.)"""
    rng = np.random.default_rng(4)
    m, n, k = 8, 32, 1 << 15
    xa, wa = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
    ba = rng.standard_normal(n).astype(np.float32)
    x, w, b = pn.placeholder(xa.shape, name="x"), pn.placeholder(wa.shape, name="w"), pn.placeholder(ba.shape, name="b")
    kern = compiled(pn.maximum(pn.matmul(x, w.T) + b, 0.0), deterministic=deterministic)
    mp = only_kernel(kern)
    assert mp.rtile * mp.ctile > 1 and mp.split > 1
    x64, w64 = xa.astype(np.float64), wa.astype(np.float64)
    ref = np.maximum(x64 @ w64.T + ba, 0)
    assert_within(kern(xa, wa, ba), ref, np.abs(x64) @ np.abs(w64).T, np.abs(x64 @ w64.T) + np.abs(ba), "float32", k)
