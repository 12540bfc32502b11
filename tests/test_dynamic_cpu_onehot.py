"""The one-hot → gather rewrite on the symbolic CPU path (schedule/onehot.py through
dynamic_cpu.py's `build`): a symbolic cross-entropy reads each row's target logit by one gather
(poly/params.py's indirect read), matches numpy in float64 at several sizes from one program, and
the parametric model's gather preconditions each refuse what they do not cover.

Tolerances: the logsumexp's (tests/test_cpu_onehot.py): `conftest.tolerance` of the dtype and the
row length, on the scale of the row's largest logit; the picked logit itself is exact."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tolerance

import panamera as pn
from panamera.dynamic_cpu import DynamicCpuCompiled
from panamera.errors import Unsupported
from panamera.frontend.tensor import topological
from panamera.poly.params import build

SIZES = ((6, 300), (3, 17), (40, 1000), (1, 1), (9, 4099))


def _reference(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    m = x.max(1)
    lse = m + np.log(np.exp(x - m[:, None]).sum(1))
    ok = (t >= 0) & (t < x.shape[1])
    return lse - np.where(ok, x[np.arange(len(t)), np.clip(t, 0, x.shape[1] - 1)], 0.0)


def _targets(rng, b: int, c: int, dtype) -> np.ndarray:
    t = rng.integers(0, c, b)
    t[: min(b, 3)] = (-1, c, -c - 7)[: min(b, 3)]  # outside [0, C): no logit selected (the loss is the logsumexp)
    return t.astype(dtype)


def _ops(k: DynamicCpuCompiled) -> set[str]:
    return {u.op for u in topological(k.program.outputs)}


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_symbolic_cross_entropy_gathers_the_target_at_every_size(dtype, rng):
    x = pn.placeholder(("B", "C"), dtype, name="x")
    t = pn.placeholder(("B",), "int64", name="t")
    k = pn.compile(pn.nn.cross_entropy(x, t, reduction="none"), target="cpu", cache=False)
    assert isinstance(k, DynamicCpuCompiled)
    assert "gather" in _ops(k) and not {"eq", "iota"} & _ops(k)  # one read per row, no compare per element
    for b, c in SIZES:
        xs = (rng.standard_normal((b, c)) * 4).astype(pn.dtypes.as_dtype(dtype).np)
        ts = _targets(rng, b, c, np.int64)
        x64 = xs.astype(np.float64)
        want = _reference(x64, ts)
        got = k(xs, ts, threads=1)
        atol = tolerance(dtype, c) * (np.abs(x64).max() + np.log(c) + 1)
        np.testing.assert_allclose(
            got.astype(np.float64), want, rtol=tolerance(dtype, c), atol=atol, err_msg=f"{b}x{c}"
        )
        assert np.array_equal(got, k(xs, ts, threads=2), equal_nan=True)  # no split: the same bits
    assert k.stats()["programs_compiled"] == 1


def test_symbolic_cross_entropy_mean_int32_targets_and_a_constant_class_count(rng):
    """int32 targets; C a constant (B alone symbolic): the bound is an int, the read the same gather."""
    x = pn.placeholder(("B", 257), "float32", name="x")
    t = pn.placeholder(("B",), "int32", name="t")
    k = pn.compile(pn.nn.cross_entropy(x, t), target="cpu", cache=False)
    assert "gather" in _ops(k)
    for b in (5, 33, 130):
        xs = rng.standard_normal((b, 257)).astype(np.float32)
        ts = _targets(rng, b, 257, np.int32)
        want = _reference(xs.astype(np.float64), ts).mean()
        atol = tolerance("float32", 257) * (np.abs(xs).max() + np.log(257) + 1)
        np.testing.assert_allclose(float(k(xs, ts)), want, rtol=tolerance("float32", 257 * b), atol=atol)


def test_a_nan_off_the_target_is_never_read(rng):
    """The gather reads x[i, t[i]] only: a NaN elsewhere in the row reaches the logsumexp (NaN, as
    numpy) but not the picked logit, which a one-hot sum would also give."""
    x = pn.placeholder(("B", "C"), "float32", name="x")
    t = pn.placeholder(("B",), "int64", name="t")
    k = pn.compile(pn.nn.cross_entropy(x, t, reduction="none"), target="cpu", cache=False)
    xs = rng.standard_normal((4, 64)).astype(np.float32)
    xs[0, 5] = np.nan
    ts = np.array([3, 5, 7, 9])
    got = k(xs, ts)
    assert np.isnan(got[0]) and np.isfinite(got[1:]).all()


# -- poly/params.py's gather (precondition 1): each refusal ---------------------------------------


def test_a_gather_is_unsupported_unless_the_target_asks_for_them():
    """The GPU's symbolic path (gathers=False) refuses it as before: its kernels print no indirect read."""
    x, t = pn.placeholder(("B", "C"), name="x"), pn.placeholder(("B", 1), "int64", name="t")
    g = pn.take_along_axis(x, t, 1)
    with pytest.raises(Unsupported, match="gather"):
        build((g,))
    assert build((g,), gathers=True).statements[0].reads[-1].indirect is not None


def test_a_gather_of_a_computed_tensor_is_unsupported():
    x, t = pn.placeholder(("B", "C"), name="x"), pn.placeholder(("B", 1), "int64", name="t")
    with pytest.raises(Unsupported, match="stored tensor"):
        build((pn.take_along_axis(pn.exp(x), t, 1),), gathers=True)


def test_a_gather_whose_index_is_narrower_than_the_data_is_unsupported():
    x, t = pn.placeholder(("B", 8), name="x"), pn.placeholder(("B", 4), "int64", name="t")
    with pytest.raises(Unsupported, match="extents"):
        build((pn.take_along_axis(x, t, 0),), gathers=True)  # 4 of x's 8 columns
