"""The dense stride-1 conv in one C call (subgraph/conv_direct.py) and a library Conv's bound run
path (subgraph/conv_run.py) against a float64 tap-by-tap conv; one negative case per precondition."""

import numpy as np
import pytest
from conftest import random_array
from test_cpu_models import _conv_reference, _epilogue_reference, close

from panamera.frontend import pool
from panamera.subgraph.conv import geometry
from panamera.subgraph.conv_direct import MAX_TAPS, SHIFT_BYTES, direct_geometry
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
        ((1, 3, 8, 40), (10, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # wide rows: the padded-width layout
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


def test_direct_layouts():
    """Small planes take the shifted layout (kw copies, rows ow wide: no dropped lanes), wide rows and
    copies beyond SHIFT_BYTES the padded width; a window one column wide drops none either way."""

    def geo(x_shape, w_shape, attrs):
        win, group = geometry(x_shape, w_shape, attrs)
        return direct_geometry(x_shape, w_shape, win, group)

    pads = {"pads": [1, 1, 1, 1]}
    unet = geo((1, 32, 16, 16), (32, 32, 3, 3), pads)
    assert (unet.kws, unet.wp, unet.span, unet.scratch_floats) == (3, 16, 256, 32 * 3 * unet.plane)
    assert geo((1, 3, 8, 40), (10, 3, 3, 3), pads).kws == 0  # 336 positions, not 320: not worth 3 copies
    assert geo((1, 3, 4, 40), (10, 3, 3, 3), pads).kws == 3  # 192 (168 in tiles of 48), not 160
    assert geo((1, 512, 16, 16), (8, 512, 3, 3), pads).kws == 0  # 512 x 3 planes: beyond SHIFT_BYTES
    assert geo((1, 4, 8, 8), (6, 4, 3, 1), {}).kws == 0  # no padding: x read in place
    assert SHIFT_BYTES < 512 * 3 * unet.plane * 4


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


def _pool_model(pool_attrs: dict, relu_out: bool = False, indices: bool = False) -> bytes:
    """Conv (2x8x8x8 * 8x8x3x3, pads 1: a host conv), Relu, MaxPool(`pool_attrs`)."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(3)
    v = lambda n, s: helper.make_tensor_value_info(n, helper.TensorProto.FLOAT, s)  # noqa: E731
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype("float32"), n) for n, s in
             (("w", (8, 8, 3, 3)), ("b", (8,)))]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["a"]),
        helper.make_node("MaxPool", ["a"], ["y", "i"] if indices else ["y"], **pool_attrs),
    ]
    k, st = pool_attrs["kernel_shape"], pool_attrs.get("strides", [1, 1])
    dl, pads = pool_attrs.get("dilations", [1, 1]), pool_attrs.get("pads", [0, 0, 0, 0])
    rnd = np.ceil if pool_attrs.get("ceil_mode") else np.floor
    out = [2, 8] + [int(rnd((8 + pads[a] + pads[a + 2] - (k[a] - 1) * dl[a] - 1) / st[a])) + 1 for a in (0, 1)]
    outs = [v("y", out)] + ([v("a", [2, 8, 8, 8])] if relu_out else [])
    outs += [helper.make_tensor_value_info("i", helper.TensorProto.INT64, out)] if indices else []
    g = helper.make_graph(nodes, "g", [v("x", [2, 8, 8, 8])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


POOL_CASES = [
    ({"kernel_shape": [2, 2], "strides": [2, 2]}, {}, (2, 2, 2, 2)),
    ({"kernel_shape": [3, 2], "strides": [2, 1]}, {}, (3, 2, 2, 1)),  # odd window, overlapping columns
    ({"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 0, 0]}, {}, None),  # 5: padded
    ({"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, {}, None),  # 5: ceil_mode
    ({"kernel_shape": [2, 2], "dilations": [2, 2]}, {}, None),  # 5: dilated
    ({"kernel_shape": [2, 2], "strides": [2, 2]}, {"indices": True}, None),  # 5: the Indices output
    ({"kernel_shape": [2, 2], "strides": [2, 2]}, {"relu_out": True}, None),  # 2: Relu's output a graph output
]


@pytest.mark.parametrize("attrs, extra, pool", POOL_CASES)
def test_conv_maxpool_fusion(attrs, extra, pool):
    """conv_fuse.fuse_pool (precondition 5, one negative each, and 2): a MaxPool after a host
    Conv's chain joins its step, the direct kernel pooling each plane; the fused model's output
    matches the float64 reference (verify) and the step's numpy path (a non-contiguous input)."""
    from panamera.subgraph.conv_fuse import fuse_epilogues
    from panamera.subgraph.model import load_model

    model = load_model(_pool_model(attrs, **extra))
    (f,) = fuse_epilogues(model, tuple(n for n in model.nodes if n.op_type == "Conv"))
    assert f.pool == (pool or ()) and [n.op_type for n in f.nodes] == ["Relu"] + (["MaxPool"] if pool else [])
    if pool is None:
        return
    from panamera.subgraph.optimizer import optimize

    opt = optimize(_pool_model(attrs), target="cpu")
    assert [[n.op_type for n in u.nodes] for u in opt.units] == [["Conv", "Relu", "MaxPool"]]
    assert all(c.ok for c in opt.verify())
    (unit,) = opt.units
    step = HostConvStep.plan((2, 8, 8, 8), (8, 8, 3, 3), {"pads": [1, 1, 1, 1]}, True, f.epilogue, pool)
    x = np.random.default_rng(4).standard_normal((2, 8, 8, 16)).astype(np.float32)[..., ::2]  # a view
    w, b = (opt.model.constants[k] for k in ("w", "b"))
    fast = step(np.ascontiguousarray(x), w, b)
    # numpy's pool over host_conv (the columns and the BLAS): the same sums to rounding, not bit for bit (the
    # BLAS's own order: an AVX2 OpenBLAS differs from the direct kernel where an AVX-512 one happened not to)
    scale = float(np.abs(x).max() * np.abs(w).reshape(8, -1).sum(1).max() + np.abs(b).max())
    close(step(x, w, b), fast.astype(np.float64), "float32", 2 * 8 * 9, scale)


def test_fused_pool_propagates_nan():
    """A NaN in a pooled window gives NaN (numpy's max, the step's fallback), wherever it lies."""
    x = np.ones((1, 2, 6, 6), np.float32)
    w, b = np.ones((3, 2, 3, 3), np.float32), np.zeros(3, np.float32)
    x[0, 1, 2, 3] = np.nan  # reaches the outputs around (2, 3)
    step = HostConvStep.plan(x.shape, w.shape, {"pads": [1, 1, 1, 1]}, True, NO_EPILOGUE, (2, 2, 2, 2))
    y = step(x, w, b)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(step(x[..., ::-1].copy()[..., ::-1], w, b)))
    assert np.isnan(y).sum() == 3 * 4 and not np.isnan(y[:, :, 2, 0]).any()
