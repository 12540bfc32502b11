"""Whole models on target="cpu" (issue 24): the contraction operands the CPU target stores
(schedule/cpu_operands.py) against numpy in float64, one negative case per precondition."""

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
    after it stays a Panamera kernel; the model matches the float64 reference. A smaller Conv,
    or one planned for the emulator, is routed by the model."""
    from panamera.subgraph.optimizer import optimize
    from panamera.subgraph.partition import partition
    from panamera.subgraph.route import HOST_CONV_MIN_MACS, Runner, contraction_shape

    rng = np.random.default_rng(0)
    opt = optimize(_conv_model(8, 32, 16, rng), target="cpu")
    (node, route) = opt.partition.routes[0]
    assert np.prod(contraction_shape(opt.model, node)) >= HOST_CONV_MIN_MACS
    assert route.runner is Runner.LIBRARY and "host convolution" in route.reason
    assert [u.node.op_type for u in opt.library] == ["Conv"] and opt.backend == "cpu"
    assert all(c.ok for c in opt.verify())
    (model_route,) = [r for _, r in partition(opt.model).routes]  # not the CPU target: the model decides
    assert "host convolution" not in model_route.reason
    small = optimize(_conv_model(2, 8, 8, rng), target="cpu")  # 9 K multiply-adds
    assert "host convolution" not in small.partition.routes[0][1].reason


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
