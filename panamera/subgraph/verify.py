"""Verification: comparing a model's values with onnx's reference evaluator, within a tolerance
fitted to each dtype, on random or given inputs.

>>> import numpy as np
>>> compare("y", np.float32([1.0, 2.0]), np.float32([1.0, 2.00001])).ok
True
>>> compare("y", np.int64([1, 2]), np.int64([1, 3])).detail
'max |error| 1 (rtol 0, atol 0)'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper

from .library import to_host
from .model import OnnxModel


@dataclass(frozen=True)
class Check:
    """The comparison of one value with the reference: whether it matches, and by how much not."""

    value: str
    ok: bool
    max_abs_err: float
    detail: str = ""


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing a Panamera result with onnx's reference evaluator."""
    name = np.dtype(dtype).name
    return {"float64": (1e-9, 1e-12), "float32": (2e-4, 1e-5), "float16": (1e-2, 1e-3), "bfloat16": (5e-2, 1e-2)}.get(
        name, (0.0, 0.0)
    )


def compare(name: str, got, want, rtol: float | None = None, atol: float | None = None) -> Check:
    """Compare `got` (numpy or CuPy) with the reference `want`: floats within the dtype's tolerance
    (widened to `rtol`/`atol` if given), NaN matching NaN; integers and booleans exactly."""
    got = to_host(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return Check(name, False, float("inf"), f"shape {got.shape} != reference {want.shape}")
    r, a = tolerance(want.dtype)
    r, a = max(r, rtol or 0.0), max(a, atol or 0.0)
    if want.dtype.kind not in "biu":  # floats, including ml_dtypes' bfloat16 and float8 types
        g64, w64 = got.astype(np.float64), want.astype(np.float64)
        ok = bool(np.allclose(g64, w64, rtol=r, atol=a, equal_nan=True))
        fin = np.isfinite(g64) & np.isfinite(w64)
        err = float(np.max(np.abs(g64[fin] - w64[fin]), initial=0.0))
    else:
        ok = bool(np.array_equal(got, want))
        err = 0.0 if ok else float(np.max(np.abs(got.astype(np.int64) - want.astype(np.int64)), initial=0))
    return Check(name, ok, err, "" if ok else f"max |error| {err:.3g} (rtol {r:g}, atol {a:g})")


def random_inputs(model: OnnxModel, seed: int = 0) -> dict[str, np.ndarray]:
    """One random array per model input: booleans, small integers in [-10, 10), standard normal floats."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in model.inputs:
        v = model.values[name]
        dt = helper.tensor_dtype_to_np_dtype(v.elem)
        if dt == np.bool_:
            feeds[name] = rng.random(v.shape) < 0.5
        elif np.issubdtype(dt, np.integer):
            feeds[name] = rng.integers(-10, 10, v.shape).astype(dt)
        else:
            feeds[name] = rng.standard_normal(v.shape).astype(dt)
    return feeds
