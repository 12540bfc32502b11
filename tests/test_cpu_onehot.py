"""One-hot selections summed over their axis read as gathers on the CPU target (schedule/onehot.py):
cross_entropy's and nll_loss's target logit, against numpy in float64; one negative test per
precondition of `onehot.match`."""

import numpy as np
import pytest
from conftest import tolerance

import panamera as pn
from panamera.frontend.tensor import topological
from panamera.schedule import onehot

N, C = 6, 300


def _targets(rng):
    t = rng.integers(0, C, N)
    t[1], t[3], t[4] = -1, C, -C - 7  # outside [0, C): no logit selected (the loss is the logsumexp)
    return t


def _lse(x: np.ndarray) -> np.ndarray:
    m = x.max(1)
    return m + np.log(np.exp(x - m[:, None]).sum(1))


def _picked(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    ok = (t >= 0) & (t < x.shape[1])
    return np.where(ok, x[np.arange(len(t)), np.clip(t, 0, x.shape[1] - 1)], 0.0)


def _atol(x: np.ndarray, dtype: str) -> float:
    """The logsumexp's error: a sum of C exponentials (each within a few ulp) and its log, on the
    scale of the row's largest logit; the picked logit itself is exact."""
    return tolerance(dtype, C) * (np.abs(x).max() + np.log(C) + 1)


def _nll(x, t, ignore: int):
    """torch_backend/aten.py's nll_loss (arange(C).reshape(1, C) == t): the loss per row, 0 where ignored."""
    n, c = x.shape
    picked = pn.sum(pn.where(pn.arange(c).reshape((1, c)) == t.reshape((n, 1)), x, 0.0), axis=1)
    return pn.where(t != ignore, -picked, 0.0)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_cross_entropy_reads_the_target(dtype, rng):
    """The CPU plan gathers x[i, t[i]] (no compare in the row scan), matches float64 numpy for
    in-range and out-of-range targets, and is bit-identical across thread counts."""
    x = pn.placeholder((N, C), dtype, name="x")
    t = pn.placeholder((N,), "int64", name="t")
    k = pn.compile(pn.nn.cross_entropy(x, t, reduction="none"), target="cpu")
    assert "gather" in {u.op for u in topological(k.stages.graph)}
    assert "eq" not in {u.op for u in topological(k.stages.graph)}
    xs = (rng.standard_normal((N, C)) * 4).astype(pn.dtypes.as_dtype(dtype).np)
    ts = _targets(rng)
    x64 = xs.astype(np.float64)
    want = _lse(x64) - _picked(x64, ts)
    got = k(xs, ts, threads=1)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tolerance(dtype, C), atol=_atol(x64, dtype))
    assert np.array_equal(got, k(xs, ts, threads=2), equal_nan=True)


def test_cross_entropy_mean_int32_targets(rng):
    x = pn.placeholder((N, C), "float32", name="x")
    t = pn.placeholder((N,), "int32", name="t")
    k = pn.compile(pn.nn.cross_entropy(x, t), target="cpu")
    xs = rng.standard_normal((N, C)).astype(np.float32)
    ts = _targets(rng).astype(np.int32)
    x64 = xs.astype(np.float64)
    want = (_lse(x64) - _picked(x64, ts)).mean()
    np.testing.assert_allclose(float(k(xs, ts)), want, rtol=tolerance("float32", C * N), atol=_atol(x64, "float32"))


def test_nll_ignore_index_and_nan(rng):
    """nll_loss's pattern (arange reshaped, ignore_index rows 0): a NaN off the target column is
    never read (the row's loss stays finite), a NaN on it is the loss, as with the one-hot sum."""
    x = pn.placeholder((N, C), "float32", name="x")
    t = pn.placeholder((N,), "int64", name="t")
    k = pn.compile(_nll(x, t, -100), target="cpu")
    assert "eq" not in {u.op for u in topological(k.stages.graph)}
    xs = rng.standard_normal((N, C)).astype(np.float32)
    ts = _targets(rng)
    ts[0], ts[2], ts[5] = -100, 7, 9
    xs[2, 8], xs[5, 9] = np.nan, np.nan
    want = np.where(ts != -100, -_picked(xs.astype(np.float64), ts), 0.0)
    got = k(xs, ts)
    assert np.isnan(got[5]) and np.isfinite(np.delete(got, 5)).all()
    np.testing.assert_array_equal(
        np.delete(got, 5), np.delete(want, 5).astype(np.float32)
    )  # the gathered values, exact


def test_nll_of_log_softmax_one_kernel(rng):
    """torch's cross_entropy (log_softmax, then nll_loss): the log-probability is recomputed at the
    target, so log_softmax's (N, C) output is never written: one row kernel."""
    x = pn.placeholder((N, C), "float32", name="x")
    t = pn.placeholder((N,), "int64", name="t")
    k = pn.compile(_nll(pn.nn.log_softmax(x, axis=1), t, -100), target="cpu")
    assert "eq" not in {u.op for u in topological(k.stages.graph)} and len(k.cpu_kernels) == 1
    xs = (rng.standard_normal((N, C)) * 4).astype(np.float32)
    ts = _targets(rng)
    ts[0] = -100
    x64 = xs.astype(np.float64)
    want = np.where(ts != -100, -_picked(x64 - _lse(x64)[:, None], ts), 0.0)
    np.testing.assert_allclose(k(xs, ts), want, rtol=tolerance("float32", C), atol=_atol(x64, "float32"))


# -- one negative test per precondition of onehot.match -------------------------------------------
def _x():
    return pn.placeholder((N, C), "float32", name="x")


def _t(shape=(N, 1), dtype="int64"):
    return pn.placeholder(shape, dtype, name="t")


def _select(x, t, axis=1, other=0.0):
    return pn.where(pn.arange(C if axis == 1 else N).reshape((1, C) if axis == 1 else (N, 1)) == t, x, other)


def test_match_positive_either_order():
    x, t = _x(), _t()
    assert onehot.match(pn.sum(_select(x, t), axis=1)) is not None
    idx = pn.arange(C).reshape((1, C))
    assert onehot.match(pn.sum(pn.where(t == idx, x, 0.0), axis=1)) is not None


def test_precondition_1_sum_over_one_axis():
    x, t = _x(), _t()
    assert onehot.match(pn.mean(_select(x, t), axis=1)) is None
    assert onehot.match(pn.max(_select(x, t), axis=1)) is None
    assert onehot.match(pn.sum(_select(x, t), axis=(0, 1))) is None


def test_precondition_2_where_eq_zero():
    x, t = _x(), _t()
    assert onehot.match(pn.sum(_select(x, t, other=1.0), axis=1)) is None
    assert onehot.match(pn.sum(_select(x, t, other=-0.0), axis=1)) is None
    assert onehot.match(pn.sum(pn.where(pn.arange(C).reshape((1, C)) < t, x, 0.0), axis=1)) is None


def test_precondition_3_index_along_the_axis():
    x, t = _x(), _t((1, C))
    assert onehot.match(pn.sum(_select(x, t, axis=0), axis=1)) is None  # the index runs along axis 0
    shifted = pn.arange(C).reshape((1, C)) + 1
    assert onehot.match(pn.sum(pn.where(shifted == _t(), x, 0.0), axis=1)) is None


def test_precondition_4_one_integer_target_per_row():
    x = _x()
    assert onehot.match(pn.sum(_select(x, _t((1, 1))), axis=1)) is None  # one target broadcast to all rows
    assert onehot.match(pn.sum(_select(x, _t(dtype="float32")), axis=1)) is None


def test_precondition_5_elementwise_of_memory():
    x, t = _x(), _t()
    xt = pn.placeholder((C, N), "float32", name="xt").T
    assert onehot.match(pn.sum(_select(xt, t), axis=1)) is None  # a transpose: not element-wise
    bias = pn.placeholder((C,), "float32", name="b")
    assert onehot.match(pn.sum(_select(x + bias, t), axis=1)) is None  # a per-class operand would need a gather too
    row = pn.max(x, axis=1, keepdims=True)
    assert onehot.match(pn.sum(_select(pn.exp(x - row), t), axis=1)) is not None  # per-row operands: read as they are
    assert onehot.match(pn.sum(_select(x.astype("float64"), t), axis=1)) is not None


def test_precondition_6_same_dtype():
    x, t = pn.placeholder((N, C), "int8", name="x"), _t()
    r = pn.sum(pn.where(pn.arange(C).reshape((1, C)) == t, x, 0), axis=1)
    assert r.dtype != x.dtype and onehot.match(r) is None
