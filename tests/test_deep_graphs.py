"""Deep graphs (issue 18): a chain of 400 element-wise ops raised RecursionError, and so did a
3000-node ONNX chain. Every walk over the tensor graph, the statement bodies and the ONNX nodes is
iterative (panamera/walk.py); these chains compile under a stack only a little deeper than the
caller's, and match numpy in float64 within bounds derived from the chain's length."""

import random
import sys
import traceback

import numpy as np
import pytest
from onnx import TensorProto, helper

import panamera as pn
from panamera.frontend.walk import evaluate, postorder
from panamera.subgraph import optimize

EPS32 = 2.0**-24  # float32's unit roundoff


@pytest.fixture
def shallow_stack():
    """The recursion limit set to the caller's depth plus 150 frames: a walk that recursed once
    per node of a 400-op chain fails here."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(len(traceback.extract_stack()) + 150)
    yield
    sys.setrecursionlimit(old)


def _chain(y, n: int, xp):
    for k in range(n):
        y = (y * 0.999 + 0.001) if k % 2 else xp.exp(y * 0.01)
    return y


def test_400_op_chain_compiles_and_matches_numpy(shallow_stack):
    n = 400
    x = pn.placeholder((4, 8), "float32", name="x")
    y = _chain(x, n, pn)
    k = pn.compile([y, pn.sum(y, axis=1)], target="emulator", cache=False)
    a = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    got_y, got_s = k(a)
    want = _chain(a.astype(np.float64), n, np)
    # each of the 2n ops rounds once (exp within a few ulps): relative error at most ~4 eps per op
    tol = 4 * 2 * n * EPS32
    np.testing.assert_allclose(got_y, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(got_s, want.sum(axis=1), rtol=tol + 8 * EPS32, atol=tol * 8)


def _onnx_chain(n: int) -> bytes:
    nodes, prev = [], "x"
    for k in range(n):
        op = ("Add", [prev, "c"]) if k % 2 == 0 else ("Relu", [prev])
        nodes.append(helper.make_node(op[0], op[1], [f"t{k}"], name=f"n{k}"))
        prev = f"t{k}"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[helper.make_tensor("c", TensorProto.FLOAT, [3], [-0.01, 0.02, 0.001])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_3000_node_onnx_chain_loads_and_runs():
    n = 3000
    m = optimize(_onnx_chain(n), target="emulator")
    a = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    got = m.run({"x": a})["y"]
    want = a.astype(np.float64)
    c = np.array([-0.01, 0.02, 0.001])
    peak = 0.0
    for k in range(n):
        want = np.maximum(want, 0) if k % 2 else want + c
        peak = max(peak, float(np.abs(want).max()))
    # n/2 float32 additions, each rounding by at most eps of the running value (Relu is exact)
    tol = (n / 2) * EPS32 * (peak + 1)
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)


def _recursive_postorder(roots, children):
    seen, order = set(), []

    def go(n):
        if n in seen:
            return
        seen.add(n)
        for c in children(n):
            go(c)
        order.append(n)

    for r in roots:
        go(r)
    return order


@pytest.mark.parametrize("seed", range(5))
def test_walks_visit_as_the_recursive_walk_would(seed):
    """Orders, numbering and hashes (schedule signatures, cache keys) are built from these walks,
    so they must visit exactly as the recursive walks they replaced."""
    rng = random.Random(seed)
    kids = {k: sorted(rng.sample(range(k), min(k, rng.randint(0, 3)))) for k in range(40)}
    roots = [39, 20, 39, 5]
    assert postorder(roots, kids.__getitem__, key=int) == _recursive_postorder(roots, kids.__getitem__)
    calls = []

    def combine(n, vals):
        calls.append(n)
        return n + sum(vals)

    memo = {}

    def value(n):
        return n + sum(value(c) for c in kids[n])

    assert evaluate(39, int, kids.__getitem__, combine, memo) == value(39)
    assert calls == _recursive_postorder([39], kids.__getitem__)  # each node once, children first


def test_a_deep_walk_needs_no_stack():
    n = 100_000
    kids = {k: [k - 1] if k else [] for k in range(n)}
    assert postorder([n - 1], kids.__getitem__, key=int)[-3:] == [n - 3, n - 2, n - 1]
    assert evaluate(n - 1, int, kids.__getitem__, lambda k, v: 1 + sum(v)) == n
