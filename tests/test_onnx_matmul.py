"""ONNX contractions routed by the model (issue 13 item 6, issue 11): MatMul / Gemm converters,
the partitioner's routing (both modeled figures in the reason), dequantize-then-MatMul in one
kernel reading the 8-bit weight, and the report's reason for every subgraph left alone.

Every result is compared with float64 numpy under a bound derived from the dtype, the length K
of the contraction and the magnitudes: |got - ref| <= tol(dtype, K) * (|a| @ |b|) (+ the same
for the element-wise epilogue, which adds one rounding)."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from conftest import tolerance
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from panamera.errors import OptionError, ShapeError, Unsupported
from panamera.subgraph import optimize
from panamera.subgraph.convert import VIEWS
from panamera.subgraph.convert_contract import _dequantize, _gemm
from panamera.subgraph.model import Node
from panamera.subgraph.report import build_report, markdown, why_alone
from panamera.subgraph.route import Routing, Runner

F = TensorProto.FLOAT
# issue 11's six families (issue 20's are tests/test_exported_models.py's and test_host_nodes.py's)
MODELS = sorted(
    p for p in glob.glob(os.path.join(os.path.dirname(__file__), "data", "models", "*.onnx"))
    if os.path.basename(p).split("-")[0] in ("resnet", "bert", "gpt2", "llama", "vit", "unet")
)  # fmt: skip


def _v(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def _model(nodes, inputs, outputs, inits=(), opset=21):
    g = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def assert_contraction_close(got, ref, a_abs_b, k, dtype="float32"):
    """|got - ref| within tol(dtype, K) of the magnitude |a| @ |b| of each output (plus one
    rounding of the result)."""
    tol = tolerance(dtype, k)
    bound = tol * a_abs_b + tol * np.abs(ref)
    err = np.abs(np.asarray(got, np.float64) - ref)
    assert np.all(err <= bound), f"max error {err.max():.3g}, bound there {bound.flat[err.argmax()]:.3g}"


def test_gemv_with_bias_and_activation_is_panamera_and_verifies():
    rng = np.random.default_rng(0)
    k, n = 1024, 512
    w, b = rng.standard_normal((k, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    m = _model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
         helper.make_node("Relu", ["hb"], ["y"])],
        [_v("x", [1, k])], [_v("y", [1, n])], [("w", w), ("b", b)],
    )  # fmt: skip
    opt = optimize(m.SerializeToString(), target="emulator")
    assert not opt.library  # the GEMV and its epilogue are Panamera's: one subgraph
    assert [[x.op_type for x in sg.nodes] for sg in opt.subgraphs] == [["MatMul", "Add", "Relu"]]
    ((node, route),) = opt.partition.routes
    assert route.runner is Runner.PANAMERA and route.split > 1  # split-K: 512 outputs cannot fill the GPU
    assert "library: " in route.reason and "Panamera: " in route.reason and "split-K" in route.reason
    assert route.panamera_us < route.library_us + route.neighbours_us
    x = rng.standard_normal((1, k)).astype(np.float32)
    got = opt.run({"x": x})["y"]
    ref = np.maximum(x.astype(np.float64) @ w + b, 0)
    assert_contraction_close(got, ref, np.abs(x).astype(np.float64) @ np.abs(w) + np.abs(b), k)


def test_large_gemm_stays_in_the_library_with_both_figures():
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_v("x", [1024, 1024]), _v("w", [1024, 1024])],
               [_v("y", [1024, 1024])])  # fmt: skip
    opt = optimize(m.SerializeToString(), target="emulator")
    (lib,) = opt.library
    route = opt.partition.route(lib.node)
    assert route.runner is Runner.LIBRARY and route.compute_bound
    assert lib.reason == route.reason and lib.reason.startswith("compute-bound M=1024 N=1024 K=1024")
    assert route.library_us < route.panamera_us
    rep = build_report(opt)
    assert rep["library"][0]["modeled_us"] == round(route.library_us, 3)  # the figure it was routed on


def test_routing_can_be_pinned_and_refuses_a_bad_value():
    m = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [_v("x", [1, 64]), _v("w", [64, 64])], [_v("y", [1, 64])]
    )
    opt = optimize(m.SerializeToString(), target="emulator", routing="library")
    assert [u.node.op_type for u in opt.library] == ["MatMul"] and "pinned by routing=library" in opt.library[0].reason
    assert optimize(m.SerializeToString(), target="emulator", routing=Routing.PANAMERA).subgraphs
    with pytest.raises(OptionError, match="routing must be one of"):
        optimize(m.SerializeToString(), target="emulator", routing="cublas")


GEMM_CASES = [  # transA, transB, alpha, beta, C shape (None: no C)
    (0, 0, 1.0, 1.0, None),
    (1, 0, 0.5, 2.0, (5,)),
    (0, 1, 1.0, -1.0, (4, 1)),
    (1, 1, 2.0, 0.5, (4, 5)),
    (0, 0, 1.0, 3.0, ()),
    (0, 1, 1.5, 1.0, (1, 5)),
]


@pytest.mark.parametrize("trans_a,trans_b,alpha,beta,c_shape", GEMM_CASES)
def test_gemm_attributes_against_numpy(trans_a, trans_b, alpha, beta, c_shape):
    rng = np.random.default_rng(1)
    mm, k, n = 4, 33, 5
    a = rng.standard_normal((k, mm) if trans_a else (mm, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    inits = [("b", b)]
    ins = ["a", "b"]
    if c_shape is not None:
        inits.append(("c", rng.standard_normal(c_shape).astype(np.float32)))
        ins.append("c")
    node = helper.make_node("Gemm", ins, ["y"], transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)
    m = _model([node], [_v("a", list(a.shape))], [_v("y", [mm, n])], inits, opset=13)
    opt = optimize(m.SerializeToString(), target="emulator", routing="panamera")
    assert not opt.library and len(opt.subgraphs) == 1
    got = opt.run({"a": a})["y"]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    a64, b64 = (a64.T if trans_a else a64), (b64.T if trans_b else b64)
    c = inits[1][1].astype(np.float64) if c_shape is not None else 0.0
    ref = alpha * (a64 @ b64) + beta * c
    mag = abs(alpha) * (np.abs(a64) @ np.abs(b64)) + abs(beta) * np.abs(c)
    assert_contraction_close(got, ref, mag, k)


def test_gemm_refuses_a_c_that_does_not_broadcast():
    import panamera as pn
    from panamera.subgraph.convert import Ctx

    n = Node(0, "g", "Gemm", "", ("a", "b", "c"), ("y",), {}, 13)
    a, b, c = pn.placeholder((4, 8), name="a"), pn.placeholder((8, 3), name="b"), pn.placeholder((4, 2), name="c")
    with pytest.raises(ShapeError, match="input C 'c' of shape \\(4, 2\\) does not broadcast to \\(4, 3\\)"):
        _gemm(n, [a, b, c], Ctx(None))
    with pytest.raises(ShapeError, match="input A 'a' must be 2-D"):
        _gemm(n, [pn.placeholder((2, 4, 8), name="a"), b, None], Ctx(None))


@pytest.mark.parametrize("variant", ["per_axis", "blocked", "cast_sub_mul", "uint8_per_tensor"])
def test_dequantize_then_matmul_is_one_kernel_reading_the_8bit_weight(variant):
    rng = np.random.default_rng(2)
    k, n, block = 512, 128, 64
    signed = variant != "uint8_per_tensor"
    wq = (rng.integers(-128, 128, (k, n)) if signed else rng.integers(0, 256, (k, n))).astype(
        np.int8 if signed else np.uint8
    )
    if variant == "blocked":
        scale = (rng.random((k // block, n)) * 0.02 + 0.01).astype(np.float32)
        zp = rng.integers(-4, 4, (k // block, n)).astype(np.int8)
        nodes = [helper.make_node("DequantizeLinear", ["wq", "s", "zp"], ["w"], axis=0, block_size=block)]
    elif variant == "uint8_per_tensor":
        scale, zp = np.array(0.01, np.float32), np.array(128, np.uint8)
        nodes = [helper.make_node("DequantizeLinear", ["wq", "s", "zp"], ["w"])]
    else:
        scale, zp = (rng.random(n) * 0.02 + 0.01).astype(np.float32), rng.integers(-4, 4, n).astype(np.int8)
        nodes = [helper.make_node("DequantizeLinear", ["wq", "s", "zp"], ["w"], axis=1)]
    if variant == "cast_sub_mul":
        zp = zp.astype(np.float32)
        nodes = [helper.make_node("Cast", ["wq"], ["wf"], to=F), helper.make_node("Sub", ["wf", "zp"], ["wc"]),
                 helper.make_node("Mul", ["wc", "s"], ["w"])]  # fmt: skip
    m = _model(nodes + [helper.make_node("MatMul", ["x", "w"], ["y"])], [_v("x", [2, k])], [_v("y", [2, n])],
               [("wq", wq), ("s", scale), ("zp", zp)])  # fmt: skip
    opt = optimize(m.SerializeToString(), target="emulator")
    assert not opt.library and len(opt.subgraphs) == 1
    plan = opt.subgraphs[0].compiled.plan
    assert len(plan.kernels) == 1  # the dequantization is evaluated at the weight's load
    assert sum(ln.bytes_read for ln in plan.per_call) < 2 * wq.nbytes  # the 8-bit bytes, not float32's
    assert opt.partition.routes[0][1].runner is Runner.PANAMERA
    x = rng.standard_normal((2, k)).astype(np.float32)
    got = opt.run({"x": x})["y"]
    # the dequantized weight in float64, as onnx's reference defines it
    w = ReferenceEvaluator(_model(nodes, [], [_v("w", [k, n])], [("wq", wq), ("s", scale), ("zp", zp)])).run(None, {})[
        0
    ]
    ref = x.astype(np.float64) @ w.astype(np.float64)
    assert_contraction_close(got, ref, np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64), k)
    onnx_ref = ReferenceEvaluator(m).run(None, {"x": x})[0]  # and onnx's float32 reference
    assert_contraction_close(got, onnx_ref.astype(np.float64), np.abs(x).astype(np.float64) @ np.abs(w), k)


def test_dequantize_refuses_a_scale_that_does_not_fit():
    import panamera as pn
    from panamera.subgraph.convert import Ctx

    x = pn.placeholder((8, 6), "int8", name="wq")
    per_axis = Node(0, "d", "DequantizeLinear", "", ("wq", "s"), ("w",), {"axis": 1}, 21)
    with pytest.raises(ShapeError, match="per-axis scale 's' of shape \\(5,\\) does not match axis 1"):
        _dequantize(per_axis, [x, pn.placeholder((5,), name="s")], Ctx(None))
    blocked = Node(0, "d", "DequantizeLinear", "", ("wq", "s"), ("w",), {"axis": 0, "block_size": 3}, 21)
    with pytest.raises(ShapeError, match="blocked scale 's' of shape \\(2, 6\\) does not fit"):
        _dequantize(blocked, [x, pn.placeholder((2, 6), name="s")], Ctx(None))
    ragged = Node(0, "d", "DequantizeLinear", "", ("wq", "s"), ("w",), {"axis": 0, "block_size": 3}, 21)
    with pytest.raises(Unsupported, match="not a multiple of block_size 3"):
        _dequantize(ragged, [pn.placeholder((7, 6), "int8", name="wq"), pn.placeholder((3, 6), name="s")], Ctx(None))


@pytest.mark.parametrize("path", MODELS, ids=[os.path.basename(p)[:-5] for p in MODELS])
def test_every_lone_memory_node_says_why(path):
    """Issue 11: no memory-intensive node is a kernel of its own unless the report says why."""
    opt = optimize(path, target="emulator")
    lone = [
        sg for sg in opt.subgraphs
        if len(sg.compiled.plan.kernels) == 1 and sum(n.op_type not in VIEWS for n in sg.nodes) == 1
        and not any(opt.partition.route(n) for n in sg.nodes)
    ]  # fmt: skip
    for sg in lone:
        assert why_alone(opt, sg), f"{sg.label} is alone and the report does not say why"


def test_report_says_why_on_resnet_and_conv_epilogues_are_one_kernel():
    path = next(p for p in MODELS if os.path.basename(p) == "resnet-torchscript.onnx")
    opt = optimize(path, target="emulator", routing="library")  # the Convs the library's (issue 20: routed)
    rep = build_report(opt)
    alone = {s["label"]: s["alone"] for s in rep["subgraphs"] if s["alone"]}
    assert alone and all("Conv" in why and "library" in why for why in alone.values())
    assert "alone: " in markdown(rep)
    # every element-wise epilogue of a Conv (the library's) is one Panamera kernel
    convs = {o for u in opt.library if u.node.op_type == "Conv" for o in u.node.outputs}
    after = [sg for sg in opt.subgraphs if convs & set(sg.inputs)]
    assert after and all(len(sg.compiled.plan.kernels) == 1 for sg in after)
