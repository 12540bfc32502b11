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


def _conv_model(xs, ws, group, pads, tail=()):
    rng = np.random.default_rng(3)
    w = rng.standard_normal(ws).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=group, pads=[pads] * 4, kernel_shape=list(ws[2:]))]
    last = "c"
    for k, op in enumerate(tail):
        nodes.append(helper.make_node(op, [last] if op != "Mul" else [last, "c"], [f"t{k}"]))
        last = f"t{k}"
    out = (xs[0], ws[0], xs[2] + 2 * pads - ws[2] + 1, xs[3] + 2 * pads - ws[3] + 1)
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, xs)],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, out)], [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString(), w


def test_depthwise_conv_is_a_panamera_reduction_fused_with_its_gate():
    """A depthwise 3x3 Conv (an EfficientNet's) -> SiLU as sigmoid and Mul: a windowed reduction
    the router gives Panamera (memory-bound, both figures in the reason), one subgraph with its
    gate, against the float64 definition."""
    xs, ws = (2, 8, 10, 10), (8, 1, 3, 3)
    proto, w = _conv_model(xs, ws, 8, 1, ("Sigmoid", "Mul"))
    opt = optimize(proto, target="emulator")
    assert not opt.library and len(opt.subgraphs) == 1
    route = opt.partition.route(opt.model.nodes[0])
    assert route.runner.value == "Panamera" and "memory-bound" in route.reason
    x = np.random.default_rng(4).standard_normal(xs).astype(np.float32)
    c = ref_conv(x, w, np.zeros(8), (1, 1), [1] * 4, (1, 1), 8)
    want = c / (1 + np.exp(-c)) * 1.0
    # 9 products summed (gamma_9 |x||w|), then the gate's few roundings relative to the value
    tol = tolerance("float32", 9) * ref_conv(np.abs(x), np.abs(w), np.zeros(8), (1, 1), [1] * 4, (1, 1), 8) * 2
    assert (np.abs(opt.run({"x": x})["t1"] - want) <= tol + 8 * 2.0**-24 * np.abs(want)).all()


def test_a_dense_conv_stays_with_the_library():
    """A dense 3x3 Conv with 64 -> 64 channels over 8x32x32 (an implicit GEMM of K = 576): the
    library's tensor-core convolution is modeled 6x faster, so it keeps it; the reason gives
    both figures."""
    proto, _ = _conv_model((8, 64, 32, 32), (64, 64, 3, 3), 1, 1)
    opt = optimize(proto, target="emulator")
    ((node, why),) = opt.partition.library
    assert node.op_type == "Conv" and "Panamera: " in why and "the library runs it" in why


def _blocks(n: int, width: int = 24) -> bytes:
    """n repeated blocks (Mul by the block's own gains, Softmax; a TopK the library runs between
    blocks cuts the graph into one Panamera subgraph per block), each with its own weights."""
    rng = np.random.default_rng(0)
    nodes, inits, last = [], [], "x"
    for k in range(n):
        g = numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), f"g{k}")
        inits += [g, numpy_helper.from_array(np.array([width // 2], np.int64), f"k{k}")]
        nodes += [
            helper.make_node("Mul", [last, f"g{k}"], [f"m{k}"]),
            helper.make_node("Softmax", [f"m{k}"], [f"s{k}"]),
            helper.make_node("TopK", [f"s{k}", f"k{k}"], [f"v{k}", f"i{k}"]),
            helper.make_node("Concat", [f"v{k}", f"v{k}"], [f"c{k}"], axis=-1),
        ]
        last = f"c{k}"
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, width])],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, [4, width])], inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def test_repeated_blocks_are_planned_and_compiled_once():
    """A transformer's layers: identical subgraphs with different weights are one program (the
    compile cache keys a program by its structure, weights as arguments): 6 blocks make 7
    subgraphs of 3 structures (the first, the middle ones, the last), so at most 3 compiles."""
    before = pn.cache.info()
    opt = optimize(_blocks(6), target="emulator")
    after = pn.cache.info()
    assert len(opt.subgraphs) == 7
    assert after.misses - before.misses <= 3 and after.hits - before.hits >= 4
    middle = [sg.compiled.source for sg in opt.subgraphs[1:-1]]
    assert len(set(middle)) == 1  # one kernel source, each subgraph with its own block's gains:
    assert [sorted(sg.weights) for sg in opt.subgraphs[1:-1]] == [[f"g{k}"] for k in range(1, 6)]
