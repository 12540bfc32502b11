"""Element-wise activations and math (frontend/activations.py) against float64 numpy, with
tolerances from the dtype (a few roundings of an element-wise chain)."""

import math

import numpy as np
import pytest
from conftest import tolerance

import panamera as pn

ERF = np.vectorize(math.erf)


def _ref(name, x):
    if name == "gelu":
        return 0.5 * x * (1 + ERF(x / math.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if name == "softplus":
        return np.log1p(np.exp(x))
    if name == "hard_sigmoid":
        return np.clip(0.2 * x + 0.5, 0, 1)
    if name == "hard_swish":
        return x * np.clip(x / 6 + 0.5, 0, 1)
    if name == "leaky_relu":
        return np.where(x < 0, 0.01 * x, x)
    if name == "elu":
        return np.where(x < 0, np.expm1(x), x)
    if name == "selu":
        return np.where(x <= 0, pn.frontend.activations.SELU_GAMMA * pn.frontend.activations.SELU_ALPHA * np.expm1(x),
                        pn.frontend.activations.SELU_GAMMA * x)  # fmt: skip
    return getattr(np, name)(x)


FUNCS = {
    "gelu": pn.gelu,
    "gelu_tanh": lambda x: pn.gelu(x, approximate="tanh"),
    "softplus": pn.softplus,
    "hard_sigmoid": pn.hard_sigmoid,
    "hard_swish": pn.hard_swish,
    "leaky_relu": pn.leaky_relu,
    "elu": pn.elu,
    "selu": pn.selu,
    "sign": pn.sign,
    "sin": pn.sin,
    "cos": pn.cos,
}


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("name", sorted(FUNCS))
def test_activation(name, dtype):
    rng = np.random.default_rng(5)
    a = (rng.standard_normal(256) * 4).astype(dtype)
    a[:3] = (0.0, -0.0, 3.0)
    x = pn.placeholder(a.shape, dtype, name="x")
    k = pn.compile(FUNCS[name](x), target="emulator")
    got = k(a).astype(np.float64)
    want = _ref(name, a.astype(np.float64))
    tol = 8 * tolerance(dtype, 1)  # a chain of a few rounded operations
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_nan_inf_predicates_and_sign():
    a = np.array([0.0, -1.5, np.nan, np.inf, -np.inf, 2.0], np.float32)
    x = pn.placeholder(a.shape, name="x")
    k = pn.compile([pn.isnan(x), pn.isinf(x), pn.isinf(x, detect_negative=False), pn.sign(x)], target="emulator")
    nan, inf, pos, sign = k(a)
    np.testing.assert_array_equal(nan, np.isnan(a))
    np.testing.assert_array_equal(inf, np.isinf(a))
    np.testing.assert_array_equal(pos, a == np.inf)
    np.testing.assert_array_equal(sign, np.sign(a))


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float64"])
def test_mod_and_fmod_follow_numpy(dtype):
    a = np.array([7, -7, 7, -7, 0, 5], dtype)
    b = np.array([3, 3, -3, -3, 2, 5], dtype)
    x, y = pn.placeholder(a.shape, dtype, name="a"), pn.placeholder(b.shape, dtype, name="b")
    k = pn.compile([pn.mod(x, y), pn.fmod(x, y)], target="emulator")
    m, f = k(a, b)
    np.testing.assert_array_equal(m, np.mod(a, b))
    np.testing.assert_array_equal(f, np.fmod(a, b))


def test_integer_mod_by_zero_is_zero_as_numpy():
    a, b = np.array([5, -5], np.int32), np.array([0, 0], np.int32)
    k = pn.compile(pn.mod(pn.placeholder((2,), "int32"), pn.placeholder((2,), "int32")), target="emulator")
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(k(a, b), np.mod(a, b))


def test_bad_activation_arguments():
    with pytest.raises(pn.OptionError, match="approximate"):
        pn.gelu(pn.placeholder((2,), name="h"), approximate="fast")
    with pytest.raises(pn.DTypeError, match="gelu of 'i'"):
        pn.gelu(pn.placeholder((2,), "int32", name="i"))
