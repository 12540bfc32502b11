"""The subgraph optimizer's Python API: partition convexity, specialization, and the
element-wise ops ONNX brought into the frontend (tanh, erf, pow, logical ops, trunc_div)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import panamera as pn
from panamera.errors import DTypeError, InputError, ModelError
from panamera.subgraph import load_model, optimize
from panamera.subgraph.partition import partition
from panamera.subgraph.route import Routing

V = helper.make_tensor_value_info
F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def test_partition_groups_are_convex():
    # a -> Exp -> MatMul -> Add(b) where Add also reads Exp's output: Exp and Add are both
    # Panamera's, but joining them would need MatMul inside the group: two groups.
    m = model(
        [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["h"]),
         helper.make_node("Add", ["h", "e"], ["y"])],
        [V("x", F, [4, 4]), V("w", F, [4, 4])], [V("y", F, [4, 4])],
    )  # fmt: skip
    p = partition(load_model(m), routing=Routing.LIBRARY)  # MatMul pinned to the library
    assert [[n.op_type for n in g] for g in p.groups] == [["Exp"], ["Add"]]
    opt = optimize(m, target="emulator", routing="library")
    assert all(c.ok for c in opt.verify())


def test_specialized_axes_input():
    m = model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        [V("x", F, [3, 5]), V("axes", TensorProto.INT64, [1])], [V("y", F, [3])], opset=13,
    )  # fmt: skip
    from panamera.subgraph.convert import shape_inputs

    assert shape_inputs(m) == ("axes",)
    opt = optimize(m, target="emulator")
    assert not opt.subgraphs and "must be a constant" in opt.library[0].reason  # without a value
    opt = optimize(m, target="emulator", specialize={"axes": np.array([1])})
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    np.testing.assert_allclose(opt.run({"x": x, "axes": np.array([1])})["y"], x.sum(1))
    with pytest.raises(InputError, match="compiled in as"):
        opt.run({"x": x, "axes": np.array([0])})
    with pytest.raises(ModelError, match="not a graph input"):
        load_model(m, specialize={"nope": np.array([1])})


def test_run_checks_feeds():
    m = model([helper.make_node("Exp", ["x"], ["y"])], [V("x", F, [2])], [V("y", F, [2])])
    opt = optimize(m, target="emulator")
    with pytest.raises(InputError, match="missing"):
        opt.run({})
    with pytest.raises(InputError, match="unknown"):
        opt.run({"x": np.zeros(2, np.float32), "z": np.zeros(1)})
    with pytest.raises(InputError, match="shape"):
        opt.run({"x": np.zeros(3, np.float32)})
    with pytest.raises(DTypeError, match="dtype"):
        opt.run({"x": np.zeros(2, np.float64)})


# -- schedules on pn.compile: one negative test per check --------------------------------------
def test_transcendental_and_rounding_ops():
    x = pn.placeholder((3, 70), "float32", name="x")
    k = pn.compile(
        [pn.tanh(x), pn.erf(x), pn.floor(x), pn.ceil(x), pn.sum(pn.erf(x) * pn.tanh(x), axis=1)], target="emulator"
    )
    a = (np.random.default_rng(1).standard_normal((3, 70)) * 3).astype(np.float32)
    erf = np.vectorize(math.erf)(a.astype(np.float64))
    got = k(a)
    np.testing.assert_allclose(got[0], np.tanh(a.astype(np.float64)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[1], erf, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[2], np.floor(a))
    np.testing.assert_array_equal(got[3], np.ceil(a))
    np.testing.assert_allclose(got[4], (erf * np.tanh(a.astype(np.float64))).sum(1), rtol=1e-5, atol=1e-5)


def test_pow_float_and_exact_integer():
    x, y = pn.placeholder((64,), "float64", name="x"), pn.placeholder((64,), "float64", name="y")
    rng = np.random.default_rng(2)
    a, b = rng.random(64) * 3, rng.standard_normal(64) * 2
    np.testing.assert_allclose(pn.compile(x**y, target="emulator")(a, b), a**b, rtol=1e-13)
    i, j = pn.placeholder((7,), "int64", name="i"), pn.placeholder((7,), "int64", name="j")
    ia, ja = np.array([3, -2, 7, 1, -1, 2, 0]), np.array([13, 5, 0, -4, -3, 40, 3])
    got = pn.compile(i**j, target="emulator")(ia, ja)
    want = [3**13, -32, 1, 1, -1, 2**40, 0]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(DTypeError, match="booleans have no power"):
        pn.placeholder((2,), "bool") ** pn.placeholder((2,), "bool")


def test_logical_ops_and_trunc_div():
    a, b = pn.placeholder((8,), "bool", name="a"), pn.placeholder((8,), "bool", name="b")
    k = pn.compile([a & b, a | b, a ^ b, pn.logical_not(a)], target="emulator")
    av, bv = np.array([0, 1, 0, 1, 1, 0, 1, 0], bool), np.array([0, 0, 1, 1, 1, 1, 0, 0], bool)
    for got, want in zip(k(av, bv), (av & bv, av | bv, av ^ bv, ~av)):
        np.testing.assert_array_equal(got, want)
    from panamera.frontend.tensor import binary

    with pytest.raises(DTypeError, match="both operands must be bool"):  # logical and of integers
        binary("and", pn.placeholder((2,), "int32"), pn.placeholder((2,), "int32"))
    with pytest.raises(DTypeError, match="integer operands"):  # & of integers is numpy's bitwise and
        pn.placeholder((2,), "float32") & pn.placeholder((2,), "float32")

    i, j = pn.placeholder((6,), "int32", name="i"), pn.placeholder((6,), "int32", name="j")
    got = pn.compile(binary("trunc_div", i, j), target="emulator")(
        np.array([7, -7, 7, -7, 5, 3], np.int32), np.array([2, 2, -2, -2, 0, 3], np.int32)
    )
    np.testing.assert_array_equal(got, [3, -3, -3, 3, 0, 1])  # C semantics; x / 0 gives 0


def test_argmax_last_index():
    x = pn.placeholder((3, 6), "float32", name="x")
    k = pn.compile([pn.argmax(x, axis=1, last=True), pn.argmin(x, axis=0, last=True)], target="emulator")
    a = np.array([[1, 3, 3, 0, 3, 2], [5, 5, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]], np.float32)
    r0, r1 = k(a)
    np.testing.assert_array_equal(r0, [4, 1, 5])
    np.testing.assert_array_equal(r1, a.shape[0] - 1 - np.argmin(a[::-1], axis=0))


def test_zero_size_output_reductions():
    x = pn.placeholder((2, 0, 4), "float32", name="x")
    a = np.zeros((2, 0, 4), np.float32)
    assert pn.compile(pn.sum(x, axis=2), target="emulator")(a).shape == (2, 0)
    assert pn.compile(pn.max(x, axis=2), target="emulator")(a).shape == (2, 0)
    np.testing.assert_array_equal(pn.compile(pn.sum(x, axis=None), target="emulator")(a), 0.0)


@pytest.mark.parametrize("trans_a,trans_b,with_c", [(0, 0, True), (1, 0, False), (0, 1, True), (1, 1, True)])
def test_library_gemm_and_matmul_match_the_reference(trans_a, trans_b, with_c):
    """MatMul and Gemm run through the array module (numpy here, CuPy on a GPU), with ONNX's
    semantics; the reference evaluator checks them."""
    rng = np.random.default_rng(3)
    a_shape = (5, 4) if trans_a else (4, 5)
    b_shape = (3, 5) if trans_b else (5, 3)
    inits = [helper.make_tensor("b", F, b_shape, rng.standard_normal(b_shape).astype(np.float32).ravel())]
    ins = ["h", "b"] + (["c"] if with_c else [])
    if with_c:
        inits.append(helper.make_tensor("c", F, [3], rng.standard_normal(3).astype(np.float32)))
    m = model(
        [helper.make_node("Exp", ["x"], ["h"]),
         helper.make_node("Gemm", ins, ["g"], alpha=0.5, beta=2.0, transA=trans_a, transB=trans_b),
         helper.make_node("MatMul", ["g", "w"], ["y"])],
        [V("x", F, list(a_shape)), V("w", F, [3, 2])], [V("y", F, [4, 2])], inits,
    )  # fmt: skip
    opt = optimize(m, target="emulator")
    # the model routes each (partition.py, route.py): the library's or Panamera's, right either way
    assert {n.op_type for n, _ in opt.partition.routes} == {"Gemm", "MatMul"}
    assert {u.node.op_type for u in opt.library} <= {"Gemm", "MatMul"}
    checks = opt.verify()
    assert checks and all(c.ok for c in checks), checks
