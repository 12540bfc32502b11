"""ONNX models Panamera must refuse clearly or run (issue 18): an If with a constant condition
runs its taken branch, one with a data-dependent condition is refused by name; ill-typed inputs
and out-of-range axes are refused at load (subgraph/validate.py), each naming the node, tensor or
attribute, with the CLI's exit status for user errors (2), never 3 (internal error)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from panamera.cli import main
from panamera.errors import AxisError, DTypeError, PanameraError, ShapeError, Unsupported
from panamera.subgraph import load_model, optimize

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17) -> bytes:
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _vi(name, elem=F, shape=(2, 3)):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _if_model(cond_nodes, cond_inits=()) -> bytes:
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Mul", ["t", "two"], ["u"])],
        "then",
        [],
        [_vi("u")],
        initializer=[numpy_helper.from_array(np.array(2, np.float32), "two")],
    )
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e")])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="branch")
    return _model([*cond_nodes, node], [_vi("x")], [_vi("y")], cond_inits)


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


@pytest.mark.parametrize("taken", [True, False])
def test_if_with_a_constant_condition_runs_its_taken_branch(taken):
    """The condition is a constant only after folding (Greater of two constants)."""
    a, b = (1.0, 0.0) if taken else (0.0, 1.0)
    model = _if_model(
        [helper.make_node("Greater", ["a", "b"], ["cond"])],
        [_const("a", np.float32(a)), _const("b", np.float32(b))],
    )
    m = optimize(model, target="emulator")
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    want = 2 * np.maximum(x, 0) if taken else -x
    np.testing.assert_array_equal(m.run({"x": x})["y"], want)  # exact: one rounding-free op each


def test_if_with_a_data_dependent_condition_is_refused_by_name(tmp_path):
    model = _if_model(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "z"], ["cond"])],
        [_const("z", np.float32(0))],
    )
    with pytest.raises(Unsupported, match=r"unsupported op If \(non-constant condition\) at node 'branch'"):
        load_model(model)
    path = tmp_path / "if.onnx"
    path.write_bytes(model)
    assert main(["run", str(path), "--target", "emulator"]) == 2


BAD = {
    "float-gather-indices": (
        _model(
            [helper.make_node("Gather", ["x", "i"], ["y"], name="g")],
            [_vi("x"), _vi("i", F, (2,))],
            [_vi("y", F, (2, 3))],
        ),
        DTypeError,
        r"Gather 'g': input 1 \(indices, 'i'\) has element type FLOAT; ONNX opset 17 allows int32, int64",
    ),
    "complex-input": (
        _model(
            [helper.make_node("Identity", ["x"], ["y"], name="id")],
            [_vi("x", TensorProto.COMPLEX64)],
            [_vi("y", TensorProto.COMPLEX64)],
        ),
        DTypeError,
        r"graph input 'x' has element type COMPLEX64",
    ),
    "softmax-axis": (
        _model([helper.make_node("Softmax", ["x"], ["y"], axis=2**62, name="sm")], [_vi("x")], [_vi("y")]),
        AxisError,
        r"Softmax 'sm': attribute axis 4611686018427387904 is out of range for input 'x' of rank 2 \(allowed -2 to 1\)",
    ),
    "pool-stride-zero": (
        _model(
            [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[0, 1], name="mp")],
            [_vi("x", F, (1, 1, 3, 3))],
            [_vi("y", F, (1, 1, 2, 2))],
        ),
        ShapeError,
        r"MaxPool 'mp': attribute strides \[0, 1\] must be positive",
    ),
    "transpose-perm": (
        _model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 0], name="tr")], [_vi("x")], [_vi("y")]),
        AxisError,
        r"Transpose 'tr': attribute perm \[0, 0\] is not a permutation of the 2 axes of input 'x'",
    ),
    "reduce-axes": (
        _model(
            [helper.make_node("ReduceMax", ["x"], ["y"], axes=[0, -3], name="rm")],
            [_vi("x")],
            [_vi("y", F, (1, 1))],
            opset=13,
        ),
        AxisError,
        r"ReduceMax 'rm': attribute axes -3 is out of range",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_models_are_refused_at_load_naming_the_fault(case, tmp_path):
    model, error, message = BAD[case]
    with pytest.raises(error, match=message):
        load_model(model)
    path = tmp_path / f"{case}.onnx"
    path.write_bytes(model)
    assert main(["run", str(path), "--target", "emulator"]) == 2


@pytest.mark.parametrize(
    "node,out_shape,opset",
    [
        (helper.make_node("Softmax", ["x"], ["y"], axis=-2), (2, 3), 17),
        (helper.make_node("Flatten", ["x"], ["y"], axis=2), (6, 1), 17),  # Flatten's axis may be the rank
        (helper.make_node("Unsqueeze", ["x"], ["y"], axes=[3, 0]), (1, 2, 3, 1), 11),  # counts the output's rank
        (helper.make_node("Concat", ["x", "x"], ["y"], axis=-1), (2, 6), 17),  # variadic inputs of one type
    ],
)
def test_valid_axes_and_types_pass(node, out_shape, opset):
    m = load_model(_model([node], [_vi("x")], [_vi("y", F, out_shape)], opset=opset))
    assert m.values["y"].shape == out_shape


def test_refusals_are_panamera_errors():
    for _, error, _ in BAD.values():
        assert issubclass(error, PanameraError)
    assert issubclass(Unsupported, PanameraError)
