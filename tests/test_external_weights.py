"""Models whose weights live in external files (every model over 2 GB: a 1B-parameter LLaMA):
loaded by path, weights memory-mapped and never copied (panamera/subgraph/weights.py), with a
clear error for a file that is missing, too short or outside the model's folder."""

import numpy as np
import onnx
import pytest
from conftest import tolerance
from onnx import TensorProto, helper, numpy_helper

from panamera.errors import ModelError
from panamera.subgraph import load_model, load_optimized, optimize, write_deployable

W = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)  # over INFER_INLINE: a typed input


def _save(tmp_path, name="model.onnx"):
    """x @ W + 1 with W (and the Constant) in one external file beside the model."""
    g = helper.make_graph(
        [helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.ones(128, np.float32), "one")),
         helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "one"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 128])], [numpy_helper.from_array(W, "w")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / name
    onnx.save_model(m, path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    return path


def test_external_weights_are_memory_mapped_and_run(tmp_path):
    path = _save(tmp_path)
    model = load_model(str(path))
    w = model.constants["w"]
    assert isinstance(w.base, np.memmap) and not w.flags.writeable and np.asarray(w) is w  # one object: one name
    stub = next(t for t in model.proto.graph.initializer if t.name == "w")
    assert stub.data_location == TensorProto.EXTERNAL and not stub.raw_data  # the proto names the file: no copy
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    opt = optimize(str(path), target="emulator")
    got = opt.run({"x": x})["y"]
    want = x.astype(np.float64) @ W + 1
    tol = tolerance("float32", 64) * (np.abs(x).astype(np.float64) @ np.abs(W) + 1)
    assert (np.abs(got - want) <= tol).all()
    # the deployable folder: the mapped weights are written out and the schedules replay (the
    # subgraph signatures name the weights as at optimize time)
    write_deployable(opt, str(tmp_path / "out"))
    np.testing.assert_array_equal(load_optimized(str(tmp_path / "out"), target="emulator").run({"x": x})["y"], got)


def test_external_weights_need_the_path(tmp_path):
    proto = onnx.load_model(_save(tmp_path), load_external_data=False)
    with pytest.raises(ModelError, match="keeps its weights in external files: load it from its path"):
        load_model(proto)


def test_a_missing_or_short_weights_file_is_named(tmp_path):
    path = _save(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ModelError, match=r"weights 'w' .* do not fit 'weights.bin'"):
        load_model(str(path))
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ModelError, match="weights.bin"):
        load_model(str(path))


def test_a_weights_file_outside_the_folder_is_refused(tmp_path):
    path = _save(tmp_path)
    m = onnx.load_model(path, load_external_data=False)
    for e in m.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../elsewhere.bin"
    onnx.save_model(m, path)
    with pytest.raises(ModelError, match=r"tensor name: w\) should be file inside .* points outside the directory"):
        load_model(str(path))
