"""ONNX models with symbolic dims (dim_param) optimized without --shape (issue 22, item 4): the
subgraphs the symbolic path supports are one DynamicCompiled each, the others compiled per call
shape (cached), and the model runs at two sizes against onnxruntime. Small hand-built models: the
exported models of tests/data/models all have static dims.

Tolerances: onnxruntime computes in float32 too; each output is a softmax after a layer norm of
16 values and a 16-term dot product, so both sides carry about sqrt(16) float32
roundings of values of magnitude ~4 before the softmax: `tolerance("float32", 16)` times that
magnitude, absolute, on probabilities.
"""

import numpy as np
import pytest
from conftest import tolerance

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import panamera as pn  # noqa: E402
from panamera.subgraph.dynamic_model import dim_params, fit, optimize_dynamic  # noqa: E402


def model(gather: bool) -> bytes:
    """x (batch, seq, 16) [+ an embedding of ids (batch, seq)] -> LayerNorm -> MatMul -> Softmax
    over the last axis: y (batch, seq, 16)."""
    rng = np.random.default_rng(0)
    f32 = TensorProto.FLOAT
    arrays = {"g": (16,), "b": (16,), "w": (16, 16), "emb": (50, 16)}
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), k) for k, s in arrays.items()]
    inputs = [helper.make_tensor_value_info("x", f32, ["batch", "seq", 16])]
    nodes = [helper.make_node("Relu", ["x"], ["xe"])]
    if gather:
        inputs.append(helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]))
        nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"]), helper.make_node("Add", ["x", "e"], ["xe"])]
    nodes += [
        helper.make_node("LayerNormalization", ["xe", "g", "b"], ["ln"], axis=-1),
        helper.make_node("MatMul", ["ln", "w"], ["mm"]),
        helper.make_node("Softmax", ["mm"], ["y"], axis=-1),
    ]
    out = [helper.make_tensor_value_info("y", f32, ["batch", "seq", 16])]
    g = helper.make_graph(nodes, "g", inputs, out, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def feeds(rng, batch: int, seq: int, gather: bool) -> dict:
    out = {"x": rng.standard_normal((batch, seq, 16)).astype(np.float32)}
    if gather:
        out["ids"] = rng.integers(0, 50, (batch, seq))
    return out


@pytest.mark.parametrize("gather", [False, True], ids=["symbolic", "per-shape"])
def test_a_model_with_dim_params_runs_at_two_sizes_against_onnxruntime(gather):
    data, rng = model(gather), np.random.default_rng(1)
    assert dim_params(data)["batch"][0] == ("x", 0)
    dm = optimize_dynamic(data, target="emulator", hints={"seq": 4})  # no --shape: batch hinted 8 (the default)
    session = ort.InferenceSession(data)
    for batch, seq in ((2, 3), (5, 7), (2, 3)):
        f = feeds(rng, batch, seq, gather)
        got, ref = dm.run(f)["y"], session.run(None, f)[0]
        assert got.shape == (batch, seq, 16)
        tol = tolerance("float32", 16) * 4
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    s = dm.stats()
    assert s["sizes"] == 2, s  # (2, 3) again: cached
    if gather:  # the gather keeps its subgraph off the symbolic path: compiled at each size, with why
        assert (s["symbolic_subgraphs"], s["per_shape_compiles"]) == (0, 2), dm.describe()
        assert "gather" in dm.describe()
    else:
        assert s["symbolic_subgraphs"] >= 1 and s["per_shape_subgraphs"] == 0, dm.describe()
        assert s["per_shape_compiles"] == 0 and s["size_classes"] >= 1, s


def test_extents_are_fitted_as_monomials_of_the_dim_params():
    sizes, scale = {"batch": 8, "seq": 4}, {"batch": 3, "seq": 5}
    assert fit(16, 16, sizes, scale) == 16
    assert fit(32 * 16, 32 * 16 * 15, sizes, scale) == pn.sym("batch") * pn.sym("seq") * 16
    assert fit(9, 25, sizes, scale) is None  # batch + 1: not a monomial, stays per shape


def test_two_sizes_for_one_dim_param_are_refused_naming_both():
    dm = optimize_dynamic(model(True), target="emulator", hints={"batch": 2, "seq": 2})
    with pytest.raises(pn.SymbolBindingError, match="'batch' is 3 at input 'ids' axis 0 but 2 at input 'x'"):
        dm.run({"x": np.zeros((2, 2, 16), np.float32), "ids": np.zeros((3, 2), np.int64)})


def test_the_deployable_folder_runs_every_size_in_a_fresh_process(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from click.testing import CliRunner

    from panamera.cli import cli
    from panamera.subgraph.dynamic_deploy import load_dynamic

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import onnx_models

    path, out = tmp_path / "encoder.onnx", tmp_path / "enc"
    path.write_bytes(onnx_models.encoder(seq=8, hidden=32, heads=2))  # dim_param "batch"
    r = CliRunner().invoke(cli, ["optimize", str(path), "--hint", "batch=2", "--out", str(out), "--target", "emulator"])
    assert r.exit_code == 0 and "one symbolic program over batch" in r.output, r.output
    dm = load_dynamic(str(out), target="emulator")
    session = ort.InferenceSession(path.read_bytes())
    rng = np.random.default_rng(3)
    for batch in (3, 5):  # 3 in a fresh process (`panamera run DIR`), 5 here from the folder
        feeds = {
            i.name: rng.standard_normal([batch if isinstance(d, str) else d for d in i.shape]).astype(np.float32)
            for i in session.get_inputs()
        }
        ref = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        if batch == 3:
            np.savez(tmp_path / "in.npz", **feeds)
            args = ["run", str(out), "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "o.npz")]
            p = subprocess.run([sys.executable, "-m", "panamera.cli", *args, "--target", "emulator", "--json"],
                               capture_output=True, text=True, timeout=300)  # fmt: skip
            assert p.returncode == 0, p.stderr
            assert json.loads(p.stdout)["outputs"]["y"]["shape"][0] == 3
            got = dict(np.load(tmp_path / "o.npz"))
        else:
            got = dm.run(feeds)
        for name, want in ref.items():  # a row of 32 values through layer norm and a 32-term product
            tol = tolerance("float32", 32) * max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(got[name], want, rtol=tol, atol=tol)
    assert dm.stats()["symbolic_subgraphs"] >= 1 and dm.stats()["per_shape_compiles"] == 0
