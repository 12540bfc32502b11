"""The dense stride-1 conv in one C call (subgraph/conv_direct.py) and a library Conv's bound run
path (subgraph/conv_run.py) against a float64 tap-by-tap conv; one negative case per precondition."""

import numpy as np
import pytest
from conftest import random_array
from test_cpu_models import _conv_reference, _epilogue_reference, close

from panamera.frontend import pool
from panamera.subgraph.conv import geometry
from panamera.subgraph.conv_direct import MAX_TAPS, direct_geometry
from panamera.subgraph.conv_kernels import NO_EPILOGUE, Epilogue, EpiOp, EpiStep
from panamera.subgraph.conv_step import HostConvStep

CHAIN = Epilogue((EpiStep(EpiOp.ADD), EpiStep(EpiOp.LEAKYRELU, (0.1,))))


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ((2, 3, 9, 8), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # fewer outputs than a channel block
        ((1, 7, 6, 11), (13, 7, 3, 3), {"pads": [1, 0, 2, 1]}),  # a full block and a tail; asymmetric pads
        ((2, 4, 9, 9), (9, 4, 3, 2), {"dilations": [2, 3], "pads": [2, 1, 1, 2]}),  # dilations
        ((1, 4, 8, 8), (6, 4, 3, 1), {}),  # no padding, span = oh * w: the input read in place
        ((1, 6, 5, 7), (8, 6, 5, 5), {"pads": [2, 2, 2, 2]}),  # 25 taps
        ((1, 16, 12, 12), (16, 16, 1, 1), {"pads": [1, 1, 1, 1]}),  # a padded 1x1 (not pointwise)
        ((1, 40, 7, 7), (3, 40, 3, 3), {"pads": [1, 1, 1, 1]}),  # reduction length 360
    ],
)
def test_direct_conv_against_float64(x_shape, w_shape, attrs, rng):
    """The direct form (no column tensor), with and without bias and epilogue (residual Add, then
    LeakyRelu), twice (scratch reused), and through its bound call at 1 and 2 threads (bit-equal:
    each output value is one register tile's sum), within the float32 bound of C*K + 2 rounded terms."""
    win, group = geometry(x_shape, w_shape, attrs)
    assert direct_geometry(x_shape, w_shape, win, group) is not None
    x, w = random_array(x_shape, "float32", rng), random_array(w_shape, "float32", rng)
    b = random_array((w_shape[0],), "float32", rng)
    out = (x_shape[0], w_shape[0], *win.out)
    r = random_array(out, "float32", rng)
    k = int(np.prod(w_shape[1:]))
    plain = _conv_reference(x, w, win, group)
    scale = float((_conv_reference(np.abs(x), np.abs(w), win, group) + np.abs(b).max() + 2).max())
    ref = _epilogue_reference(plain + b.astype(np.float64).reshape(1, -1, 1, 1), CHAIN.steps, (r,))
    step = HostConvStep.plan(x_shape, w_shape, attrs, True, CHAIN)
    assert "direct" in step._c
    for got in (step(x, w, b, r), step(x, w, b, r)):
        assert got.shape == out and got.dtype == np.float32
        close(got, ref, "float32", k + 2, 1.5 * scale)
    call = step.with_weights(w, b)
    one, two = call(x, (r,), 1), call(x, (r,), 2)
    close(one, ref, "float32", k + 2, 1.5 * scale)
    assert np.array_equal(one, two)  # bit-stable across thread counts
    bare = HostConvStep.plan(x_shape, w_shape, attrs, False, NO_EPILOGUE)
    close(bare(x, w), plain, "float32", k, scale)
    assert call(x.astype(np.float64), (r,), 1) is None  # not the planned array: the caller's general path
    assert call(x, (), 1) is None  # a residual missing
    assert bare.with_weights(w, b) is None  # planned without a bias


def test_direct_geometry_preconditions():
    """One negative case per precondition of conv_direct.direct_geometry."""

    def geo(x_shape, w_shape, attrs):
        win, group = geometry(x_shape, w_shape, attrs)
        return direct_geometry(x_shape, w_shape, win, group)

    assert geo((1, 4, 8, 8), (4, 4, 3, 3), {"pads": [1, 1, 1, 1]}) is not None
    assert geo((1, 4, 11), (3, 4, 3), {"pads": [1, 1]}) is None  # 1: a 1-D window
    assert geo((1, 4, 8, 8), (4, 2, 3, 3), {"group": 2}) is None  # 2: grouped
    assert geo((1, 4, 8, 8), (4, 4, 3, 3), {"strides": [1, 2]}) is None  # 3: strided
    cropped = pool.Window((3, 3), (1, 1), ((-1, 0), (0, 0)), (1, 1), (5, 6))  # ONNX's geometry refuses it
    assert direct_geometry((1, 4, 8, 8), (4, 4, 3, 3), cropped, 1) is None  # 4: a negative pad
    big = int(MAX_TAPS**0.5) + 1
    assert geo((1, 1, 20, 20), (1, 1, big, big), {}) is None  # 5: more taps than the C table holds


def test_library_conv_bound_run(rng):
    """A model's library Convs (a residual block: Conv+Relu, Conv+Add+Relu) take the bound path
    (conv_run.py) and agree with a float64 reference at 1 and 2 threads; a float64 feed is
    refused by name."""
    from onnx import helper, numpy_helper

    from panamera.errors import DTypeError
    from panamera.subgraph.conv_run import BoundConv
    from panamera.subgraph.optimizer import optimize

    w1, w2 = random_array((8, 8, 3, 3), "float32", rng), random_array((8, 8, 3, 3), "float32", rng)
    b1 = random_array((8,), "float32", rng)
    v = lambda n: helper.make_tensor_value_info(n, helper.TensorProto.FLOAT, [2, 8, 8, 8])  # noqa: E731
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["h"]),
        helper.make_node("Conv", ["h", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in (("w1", w1), ("b1", b1), ("w2", w2))]
    g = helper.make_graph(nodes, "g", [v("x")], [v("y")], inits)
    opt = optimize(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), target="cpu")
    assert [type(st[4]) for st in opt._steps] == [BoundConv, BoundConv]
    x = random_array((2, 8, 8, 8), "float32", rng)
    win, _ = geometry(x.shape, w1.shape, {"pads": [1, 1, 1, 1]})
    h = np.maximum(_conv_reference(x, w1, win, 1) + b1.astype(np.float64).reshape(1, -1, 1, 1), 0)
    ref = np.maximum(_conv_reference(h, w2, win, 1) + x, 0)
    scale = float(_conv_reference(np.abs(h), np.abs(w2), win, 1).max() + np.abs(x).max())
    one, two = (opt.run({"x": x}, threads=t)["y"] for t in (1, 2))
    close(one, ref, "float32", 2 * 72 + 2, 2 * scale)
    assert np.array_equal(one, two)
    with pytest.raises(DTypeError, match="'x'"):
        opt.run({"x": x.astype(np.float64)})
