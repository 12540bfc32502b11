"""A CPU kernel on one thread enters no OpenMP parallel region (codegen/cpu_region.py): the kernels
the mapper runs on one thread are rendered without one, the tile GEMM and the direct convolution
skip theirs where the call's thread count is 1; the values are the float64 reference's, and the same
bits on one and two threads. One negative test per precondition of `one_thread`."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from panamera.codegen.cpu_region import one_thread
from panamera.errors import LegalityError
from panamera.subgraph.optimizer import optimize
from panamera.subgraph.verify import reference_values

EPS = float(np.finfo(np.float32).eps)


def _block(rng) -> bytes:
    """x [8, 32] -> LayerNorm (as exported: ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, Mul,
    Add) -> MatMul [32, 32] -> Add bias -> Relu -> MatMul [32, 16]: a transformer block's small kernels."""
    f = lambda *s: (rng.standard_normal(s) * 0.5).astype(np.float32)  # noqa: E731
    c = lambda name, a: helper.make_tensor(name, TensorProto.FLOAT, a.shape, a.ravel())  # noqa: E731
    inits = [c("g", f(32)), c("be", f(32)), c("w1", f(32, 32)), c("b1", f(32)), c("w2", f(32, 16)),
             c("two", np.array(2, np.float32)), c("eps", np.array(1e-5, np.float32))]  # fmt: skip
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        helper.make_node("Mul", ["n", "g"], ["ng"]),
        helper.make_node("Add", ["ng", "be"], ["ln"]),
        helper.make_node("MatMul", ["ln", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    g = helper.make_graph(nodes, "block", [v("x", [8, 32])], [v("y", [8, 16])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def test_one_thread_kernels_have_no_region_and_the_reference_values(rng, monkeypatch):
    import dataclasses

    from panamera.runtime import cpu_probe

    real = cpu_probe.rates

    def woken(threads, caches=None):  # a passive pool's wake-up on the all-thread entry, as the bench's workers
        r = real(threads, caches)  # (this process's spinning pool can measure no extra: tiny kernels on 2 threads)
        return dataclasses.replace(r, fork_us=(r.fork_us[0], r.fork_us[0] + 30.0))

    monkeypatch.setattr(cpu_probe, "rates", woken)
    opt = optimize(_block(rng), target="cpu")
    kernels = [k for sg in opt.subgraphs if sg.runner is not None for k in sg.runner.cpu_kernels]
    serial = [k for k in kernels if k.decision.threads == 1 and k.host is None]
    assert serial  # the layer norm's small kernels
    assert all("omp parallel" not in k.source for k in serial)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    got = [opt.run({"x": x}, threads=t)["y"] for t in (1, 2, 1, 2)]  # unit path, then the chain
    wide, _, _ = reference_values(opt.model, {"x": x}, ["ln", "r", "y"])
    ln, r = np.abs(wide["ln"]), np.abs(wide["r"])
    w1, b1, w2, be = (np.abs(opt.model.constants[n]).astype(np.float64) for n in ("w1", "b1", "w2", "be"))
    # float32 rounding: the normalized row through two 32-term means, a sqrt and a few ops (~ 2 * 32 + 8
    # roundings of its magnitude), then each product gamma_33 |a| |b| plus the error it carries in
    e_ln = (2 * 32 + 8) * EPS * (ln + be).max()
    e_h = 33 * EPS * (ln @ w1 + b1) + e_ln * w1.sum(axis=0)
    bound = 33 * EPS * (r @ w2) + e_h @ w2
    for y in got:
        assert (np.abs(y.astype(np.float64) - wide["y"]) <= bound).all()
    np.testing.assert_array_equal(got[2], got[3])  # one thread (no region) and two: the same bits
    np.testing.assert_array_equal(got[0], got[2])


def test_tile_gemm_on_one_thread_runs_without_a_region(rng):
    import panamera as pn

    a, b = rng.standard_normal((8, 96)).astype(np.float32), rng.standard_normal((96, 32)).astype(np.float32)
    k = pn.compile(pn.placeholder((8, 96), "float32") @ pn.placeholder((96, 32), "float32"), target="cpu")
    if not any(c.tile is not None for c in k.cpu_kernels):
        pytest.skip("the CPU model did not pick the register tile on this machine")
    one, two = k(a, b, threads=1), k(a, b, threads=2)
    np.testing.assert_array_equal(one, two)  # fixed K chunks: the same bits on any threads
    ref = a.astype(np.float64) @ b.astype(np.float64)
    bound = 96 * EPS * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))  # gamma_K |a| |b|
    assert (np.abs(one - ref) <= bound).all()


def test_one_thread_forms():
    body = [
        "#pragma omp parallel num_threads(pn_nt)",
        "{",
        "  #pragma omp for schedule(static)",
        "  for (pn_idx i = 0; i < 4; ++i) y[i] = 0;",
        "}",
        "  #pragma omp parallel for schedule(static) num_threads(pn_nt)",
        "  for (pn_idx i = 0; i < 4; ++i) y[i] = 1;",
    ]
    assert one_thread(body) == [
        "{",
        "  #pragma omp for schedule(static)",  # a work-sharing loop stays: a team of one outside any region
        "  for (pn_idx i = 0; i < 4; ++i) y[i] = 0;",
        "}",
        "  #pragma omp for schedule(static)",
        "  for (pn_idx i = 0; i < 4; ++i) y[i] = 1;",
    ]


def test_precondition_1_unknown_region_form_refused():
    with pytest.raises(LegalityError, match="unknown parallel region form"):
        one_thread(["#pragma omp parallel for schedule(dynamic) num_threads(pn_nt)", "for (;;) {}"])


def test_precondition_2_bare_region_without_its_block_refused():
    with pytest.raises(LegalityError, match="not followed by its block"):
        one_thread(["#pragma omp parallel num_threads(pn_nt)", "y[0] = 0;"])
