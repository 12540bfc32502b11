"""Whole models on target="cpu" (issue 24): the contraction operands the CPU target stores
(schedule/cpu_operands.py) against numpy in float64, one negative case per precondition."""

import math

import numpy as np
import pytest
from conftest import random_array, tolerance

import panamera as pn
from panamera.schedule.cpu_operands import stored_operands


def close(out, ref, dtype: str, n: int, scale: float):
    """`out` within the float32 tolerance of n rounded terms (conftest.tolerance), absolute errors
    scaled by `scale`: the largest sum of |terms| of a dot product."""
    tol = tolerance(dtype, n)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=tol, atol=tol * scale)


def test_stored_operands_preconditions():
    """A computed operand used by several outputs is stored; one negative case per precondition."""
    x, w = pn.placeholder((8, 64), name="x"), pn.placeholder((64, 32), name="w")
    assert {t.op for t in stored_operands((pn.exp(x) @ w,))} == {"exp"}
    assert {t.op for t in stored_operands((pn.exp(x).T.T @ w,))} == {"exp"}  # seen through views
    assert not stored_operands((pn.sum(pn.exp(x), axis=1),))  # 1: a reduction that is no contraction
    assert not stored_operands((x @ w,))  # 2: stored already (placeholders)
    assert not stored_operands((pn.sum(x, axis=0, keepdims=True).T @ x[:1],))  # 2: a reduction's result
    assert not stored_operands((x[:1] @ pn.exp(w),))  # 3: one row, each element of exp(w) used once
    wide = pn.exp(pn.broadcast_to(pn.placeholder((1, 64), name="v"), (8, 64)))
    assert not stored_operands((wide @ w,))  # 4: 8x the elements of what it reads (as im2col's remap)


def test_stored_operand_chains_match_numpy(rng):
    """A GELU MLP and a normalized projection on the CPU target: the GELU and the normalization
    are computed once (stored), the contractions read them; results against float64 numpy; a
    large product with a stored producer runs in BLAS (schedule/cpu_blas.py, precondition 3)."""
    x = pn.placeholder((8, 32), "float32", name="x")
    w1, w2 = pn.placeholder((32, 64), "float32", name="w1"), pn.placeholder((64, 32), "float32", name="w2")
    h = x @ w1
    mlp = pn.gelu(h) @ w2
    mu = pn.mean(x, axis=1, keepdims=True)
    normed = (x - mu) * pn.rsqrt(pn.mean((x - mu) * (x - mu), axis=1, keepdims=True) + 1e-5)
    proj = normed @ w1
    k = pn.compile([mlp, proj], target="cpu")
    # the GELU once, not once per output of the down-projection
    assert sum(c.source.count("erff(") for c in k.cpu_kernels) == 1
    X, W1, W2 = (random_array(s, "float32", rng).astype(np.float64) for s in ((8, 32), (32, 64), (64, 32)))
    from math import erf

    H = X @ W1
    G = 0.5 * H * (1 + np.vectorize(erf)(H / np.sqrt(2)))
    d = X - X.mean(1, keepdims=True)
    N = d / np.sqrt((d * d).mean(1, keepdims=True) + 1e-5)
    got = k(X.astype(np.float32), W1.astype(np.float32), W2.astype(np.float32))
    # errors of the chain add up: its reductions' lengths (32 then 64; 32, 32 then 32)
    close(got[0], G @ W2, "float32", 32 + 64, float((np.abs(G) @ np.abs(W2)).max()))
    close(got[1], N @ W1, "float32", 32 * 3, float((np.abs(N) @ np.abs(W1)).max()))

    a, b = pn.placeholder((256, 128), "float32", name="a"), pn.placeholder((128, 512), "float32", name="b")
    big = pn.compile(pn.exp(a) @ b, target="cpu")
    assert [c.host is not None for c in big.cpu_kernels] == [False, True]  # exp(a) stored, then BLAS
    A, B = random_array((256, 128), "float32", rng), random_array((128, 512), "float32", rng)
    E = np.exp(A.astype(np.float64))
    close(big(A, B), E @ B, "float32", 128, float((E @ np.abs(B)).max()))


def test_bench_models_and_contractions(tmp_path):
    """`bench --measure --suite models` on the smallest exported model: both thread counts timed
    against onnxruntime, the output checked within the error budget, the counts reported; the
    contraction suite is selectable and its recipes build for every backend."""
    import json

    pytest.importorskip("onnxruntime")
    from panamera.bench.cpu_measure import bench_models, select
    from panamera.bench.cpu_models import TINY_MODELS, model_names
    from panamera.bench.cpu_recipes import NumpyBackend, OnnxBackend, cpu_workloads

    assert set(TINY_MODELS) <= set(model_names())
    text = bench_models(str(tmp_path), 1, "test", names=list(TINY_MODELS) + ["no-such-model"])
    recs = json.loads((tmp_path / "results.json").read_text())["records"]
    assert {r["workload"] for r in recs} == set(TINY_MODELS) and all(r["correct"] for r in recs)
    assert all(r["kernels"] >= 1 and r["measured"]["onnxruntime"]["median_us"] > 0 for r in recs)
    assert "| widedeep-torchscript |" in text and "no-such-model: no " in text
    from panamera.cli import main

    assert main(["bench", "--suite", "models", "--no-measure"]) == 2  # measured on the CPU target only

    ws = select(cpu_workloads(), "contractions")
    assert {w.name for w in ws} >= {"table1 128x32x1024", "linear 16x4096x4096 w=int8"}
    w = next(w for w in ws if w.name == "linear 4x4096x4096 w=int8")
    assert OnnxBackend().model(w)  # builds
    x, q, s = np.ones((4, 4096), np.float32), np.full((4096, 4096), 2, np.int8), np.full((4096, 1), 0.5, np.float32)
    assert w.recipe(NumpyBackend(), x, q, s).tolist()[0][:2] == [4096.0, 4096.0]


def _conv_model(c: int, hw: int, m: int, rng) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(rng.standard_normal((m, c, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, hw, hw])],
        [w],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_cpu_target_runs_large_convs_in_the_host_convolution():
    """With the CPU target running the subgraphs, a Conv of at least HOST_CONV_MIN_MACS goes to
    the library's host convolution (route.host_rule) whatever the GPU model prefers; the ReLU
    after it runs in the Conv's step (conv_fuse.py); the model matches the float64 reference. A smaller
    float32 2-D Conv goes there too (its C kernels: route.host_c_conv); a small 1-D Conv, or one planned
    for the emulator, is routed by the model."""
    from panamera.subgraph.optimizer import optimize
    from panamera.subgraph.partition import partition
    from panamera.subgraph.route import HOST_CONV_MIN_MACS, Runner, contraction_shape

    rng = np.random.default_rng(0)
    opt = optimize(_conv_model(8, 32, 16, rng), target="cpu")
    (node, route) = opt.partition.routes[0]
    assert np.prod(contraction_shape(opt.model, node)) >= HOST_CONV_MIN_MACS
    assert route.runner is Runner.LIBRARY and "host convolution" in route.reason
    assert [[n.op_type for n in u.nodes] for u in opt.units] == [["Conv", "Relu"]] and not opt.subgraphs
    assert all(c.ok for c in opt.verify())
    not_cpu = partition(opt.model)  # not the CPU target: the model decides, nothing fused (conv_fuse.py's 1)
    (model_route,) = [r for _, r in not_cpu.routes]
    assert "host convolution" not in model_route.reason and not not_cpu.fused
    small = optimize(_conv_model(2, 8, 8, rng), target="cpu")  # 9 K multiply-adds: float32 2-D, the C kernels
    assert "host convolution's C kernels" in small.partition.routes[0][1].reason
    one_d = optimize(_conv1d_model(2, 8, 8, rng), target="cpu")  # 1-D, 384 multiply-adds: the model decides
    assert "host convolution" not in one_d.partition.routes[0][1].reason


def _conv1d_model(c: int, length: int, m: int, rng) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(rng.standard_normal((m, c, 3)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, length])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, length])],
        [w],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _conv_reference(x, w, win, group):
    """Conv in float64, one kernel tap at a time (independent of host_conv's three forms)."""
    import itertools

    n, m, cg = x.shape[0], w.shape[0], w.shape[1]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), *win.pads))
    y = np.zeros((n, m, *win.out))
    for tap in itertools.product(*(range(k) for k in win.kernel)):
        at = zip(tap, win.dilations, win.out, win.strides)
        v = xp[(slice(None), slice(None)) + tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in at)]
        for g in range(group):
            wg = w[(slice(g * (m // group), (g + 1) * (m // group)), slice(None), *tap)].astype(np.float64)
            y[:, g * (m // group) : (g + 1) * (m // group)] += np.einsum(
                "mc,nc...->nm...", wg, v[:, g * cg : (g + 1) * cg]
            )
    return y


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs, form",
    [
        ((2, 16, 4, 4), (24, 16, 1, 1), {}, "pointwise"),
        ((2, 8, 3, 5), (6, 4, 1, 1), {"group": 2}, "pointwise"),
        ((2, 12, 7, 6), (12, 1, 5, 5), {"group": 12, "pads": [2, 2, 2, 2], "strides": [2, 2]}, "depthwise"),
        ((1, 6, 9, 9), (6, 1, 3, 3), {"group": 6, "dilations": [2, 1], "pads": [1, 0, 2, 1]}, "depthwise"),
        ((2, 3, 9, 8), (5, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}, "columns"),
        ((1, 8, 5, 7), (6, 4, 3, 2), {"group": 2, "dilations": [1, 2], "pads": [1, 0, 2, 1]}, "columns"),
        ((1, 4, 6, 6), (8, 1, 3, 3), {"group": 4}, "columns"),  # two outputs per group: not depthwise
        ((2, 6, 5, 5), (4, 6, 1, 1), {"strides": [2, 2]}, "columns"),  # strided 1x1
        ((1, 4, 11), (3, 4, 3), {"pads": [2, 1]}, "columns"),
        ((1, 2, 3, 4, 5), (3, 2, 2, 2, 2), {"pads": [1, 0, 1, 0, 1, 0]}, "columns"),
    ],
)
def test_host_conv_forms_against_float64(x_shape, w_shape, attrs, form, rng):
    """The CPU target's library convolution (conv.host_conv): each form (pointwise matmul, depthwise
    window view, per-tap columns) picked where expected, with bias, against a float64 tap-by-tap
    reference within the float32 bound of its Cg*K-term dot products; float32 out."""
    from panamera.subgraph.conv import HostForm, conv, geometry, host_form

    win, group = geometry(x_shape, w_shape, attrs)
    assert host_form(w_shape, win, group) is HostForm(form)
    x, w = random_array(x_shape, "float32", rng), random_array(w_shape, "float32", rng)
    b = random_array((w_shape[0],), "float32", rng)
    y = conv(np, attrs, x, w, b)
    assert y.dtype == np.float32 and y.flags.c_contiguous
    bias = b.astype(np.float64).reshape((1, -1) + (1,) * len(win.out))
    scale = float((_conv_reference(np.abs(x), np.abs(w), win, group) + np.abs(bias)).max())
    close(y, _conv_reference(x, w, win, group) + bias, "float32", int(np.prod(w_shape[1:])) + 1, scale)
    assert conv(np, attrs, x, w, b) is not y  # the second call (cached geometry) gives a fresh array
    np.testing.assert_array_equal(conv(np, attrs, x, w, b), y)


def test_blas_takes_split_groups_and_small_products(rng):
    """Small float32 products run in BLAS as one np.matmul (schedule/cpu_blas.py): a contraction's
    element-wise consumer becomes a MAP kernel after it, two independent contractions two calls,
    a batched einsum with a transposed result; against float64 numpy. split_for_blas: one
    negative case per precondition."""
    from panamera.compiler import lower
    from panamera.schedule.cpu_blas import split_for_blas

    a, b = pn.placeholder((16, 40), "float32", name="a"), pn.placeholder((40, 8), "float32", name="b")
    c, d = pn.placeholder((40, 24), "float32", name="c"), pn.placeholder((40, 24), "float32", name="d")
    p, q = pn.placeholder((3, 5, 70), "float32", name="p"), pn.placeholder((3, 6, 70), "float32", name="q")
    outs = [pn.maximum(a @ b + 1.0, 0.0), a @ c, a @ d, pn.einsum("bmk,bnk->nbm", p, q)]
    k = pn.compile(outs, target="cpu")
    assert [x.host is not None for x in k.cpu_kernels].count(True) == 4, k.explain()
    A, B, C, D = (random_array(s, "float32", rng) for s in ((16, 40), (40, 8), (40, 24), (40, 24)))
    P, Q = random_array((3, 5, 70), "float32", rng), random_array((3, 6, 70), "float32", rng)
    r = k(A, B, C, D, P, Q)
    f = lambda t: t.astype(np.float64)  # noqa: E731
    close(r[0], np.maximum(f(A) @ f(B) + 1, 0), "float32", 40, float((abs(f(A)) @ abs(f(B))).max()) + 1)
    close(r[1], f(A) @ f(C), "float32", 40, float((abs(f(A)) @ abs(f(C))).max()))
    close(r[2], f(A) @ f(D), "float32", 40, float((abs(f(A)) @ abs(f(D))).max()))
    ref = np.einsum("bmk,bnk->nbm", f(P), f(Q))
    close(r[3], ref, "float32", 70, float(np.einsum("bmk,bnk->nbm", abs(f(P)), abs(f(Q))).max()))

    def pieces(y):
        return [len(split_for_blas(g)) for g in lower(y, stop_after="groups", target="cpu").groups]

    assert pieces(pn.maximum(a @ b + 1.0, 0.0)) == [2] and pieces([a @ c, a @ d]) == [2]
    assert set(pieces(pn.nn.softmax(a))) == {1}  # S1: a stitched row with reductions keeps its rows
    h = pn.placeholder((16, 40), "float16", name="h")
    assert set(pieces(pn.maximum(h @ pn.transpose(h) + 1.0, 0.0))) == {1}  # S1: BLAS refuses 16-bit operands
    t = pn.placeholder((2, 8), "float32", name="t")
    w1, w2 = pn.placeholder((8, 16), "float32", name="w1"), pn.placeholder((8, 16), "float32", name="w2")
    assert set(pieces([t @ w1, t @ w2])) == {1}  # S2: too small for BLAS


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs, form",
    [
        ((1, 16, 16), (32, 16, 3), {"pads": [1, 1]}, "columns"),  # whisper's stem: stride 1, the padded width
        ((2, 8, 13), (6, 8, 3), {"pads": [1, 2], "strides": [2], "dilations": [2]}, "columns"),  # im2col
        ((1, 6, 9), (6, 1, 5), {"group": 6, "pads": [2, 2], "strides": [2]}, "depthwise"),
        ((2, 4, 7), (6, 2, 1), {"group": 2}, "pointwise"),
        ((1, 4, 10), (3, 4, 4), {"auto_pad": "SAME_UPPER", "strides": [3]}, "columns"),
    ],
)
def test_conv1d_runs_as_2d_of_unit_height(x_shape, w_shape, attrs, form, rng):
    """A 1-D Conv's step is the 2-D step of unit height (conv_step.lift_1d): the C kernels' form,
    not numpy's strided path; with bias and a residual Add + Relu epilogue, against the float64
    tap-by-tap 1-D reference within the float32 bound of its Cg*K + 2 term sums."""
    from panamera.subgraph.conv import geometry
    from panamera.subgraph.conv_kernels import Epilogue, EpiOp, EpiStep
    from panamera.subgraph.conv_step import HostConvStep, Lifted1d

    win, group = geometry(x_shape, w_shape, attrs)
    epi = Epilogue((EpiStep(EpiOp.ADD), EpiStep(EpiOp.RELU)))
    step = HostConvStep.plan(x_shape, w_shape, attrs, True, epi)
    assert isinstance(step, Lifted1d) and step.fast and step.form.value == form
    x, w = random_array(x_shape, "float32", rng), random_array(w_shape, "float32", rng)
    b = random_array((w_shape[0],), "float32", rng)
    out = (x_shape[0], w_shape[0], *win.out)
    r = random_array(out, "float32", rng)
    ref = _conv_reference(x, w, win, group) + b.astype(np.float64)[None, :, None]
    scale = float((_conv_reference(np.abs(x), np.abs(w), win, group) + np.abs(b).max() + np.abs(r).max()).max())
    for _ in range(2):  # the scratch reused
        got = step(x, w, b, r)
        assert got.shape == out and got.dtype == np.float32 and got.flags.c_contiguous
        close(got, np.maximum(ref + r, 0), "float32", int(np.prod(w_shape[1:])) + 2, scale)


def _epilogue_reference(y, steps, residuals):
    """The epilogue's steps in float64 (ONNX's definitions), after the conv and its bias."""
    from panamera.subgraph.conv_kernels import EpiOp

    res = iter(residuals)
    for s in steps:
        if s.op is EpiOp.ADD:
            y = y + next(res).astype(np.float64)
        elif s.op is EpiOp.RELU:
            y = np.maximum(y, 0)
        elif s.op is EpiOp.CLIP:
            y = np.clip(y, *s.params)
        elif s.op is EpiOp.HARDSWISH:
            y = y * np.clip(y / 6 + 0.5, 0, 1)
        elif s.op is EpiOp.HARDSIGMOID:
            y = np.clip(s.params[0] * y + s.params[1], 0, 1)
        elif s.op is EpiOp.SIGMOID:
            y = 1 / (1 + np.exp(-y))
        elif s.op is EpiOp.SILU:
            y = y * (1 / (1 + np.exp(-y)))
        elif s.op is EpiOp.GELU:
            y = 0.5 * y * (1 + np.vectorize(math.erf)(y / np.sqrt(2)))
        else:
            y = np.where(y >= 0, y, s.params[0] * y)
    return y


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs, dtype",
    [
        ((2, 16, 4, 4), (24, 16, 1, 1), {}, "float32"),  # pointwise
        ((2, 12, 7, 6), (12, 1, 3, 3), {"group": 12, "pads": [1, 0, 2, 1]}, "float32"),  # depthwise, channels last
        ((1, 8, 10, 9), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}, "float32"),  # depthwise by planes, stride 1
        (
            (1, 20, 6, 5),
            (20, 1, 3, 3),
            {"group": 20, "pads": [2, 2, 2, 2], "dilations": [2, 2]},
            "float32",
        ),  # pad lanes
        ((2, 12, 7, 6), (12, 1, 5, 5), {"group": 12, "pads": [2, 2, 2, 2], "strides": [2, 2]}, "float32"),
        ((2, 3, 9, 8), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "float32"),  # columns, stride 1 (padded width)
        ((1, 8, 5, 7), (6, 4, 3, 2), {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1]}, "float32"),  # strided
        ((1, 4, 11), (3, 4, 3), {"pads": [2, 1]}, "float32"),  # 1-D: conv() numpy's strided form; the step 2-D
        ((1, 3, 6, 6), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "float64"),  # float64: numpy throughout
    ],
)
def test_host_conv_epilogues_against_float64(x_shape, w_shape, attrs, dtype, rng):
    """Each host conv form with a fused epilogue (bias, residual Add, every activation of
    conv_kernels.EpiOp), through conv() and the planned HostConvStep (C tables bound once), against
    the float64 conv plus the ONNX definitions, within the float32 bound of the Cg*K + 2 term sums
    (the activations' slopes are at most 1.5); float64 and 1-D take the general numpy path."""
    from panamera.subgraph.conv import conv, geometry
    from panamera.subgraph.conv_kernels import Epilogue, EpiOp, EpiStep
    from panamera.subgraph.conv_step import HostConvStep

    win, group = geometry(x_shape, w_shape, attrs)
    x, w = random_array(x_shape, dtype, rng), random_array(w_shape, dtype, rng)
    b = random_array((w_shape[0],), dtype, rng)
    out = (x_shape[0], w_shape[0], *win.out)
    r1, r2 = random_array(out, dtype, rng), random_array(out, dtype, rng)
    base = _conv_reference(x, w, win, group) + b.astype(np.float64).reshape((1, -1) + (1,) * len(win.out))
    scale = float((_conv_reference(np.abs(x), np.abs(w), win, group) + np.abs(b).max() + 2).max())
    chains = [
        (EpiStep(EpiOp.ADD), EpiStep(EpiOp.RELU)),
        (EpiStep(EpiOp.HARDSWISH), EpiStep(EpiOp.ADD), EpiStep(EpiOp.CLIP, (-0.5, 0.75))),
        (EpiStep(EpiOp.SIGMOID),),
        (EpiStep(EpiOp.ADD), EpiStep(EpiOp.SILU)),
        (EpiStep(EpiOp.HARDSIGMOID, (0.3, 0.4)), EpiStep(EpiOp.LEAKYRELU, (0.1,))),
        (EpiStep(EpiOp.LEAKYRELU, (0.1,)),),
        (EpiStep(EpiOp.GELU), EpiStep(EpiOp.ADD)),
    ]
    for steps in chains:
        res = (r1, r2)[: sum(s.op is EpiOp.ADD for s in steps)]
        ref = _epilogue_reference(base, steps, res)
        y = conv(np, attrs, x, w, b, epilogue=Epilogue(steps), residuals=res)
        step = HostConvStep.plan(x_shape, w_shape, attrs, True, Epilogue(steps))  # the library node's step
        for got in (y, step(x, w, b, *res), step(x, w, b, *res)):  # twice: its scratch reused
            assert got.dtype == np.dtype(dtype) and got.shape == out and got.flags.c_contiguous
            close(got, ref, dtype, int(np.prod(w_shape[1:])) + 3, 1.5 * scale)
    plain = HostConvStep.plan(x_shape, w_shape, attrs, False)  # no bias, no epilogue
    close(plain(x, w), _conv_reference(x, w, win, group), dtype, int(np.prod(w_shape[1:])), scale)


def _fusion_model(tail: str, dtype: str = "float32") -> bytes:
    """Conv (2x8x8x8 * 8x8x3x3, 74 K multiply-adds: a host conv) then `tail`'s nodes (model text)."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(1)
    v = lambda n, s: helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), s)  # noqa: E731
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(dtype), n) for n, s in
             (("w", (8, 8, 3, 3)), ("b", (8,)), ("lo", ()), ("hi", ()), ("row", (1, 8, 1, 1)), ("w1", (8, 8, 1, 1)))]  # fmt: skip
    inits += [
        numpy_helper.from_array(np.array(c, dtype), n) for n, c in (("s2", np.sqrt(2)), ("one", 1), ("half", 0.5))
    ]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])]
    for line in tail.split(";"):
        op, ins, out = line.split()
        nodes.append(helper.make_node(op, ins.split(","), [out]))
    outs = [v(o, [2, 8, 8, 8]) for o in ("y", "z") if any(o in n.output for n in nodes)]
    g = helper.make_graph(nodes, "g", [v("x", [2, 8, 8, 8]), v("r", [2, 8, 8, 8])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


GELU_CHAIN = "Div c,s2 d;Erf d e;Add e,one a;Mul c,a m;Mul m,half g"  # PyTorch's exported erf GELU
FUSION_CASES = [
    ("Add c,r a;Relu a y", ["Add", "Relu"]),  # residual from a graph input, then an activation
    ("Relu r q;Add q,c a;Clip a,lo,hi y", ["Add", "Clip"]),  # a residual made before the Conv, constant bounds
    ("Relu c a;Relu a y;Relu c z", []),  # 2: the Conv's output has two consumers
    ("Relu c y;Sigmoid y z", ["Relu"]),  # 2: Relu's output is a graph output: the chain stops there
    ("Sigmoid c s;Add c,s y", []),  # 2: an Add whose other operand is made from the Conv's output
    ("Sigmoid c s;Mul s,c y", ["Sigmoid", "Mul"]),  # 2: the Swish pair, one SILU step
    ("Sigmoid c s;Mul c,s y;Relu s z", []),  # 2: no Swish pair: the Sigmoid's output is read twice
    ("Add c,row a;Relu a y", []),  # 3: the Add broadcasts its other operand
    ("Tanh c y", []),  # 3: no epilogue op
    ("Relu c a;Add a,a y", ["Relu"]),  # 3: an Add of the chain's value with itself
    ("Conv x,w1 e;Add c,e y", ["Add"]),  # 4: the Add joins the first Conv only (the second's output its residual)
    (GELU_CHAIN + ";Relu g y", ["Div", "Erf", "Add", "Mul", "Mul", "Relu"]),  # 2: the erf GELU chain, one step
    ("Div c,s2 d;Erf d e;Add one,e a;Mul a,c m;Mul half,m y", ["Div", "Erf", "Add", "Mul", "Mul"]),  # operands swapped
    ("Div c,half d;Erf d e;Add e,one a;Mul c,a m;Mul m,half y", []),  # 2: no GELU chain: not divided by sqrt 2
    ("Div c,s2 d;Erf d e;Add e,half a;Mul c,a m;Mul m,half y", []),  # 2: no GELU chain: erf + 0.5
    (GELU_CHAIN + ";Relu e y", []),  # 2: no GELU chain: an inner value (the Erf's) read twice
    ("Div c,s2 d;Erf d e;Add e,one a;Mul c,a y;Mul y,half z", []),  # 2: no GELU chain: an inner value is an output
]


def test_conv_epilogue_fusion_preconditions():
    """conv_fuse.py: the element-wise chain after a library Conv that joins its step; negative
    cases per precondition (1: a float64 Conv; without the CPU target the partition fuses nothing:
    test_cpu_target_runs_large_convs_in_the_host_convolution)."""
    from panamera.subgraph.conv_fuse import fuse_epilogues
    from panamera.subgraph.model import load_model

    for tail, fused in FUSION_CASES:
        model = load_model(_fusion_model(tail))
        got = fuse_epilogues(model, tuple(n for n in model.nodes if n.op_type == "Conv"))
        assert [[n.op_type for n in f.nodes] for f in got] == ([fused] if fused else []), tail
    model = load_model(_fusion_model(FUSION_CASES[0][0], "float64"))
    assert not fuse_epilogues(model, tuple(n for n in model.nodes if n.op_type == "Conv"))  # 1: not float32


def test_fused_conv_epilogues_run():
    """A model with a fused Conv epilogue (a residual made by a subgraph before the Conv, the chain
    cut at a graph output that a subgraph after it reads; two Convs meeting at an Add, the second
    run first) runs it in the Conv's step and matches the float64 reference (verify)."""
    from panamera.subgraph.optimizer import optimize

    opt = optimize(_fusion_model("Relu r q;Add q,c a;Clip a,lo,hi y;Sigmoid y z"), target="cpu")
    (conv_unit,) = [u for u in opt.library if u.node.op_type == "Conv"]
    assert [n.op_type for n in conv_unit.nodes] == ["Conv", "Add", "Clip"] and conv_unit.outputs == ("y",)
    assert [[n.op_type for n in sg.nodes] for sg in opt.subgraphs] == [["Relu"], ["Sigmoid"]]
    assert all(c.ok for c in opt.verify())
    two = optimize(_fusion_model("Conv x,w1 e;Add c,e a;Relu a y"), target="cpu")  # 4: two Convs meet at the Add
    assert [[n.op_type for n in u.nodes] for u in two.units] == [["Conv"], ["Conv", "Add", "Relu"]]
    assert all(c.ok for c in two.verify())
    gelu = optimize(_fusion_model(GELU_CHAIN + ";Add g,r y"), target="cpu")  # the GELU step, then a residual
    assert [[n.op_type for n in u.nodes] for u in gelu.units] == [["Conv", "Div", "Erf", "Add", "Mul", "Mul", "Add"]]
    assert all(c.ok for c in gelu.verify())
