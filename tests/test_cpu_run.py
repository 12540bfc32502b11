"""OptimizedModel.run on the CPU target: each subgraph's constants bound once in its call table
(subgraph/cpu_run.py), the live inputs checked and passed per run. Two runs with other inputs return
independent results, each against float64 numpy; a live input of the wrong dtype still gets its
specific error."""

import numpy as np
import pytest
from conftest import random_array, tolerance
from onnx import TensorProto, helper

from panamera.errors import DTypeError
from panamera.subgraph.optimizer import optimize


def _model(rng):
    v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    w = random_array((32, 24), "float32", rng)
    b = random_array((24,), "float32", rng)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"]), helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0)]  # fmt: skip
    inits = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
             helper.make_tensor("b", TensorProto.FLOAT, b.shape, b.ravel())]  # fmt: skip
    g = helper.make_graph(nodes, "g", [v("x", [8, 32])], [v("y", [8, 24]), v("s", [])], inits)
    return helper.make_model(g).SerializeToString(), w.astype(np.float64), b.astype(np.float64)


def test_two_runs_return_independent_correct_results(rng):
    data, w, b = _model(rng)
    opt = optimize(data, target="cpu")
    bound = [st[4] for st in opt._steps if st[4] is not None]
    assert bound and all(run.live == ("x",) for run in bound), opt  # w and b bound once
    runs = []
    for _ in range(2):
        x = random_array((8, 32), "float32", rng)
        runs.append((x, opt.run({"x": x}, threads=1)))
    assert not np.shares_memory(runs[0][1]["y"], runs[1][1]["y"])
    for x, got in runs:  # the first run's results are untouched by the second
        y = np.maximum(x.astype(np.float64) @ w + b, 0.0)
        scale = float((np.abs(x.astype(np.float64)) @ np.abs(w) + np.abs(b)).max())
        t = tolerance("float32", 33)
        np.testing.assert_allclose(got["y"], y, rtol=t, atol=t * scale)
        t = tolerance("float32", 33 + 8 * 24)
        np.testing.assert_allclose(got["s"], y.sum(), rtol=t, atol=t * scale * 8 * 24)
    with pytest.raises(DTypeError, match="'x'"):
        opt.run({"x": np.ones((8, 32), np.float64)})
