"""Regression tests of issue 18's frontend items: special values, extreme integers, shapes at the
edges (empty, huge, broadcast from both sides) and the arguments a compiled call is given.

Each wrong answer is checked against numpy in float64 (tolerances from conftest.tolerance: the
dtype and the reduction length); each refused input asserts the specific PanameraError.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tolerance

import panamera as pn
from panamera.codegen.kernel import index_type
from panamera.compiler import lower
from panamera.errors import InputError, OptionError, OutOfMemoryError, ShapeError
from panamera.frontend import ops

INF, NAN = np.inf, np.nan


def _emu(out):
    return pn.compile(out, target="emulator")


# -- var / std / Welford mean with inf and NaN ----------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_var_and_std_of_inf_and_nan_are_nan_as_numpy(dtype):
    a = np.array([[1, INF, 2], [INF, INF, INF], [-INF, 1, 1], [1, 2, NAN], [1, 2, 4]], dtype)
    x = pn.placeholder(a.shape, dtype, name="x")
    v, s, m = _emu([pn.var(x, axis=1), pn.std(x, axis=1, ddof=1), ops.welford(x, 1, False, "mean")])(a)
    with np.errstate(invalid="ignore"):
        rv, rs, rm = np.var(a, axis=1), np.std(a, axis=1, ddof=1), np.mean(a.astype(np.float64), axis=1)
    assert np.isnan(v[:4]).all() and np.isnan(s[:4]).all()
    np.testing.assert_allclose(v, rv, rtol=tolerance(dtype, 3), atol=0)
    np.testing.assert_allclose(s, rs, rtol=tolerance(dtype, 3), atol=0)
    np.testing.assert_array_equal(m[:4], rm[:4])  # inf, inf, nan (inf - inf), nan: the Welford mean too


def test_var_over_an_extent_of_one_is_nan_for_inf_and_nan():
    a = np.array([[INF], [-INF], [NAN], [3.0]])
    x = pn.placeholder(a.shape, "float64", name="x")
    got = _emu(pn.var(x, axis=1))(a)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, np.var(a, axis=1))  # [nan, nan, nan, 0]


def test_var_with_inf_merged_across_threads_and_blocks(rng):
    """One inf per row, far from the first element: the merges of partials (split across blocks)
    must carry it into NaN, while a finite row keeps its numpy variance."""
    a = rng.standard_normal((4, 20000)).astype(np.float32)
    a[1, 12345], a[2, 777], a[3, 19999] = INF, NAN, -INF
    x = pn.placeholder(a.shape, "float32", name="x")
    got = pn.compile(pn.var(x, axis=1), target="emulator", split=4)(a)
    ref = np.var(a.astype(np.float64), axis=1)
    assert np.isnan(got[1:]).all() and np.isnan(ref[1:]).all()
    np.testing.assert_allclose(got[0], ref[0], rtol=tolerance("float32", a.shape[1]))


# -- max / min with where= and initial= -----------------------------------------------------------
@pytest.mark.parametrize("op,initial", [("max", -5), ("min", -75)])
def test_masked_max_min_fold_initial_into_rows_that_are_all_selected(op, initial):
    a = np.array([[-60, -51, -70], [-80, -90, 3], [-1, -2, -3]], np.float32)
    mask = np.array([[True, True, True], [True, False, True], [False, False, False]])
    x, m = pn.placeholder(a.shape, "float32", name="x"), pn.placeholder(a.shape, "bool", name="m")
    got = _emu(getattr(pn, op)(x, axis=1, where=m, initial=initial))(a, mask)
    np.testing.assert_array_equal(got, getattr(np, op)(a, axis=1, where=mask, initial=initial))  # -5, not -51


def test_where_takes_a_numpy_bool_array_as_a_constant_mask():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    mask = np.array([True, False, True, True])  # broadcast over the rows, as numpy
    x = pn.placeholder(a.shape, "float32", name="x")
    k = _emu([pn.sum(x, axis=1, where=mask), pn.max(x, axis=0, where=mask, initial=-1.0), pn.mean(x, where=mask)])
    assert [t.name for t in k.inputs] == ["x"]  # the mask is the kernel's own: the caller passes x only
    for got, want in zip(k(a), (a.sum(1, where=mask), a.max(0, where=mask, initial=-1.0), a.mean(where=mask))):
        np.testing.assert_allclose(got, want, rtol=tolerance("float32", a.size))
    k2 = _emu(pn.sum(x, axis=1, where=~mask))  # another mask: another program, not a stale cache entry
    np.testing.assert_array_equal(k2(a), a.sum(1, where=~mask))
    with pytest.raises(OptionError, match="bool"):
        pn.sum(x, where=np.array([1, 0, 1, 1]))  # numpy refuses an int mask too
    with pytest.raises(ShapeError, match="where=.*broadcast"):
        pn.sum(x, where=np.ones(3, bool))


# -- integer edge values and wide index arithmetic ------------------------------------------------
@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("op", ["mod", "fmod"])
def test_int_min_mod_minus_one_is_zero_not_sigfpe(op, dtype):
    lo = np.iinfo(dtype).min
    a, b = np.array([lo, lo, 7, -7, lo], dtype), np.array([-1, 0, -1, 3, 7], dtype)
    x, y = pn.placeholder((5,), dtype, name="x"), pn.placeholder((5,), dtype, name="y")
    with np.errstate(all="ignore"):
        want = getattr(np, op)(a, b)
    np.testing.assert_array_equal(_emu(getattr(pn, op)(x, y))(a, b), want)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_int_min_trunc_div_minus_one_wraps_as_numpy(dtype):
    """ONNX's integer Div (trunc_div): INT_MIN / -1 wraps to INT_MIN, x / 0 is 0."""
    lo = np.iinfo(dtype).min
    a, b = np.array([lo, 7, -7, lo], dtype), np.array([-1, -1, 2, 0], dtype)
    x, y = pn.placeholder((4,), dtype, name="x"), pn.placeholder((4,), dtype, name="y")
    got = _emu(pn.frontend.tensor.binary("trunc_div", x, y))(a, b)
    np.testing.assert_array_equal(got, np.array([lo, -7, -3, 0], dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_whose_batch_axes_broadcast_from_both_sides(dtype, rng):
    """(2, 1, M, K) @ (5, K, N): the pulled-back batch index reads `(32767 * i + 32767) / 32768`,
    whose product overflows int although every address fits: the kernel indexes in 64 bits."""
    sa, sb = (2, 1, 128, 33), (5, 33, 256)
    a, b = (rng.standard_normal(s).astype(dtype) for s in (sa, sb))
    out = pn.placeholder(sa, dtype, name="a") @ pn.placeholder(sb, dtype, name="b")
    low = lower(out, stop_after="mappings", target="emulator")
    assert index_type(low.groups[0], low.mappings[0]) == "long long"
    ref = a.astype(np.float64) @ b.astype(np.float64)
    bound = tolerance(dtype, 33) * np.abs(a).max() * np.abs(b).max() * 33
    np.testing.assert_allclose(_emu(out)(a, b), ref, rtol=0, atol=bound)


# -- valid input that was refused -----------------------------------------------------------------
def test_an_empty_input_nothing_reads_stays_an_input():
    e, w = pn.placeholder((0, 3), name="e"), pn.placeholder((2, 3), name="w")
    k = _emu(pn.concatenate([e, w]))
    assert [t.name for t in k.inputs] == ["e", "w"]
    ones = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(k(np.zeros((0, 3), np.float32), ones), ones)  # positionally
    np.testing.assert_array_equal(k(e=np.zeros((0, 3), np.float32), w=ones), ones)
    f = pn.placeholder((0, 3), name="f")
    assert [t.name for t in _emu(pn.concatenate([e, f])).inputs] == ["e", "f"]  # all pieces empty


def test_constant_pad_of_an_empty_tensor():
    e = pn.placeholder((2, 0), "float32", name="e")
    k = _emu(pn.pad(e, ((1, 0), (1, 2)), value=7.0))
    np.testing.assert_array_equal(
        k(np.zeros((2, 0), np.float32)), np.pad(np.zeros((2, 0)), ((1, 0), (1, 2)), constant_values=7)
    )


@pytest.mark.parametrize("key", [np.s_[-5::-1], np.s_[-1:-5:-1], np.s_[5:], np.s_[:-9:-2], np.s_[10:0:-3]])
def test_slices_that_clamp_or_come_out_empty(key):
    a = np.arange(3, dtype=np.float32)
    y = pn.placeholder((3,), "float32", name="y")
    np.testing.assert_array_equal(_emu(y[key] + 0.0)(a), a[key])


@pytest.mark.parametrize("name", ["order", "seed", "out"])
def test_inputs_named_like_call_options_are_passed_by_name(name):
    p, q = pn.placeholder((3,), name=name), pn.placeholder((3,), name="q")
    k = _emu(p * 2.0 + q)
    one = np.ones(3, np.float32)
    np.testing.assert_array_equal(k(**{name: one, "q": one}), np.full(3, 3.0, np.float32))
    r = pn.placeholder((3,), name="r")
    buf = np.zeros(3, np.float32)
    assert _emu(r * 2.0)(r=one, order="reverse", seed=5, out=buf) is buf and (buf == 2).all()  # still options


# -- bad input let through ------------------------------------------------------------------------
def test_shapes_beyond_int64_indexing_are_refused():
    with pytest.raises(ShapeError, match="placeholder 'h'.*more than"):
        pn.placeholder((2**32, 2**32), name="h")
    with pytest.raises(ShapeError, match="more than"):
        pn.placeholder((2**63, 4), name="h")
    a, b = pn.placeholder((2**30, 1), "int8", name="a"), pn.placeholder((1, 2**30), "int8", name="b")
    with pytest.raises(ShapeError):  # a broadcast result, not only a placeholder
        a + b
    assert pn.placeholder((2**28, 2**28), "int8", name="ok").size == 2**56  # the bound itself is fine


# -- unclear errors -------------------------------------------------------------------------------
def test_slice_step_zero_is_a_shape_error():
    y = pn.placeholder((8,), name="y")
    with pytest.raises(ShapeError, match="'y'.*step cannot be zero"):
        y[::0]
    with pytest.raises(ShapeError, match="step 0"):
        pn.slice(y, (0,), (8,), steps=(0,))


def test_a_read_only_out_array_is_an_input_error():
    x = pn.placeholder((3,), name="x")
    buf = np.zeros(3, np.float32)
    buf.flags.writeable = False
    with pytest.raises(InputError, match="out= output 0.*read-only"):
        _emu(x * 2.0)(np.ones(3, np.float32), out=buf)


def test_torch_sparse_tensors_are_refused_clearly():
    torch = pytest.importorskip("torch")
    k = _emu(pn.placeholder((2, 2), name="m") * 2.0)
    for t in (torch.ones(2, 2).to_sparse(), torch.ones(2, 2).to_sparse_csr()):
        with pytest.raises(InputError, match="'m'.*layout.*to_dense"):
            k(t)


def test_an_allocation_that_fails_is_an_out_of_memory_error():
    x = pn.placeholder((1, 1), "float32", name="x")
    k = _emu(pn.broadcast_to(x, (2**25, 2**25)))  # a 4 PiB result: no host can hold it
    with pytest.raises(OutOfMemoryError, match="cannot allocate buffer 'out:") as e:
        k(np.ones((1, 1), np.float32))
    assert isinstance(e.value, MemoryError) and f"{4 * 2**50} bytes" in str(e.value)
