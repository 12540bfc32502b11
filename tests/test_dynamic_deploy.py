"""A deploy folder of an ONNX model with dim_params saves its symbolic subgraphs' class plans
(issue 22): a fresh load replays them instead of planning the classes again; a saved plan that
does not replay is refused naming the subgraph, never replanned silently. Emulator, small sizes."""

import json

import numpy as np
import pytest
from conftest import tolerance

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from panamera.errors import ModelError  # noqa: E402
from panamera.subgraph.dynamic_deploy import DYNAMIC, load_dynamic, write_dynamic  # noqa: E402
from panamera.subgraph.dynamic_model import optimize_dynamic  # noqa: E402

G = np.linspace(0.5, 1.5, 16, dtype=np.float32)


def model() -> bytes:
    """x (batch, seq, 16) -> LayerNorm (scale G, no bias) -> Softmax over the last axis."""
    f32 = TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "g"], ["ln"], axis=-1),
         helper.make_node("Softmax", ["ln"], ["y"], axis=-1)],
        "g", [helper.make_tensor_value_info("x", f32, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("y", f32, ["batch", "seq", 16])], [numpy_helper.from_array(G, "g")],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def reference(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    ln = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * G
    e = np.exp(ln - ln.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def symbolic(dm):
    return [u.compiled for u in dm.units if u.kind == "symbolic"]


def test_a_loaded_folder_replays_the_saved_class_plans(tmp_path):
    write_dynamic(optimize_dynamic(model(), {"batch": 2, "seq": 5}, target="emulator"), str(tmp_path))
    saved = json.loads((tmp_path / DYNAMIC).read_text())["schedules"]
    assert saved and all(s["classes"] for s in saved.values()), saved
    dm = load_dynamic(str(tmp_path), target="emulator")
    (k,) = symbolic(dm)
    assert k.origin == "replayed from the given schedule"
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    np.testing.assert_allclose(dm.run({"x": x})["y"], reference(x), rtol=tolerance("float32", 16),
                               atol=tolerance("float32", 16))  # fmt: skip
    assert k.stats()["classes_planned"] == 0 and k.stats()["classes_compiled"] == 1, k.stats()
    dm.run({"x": np.zeros((3, 70, 16), np.float32)})  # a class not saved: planned on first use
    assert k.stats()["classes_planned"] == 1


def test_a_saved_plan_that_does_not_replay_is_refused_naming_the_subgraph(tmp_path):
    write_dynamic(optimize_dynamic(model(), {"batch": 2, "seq": 5}, target="emulator"), str(tmp_path))
    doc = json.loads((tmp_path / DYNAMIC).read_text())
    label = next(iter(doc["schedules"]))
    doc["schedules"][label]["classes"][0]["kernels"][0]["unroll"] = 0
    (tmp_path / DYNAMIC).write_text(json.dumps(doc))
    with pytest.raises(ModelError, match=label):
        load_dynamic(str(tmp_path), target="emulator")
    doc["schedules"] = ["not", "a", "map"]
    (tmp_path / DYNAMIC).write_text(json.dumps(doc))
    with pytest.raises(ModelError, match="'schedules' must be a map"):
        load_dynamic(str(tmp_path), target="emulator")
