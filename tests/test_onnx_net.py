"""Whole-network ops through the ONNX optimizer: Conv on the device (im2col Panamera kernel +
the library's matmul, against numpy), epilogues fused after it, layout changes and pooling inside
Panamera's subgraphs (kernel counts), and the nodes a supported op still leaves to the library."""

import math

import numpy as np
import pytest
from conftest import tolerance
from onnx import TensorProto, helper, numpy_helper

import panamera as pn
from panamera.subgraph import optimize
from panamera.subgraph.conv import conv, geometry, im2col


def _model(nodes, inputs, outputs, inits=(), opset=18):
    v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    g = helper.make_graph(nodes, "g", [v(n, s) for n, s in inputs], [v(n, s) for n, s in outputs],
                          [numpy_helper.from_array(a, n) for n, a in inits])  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def ref_conv(x, w, b, strides, pads, dilations, group):
    """The definition in float64: loops over the output and the window."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    oh = (h + pads[0] + pads[2] - (kh - 1) * dilations[0] - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - (kw - 1) * dilations[1] - 1) // strides[1] + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    y = np.zeros((n, m, oh, ow))
    for o in range(m):
        g = o // (m // group)
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg : (g + 1) * cg, i * dilations[0] :, j * dilations[1] :]
                patch = patch[:, :, : (oh - 1) * strides[0] + 1 : strides[0], : (ow - 1) * strides[1] + 1 : strides[1]]
                y[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j])
    return y + b.reshape(1, m, 1, 1)


@pytest.mark.parametrize(
    "xs,ws,strides,pads,dil,group",
    [
        ((2, 4, 7, 6), (6, 2, 3, 3), (2, 1), (1, 0, 2, 1), (1, 1), 2),
        ((1, 3, 8, 8), (4, 3, 3, 2), (1, 2), (0, 0, 0, 0), (2, 1), 1),
    ],
)
def test_conv_via_im2col_against_numpy(xs, ws, strides, pads, dil, group):
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    attrs = {"strides": strides, "pads": pads, "dilations": dil, "group": group}
    got = conv(np, attrs, x, w, b)
    k = math.prod(ws[1:])
    tol = tolerance("float32", k) * 4
    np.testing.assert_allclose(got, ref_conv(x, w, b, strides, pads, dil, group), rtol=tol, atol=tol)
    win, g = geometry(xs, ws, attrs)
    cols = pn.compile(im2col(pn.placeholder(xs, name="x"), win, g), target="emulator")
    assert len(cols.plan.kernels) == 1  # im2col: one data-movement statement
    assert cols(x).shape == (xs[0], group, k, math.prod(win.out))


def _one_kernel(m, library=(), routing="model"):
    """The optimized model, checked to be one Panamera subgraph of one kernel beside the library
    nodes `library` (op types), verified against the reference."""
    opt = optimize(m, target="emulator", routing=routing)
    assert [u.node.op_type for u in opt.library] == list(library)
    (sg,) = opt.subgraphs
    assert len(sg.compiled.plan.kernels) == 1
    assert all(c.ok for c in opt.verify())
    return opt


def test_conv_bias_relu_residual_epilogue_is_one_kernel():
    rng = np.random.default_rng(4)
    w, b = rng.standard_normal((4, 4, 3, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])]  # fmt: skip
    m = _model(nodes, [("x", [1, 4, 6, 6])], [("y", [1, 4, 6, 6])], [("w", w), ("b", b)])
    opt = _one_kernel(m, ["Conv"], routing="library")  # the epilogue after the library's Conv
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    want = np.maximum(ref_conv(x, w, b, (1, 1), (1, 1, 1, 1), (1, 1), 1), 0) + x
    tol = tolerance("float32", 36) * 4
    np.testing.assert_allclose(opt.run({"x": x})["y"], want, rtol=tol, atol=tol)


def test_transpose_reshape_softmax_is_one_subgraph_and_kernel():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "shape"], ["r"]), helper.make_node("Softmax", ["r"], ["y"])]  # fmt: skip
    m = _model(nodes, [("x", [2, 8, 4, 16])], [("y", [2, 4, 128])], [("shape", np.array([2, 4, 128], np.int64))])
    _one_kernel(m)


def test_batchnorm_relu_global_average_pool_is_one_kernel():
    rng = np.random.default_rng(6)
    c = 8
    p = [(n, (rng.random(c) + 0.5).astype(np.float32)) for n in ("scale", "bias", "mean", "var")]
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["y"])]  # fmt: skip
    m = _model(nodes, [("x", [2, c, 7, 7])], [("y", [2, c, 1, 1])], p)
    _one_kernel(m)


def test_resnet_stem_pooling_stays_in_panamera():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]  # fmt: skip
    m = _model(nodes, [("x", [1, 4, 9, 9])], [("y", [1, 4, 5, 5])])
    opt = optimize(m, target="emulator")
    assert not opt.library and len(opt.subgraphs[0].compiled.plan.kernels) == 1
    assert all(c.ok for c in opt.verify())


def test_interpolating_resize_runs_in_panamera():
    """Linear Resize is a weighted sum of gathers through host-computed tap tables (issue 11;
    every mode is tested in tests/test_resize.py): no library node."""
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")]
    m = _model(nodes, [("x", [1, 1, 2, 2])], [("y", [1, 1, 4, 4])], [("scales", np.array([1, 1, 2, 2], np.float32))])
    opt = optimize(m, target="emulator")
    assert not opt.library and len(opt.subgraphs[0].compiled.plan.kernels) == 1
    assert all(c.ok for c in opt.verify())


def test_bad_conv_weights_name_the_attribute():
    with pytest.raises(pn.ShapeError, match="Conv: group 3"):
        geometry((1, 4, 5, 5), (6, 2, 3, 3), {"group": 3})
    with pytest.raises(pn.ShapeError, match="kernel_shape"):
        geometry((1, 4, 5, 5), (6, 4, 3, 3), {"kernel_shape": [2, 2]})
