"""target="cpu": BLAS contractions as gemm calls from C (schedule/cpu_gemm.py's plan, runtime/cpu_gemm.py's
library), so a program with contractions is one C entry. The planner's preconditions, each with a negative
case; products whose operands are views numpy would copy (merged heads), whose output is transposed, or
batched, against float64 numpy, with two calls returning independent results."""

import numpy as np
import pytest
from conftest import random_array, tolerance

import panamera as pn
from panamera.model.cpu_tile import tile_shape
from panamera.runtime import cpu_gemm
from panamera.schedule.cpu_blas import matmul_form
from panamera.schedule.cpu_gemm import MAX_CALLS, gemm_calls, pieces, refine

needs_blas = pytest.mark.skipif(cpu_gemm.blas() is None, reason="no CBLAS gemm found in numpy's BLAS")


def _plan(a_view, b_view, sub="ab,bc->ac", shapes=((8, 32), (32, 32)), out=(8, 32)):
    f = matmul_form(sub, shapes)
    return gemm_calls(f, ((*a_view, f.a_perm, f.a_shape), (*b_view, f.b_perm, f.b_shape)), None, out, 4)


def test_plan_preconditions():
    """1: offsets separable into uniform-stride pieces; 2: a common refinement; 3: a unit stride per
    block; 4: at most MAX_CALLS calls. Each negative falls back (None)."""
    heads = ((1, 2, 8, 16), (("transpose", (0, 2, 1, 3)), ("reshape", (8, 32))))
    w = ((32, 32), ())
    g = _plan(heads, w)
    assert (g.m, g.n, g.k) == (8, 32, 16) and [c[3] for c in g.calls] == [0, 1]  # K in 2 pieces, accumulated
    assert pieces(np.array([0, 1, 2, 4])) is None  # 1: no uniform pieces
    assert pieces(np.array([0, 1, 5, 6, 10, 11])) == ((3, 5), (2, 1))
    assert refine(((2, 3),), ((3, 2),)) is None  # 2: cuts 2 and 3 are no chain
    # 3: K read with stride 2 within pieces of 16 (each piece a step of 1 apart): no unit stride in the block
    assert _plan(((8, 16, 2), (("transpose", (0, 2, 1)), ("reshape", (8, 32)))), w) is None
    # 4: a batch of 200 is 200 calls; of 300, more than MAX_CALLS
    for nb, ok in ((200, True), (MAX_CALLS + 44, False)):
        g = _plan(((nb, 2, 2), ()), ((nb, 2, 2), ()), "abc,acd->abd", ((nb, 2, 2), (nb, 2, 2)), (nb, 2, 2))
        assert (g is not None) is ok and (not ok or len(g.calls) == nb)


def _close(got, ref, k, scale):
    t = tolerance("float32", k)
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=t, atol=t * scale)


@needs_blas
def test_products_through_gemm_from_c(rng):
    """Merged heads (K in pieces), a transposed product, and a batched one: all gemm kernels in the
    one C entry, two calls with other inputs return independent, correct results, out= prefilled with
    NaN is overwritten (beta 0 never reads it)."""
    h = pn.placeholder((2, 8, 16), "float32", name="h")
    w = pn.placeholder((32, 24), "float32", name="w")
    q = pn.placeholder((3, 8, 16), "float32", name="q")
    kk = pn.placeholder((3, 16, 12), "float32", name="kk")
    hm = pn.transpose(h, (1, 0, 2)).reshape(8, 32)
    # merged heads @ w; the same product transposed (computed as W^T A^T); a batched product stored (m, b, n)
    k = pn.compile([hm @ w, pn.einsum("mk,kn->nm", hm, w), pn.einsum("bmk,bkn->mbn", q, kk)], target="cpu")
    gemms = [c.host.gemm for c in k.cpu_kernels if c.host is not None]
    assert all(c.source for c in k.cpu_kernels) and not k.executor.fast().hosts, k.explain()
    assert len(gemms) == 3 and {g.swap for g in gemms} == {True, False}
    assert sorted(len(g.calls) for g in gemms) == [2, 2, 3] and {g.ldc for g in gemms} == {8, 24, 36}, gemms
    results = []
    for _ in range(2):
        H, W = random_array((2, 8, 16), "float32", rng), random_array((32, 24), "float32", rng)
        Q, K = random_array((3, 8, 16), "float32", rng), random_array((3, 16, 12), "float32", rng)
        got = k(H, W, Q, K)
        A = H.astype(np.float64).transpose(1, 0, 2).reshape(8, 32)
        QK, QKa = Q.astype(np.float64) @ K, np.abs(Q.astype(np.float64)) @ np.abs(K)
        ref = (A @ W, (A @ W).T, QK.transpose(1, 0, 2))
        scales = (np.abs(A) @ np.abs(W), (np.abs(A) @ np.abs(W)).T, QKa)
        results.append((got, ref, scales))
    for got, ref, scales in results:  # the first call's results are untouched by the second
        for g, r, s, n in zip(got, ref, scales, (32, 32, 16)):
            _close(g, r, n, float(s.max()))
    outs = tuple(np.full(r.shape, np.nan, np.float32) for r in results[-1][1])
    k(H, W, Q, K, out=outs)
    for g, r, s, n in zip(outs, *results[-1][1:], (32, 32, 16)):
        _close(g, r, n, float(s.max()))


def test_cpu_target_runs_small_matmuls_in_its_program():
    """route.HOST_PANAMERA: with the CPU target a small MatMul the GPU model gives the library (a numpy
    call per node on the CPU) runs in Panamera's program; without it, the GPU model decides. verify()
    checks the result against the float64 reference."""
    from onnx import TensorProto, helper

    from panamera.model import H100
    from panamera.subgraph.model import load_model
    from panamera.subgraph.optimizer import optimize
    from panamera.subgraph.route import HOST_PANAMERA_RULE, Runner, route_contraction

    v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    w = helper.make_tensor("w", TensorProto.FLOAT, (32, 16), np.linspace(-1, 1, 512, dtype=np.float32))
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [v("x", [8, 32])], [v("y", [8, 16])],
                          initializer=[w])  # fmt: skip
    data = helper.make_model(g).SerializeToString()
    m = load_model(data)
    assert route_contraction(m, m.nodes[0], H100).runner is Runner.LIBRARY  # the GPU model's tie
    r = route_contraction(m, m.nodes[0], H100, host=True)
    assert r.runner is Runner.PANAMERA and HOST_PANAMERA_RULE in r.reason
    opt = optimize(data, target="cpu")
    assert not opt.library and all(c.ok for c in opt.verify()), opt


def test_gemm_runs_on_the_calls_thread_count(monkeypatch):
    """numpy's BLAS keeps its own pool: a program with a gemm holds it at the call's `threads`
    (runtime/blas_threads.py), on the one-table path and kernel by kernel; without a gemm (a reduction,
    or the product on the register tile: no BLAS call) it is not touched."""
    from panamera.runtime import cpu, cpu_call
    from panamera.schedule import cpu_contraction

    seen = []

    class Recorder:
        def __init__(self, n):
            seen.append(n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(cpu_call, "blas_threads", Recorder)
    monkeypatch.setattr(cpu, "blas_threads", Recorder)
    monkeypatch.setattr(cpu_contraction, "gemm_tile", lambda *a: None)  # the BLAS, whatever the model says
    x, w = pn.placeholder((64, 64), "float32", name="x"), pn.placeholder((64, 64), "float32", name="w")
    k = pn.compile(x @ w, target="cpu", cache=False)
    rng = np.random.default_rng(5)
    a, b = random_array((64, 64), "float32", rng), random_array((64, 64), "float32", rng)
    got = k(a, b, threads=1)
    assert seen and seen[-1] == 1
    _close(got, a.astype(np.float64) @ b, 64, float((np.abs(a.astype(np.float64)) @ np.abs(b)).max()))
    seen.clear()
    pn.compile(x.sum(axis=1), target="cpu")(a, threads=1)
    assert seen == []
    monkeypatch.setattr(cpu_contraction, "gemm_tile", lambda gm, i, m, t=1: tile_shape(m.simd_bytes, i))
    tiled = pn.compile(x @ w, target="cpu", cache=False)
    _close(
        tiled(a, b, threads=1), a.astype(np.float64) @ b, 64, float((np.abs(a.astype(np.float64)) @ np.abs(b)).max())
    )
    assert seen == [] and "pn_tile_gemm<" in tiled.source
