"""ONNX's backend node tests (onnx.backend.test.case.node) through Panamera on the emulator.

Every test case whose nodes all have Panamera converters (plus constant-only helpers that fold)
is optimized and run; every output is compared with the case's expected output. Inputs that
set axes or shapes are specialized (compiled in as constants), as `panamera run` does.
A case whose tensors have a dtype Panamera does not support (int8, uint*, float8, string, ...)
must still give the right answer, through the array library, with the reason reported.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import numpy_helper

from panamera.errors import ModelError
from panamera.subgraph import optimize
from panamera.subgraph.convert import CONVERTERS, shape_inputs
from panamera.subgraph.library import ARRAY_OPS
from panamera.subgraph.verify import compare

FOLDABLE = {"Constant", "Shape", "Slice", "Gather", "Concat", "ConstantOfShape"}


def _cases():
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    return [
        c
        for c in cases
        if c.model.graph.node
        and all(n.op_type in CONVERTERS or n.op_type in FOLDABLE or n.op_type in ARRAY_OPS for n in c.model.graph.node)
        and any(n.op_type in CONVERTERS or n.op_type in ARRAY_OPS for n in c.model.graph.node)
    ]


CASES = _cases()
NOT_TENSORS = {"test_identity_sequence", "test_identity_opt"}  # sequence / optional inputs
# Why a node of a supported op may still be left to the library: a dtype Panamera does not have
# (no converter refuses a node any more: interpolating Resize and MaxPool's Indices run too).
REFUSED = ("is not a Panamera dtype",)


def _arrays(values):
    return [numpy_helper.to_array(a) if hasattr(a, "SerializeToString") else np.asarray(a) for a in values]


def test_the_suite_is_there():
    assert len(CASES) > 500  # onnx 1.16+ ships about 576 such cases


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node(case):
    in_names = [i.name for i in case.model.graph.input]
    out_names = [o.name for o in case.model.graph.output]
    if case.name in NOT_TENSORS:
        with pytest.raises(ModelError, match="not a tensor"):
            optimize(case.model, target="emulator")
        return
    for inputs, outputs in case.data_sets:
        feeds = dict(zip(in_names, _arrays(inputs)))
        spec = {k: feeds[k] for k in shape_inputs(case.model)}
        # routing="panamera": the contractions (MatMul, Gemm, MatMulInteger) are Panamera's whatever
        # the model would choose at these sizes, so that their converters are what is tested
        opt = optimize(case.model, target="emulator", specialize=spec, compile_views=True, routing="panamera")
        # Only Conv (the array library's, on the device with a GPU) and nodes with a dtype Panamera
        # does not support (on the host) may stay with the library, which must still give the
        # right answer; everything else is compiled by Panamera.
        lib = [u.reason for u in opt.library if u.host]
        assert all(any(why in r for why in REFUSED) for r in lib), f"not compiled by Panamera: {lib}"
        assert opt.subgraphs or opt.library
        got = opt.run(feeds)
        for name, want in zip(out_names, _arrays(outputs)):
            check = compare(name, got[name], want, case.rtol, case.atol)
            assert check.ok, check.detail


# One single-node case per op family the CPU target compiles (reductions, norms, softmax,
# contractions, argmax), run with target="cpu": the plan stays the emulator's, the subgraphs run as
# OpenMP C++ (each case is one g++ -O3 build: the subset stays small).
CPU_OPS = ("ReduceSum", "ReduceLogSumExp", "Softmax", "LayerNormalization", "MatMul", "Gemm", "ArgMax",
           "InstanceNormalization")  # fmt: skip
CPU_CASES = [next(c for c in CASES if [n.op_type for n in c.model.graph.node] == [op]) for op in CPU_OPS]


@pytest.mark.parametrize("case", CPU_CASES, ids=[c.name for c in CPU_CASES])
def test_node_on_the_cpu_target(case):
    in_names = [i.name for i in case.model.graph.input]
    out_names = [o.name for o in case.model.graph.output]
    inputs, outputs = case.data_sets[0]
    feeds = dict(zip(in_names, _arrays(inputs)))
    spec = {k: feeds[k] for k in shape_inputs(case.model)}
    opt = optimize(case.model, target="cpu", specialize=spec, compile_views=True, routing="panamera")
    assert opt.subgraphs and opt.backend == "cpu", [sg.runner_note for sg in opt.subgraphs]
    got = opt.run(feeds)
    for name, want in zip(out_names, _arrays(outputs)):
        check = compare(name, got[name], want, case.rtol, case.atol)
        assert check.ok, check.detail
