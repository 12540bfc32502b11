"""The symbolic CPU softmax's last pass as the static one's (schedule/cpu_param_reuse.py: exp(x - m)
kept in the output row, one negative test per precondition; codegen/cpu_param_kernel.py: the
per-row reciprocal, the pass unswitched on its flag), and the symbolic argmax/argmin (an iota read,
the 32-bit and empty extents checked at the binding) against numpy over several shapes from one
program.

Tolerances: softmax's per-element bound (conftest.softmax_bound: float32's exp, sum, reciprocal and
product roundings); argmax/argmin are exact (numpy's first index of the extreme, NaN first)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
from conftest import softmax_bound, tolerance

import panamera as pn
from panamera.errors import AxisError, EmptyReductionError, Unsupported
from panamera.model.cpu import CpuModel
from panamera.poly.params import build
from panamera.schedule.cpu_param_mapping import arg_lanes
from panamera.schedule.cpu_param_reuse import choose
from panamera.schedule.size_class import SizeClass

MODEL = CpuModel.nominal(2, 32)
CLS = SizeClass.of({"B": 64, "N": 30522}, frozenset())
SHAPES = ((3, 5), (1, 1), (64, 3000), (2, 70001), (33, 7))


def _kept(outputs, model=MODEL, kind="stitched"):
    p = build(outputs, gathers=True)
    return choose(p.statements, kind, CLS, model)


def _softmax(dtype="float32"):
    return pn.nn.softmax(pn.placeholder(("B", "N"), dtype, name="x"), axis=1, method="multipass")


def test_softmax_keeps_exp_in_its_output_row_and_matches_numpy_at_every_size():
    (x,) = _kept((_softmax(),))
    assert (x.producer, x.consumers, x.ops, x.into) == (1, (2,), "exp(sub)", 2)
    k = pn.compile(_softmax(), target="cpu")
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        a = (rng.standard_normal(shape) * 4).astype(np.float32)
        ref, bound = softmax_bound(a)
        out = np.asarray(k(a), np.float64)
        assert np.all(np.abs(out - ref) <= bound), shape
    plans = [c.plan.decisions[0] for c in k._classes.values()]
    assert any(d.reuse for d in plans)
    src = next(c for c in k._classes.values() if c.plan.decisions[0].reuse).kernels[0].source
    assert "kept for the last pass" in src and "if (pn_rcp" in src and "expf" not in src.split("if (pn_rcp")[1]


def test_a_nan_row_takes_the_division_branch_as_numpy():
    k = pn.compile(_softmax(), target="cpu")
    a = (np.random.default_rng(4).standard_normal((3, 3000)) * 4).astype(np.float32)
    a[1, 17] = np.nan  # its sum is NaN: the flag is false, the row divides (all NaN, as numpy)
    ref, bound = softmax_bound(a)
    out = np.asarray(k(a), np.float64)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    assert np.isnan(out[1]).all() and np.all(np.abs(out[[0, 2]] - ref[[0, 2]]) <= bound[[0, 2]])


def test_precondition_1_a_kernel_that_is_no_stitched_row_group_keeps_nothing():
    assert _kept((_softmax(),), kind="single") == ()
    assert _kept((pn.sum(pn.exp(pn.placeholder(("B", "N"), "float32", name="x")), axis=1),), kind="single") == ()


def test_precondition_2_nothing_varying_and_costly_in_common_keeps_nothing():
    x = pn.placeholder(("B", "N"), "float32", name="x")
    assert _kept((x / pn.sum(x, axis=1, keepdims=True),)) == ()  # only the load of x in common


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_precondition_3_a_16_bit_output_cannot_hold_the_float_value(dtype):
    assert _kept((_softmax(dtype),)) == ()


def test_precondition_4_a_cheap_exp_is_recomputed():
    cheap = dataclasses.replace(MODEL, rates=dataclasses.replace(MODEL.rates, exp_ns=MODEL.rates.add_ns))
    assert _kept((_softmax(),), cheap) == ()


def test_log_softmax_matches_numpy_whatever_is_kept():
    k = pn.compile(pn.nn.log_softmax(pn.placeholder(("B", "N"), "float32", name="x"), axis=1), target="cpu")
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        a = (rng.standard_normal(shape) * 4).astype(np.float32)
        x = a.astype(np.float64)
        m = x.max(1, keepdims=True)
        ref = x - m - np.log(np.exp(x - m).sum(1, keepdims=True))
        tol = tolerance("float32", shape[1]) * (1 + np.abs(x).max())
        np.testing.assert_allclose(np.asarray(k(a), np.float64), ref, rtol=0, atol=tol)


def _arrays(dtype, shape, rng):
    a = rng.standard_normal(shape) * 3
    a = a.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else a.astype(dtype)
    if a.size > 8:
        a.flat[-1] = a.max()  # a tie: the first index wins
    if dtype.startswith(("float", "bfloat")) and a.size > 4:
        a.flat[3] = np.nan  # numpy: the first NaN is the extreme
    return a


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("axis", [1, 0, None])
def test_symbolic_argmax_and_argmin_match_numpy_from_one_program(dtype, axis):
    x = pn.placeholder(("B", "N"), dtype, name="x")
    kmax, kmin = pn.compile(pn.argmax(x, axis=axis), target="cpu"), pn.compile(pn.argmin(x, axis=axis), target="cpu")
    rng = np.random.default_rng(2)
    for shape in SHAPES:
        a = _arrays(dtype, shape, rng)
        wide = np.asarray(a, np.float64)
        np.testing.assert_array_equal(np.asarray(kmax(a)), wide.argmax(axis))
        np.testing.assert_array_equal(np.asarray(kmin(a)), wide.argmin(axis))
    assert kmax.counters["calls"] == len(SHAPES)
    src = next(iter(kmax._classes.values())).kernels[0].source
    assert "in1" not in src  # the iota is no buffer: its value is printed from the coordinates


def test_symbolic_argmax_keepdims_and_two_threads():
    x = pn.placeholder(("B", "N"), "float32", name="x")
    k = pn.compile(pn.argmax(x, axis=1, keepdims=True), target="cpu")
    a = _arrays("float32", (37, 5000), np.random.default_rng(3))
    ref = np.asarray(a, np.float64).argmax(1)[:, None]
    np.testing.assert_array_equal(np.asarray(k(a, threads=1)), ref)
    np.testing.assert_array_equal(np.asarray(k(a, threads=2)), ref)


def test_symbolic_argmax_of_an_empty_row_is_numpys_error():
    k = pn.compile(pn.argmax(pn.placeholder(("B", "N"), "float32", name="x"), axis=1), target="cpu")
    with pytest.raises(EmptyReductionError, match="argmax"):
        k(np.zeros((3, 0), np.float32))


def test_symbolic_argmax_extent_beyond_a_32_bit_index_is_refused_at_binding():
    k = pn.compile(pn.argmin(pn.placeholder(("B", "N"), "float32", name="x"), axis=1), target="cpu")
    with pytest.raises(AxisError, match="32-bit"):
        k.bind_sizes([SimpleNamespace(shape=(2, 2**32))])
    assert k.bind_sizes([SimpleNamespace(shape=(2, 2**31))]) == {"B": 2, "N": 2**31}


def test_iota_stays_unsupported_without_the_cpu_reads():
    with pytest.raises(Unsupported, match="iota"):
        build((pn.argmax(pn.placeholder(("B", "N"), "float32", name="x"), axis=1),))


def _arg_lanes(y, scan=32):
    (s,) = build((y,), gathers=True).statements
    return arg_lanes((s,), scan)


def test_arg_lanes_keep_value_and_index_per_lane_where_the_index_is_j():
    x = pn.placeholder(("B", "N"), "float32", name="x")
    assert _arg_lanes(pn.argmax(x, axis=1)) and _arg_lanes(pn.argmin(x, axis=None))
    k = pn.compile(pn.argmax(x, axis=1), target="cpu")
    a = _arrays("float32", (5, 20000), np.random.default_rng(5))
    np.testing.assert_array_equal(np.asarray(k(a)), np.asarray(a, np.float64).argmax(1))
    c = k._class(k.size_class({"B": 5, "N": 20000}))
    assert c.plan.decisions[0].arg_lanes and "pn_lv[c0]" in c.kernels[0].source


def test_arg_lanes_refused_without_a_lane_scan_a_key_body_or_a_row_index():
    x = pn.placeholder(("B", "N"), "float32", name="x")
    assert not _arg_lanes(pn.argmax(x, axis=1), scan=0)  # short rows: no lane scan
    assert not _arg_lanes(pn.max(x, axis=1))  # no (value, index) key
    assert not _arg_lanes(pn.argmax(x, axis=0))  # COLUMN: the index is no row's j
