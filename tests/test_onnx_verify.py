"""The verifier never fails a correct result: a float64 reference, tolerances from reduction
lengths and magnitudes, index inputs drawn within what they index, masks as masks."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from panamera.errors import OptionError
from panamera.subgraph import optimize
from panamera.subgraph.verify import compare, random_inputs


def _column_sum(rows: int = 65536, cols: int = 4) -> bytes:
    g = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0, axes=[0])], "colsum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, cols])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [cols])],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)]).SerializeToString()


def _centered(rows: int = 65536, cols: int = 4) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    return x - x.mean(0, dtype=np.float64).astype(np.float32)  # column sums near zero


def test_correct_column_sum_near_zero_passes():
    x = _centered()
    opt = optimize(_column_sum(), target="emulator")
    y = opt.run({"x": x})["y"]
    exact = x.astype(np.float64).sum(0)
    assert np.abs(exact).max() < 1e-3  # the result is near zero: |result|-relative tolerances fail it
    assert not compare("y", y, x.sum(0)).ok  # as the float32 reference with the old tolerance did
    checks = opt.verify({"x": x})
    assert [c.ok for c in checks] == [True], checks
    assert checks[0].reference == "float64 reference"


def test_wrong_column_sum_still_fails():
    x = _centered(4096, 4)
    opt = optimize(_column_sum(4096, 4), target="emulator")
    ours = opt.run({"x": x})
    ours["y"] = ours["y"] + np.float32([0, 0, 0.5, 0])  # one term of ~0.5 missing from a column
    from panamera.subgraph.verify import verify_values

    checks = verify_values(opt.model, {"x": x}, ours)
    assert not checks[0].ok and "max |error| 0.5" in checks[0].detail


def _embedding(rows: int = 2) -> bytes:
    emb = numpy_helper.from_array(np.random.default_rng(1).standard_normal((rows, 8)).astype(np.float32), "emb")
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Gather", ["emb", "ids32"], ["e"]),
        helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axes"], ["m3"]),
        helper.make_node("Mul", ["e", "m3"], ["em"]),
        helper.make_node("Softmax", ["em"], ["y"], axis=-1),
    ]
    g = helper.make_graph(
        nodes, "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4, 16]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16, 8])],
        [emb, numpy_helper.from_array(np.int64([-1]), "axes")],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def test_gather_index_input_drawn_within_the_table():
    opt = optimize(_embedding(rows=2), target="emulator")
    feeds = random_inputs(opt.model, seed=7)
    assert set(np.unique(feeds["ids"])) <= {0, 1}
    assert set(np.unique(feeds["mask"])) <= {0, 1} and feeds["mask"][:, 0].all()  # a mask: 0/1, never all hidden
    assert all(c.ok for c in opt.verify(seed=7))


def test_cli_verify_options(tmp_path):
    path = tmp_path / "embed.onnx"
    path.write_bytes(_embedding(rows=3))
    r = subprocess.run(
        [sys.executable, "-m", "panamera.cli", "optimize", str(path), "--target", "emulator", "--verify",
         "--seed", "3", "--rtol", "1e-3", "--atol", "1e-4"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    # Gather, casts, mask and softmax are one subgraph now (a gather is a non-affine read): one value
    assert "1/1 values match (float64 reference; random inputs, seed 3; emulator backend)" in r.stdout


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="onnxruntime is not installed")
def test_verify_with_onnxruntime():
    opt = optimize(_embedding(rows=5), target="emulator")
    checks = opt.verify(seed=1, against="onnxruntime")
    refs = {c.reference for c in checks}
    assert {"float64 reference", "onnxruntime"} <= refs and all(c.ok for c in checks), checks


def test_unknown_reference_is_an_option_error():
    opt = optimize(_embedding(), target="emulator")
    with pytest.raises(OptionError, match="--verify=tensorflow"):
        opt.verify(against="tensorflow")


def test_cli_rejects_unknown_verify_value(tmp_path):
    path = tmp_path / "embed.onnx"
    path.write_bytes(_embedding())
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "panamera.cli", "optimize", str(path), "--verify=tensorflow"],
                       capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert r.returncode == 2 and "tensorflow" in r.stderr and "Traceback" not in r.stderr
