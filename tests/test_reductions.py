"""Every op x dtype x canonical form x keepdims against numpy, single- and multi-block."""

import math

import numpy as np
import pytest
from conftest import check, np_dtype, random_array, reference, tolerance

import panamera as pn

OPS = ["sum", "mean", "max", "min", "prod", "all", "any"]
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "bool"]
FORMS = {  # shape, axis -> canonical form
    "ROW": ((5, 301), 1),
    "COLUMN": ((301, 6), 0),
    "ALL": ((7, 43), None),
    "ROW-nchw": ((3, 4, 5, 7), (0, 2, 3)),
    "COLUMN-nhwc": ((3, 5, 7, 4), (0, 1, 2)),
}


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_reduction_matches_numpy(op, dtype, form, keepdims, rng):
    shape, axis = FORMS[form]
    a = random_array(shape, dtype, rng, op)
    x = pn.placeholder(shape, dtype, name="x")
    y = getattr(pn, op)(x, axis=axis, keepdims=keepdims)
    ref = reference(op, a, axis, keepdims)
    assert y.dtype.np == np.asarray(getattr(np, op)(a, axis=axis, keepdims=keepdims)).dtype
    k = pn.compile(y, target="emulator")
    assert k.program.statements[0].form == form.split("-")[0]
    n = a.size // max(1, np.asarray(ref).size)
    out = check(k, [a], ref, dtype, n)[0]
    assert out.dtype == y.dtype.np


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_multi_block(op, dtype, deterministic, rng):
    """split forced to 4 (clamped to what the extents allow, at least 2): every block merges one
    partial per output, with atomics or through the last block."""
    for shape, axis in [((3, 8192), 1), ((1500, 5), 0)]:
        a = random_array(shape, dtype, rng, op)
        y = getattr(pn, op)(pn.placeholder(shape, dtype, name="x"), axis=axis)
        k = pn.compile(y, target="emulator", deterministic=deterministic, split=4)
        assert k.plan.kernels[0].blocks_per_reduction >= 2
        ref = reference(op, a, axis)
        outs = check(k, [a], ref, dtype, math.prod(shape), orders=("forward", "shuffled"))
        if deterministic:
            assert outs[0].tobytes() == outs[1].tobytes()
            assert k(a, order="reverse").tobytes() == outs[0].tobytes()
            assert all(mode == "partials" for mode in k.plan.kernels[0].modes)


def test_int32_sum_is_int64_without_overflow():
    a = np.full((4, 1000), 2**30, np.int32)
    k = pn.compile(pn.sum(pn.placeholder(a.shape, "int32", name="x"), axis=1), target="emulator")
    out = k(a)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, a.sum(axis=1))


def test_nan_propagates_through_max_and_min(rng):
    a = rng.random((4, 300)).astype(np.float32)
    a[1, 17] = np.nan
    for op in ("max", "min"):
        k = pn.compile(
            getattr(pn, op)(pn.placeholder(a.shape, "float32", name="x"), axis=1), target="emulator", split=3
        )
        out = k(a, order="shuffled")
        np.testing.assert_array_equal(np.isnan(out), [False, True, False, False])
        np.testing.assert_allclose(out[[0, 2, 3]], getattr(np, op)(a, axis=1)[[0, 2, 3]])


def test_empty_reductions_take_the_identity():
    x = pn.placeholder((3, 0), "float32", name="x")
    a = np.zeros((3, 0), np.float32)
    np.testing.assert_array_equal(pn.compile(pn.sum(x, axis=1), target="emulator")(a), np.zeros(3))
    np.testing.assert_array_equal(pn.compile(pn.prod(x, axis=1), target="emulator")(a), np.ones(3))
    assert np.isnan(pn.compile(pn.mean(x, axis=1), target="emulator")(a)).all()
    assert pn.compile(pn.sum(x, axis=0), target="emulator")(a).shape == (0,)
    # The other storage types of the generated fill: 16-bit floats, bool, integers.
    h = pn.placeholder((3, 0), "float16", name="h")
    out = pn.compile(pn.mean(h, axis=1), target="emulator")(np.zeros((3, 0), np.float16))
    assert out.dtype == np.float16 and np.isnan(out).all()
    out = pn.compile(pn.all(pn.placeholder((3, 0), "bool"), axis=1), target="emulator")(np.zeros((3, 0), bool))
    np.testing.assert_array_equal(out, [True, True, True])
    i = pn.placeholder((3, 0), "int32", name="i")
    np.testing.assert_array_equal(pn.compile(pn.prod(i, axis=1), target="emulator")(np.zeros((3, 0), np.int32)), 1)


@pytest.mark.parametrize("rank", [1, 2, 5, 8])
def test_ranks_one_to_eight(rank, rng):
    shape = (3, 2, 1, 4, 2, 3, 2, 2)[:rank]
    a = rng.random(shape).astype(np.float32)
    axes = tuple(range(0, rank, 2))
    y = pn.sum(pn.placeholder(shape, "float32", name="x"), axis=tuple(-rank + ax for ax in axes))
    np.testing.assert_allclose(pn.compile(y, target="emulator")(a), a.sum(axis=axes), rtol=1e-5)


def test_results_are_numpy_dtype_for_bfloat16(rng):
    a = rng.random((4, 64)).astype(np_dtype("bfloat16"))
    out = pn.compile(pn.sum(pn.placeholder(a.shape, "bfloat16"), axis=1), target="emulator")(a)
    assert out.dtype == np_dtype("bfloat16")


def _close(out, ref, dtype: str, n: int) -> None:
    tol = tolerance(dtype, n)
    if tol:
        np.testing.assert_allclose(np.asarray(out, np.float64), np.asarray(ref, np.float64), rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_op_and_form_on_the_cpu_target(dtype, rng):
    """The same cases on target="cpu" (OpenMP C++): every op and form of one dtype in one program
    (one g++ build), against numpy in float64."""
    xs = {form: pn.placeholder(shape, dtype, name=f"x{k}") for k, (form, (shape, _)) in enumerate(FORMS.items())}
    cases = [(op, form) for op in OPS for form in FORMS]
    k = pn.compile([getattr(pn, op)(xs[form], axis=FORMS[form][1]) for op, form in cases], target="cpu")
    arrays = {form: random_array(FORMS[form][0], dtype, rng, "prod" if dtype != "bool" else "sum") for form in FORMS}
    outs = k(*arrays.values())
    for (op, form), out in zip(cases, outs):
        a, axis = arrays[form], FORMS[form][1]
        ref = reference(op, a, axis)
        assert out.dtype == np.asarray(getattr(np, op)(a, axis=axis)).dtype, (op, form)
        _close(out, ref, dtype, a.size // max(1, np.asarray(ref).size))


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "int64"])  # float32: tests/test_cpu_target.py
def test_multi_block_on_the_cpu_target(dtype, deterministic, rng):
    """Split in 4 chunks on the CPU target: merged by atomics or the last task (not deterministic),
    in chunk order (deterministic: bit-identical on 1 and 2 threads)."""
    shapes = [((3, 8192), 1), ((1500, 5), 0)]
    xs = [pn.placeholder(shape, dtype, name=f"x{k}") for k, (shape, _) in enumerate(shapes)]
    cases = [(op, s) for op in OPS for s in range(len(shapes))]
    k = pn.compile([getattr(pn, op)(xs[s], axis=shapes[s][1]) for op, s in cases], target="cpu", split=4,
                   deterministic=deterministic)  # fmt: skip
    assert all(d.split >= 2 for d in k.decisions), [d.describe() for d in k.decisions]
    arrays = [random_array(shape, dtype, rng, "prod" if dtype != "bool" else "sum") for shape, _ in shapes]
    one, two = k(*arrays, threads=1), k(*arrays, threads=2)
    for (op, s), p, q in zip(cases, one, two):
        if deterministic:
            assert p.tobytes() == q.tobytes(), op
        _close(q, reference(op, arrays[s], shapes[s][1]), dtype, math.prod(shapes[s][0]))
