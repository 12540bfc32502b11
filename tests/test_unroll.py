"""Loops and sequences unrolled at load time (panamera/subgraph/unroll.py): torch's EmbeddingBag
exports (a Loop over the bags reading the enclosing graph's ids, offsets and table; the dynamo
exporter's sequences), reduced to minimal graphs, against float64 numpy; one negative test per
precondition of unroll.py."""

import numpy as np
import onnx
import pytest
from conftest import tolerance
from onnx import TensorProto, helper, numpy_helper

from panamera.errors import Unsupported
from panamera.subgraph import load_model, optimize
from panamera.subgraph.unroll import MAX_UNROLL

TABLE = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)
BAGS, BAG = 3, 2  # 3 bags of 2 ids


def _i64(name, v):
    return numpy_helper.from_array(np.array(v, np.int64), name)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _bag_loop(trips="m", cond="c", cond_out=None, scan=True, extra_inits=()):
    """TorchScript's EmbeddingBag(mode="sum"): Loop over the bags; iteration i slices the ids
    [off[i], off[i+1]), gathers the table's rows and sums them (a scan output), reading ids,
    off and table from the enclosing graph."""
    body_nodes = [
        helper.make_node("Gather", ["off", "i"], ["lo"], axis=0),
        helper.make_node("Add", ["i", "one"], ["i1"]),
        helper.make_node("Gather", ["off", "i1"], ["hi"], axis=0),
        helper.make_node("Unsqueeze", ["lo", "zero"], ["lo1"]),
        helper.make_node("Unsqueeze", ["hi", "zero"], ["hi1"]),
        helper.make_node("Slice", ["ids", "lo1", "hi1", "zero"], ["bag"]),
        helper.make_node("Gather", ["table", "bag"], ["rows"], axis=0),
        helper.make_node("ReduceSum", ["rows", "zero"], ["row"], keepdims=0),
        cond_out or helper.make_node("Identity", ["cin"], ["cout"]),
    ]
    outs = [_vi("cout", TensorProto.BOOL, [])] + ([_vi("row", TensorProto.FLOAT, [4])] if scan else [])
    body = helper.make_graph(
        body_nodes, "body", [_vi("i", TensorProto.INT64, []), _vi("cin", TensorProto.BOOL, [])], outs
    )
    loop = helper.make_node("Loop", [trips, cond], ["y"] if scan else [], body=body)
    inits = [
        numpy_helper.from_array(TABLE, "table"), _i64("off", np.arange(BAGS + 1) * BAG), _i64("one", 1),
        _i64("zero", [0]), _i64("m", BAGS), numpy_helper.from_array(np.array(True), "c"), *extra_inits,
    ]  # fmt: skip
    g = helper.make_graph(
        [loop], "g", [_vi("ids", TensorProto.INT64, [BAGS * BAG])], [_vi("y", TensorProto.FLOAT, [BAGS, 4])], inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def _check(opt, out="y"):
    ids = np.random.default_rng(1).integers(0, 32, BAGS * BAG)
    want = TABLE.astype(np.float64)[ids].reshape(BAGS, BAG, 4).sum(1)
    tol = tolerance("float32", BAG) * np.abs(TABLE.astype(np.float64)[ids]).reshape(BAGS, BAG, 4).sum(1)
    got = opt.run({"ids": ids})[out]
    assert got.shape == want.shape and (np.abs(got - want) <= tol).all()


def test_a_loop_over_bags_reading_outer_values_unrolls_to_panamera_nodes():
    """The Loop's trip count and condition are constants: it unrolls into per-bag Slice, Gather
    and ReduceSum nodes and a Concat of the rows, all Panamera's (no library node, no Loop)."""
    opt = optimize(_bag_loop(), target="emulator")
    assert not opt.library and "Loop" not in {n.op_type for n in opt.model.nodes}
    _check(opt)


def test_sequences_of_bag_rows_become_a_concat():
    """The dynamo exporter's form: the rows collected by SequenceInsert into a loop-carried
    sequence, ConcatFromSequence after the loop (new_axis=1: a stack)."""
    body_nodes = [
        helper.make_node("Gather", ["off", "i"], ["lo"], axis=0),
        helper.make_node("Add", ["i", "one"], ["i1"]),
        helper.make_node("Gather", ["off", "i1"], ["hi"], axis=0),
        helper.make_node("Unsqueeze", ["lo", "zero"], ["lo1"]),
        helper.make_node("Unsqueeze", ["hi", "zero"], ["hi1"]),
        helper.make_node("Slice", ["ids", "lo1", "hi1", "zero"], ["bag"]),
        helper.make_node("Gather", ["table", "bag"], ["rows"], axis=0),
        helper.make_node("ReduceSum", ["rows", "zero"], ["row"], keepdims=0),
        helper.make_node("SequenceInsert", ["sin", "row"], ["sout"]),
        helper.make_node("Less", ["i1", "m"], ["cout"]),
    ]
    seq = helper.make_tensor_sequence_value_info
    body = helper.make_graph(
        body_nodes, "body",
        [_vi("i", TensorProto.INT64, []), _vi("cin", TensorProto.BOOL, []), seq("sin", TensorProto.FLOAT, None)],
        [_vi("cout", TensorProto.BOOL, []), seq("sout", TensorProto.FLOAT, None)],
    )  # fmt: skip
    nodes = [
        helper.make_node("SequenceEmpty", [], ["s0"], dtype=TensorProto.FLOAT),
        helper.make_node("Loop", ["", "c", "s0"], ["s"], body=body),
        helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, new_axis=1),
    ]
    inits = [numpy_helper.from_array(TABLE, "table"), _i64("off", np.arange(BAGS + 1) * BAG), _i64("one", 1),
             _i64("zero", [0]), _i64("m", BAGS), numpy_helper.from_array(np.array(True), "c")]  # fmt: skip
    g = helper.make_graph(
        nodes, "g", [_vi("ids", TensorProto.INT64, [BAGS * BAG])], [_vi("y", TensorProto.FLOAT, [BAGS, 4])], inits
    )
    opt = optimize(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString(), target="emulator"
    )
    assert not opt.library
    _check(opt)


def test_precondition_1_a_loop_whose_trip_count_is_an_input_stays_live():
    m = onnx.load_model_from_string(_bag_loop(trips="n"))
    m.graph.input.append(_vi("n", TensorProto.INT64, []))
    assert [n.op_type for n in load_model(m).nodes] == ["Loop"]


def test_precondition_2_a_condition_from_data_is_refused_by_name():
    """The body's condition reads the ids (the largest id of the bag): it does not fold."""
    m = onnx.load_model_from_string(_bag_loop(cond_out=helper.make_node("ReduceMax", ["bag"], ["big"], keepdims=0)))
    m.graph.node[0].attribute[0].g.node.append(helper.make_node("Greater", ["big", "one"], ["cout"]))
    with pytest.raises(Unsupported, match=r"Loop 'y': iteration 0's condition depends on the inputs"):
        load_model(m)


def test_precondition_3_a_loop_past_the_unroll_limit_is_refused():
    m = onnx.load_model_from_string(_bag_loop(trips="big_m", extra_inits=[_i64("big_m", MAX_UNROLL + 1)]))
    m.graph.node[0].input[1] = ""  # no condition: the trip count alone says it is too long
    with pytest.raises(Unsupported, match=rf"Loop 'y' runs more than {MAX_UNROLL} iterations"):
        load_model(m)


def test_precondition_4_a_scan_of_no_iteration_is_refused():
    m = _bag_loop(extra_inits=[_i64("none", 0)], trips="none")
    with pytest.raises(Unsupported, match=r"runs no iteration: its scan output 'y'"):
        load_model(m)


def test_two_gathers_of_one_table_at_different_indices_are_two_reductions():
    """Two bags' sums in one fused kernel: the reductions read the same table through gathers
    whose indices are different slices of the ids. The kernel merged them into one accumulator
    (program._body_key ignored a gather's index), so the first bag got the second's sum."""
    nodes, parts, inits = [], [], [numpy_helper.from_array(TABLE, "table"), _i64("zero", [0])]
    for b in range(2):
        inits += [_i64(f"s{b}", [BAG * b]), _i64(f"e{b}", [BAG * b + BAG])]
        nodes += [
            helper.make_node("Slice", ["ids", f"s{b}", f"e{b}", "zero"], [f"i{b}"]),
            helper.make_node("Gather", ["table", f"i{b}"], [f"g{b}"]),
            helper.make_node("ReduceSum", [f"g{b}", "zero"], [f"r{b}"], keepdims=0),
            helper.make_node("Unsqueeze", [f"r{b}", "zero"], [f"u{b}"]),
        ]
        parts.append(f"u{b}")
    nodes.append(helper.make_node("Concat", parts + [parts[-1]], ["y"], axis=0))  # 3 rows: bags 0, 1, 1
    g = helper.make_graph(
        nodes, "g", [_vi("ids", TensorProto.INT64, [BAGS * BAG])], [_vi("y", TensorProto.FLOAT, [BAGS, 4])], inits
    )
    opt = optimize(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString(), target="emulator"
    )
    ids = np.random.default_rng(1).integers(0, 32, BAGS * BAG)
    rows = TABLE.astype(np.float64)[ids].reshape(BAGS, BAG, 4)
    want, tol = rows.sum(1)[[0, 1, 1]], tolerance("float32", BAG) * np.abs(rows).sum(1)[[0, 1, 1]]
    assert (np.abs(opt.run({"ids": ids})["y"] - want) <= tol).all()
