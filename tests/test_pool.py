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
