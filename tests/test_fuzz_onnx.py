"""A fuzz test of the ONNX loader (issue 18): tiny valid models, built with onnx.helper, mutated
(attribute values, element types, shapes, dropped and renamed inputs, truncated and corrupted
bytes); every outcome must be a result or a `PanameraError` (never another exception), and no case
may hang (each runs under an alarm). Derandomized, so CI draws the same cases every run; the cases
are tiny and the kernels few (the compile cache serves repeats), well under a minute of CPU.
"""

from __future__ import annotations

import signal

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from panamera.errors import PanameraError
from panamera.subgraph import optimize
from panamera.subgraph.model import SUPPORTED_ELEM

F = TensorProto.FLOAT
CASE_SECONDS = 60  # a case past this is a hang (a case takes well under a second, g++ aside)


def _vi(name, elem=F, shape=(2, 3)):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "fuzz", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _bases() -> list[onnx.ModelProto]:
    """Small valid models over the converters' main families."""
    c = numpy_helper.from_array(np.array([0.5, -1.0, 2.0], np.float32), "c")
    idx = numpy_helper.from_array(np.array([1, 0, 1], np.int64), "idx")
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [_vi("t")])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e")])
    cond = numpy_helper.from_array(np.array(True), "cond")
    return [
        _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1, name="sm")], [_vi("x")], [_vi("y")]),
        _model(
            [
                helper.make_node("Add", ["x", "c"], ["a"], name="add"),
                helper.make_node("Relu", ["a"], ["y"], name="relu"),
            ],
            [_vi("x")],
            [_vi("y")],
            [c],
        ),
        _model(
            [helper.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=1, name="rs")],
            [_vi("x")],
            [_vi("y", F, (2, 1))],
            opset=11,
        ),
        _model(
            [helper.make_node("Gather", ["x", "idx"], ["y"], axis=0, name="g")],
            [_vi("x")],
            [_vi("y", F, (3, 3))],
            [idx],
        ),
        _model(
            [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0], name="tr")], [_vi("x")], [_vi("y", F, (3, 2))]
        ),
        _model(
            [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[1, 1], name="mp")],
            [_vi("x", F, (1, 1, 3, 3))],
            [_vi("y", F, (1, 1, 2, 2))],
        ),
        _model([helper.make_node("Concat", ["x", "x"], ["y"], axis=0, name="cat")], [_vi("x")], [_vi("y", F, (4, 3))]),
        _model(
            [helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="if")],
            [_vi("x")],
            [_vi("y")],
            [cond],
        ),
    ]


BASES = _bases()
ELEMS = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64,
         TensorProto.BOOL, TensorProto.INT8, TensorProto.UINT8, TensorProto.STRING, TensorProto.COMPLEX64,
         TensorProto.UNDEFINED]  # fmt: skip
INTS = st.one_of(st.integers(-4, 4), st.sampled_from([2**31, -(2**31) - 1, 2**62, -(2**63)]))


@st.composite
def mutated(draw) -> bytes:
    m = onnx.ModelProto()
    m.CopyFrom(BASES[draw(st.integers(0, len(BASES) - 1))])
    g = m.graph
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["attr", "dtype", "shape", "drop", "rename", "bytes"]))
        node = g.node[draw(st.integers(0, len(g.node) - 1))]
        if kind == "attr":
            ints = [a for a in node.attribute if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS)]
            if ints:
                a = ints[draw(st.integers(0, len(ints) - 1))]
                if a.type == onnx.AttributeProto.INT:
                    a.i = draw(INTS)
                else:
                    a.ints[:] = draw(st.lists(INTS, max_size=4))
        elif kind == "dtype":
            vi = draw(st.sampled_from(list(g.input) + list(g.output)))
            vi.type.tensor_type.elem_type = draw(st.sampled_from(ELEMS))
        elif kind == "shape":
            vi = draw(st.sampled_from(list(g.input) + list(g.output)))
            dims = draw(st.lists(st.integers(0, 4), max_size=4))
            vi.type.tensor_type.shape.ClearField("dim")
            for d in dims:
                vi.type.tensor_type.shape.dim.add().dim_value = d
        elif kind == "drop" and node.input:
            k = draw(st.integers(0, len(node.input) - 1))
            node.input[k] = ""
        elif kind == "rename" and node.input:
            k = draw(st.integers(0, len(node.input) - 1))
            node.input[k] = draw(st.sampled_from(["nowhere", "y", node.output[0]]))
    data = m.SerializeToString()
    if draw(st.booleans()) and draw(st.booleans()):  # a quarter of the cases: damaged bytes
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
        else:
            at = draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=4))
            b = bytearray(data)
            for k in at:
                b[k] = draw(st.integers(0, 255))
            data = bytes(b)
    return data


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"a fuzz case ran past {CASE_SECONDS} s")


def _feeds(model) -> dict:
    """Random inputs of the declared shapes and dtypes (the loader fixed them)."""
    rng = np.random.default_rng(0)
    out = {}
    for name in model.inputs:
        v = model.values[name]
        dt = SUPPORTED_ELEM.get(v.elem)
        if v.shape is None or dt is None or dt == "bfloat16":
            return {}
        a = rng.standard_normal(v.shape) if dt.startswith("float") else rng.integers(0, 2, v.shape)
        out[name] = a.astype(dt)
    return out


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(mutated())
def test_every_outcome_is_a_result_or_a_panamera_error(data):
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        m = optimize(data, target="emulator")
        feeds = _feeds(m.model)
        if feeds or not m.model.inputs:
            m.run(feeds)
    except PanameraError:
        pass
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("k", range(len(BASES)))
def test_the_bases_run(k):
    """The unmutated models load and run, equal to onnx's reference evaluator (float32 over at
    most 6 elements: a few ulps), so the mutations start from valid ground."""
    from onnx.reference import ReferenceEvaluator

    m = optimize(BASES[k].SerializeToString(), target="emulator")
    feeds = _feeds(m.model)
    got = m.run(feeds)
    want = ReferenceEvaluator(BASES[k]).run(None, feeds)
    assert list(got) == list(m.model.outputs) and len(want) == len(got)
    for g, w in zip(got.values(), want):
        np.testing.assert_allclose(g, w, rtol=8 * 2**-23, atol=8 * 2**-23 * max(1.0, float(np.abs(w).max(initial=0))))
