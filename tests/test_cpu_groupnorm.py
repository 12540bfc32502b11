"""target="cpu": GroupNorm as PyTorch exports it (Reshape to (N, G, -1), InstanceNormalization, Reshape
back, per-channel affine) with a SiLU epilogue, UNet's block. The normalize pass reads per-group
statistics (floor(i / group)) and per-channel weights (floor(i / plane)): it scans runs of i over
which both are constant (codegen/cpu_runs.py), with the per-run values hoisted out of the SIMD loop.
Results against float64 with tolerances from the dtype and the group length; the exported UNet run
as one C call against onnxruntime."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import tolerance
from onnx import TensorProto, helper, numpy_helper

from panamera.codegen.cpu_runs import MIN_RUN
from panamera.subgraph.optimizer import optimize

EPS32 = 2.0**-24
EPS = 1e-5


def _group_norm_silu(shape: tuple[int, ...], groups: int, rng) -> tuple[bytes, dict]:
    """x -> Reshape (N, G, -1) -> InstanceNormalization (scale s, bias b per group) -> Reshape to x's
    shape -> * gamma[C,1,1] + beta[C,1,1] -> x * Sigmoid(x); the weights as a dict."""
    c = shape[1]
    w = {
        "s": rng.uniform(0.5, 1.5, groups).astype(np.float32),
        "b": rng.standard_normal(groups).astype(np.float32) * 0.1,
        "gamma": rng.uniform(0.5, 2.0, (c, 1, 1)).astype(np.float32),
        "beta": rng.standard_normal((c, 1, 1)).astype(np.float32),
        "gshape": np.array([0, groups, -1], np.int64),
    }
    nodes = [
        helper.make_node("Reshape", ["x", "gshape"], ["r"]),
        helper.make_node("InstanceNormalization", ["r", "s", "b"], ["n"], epsilon=EPS),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Reshape", ["n", "xs"], ["n4"]),
        helper.make_node("Mul", ["n4", "gamma"], ["m"]),
        helper.make_node("Add", ["m", "beta"], ["h"]),
        helper.make_node("Sigmoid", ["h"], ["sg"]),
        helper.make_node("Mul", ["h", "sg"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "gn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        [numpy_helper.from_array(a, k) for k, a in w.items()],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString(), w


def _reference(x: np.ndarray, groups: int, w: dict) -> tuple[np.ndarray, np.ndarray]:
    """float64 GroupNorm + SiLU of `x` and a bound on a float32 kernel's error per element: the
    statistics within `tolerance(float32, n)` (n the group's length; relative to its magnitude), the
    normalized value within |y| (var's and rsqrt's relative error) + |mean error| / sigma, scaled by
    the affine weights (plus 4 roundings), then SiLU's slope (<= 1.1) and its own roundings (expf's
    4 ulp, the sum, the division, the product)."""
    n, c = x.shape[:2]
    xg = x.astype(np.float64).reshape(n, groups, -1)
    mean, var = xg.mean(-1, keepdims=True), xg.var(-1, keepdims=True)
    sigma = np.sqrt(var + EPS)
    y = (xg - mean) / sigma
    t = tolerance("float32", xg.shape[-1])
    mag = np.abs(xg).max(-1, keepdims=True)
    y_err = np.abs(y) * (t * mag**2 / (var + EPS) + 8 * EPS32) + t * mag / sigma
    s, b = w["s"].astype(np.float64)[None, :, None], w["b"].astype(np.float64)[None, :, None]
    z = (y * s + b).reshape(x.shape)
    z_err = (y_err * np.abs(s)).reshape(x.shape) + 4 * EPS32 * (np.abs(y * s) + np.abs(b)).reshape(x.shape)
    gamma, beta = w["gamma"].astype(np.float64)[None], w["beta"].astype(np.float64)[None]
    h = z * gamma + beta
    h_err = z_err * np.abs(gamma) + 4 * EPS32 * (np.abs(z * gamma) + np.abs(beta))
    out = h / (1.0 + np.exp(-h))
    return out, 1.1 * h_err + 16 * EPS32 * np.abs(out) + 1e-30


@pytest.mark.parametrize(
    "shape, groups",
    [((2, 8, 8, 8), 4), ((1, 16, 6, 6), 8), ((1, 6, 3, 3), 3)],
    ids=["runs-of-64", "runs-of-36", "plane-9-flat"],
)
def test_group_norm_silu_against_float64(shape, groups, rng):
    """Planes of 64 and 36 elements (>= MIN_RUN) scan runs of a plane: the source reads the group's
    statistics at floor(pn_q / channels per group), with no division of i left; a plane of 9 keeps
    the flat loop. Each run (unit path, then the one-call chain) within the float64 bound, 1 and 2
    threads bit-equal (the normalize pass is element-wise, the statistics one task per group)."""
    model, w = _group_norm_silu(shape, groups, rng)
    opt = optimize(model, target="cpu")
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    ref, bound = _reference(x, groups, w)
    plane = shape[2] * shape[3]
    src = "".join(sg.runner.executor.source for sg in opt.subgraphs)
    if plane >= MIN_RUN:
        assert "pn_q" in src and f"/ {plane})" not in src and f"/ {plane * shape[1] // groups})" not in src
    outs = [opt.run({"x": x}, threads=t)["y"] for t in (1, 1, 2)]  # the second run builds the chain
    assert len(opt._chain) == 2 and opt._chain[1] is not None
    for got in outs:
        err = np.abs(got.astype(np.float64) - ref)
        assert (err <= bound).all(), f"max |error| {err.max():.3g}, bound there {bound.flat[err.argmax()]:.3g}"
    np.testing.assert_array_equal(outs[2], outs[1])


def test_unet_chain_matches_onnxruntime(rng):
    """The exported UNet block (GroupNorm+SiLU, 3x3 convs, a time embedding, a 1x1 skip) as one C call
    on the CPU target: its output within verify.py's error budget of onnxruntime's (both sides round),
    and equal to the unit-by-unit run's."""
    ort = pytest.importorskip("onnxruntime")
    from test_exported_models import DATA, feeds_for, ort_bounds

    path = os.path.join(DATA, "unet-torchscript.onnx")
    opt = optimize(path, target="cpu")
    feeds = feeds_for(path)
    first = opt.run(feeds, threads=1)
    chained = opt.run(feeds, threads=1)
    assert opt._chain[1] is not None  # every unit in the one C call
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    bounds = ort_bounds(path, feeds, names)
    for k, want in zip(names, sess.run(None, feeds)):
        r, a = bounds[k]
        err = np.abs(chained[k].astype(np.float64) - want)
        assert (err <= 2 * (a + r * np.abs(want))).all(), f"output {k}: max |error| {err.max():.3g}"
        np.testing.assert_allclose(chained[k], first[k], rtol=4 * EPS32, atol=4 * EPS32 * float(np.abs(want).max()))
