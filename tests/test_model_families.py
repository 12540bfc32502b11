"""Issue 20's failure classes, each on a minimal graph: what the exported model families
(tests/test_exported_models.py) tripped over, reduced to the mechanism."""

import math

import numpy as np
import pytest
from conftest import tolerance
from onnx import TensorProto, helper, numpy_helper
from test_onnx_net import ref_conv

import panamera as pn
from panamera.subgraph import optimize
from panamera.subgraph.conv import conv, geometry, im2col


def test_im2col_addresses_that_scale_before_they_divide_use_64_bit_indices():
    """A depthwise 3x3 convolution over 2x16x32x32 (an EfficientNet's): every index of its
    im2col fits int, but isl's address expression multiplies i by 29507 before it divides, which
    overflows int: the kernel read out of bounds (segfault on the emulator). The index type now
    covers every intermediate value of the rendered addresses (islast.widest)."""
    xs, ws, attrs = (2, 16, 32, 32), (16, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 16}
    win, g = geometry(xs, ws, attrs)
    cols = pn.compile(im2col(pn.placeholder(xs, name="x"), win, g), target="emulator")
    assert "typedef long long pn_idx;" in cols.source
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    b = np.zeros(ws[0], np.float32)
    tol = tolerance("float32", math.prod(ws[1:])) * 4
    np.testing.assert_allclose(
        conv(np, attrs, x, w), ref_conv(x, w, b, (1, 1), [1] * 4, (1, 1), 16), rtol=tol, atol=tol
    )


def _cumsum_ref(x, axis, exclusive, reverse):
    y = np.flip(x, axis) if reverse else x
    y = np.cumsum(y.astype(np.float64) if x.dtype.kind == "f" else y, axis=axis)
    if exclusive:
        y = np.concatenate([np.zeros_like(np.take(y, [0], axis)), np.delete(y, -1, axis)], axis)
    return np.flip(y, axis) if reverse else y


@pytest.mark.parametrize(
    "dtype,axis,exclusive,reverse", [("int64", 1, 0, 0), ("int64", 1, 1, 1), ("float32", 0, 1, 0), ("float32", 0, 0, 1)]
)
def test_cumsum_is_panamera_s(dtype, axis, exclusive, reverse):
    """CumSum (BLOOM's ALiBi positions: the cumulative sum of the attention mask) was the one node
    BLOOM left on the host: now a triangular reduction Panamera compiles, every attribute."""
    elem = TensorProto.INT64 if dtype == "int64" else TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)], "g",
        [helper.make_tensor_value_info("x", elem, [3, 6])], [helper.make_tensor_value_info("y", elem, [3, 6])],
        [numpy_helper.from_array(np.array(axis, np.int64), "a")],
    )  # fmt: skip
    opt = optimize(helper.make_model(g).SerializeToString(), target="emulator")
    assert not opt.library and len(opt.subgraphs) == 1
    rng = np.random.default_rng(1)
    x = rng.integers(-5, 5, (3, 6)) if dtype == "int64" else rng.standard_normal((3, 6)).astype(np.float32)
    got, want = opt.run({"x": x})["y"], _cumsum_ref(x, axis, exclusive, reverse)
    if dtype == "int64":
        np.testing.assert_array_equal(got, want)
    else:  # a sum of at most 3 terms: 3 roundings of partial sums bounded by the sum of |x|
        bound = 3 * 2.0**-24 * _cumsum_ref(np.abs(x), axis, exclusive, reverse)
        assert (np.abs(got - want) <= bound).all()
