"""Constant folding of real exports: index ops fold with numpy, never through onnx's faulty
reference GatherElements (the Hugging Face BERT position_ids / token_type_ids pattern)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from panamera.errors import ModelError
from panamera.subgraph import load_model, optimize
from panamera.subgraph.numpy_ops import evaluate, gather_nd


def _bert_embeddings(seq: int = 16, vocab: int = 30, hidden: int = 8) -> bytes:
    """input_ids -> word + position + token-type embeddings, the positions and token types read
    from (1, 512) buffers with Shape / Slice / GatherElements, as BERT's exporters write it."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.arange(512, dtype=np.int64)[None], "position_ids"),
        numpy_helper.from_array(np.zeros((1, 512), np.int64), "token_type_buf"),
        numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "word_emb"),
        numpy_helper.from_array(rng.standard_normal((512, hidden)).astype(np.float32), "pos_emb"),
        numpy_helper.from_array(rng.standard_normal((2, hidden)).astype(np.float32), "type_emb"),
        numpy_helper.from_array(np.int64([1]), "one"),
        numpy_helper.from_array(np.int64([0]), "zero"),
        numpy_helper.from_array(np.ones(hidden, np.float32), "gamma"),
    ]
    nodes = [
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Slice", ["position_ids", "zero", "seq", "one"], ["pos"]),  # (1, seq)
        helper.make_node(
            "GatherElements", ["token_type_buf", "pos"], ["types"], axis=1, name="/m/embeddings/GatherElements"
        ),
        helper.make_node("Gather", ["word_emb", "input_ids"], ["w"]),
        helper.make_node("Gather", ["pos_emb", "pos"], ["p"]),
        helper.make_node("Gather", ["type_emb", "types"], ["t"]),
        helper.make_node("Add", ["w", "p"], ["wp"]),
        helper.make_node("Add", ["wp", "t"], ["e"]),
        helper.make_node("LayerNormalization", ["e", "gamma"], ["y"], axis=-1),
    ]
    g = helper.make_graph(
        nodes, "bert_embeddings",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])], inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_bert_gather_elements_folds_with_numpy():
    m = load_model(_bert_embeddings())
    assert "types" in m.constants and "pos" in m.constants  # folded, not live
    np.testing.assert_array_equal(m.constants["types"], np.zeros((1, 16), np.int64))
    np.testing.assert_array_equal(m.constants["pos"], np.arange(16)[None])
    assert {n.op_type for n in m.nodes} == {"Gather", "Add", "LayerNormalization"}


def test_bert_embeddings_optimize_and_verify():
    opt = optimize(_bert_embeddings(), target="emulator")
    checks = opt.verify(seed=3)  # input_ids drawn within the 30-row vocabulary
    assert checks and all(c.ok for c in checks), checks


def test_gather_elements_matches_take_along_axis_where_onnx_fails():
    buf = np.arange(512, dtype=np.int64).reshape(1, 512)
    idx = np.int64([[5, -1, 0, 17]])
    (got,) = evaluate("GatherElements", {"axis": 1}, [buf, idx])
    np.testing.assert_array_equal(got, [[5, 511, 0, 17]])


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd_matches_reference(batch_dims):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((2, 3, 4)).astype(np.float32)
    idx = np.int64([[[1, -1]], [[0, 2]]]) if batch_dims else np.int64([[[1, 2]], [[-2, 0]]])
    g = helper.make_graph(
        [helper.make_node("GatherND", ["d", "i"], ["y"], batch_dims=batch_dims)], "g",
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, None), helper.make_tensor_value_info("i", TensorProto.INT64, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    (want,) = ReferenceEvaluator(helper.make_model(g)).run(None, {"d": data, "i": idx})
    np.testing.assert_array_equal(gather_nd(data, idx, batch_dims), want)


@pytest.mark.parametrize(
    ("op", "attrs", "inputs"),
    [
        ("Gather", {"axis": 1}, [np.arange(12).reshape(3, 4), np.int64([[-4, 3]])]),
        ("Slice", {}, [np.arange(10), np.int64([8]), np.int64([-100]), np.int64([0]), np.int64([-3])]),
        ("Unsqueeze", {}, [np.arange(3), np.int64([-1, 0])]),
        ("Squeeze", {}, [np.zeros((1, 3, 1)), np.int64([-1])]),
        ("Reshape", {}, [np.arange(6), np.int64([0, -1])]),
        ("Range", {}, [np.float32(1), np.float32(2), np.float32(0.3)]),
        ("Div", {}, [np.int64([-7, 7]), np.int64([2, -2])]),
        ("Expand", {}, [np.int64([[1], [2]]), np.int64([1, 3])]),
        ("ConstantOfShape", {"value": numpy_helper.from_array(np.int64([7]))}, [np.int64([2, 2])]),
        ("Shape", {"start": -2}, [np.zeros((2, 3, 4))]),
    ],
)
def test_numpy_folding_matches_onnx_reference(op, attrs, inputs):
    names = [f"i{k}" for k in range(len(inputs))]
    g = helper.make_graph([helper.make_node(op, names, ["y"], **attrs)], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), None) for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])  # fmt: skip
    (want,) = ReferenceEvaluator(helper.make_model(g)).run(None, dict(zip(names, inputs)))
    (got,) = evaluate(op, attrs, inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)  # Range: the spec's start + i * delta, not np.arange


def test_out_of_range_constant_index_names_the_node():
    data = numpy_helper.from_array(np.zeros((2, 3), np.float32), "d")
    idx = numpy_helper.from_array(np.int64([5]), "i")
    g = helper.make_graph(
        [helper.make_node("Gather", ["d", "i"], ["g"], name="bad_gather"), helper.make_node("Add", ["g", "x"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [data, idx],
    )  # fmt: skip
    with pytest.raises(ModelError, match="bad_gather.*index 5 is out of range"):
        load_model(helper.make_model(g))
