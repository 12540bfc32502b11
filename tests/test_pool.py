"""Pooling as windowed reductions (frontend/pool.py): one test per attribute against a float64
numpy reference, with tolerances from the dtype and the window length; fusion with producers;
errors naming the op and attribute."""

import itertools
import math

import numpy as np
import pytest
from conftest import tolerance

import panamera as pn


def ref_pool(a, kind, kernel, strides=None, pads=None, dilations=None, ceil_mode=False, count_include_pad=False):
    """The definition, in float64: each output's window of positions o*s + k*d - pb."""
    d = len(kernel)
    strides, dilations = strides or (1,) * d, dilations or (1,) * d
    pads = pads or (0,) * (2 * d)
    w = pn.frontend.pool.window(pn.placeholder(a.shape), kernel, strides, pads, dilations, ceil_mode)
    spatial = a.shape[2:]
    out = np.zeros(a.shape[:2] + w.out)
    x = a.astype(np.float64)
    for o in itertools.product(*(range(n) for n in w.out)):
        vals, count = [], 0
        for k in itertools.product(*(range(n) for n in kernel)):
            pos = [o[i] * strides[i] + k[i] * dilations[i] - pads[i] for i in range(d)]
            if all(0 <= p < n for p, n in zip(pos, spatial)):
                vals.append(x[(slice(None), slice(None), *pos)])
                count += 1
            elif all(-pads[i] <= p < n + pads[d + i] for i, (p, n) in enumerate(zip(pos, spatial))):
                count += count_include_pad
        v = np.stack(vals, -1)
        out[(slice(None), slice(None), *o)] = v.max(-1) if kind == "max" else v.sum(-1) / count
    return out


def check(kind, shape, dtype="float32", **kw):
    rng = np.random.default_rng(7)
    a = rng.standard_normal(shape).astype(dtype)
    x = pn.placeholder(shape, dtype, name="x")
    f = pn.max_pool if kind == "max" else pn.avg_pool
    args = {k: v for k, v in kw.items() if kind == "avg" or k != "count_include_pad"}
    k = pn.compile(f(x, **args), target="emulator")
    got = k(a)
    want = ref_pool(a, kind, **kw)
    n = math.prod(kw["kernel"])
    tol = tolerance(dtype, n)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    assert len(k.plan.kernels) == 1
    return k


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_kernel(kind):
    check(kind, (2, 3, 7, 6), kernel=(3, 2))


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_strides(kind):
    check(kind, (1, 2, 9, 8), kernel=(3, 3), strides=(2, 3))


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pads(kind):
    check(kind, (1, 2, 6, 5), kernel=(3, 3), pads=(1, 2, 2, 1))


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_dilations(kind):
    check(kind, (1, 2, 9, 9), kernel=(2, 3), dilations=(3, 2), pads=(1, 1, 1, 1))


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_ceil_mode(kind):
    check(kind, (1, 2, 8, 7), kernel=(2, 2), strides=(3, 3), ceil_mode=True)
    x = pn.placeholder((1, 2, 8, 7), name="x")
    assert pn.max_pool(x, (2, 2), (3, 3), ceil_mode=True).shape == (1, 2, 3, 3)
    assert pn.max_pool(x, (2, 2), (3, 3)).shape == (1, 2, 3, 2)


@pytest.mark.parametrize("include", [False, True])
def test_count_include_pad(include):
    check("avg", (1, 2, 5, 5), kernel=(3, 3), pads=(1, 1, 1, 1), strides=(2, 2), count_include_pad=include)


def test_ceil_mode_windows_past_the_padding_are_not_counted():
    check("avg", (1, 1, 6, 6), kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=True, count_include_pad=True)


def test_1d_and_3d_and_float16():
    check("max", (2, 3, 11), kernel=(4,), strides=(2,))
    check("avg", (1, 2, 4, 5, 6), kernel=(2, 2, 3), pads=(1, 0, 1, 0, 1, 1))
    check("avg", (1, 4, 9, 9), "float16", kernel=(3, 3), pads=(1, 1, 1, 1))


def test_global_pools_and_batchnorm_relu_gap_is_one_kernel():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 8, 7, 7)).astype(np.float32)
    mean, var = rng.standard_normal(8).astype(np.float32), rng.random(8).astype(np.float32) + 0.5
    x = pn.placeholder(a.shape, name="x")
    m, v = pn.placeholder((8, 1, 1), name="m"), pn.placeholder((8, 1, 1), name="v")
    y = pn.global_avg_pool(pn.maximum((x - m) * pn.rsqrt(v + 1e-5), 0.0))
    k = pn.compile(y, target="emulator")
    got = k(a, mean.reshape(8, 1, 1), var.reshape(8, 1, 1))
    a64 = np.maximum((a - mean[:, None, None].astype(np.float64)) / np.sqrt(var[:, None, None] + 1e-5), 0)
    tol = tolerance("float32", 49) * 4  # the normalization's few roundings per term
    np.testing.assert_allclose(got, a64.mean((2, 3), keepdims=True), rtol=tol, atol=tol)
    assert len(k.plan.kernels) == 1
    k = pn.compile(pn.global_max_pool(x), target="emulator")
    np.testing.assert_array_equal(k(a), a.max((2, 3), keepdims=True))


def test_bad_pool_arguments_name_op_and_attribute():
    x = pn.placeholder((1, 2, 5, 5), name="img")
    with pytest.raises(pn.ShapeError, match="max_pool of 'img': kernel_shape"):
        pn.max_pool(x, (2, 2, 2, 2))
    with pytest.raises(pn.ShapeError, match="avg_pool of 'img': strides \\(0, 1\\) must be positive"):
        pn.avg_pool(x, (2, 2), strides=(0, 1))
    with pytest.raises(pn.ShapeError, match="pads .* must be non-negative"):
        pn.max_pool(x, (2, 2), pads=(-1, 0, 0, 0))
    with pytest.raises(pn.ShapeError, match="pads .* must have 4 entries"):
        pn.max_pool(x, (2, 2), pads=(1, 1, 1))
    with pytest.raises(pn.ShapeError, match="dilations"):
        pn.max_pool(x, (2, 2), dilations=(1,))
    with pytest.raises(pn.ShapeError, match="exceeds the padded extent"):
        pn.max_pool(x, (6, 2))
    with pytest.raises(pn.DTypeError, match="floating-point"):
        pn.avg_pool(pn.placeholder((1, 1, 4, 4), "int32", name="i"), (2, 2))


def test_integer_max_pool_pads_with_the_dtype_minimum():
    a = np.random.default_rng(1).integers(-100, 100, (1, 2, 5, 5)).astype(np.int32)
    k = pn.compile(pn.max_pool(pn.placeholder(a.shape, "int32"), (3, 3), pads=(1, 1, 1, 1)), target="emulator")
    np.testing.assert_array_equal(k(a), ref_pool(a, "max", (3, 3), pads=(1, 1, 1, 1)).astype(np.int32))


# -- MaxPool's Indices output (frontend/pool.max_pool_indices) ----------------------------------
def ref_indices(a, kernel, strides=None, pads=None, dilations=None, ceil_mode=False, storage_order=0):
    """ONNX's definition: the flat position in x (N and C included; spatial axes row-major, or
    column-major with storage_order 1) of the first maximum in window order, padding skipped."""
    d = len(kernel)
    strides, dilations = strides or (1,) * d, dilations or (1,) * d
    pads = pads or (0,) * (2 * d)
    w = pn.frontend.pool.window(pn.placeholder(a.shape), kernel, strides, pads, dilations, ceil_mode)
    spatial, lead = a.shape[2:], a.shape[:2]
    out = np.zeros(lead + w.out, np.int64)
    for n, c, *o in itertools.product(*(range(e) for e in lead + w.out)):
        best, at = None, None
        for k in itertools.product(*(range(e) for e in kernel)):
            pos = tuple(o[i] * strides[i] + k[i] * dilations[i] - pads[i] for i in range(d))
            if all(0 <= p < e for p, e in zip(pos, spatial)) and (best is None or a[(n, c, *pos)] > best):
                best, at = a[(n, c, *pos)], pos
        inner = np.ravel_multi_index(at, spatial, order="F" if storage_order else "C")
        out[(n, c, *o)] = (n * lead[1] + c) * math.prod(spatial) + inner
    return out


def check_indices(shape, dtype="float32", **kw):
    """Exact equality: integer inputs from a small range, so windows hold ties (the first wins)."""
    a = np.random.default_rng(3).integers(-3, 3, shape).astype(dtype)
    x = pn.placeholder(shape, dtype, name="x")
    k = pn.compile([pn.max_pool(x, **{k: v for k, v in kw.items() if k != "storage_order"}),
                    pn.max_pool_indices(x, **kw)], target="emulator")  # fmt: skip
    values, got = k(a)
    np.testing.assert_array_equal(got, ref_indices(a, **kw))
    np.testing.assert_array_equal(values, ref_pool(a, "max", **{k: v for k, v in kw.items() if k != "storage_order"}))
    assert len(k.plan.kernels) == 1  # the max and its argmax over the same windows: one kernel
    return got


def test_indices_ceil_mode():
    check_indices((2, 3, 7, 6), kernel=(2, 2), strides=(2, 2), ceil_mode=True)


def test_indices_pads():
    check_indices((1, 2, 5, 6), kernel=(3, 3), pads=(1, 2, 2, 1))


def test_indices_dilations():
    check_indices((1, 2, 8, 7), kernel=(2, 3), dilations=(3, 2))


def test_indices_strides():
    check_indices((2, 2, 9, 8), kernel=(3, 2), strides=(3, 2))


@pytest.mark.parametrize("order", [0, 1])
def test_indices_storage_order(order):
    got = check_indices((1, 3, 6, 5), kernel=(2, 2), strides=(2, 1), storage_order=order)
    other = check_indices((1, 3, 6, 5), kernel=(2, 2), strides=(2, 1), storage_order=1 - order)
    assert not np.array_equal(got, other)  # column-major positions are not row-major ones


@pytest.mark.parametrize("dtype", ["float16", "int32", "float64", "int64"])
def test_indices_dtypes_and_1d_3d(dtype):
    """Keys pack a 32-bit image of the value: 8-byte values take the max-then-first-position path."""
    check_indices((1, 2, 9), dtype, kernel=(3,), strides=(2,), pads=(1, 1))
    check_indices((1, 1, 4, 5, 3), dtype, kernel=(2, 2, 2), pads=(1, 0, 1, 0, 1, 0), storage_order=1)


def test_indices_padding_never_wins_against_minus_infinity():
    a = np.full((1, 1, 3, 3), -np.inf, np.float32)
    x = pn.placeholder(a.shape, name="x")
    got = pn.compile(pn.max_pool_indices(x, (3, 3), pads=1), target="emulator")(a)
    np.testing.assert_array_equal(got, ref_indices(a, (3, 3), pads=(1, 1, 1, 1)))


def test_indices_bad_storage_order_is_named():
    with pytest.raises(pn.OptionError, match="storage_order 2"):
        pn.max_pool_indices(pn.placeholder((1, 1, 4, 4), name="x"), (2, 2), storage_order=2)


def test_maxpool_node_with_indices_matches_onnx_reference():
    """The ONNX node, both outputs on the device, against onnx's reference (its indexing path
    runs when a stride or dilation is not 1)."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from panamera.subgraph import optimize

    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1],
                            dilations=[1, 2], ceil_mode=1, storage_order=1)  # fmt: skip
    g = helper.make_graph(
        [node],
        "mp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 7, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 4]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [2, 3, 4, 4])],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    a = np.random.default_rng(5).integers(-4, 4, (2, 3, 7, 8)).astype(np.float32)
    opt = optimize(m, target="emulator")
    assert not opt.library
    got = opt.run({"x": a})
    y, i = ReferenceEvaluator(m).run(None, {"x": a})
    np.testing.assert_array_equal(got["y"], y)
    np.testing.assert_array_equal(got["i"], i)
