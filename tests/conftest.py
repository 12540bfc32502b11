import ml_dtypes
import numpy as np
import pytest

import panamera as pn

NP = {"bfloat16": np.dtype(ml_dtypes.bfloat16)}


def np_dtype(name: str) -> np.dtype:
    return NP.get(name, np.dtype(name) if name != "bool" else np.dtype(np.bool_))


def random_array(shape, dtype: str, rng, op: str = "sum") -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) > (0.002 if op == "all" else 0.5)
    if dtype.startswith("int"):
        if op == "prod":
            return np.where(rng.random(shape) < 0.01, -1, 1).astype(dtype)
        return rng.integers(-50, 50, shape).astype(dtype)
    if op == "prod":
        return (1.0 + 0.01 * (rng.random(shape) - 0.5)).astype(np_dtype(dtype))
    return (rng.random(shape) * 2 - 0.7).astype(np_dtype(dtype))


def reference(op: str, a: np.ndarray, axis, keepdims=False):
    """numpy in float64 for float inputs (the exact semantics for the others)."""
    if a.dtype.kind == "f" or a.dtype == np_dtype("bfloat16"):
        return getattr(np, op)(a.astype(np.float64), axis=axis, keepdims=keepdims)
    return getattr(np, op)(a, axis=axis, keepdims=keepdims)


def tolerance(dtype: str, n: int) -> float:
    """Relative/absolute tolerance for a reduction of n values of dtype (accumulated in fp32 for
    16-bit floats; the result itself is rounded to the dtype)."""
    eps = {"float16": 2**-10, "bfloat16": 2**-7, "float32": 2**-23, "float64": 2**-52}.get(dtype, 0.0)
    acc = 2**-23 if dtype in ("float16", "bfloat16") else eps
    return 2 * eps + acc * max(n, 1) ** 0.5 * 8


def check(k, arrays, ref, dtype, n, orders=("forward", "reverse")):
    outs = []
    for order in orders:
        out = k(*arrays, order=order, seed=7)
        assert out.shape == np.shape(ref)
        tol = tolerance(dtype, n)
        if tol:
            np.testing.assert_allclose(out.astype(np.float64), np.asarray(ref, np.float64), rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(out, ref)
        outs.append(out)
    return outs


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


__all__ = ["pn"]
