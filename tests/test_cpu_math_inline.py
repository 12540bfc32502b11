"""The CPU target's inline float erf and log (runtime/cpu.py MATH_INLINE, replacing libmvec's
spilling calls; tanh stays libmvec's, see there). Measured on every float (2^32 inputs, vector path, against
double libm): erf 1.13 ulp, log 0.90 (bounds here: 2, 1); C's special values (+-0 keep their sign in erf,
log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf, erf(+-inf) = +-1, NaN in -> NaN out). Here: 2^20 random bit
patterns a function plus the special values, through compiled kernels, against numpy float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

import panamera as pn

ULP = {"erf": 2.0, "log": 1.0}  # measured bounds: see the module docstring
SPECIAL = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-40, 1.17549435e-38, 1.0, -1.0, 0.625, 0.875,
     4.0, 3.92, 9.0, 44.0, 45.0, 3.4e38, -3.4e38, 2.0**-24, 1.0 - 2.0**-24, 1.0 + 2.0**-23, -50.0, 50.0, -1.0, -1e-45]
).astype(np.float32)  # fmt: skip


def _reference(op: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # NaN payloads
        x64 = x.astype(np.float64)
    if op == "erf":
        return np.frompyfunc(math.erf, 1, 1)(x64).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x64)


def _ulp(r: np.ndarray) -> np.ndarray:
    """One float32 ulp at |r| (2^-149 below FLT_MIN)."""
    e = np.frexp(np.abs(r))[1]
    return np.where(np.abs(r) < np.finfo(np.float32).tiny, 2.0**-149, np.ldexp(1.0, e - 24))


@pytest.mark.parametrize("op", ["erf", "log"])
def test_inline_math_within_ulp_bound_and_special_values(op, rng):
    bits = rng.integers(0, 2**32, 2**20, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), SPECIAL])
    k = pn.compile(getattr(pn, op)(pn.placeholder(x.shape, "float32")), target="cpu")
    got = k(x).astype(np.float64)
    want = _reference(op, x)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    exact = ~nan & (np.isinf(want) | (want == 0))  # inf, -inf and signed zeros: exactly
    assert np.array_equal(got[exact], want[exact]) and np.array_equal(np.signbit(got[exact]), np.signbit(want[exact]))
    ok = ~nan & ~exact
    err = np.abs(got[ok] - want[ok]) / _ulp(want[ok])
    assert err.max() <= ULP[op], (op, err.max(), x[ok][err.argmax()])
    tail = got[-4:]  # -50, 50, -1, -1e-45
    if op == "log":
        assert np.isnan(tail[[0, 2, 3]]).all()
    else:  # odd functions saturate at exactly +-1; -0 keeps its sign (checked with the zeros above)
        assert (tail[:2] == [-1, 1]).all() and (got[x == np.inf] == 1).all() and (got[x == -np.inf] == -1).all()
