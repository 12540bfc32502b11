"""On a GPU no node of the exported models runs on the host (issue 11): every node is a Panamera
kernel or a device-library node (MatMul, Gemm, Conv: CuPy on a GPU). `LibraryNode.host` says
which library nodes would run on the host (numpy or onnx's reference evaluator) even with a GPU.
Partitioning alone decides it, so these tests compile nothing."""

from __future__ import annotations

import glob
import os

import pytest
from onnx import TensorProto, helper

from panamera.subgraph.library import LibraryNode
from panamera.subgraph.model import load_model
from panamera.subgraph.partition import partition

DATA = os.path.join(os.path.dirname(__file__), "data", "models")
MODELS = sorted(glob.glob(os.path.join(DATA, "*.onnx")))


def host_nodes(source) -> list[LibraryNode]:
    return [u for u in (LibraryNode(n, why) for n, why in partition(load_model(source)).library) if u.host]


def test_the_models_are_there():
    assert len(MODELS) == 36  # issue 11's six families and issue 20's twelve, two exporters each


@pytest.mark.parametrize("path", MODELS, ids=[os.path.basename(p)[: -len(".onnx")] for p in MODELS])
def test_exported_model_has_no_host_node(path):
    assert host_nodes(path) == []


def test_the_library_tells_host_from_device():
    """A MatMul is the device library's; an int8 Add (no Panamera dtype) runs on the host."""
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Add", ["i", "i"], ["s"])],
        "g",
        [vi("a", TensorProto.FLOAT, [2, 3]), vi("b", TensorProto.FLOAT, [3, 4]), vi("i", TensorProto.INT8, [5])],
        [vi("m", TensorProto.FLOAT, [2, 4]), vi("s", TensorProto.INT8, [5])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    lib = {n.op_type: LibraryNode(n, why) for n, why in partition(load_model(m)).library}
    assert not lib["MatMul"].host
    assert lib["Add"].host and "is not a Panamera dtype" in lib["Add"].reason
    assert [u.node.op_type for u in host_nodes(m)] == ["Add"]
