"""ONNX Resize in every mode on the device (frontend/interpolate.py, subgraph/resize.py): each
mode, coordinate transformation, nearest rounding, cubic option, antialias, axes and aspect
policy against onnx's reference run in float64; rounding of integer results; fusion with the
producer and the consumer shown by kernel counts; bad attributes named."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import panamera as pn
from panamera.frontend.interpolate import Taps, interpolate
from panamera.subgraph import optimize
from panamera.subgraph.resize import Mode, ResizeSpec, axis_table

ELEM = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16}
ELEM["int32"] = TensorProto.INT32
EPS = {"float32": 2**-24, "float16": 2**-11, "float64": 2**-53}


def model(shape, dtype, scales=None, sizes=None, roi=None, pre=None, post=None, **attrs):
    """Resize of input x (optionally after `pre` and before `post`, element-wise ops)."""
    inits = [
        helper.make_tensor("roi", TensorProto.FLOAT, [len(roi)], roi) if roi is not None else None,
        helper.make_tensor("scales", TensorProto.FLOAT, [len(scales)], scales) if scales is not None else None,
        helper.make_tensor("sizes", TensorProto.INT64, [len(sizes)], sizes) if sizes is not None else None,
    ]
    names = ["roi" if roi is not None else "", "scales" if scales is not None else "", "sizes" if sizes else ""]
    src = "x"
    nodes = []
    if pre:
        nodes.append(helper.make_node(pre, ["x"], ["p"]))
        src = "p"
    nodes.append(helper.make_node("Resize", [src, *names], ["r" if post else "y"], **attrs))
    if post:
        nodes.append(helper.make_node(post, ["r", "r"], ["y"]))
    g = helper.make_graph(
        nodes,
        "resize",
        [helper.make_tensor_value_info("x", ELEM[dtype], shape)],
        [helper.make_tensor_value_info("y", ELEM[dtype], [f"o{k}" for k in range(len(shape))])],
        [i for i in inits if i is not None],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def reference64(m: onnx.ModelProto, a: np.ndarray) -> np.ndarray:
    """onnx's reference on the input in float64 (it interpolates in float64 and casts back)."""
    m64 = onnx.ModelProto()
    m64.CopyFrom(m)
    for v in (*m64.graph.input, *m64.graph.output):
        v.type.tensor_type.elem_type = TensorProto.DOUBLE
    return ReferenceEvaluator(m64).run(None, {"x": a.astype(np.float64)})[0]


def check(m, a, dtype, taps: int):
    """Panamera against the float64 reference: the weighted sum of `taps` reads (weights of
    magnitude summing to at most 1.5 per axis, cubic's overshoot) in the compute dtype, then the
    result rounded to `dtype`."""
    opt = optimize(m, target="emulator")
    assert not opt.library, [u.reason for u in opt.library]
    got = opt.run({"x": a})["y"]
    want = reference64(m, a)
    assert got.shape == want.shape
    scale = np.abs(a.astype(np.float64)).max() * 1.5**2
    tol = (taps + 2) * 2**-24 * scale + EPS[dtype] * np.abs(want)
    np.testing.assert_array_less(np.abs(got.astype(np.float64) - want), tol + 1e-300)
    return opt


COORDS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("mode", ["linear", "cubic", "nearest"])
def test_every_mode_and_coordinate_transformation(rng, mode, coord):
    a = rng.standard_normal((1, 2, 5, 7)).astype(np.float32)
    for scales in ([1, 1, 2.0, 0.6], [1, 1, 0.5, 1.75]):
        check(
            model(a.shape, "float32", scales=scales, mode=mode, coordinate_transformation_mode=coord), a, "float32", 16
        )


@pytest.mark.parametrize("nearest", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_nearest_modes_with_symmetric_coordinates(rng, nearest):
    a = rng.standard_normal((1, 1, 6, 5)).astype(np.float32)
    m = model(a.shape, "float32", sizes=[1, 1, 9, 3], mode="nearest", nearest_mode=nearest,
              coordinate_transformation_mode="half_pixel_symmetric")  # fmt: skip
    check(m, a, "float32", 1)


@pytest.mark.parametrize("exclude", [0, 1])
def test_cubic_coefficient_and_exclude_outside(rng, exclude):
    a = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    m = model(a.shape, "float32", scales=[1, 1, 1.5, 0.75], mode="cubic", cubic_coeff_a=-0.5, exclude_outside=exclude)
    check(m, a, "float32", 16)


def test_tf_crop_and_resize_extrapolates(rng):
    a = rng.standard_normal((1, 1, 5, 6)).astype(np.float32)
    m = model(a.shape, "float32", sizes=[1, 1, 4, 7], roi=[0, 0, -0.3, 0.2, 1, 1, 0.8, 1.4], mode="linear",
              coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=7.5)  # fmt: skip
    got = optimize(m, target="emulator").run({"x": a})["y"]
    assert (got == 7.5).any() and (got != 7.5).any()
    check(m, a, "float32", 4)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias_downscale_reduces_over_its_taps(rng, mode):
    """A 4x antialiased downscale has 8 (linear) or 16 (cubic) taps per axis: past UNROLL
    combinations the taps are reduction axes of one sum."""
    a = rng.standard_normal((1, 2, 16, 12)).astype(np.float32)
    m = model(a.shape, "float32", scales=[1, 1, 0.25, 0.3], mode=mode, antialias=1)
    opt = check(m, a, "float32", 256)
    (sg,) = opt.subgraphs
    assert any(st.kind == "reduce" for st in sg.compiled.program.statements)


def test_axes_and_keep_aspect_ratio(rng):
    a = rng.standard_normal((2, 5, 7)).astype(np.float32)
    for policy in ("not_larger", "not_smaller"):
        m = model(a.shape, "float32", sizes=[8, 9], axes=[2, 1], mode="linear", keep_aspect_ratio_policy=policy)
        check(m, a, "float32", 4)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_float16_computes_in_float32_and_float64_in_float64(rng, dtype):
    a = rng.standard_normal((1, 1, 4, 5)).astype(dtype)
    check(model(a.shape, dtype, scales=[1, 1, 1.5, 2.5], mode="cubic"), a, dtype, 16)


def test_integers_round_half_to_even_as_onnx():
    a = np.array([[[[0, 1, 2, 5], [3, 4, -5, 8]]]], np.int32)  # 2x linear: weights 1/4, 3/4: halves
    m = model(a.shape, "int32", scales=[1, 1, 2, 2], mode="linear")
    got = optimize(m, target="emulator").run({"x": a})["y"]
    np.testing.assert_array_equal(got, ReferenceEvaluator(m).run(None, {"x": a})[0])


def test_linear_resize_fuses_with_producer_and_consumer(rng):
    """Resize(linear) -> Add is one kernel (the weighted sum is element-wise). A computed input
    (Relu -> Resize) is materialized first, as for any gather (poly/movement.py, precondition 2):
    two kernels."""
    a = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    (sg,) = check(model(a.shape, "float32", scales=[1, 1, 2, 2], mode="linear", post="Add"), a, "float32", 4).subgraphs
    assert len(sg.compiled.plan.kernels) == 1
    (sg,) = optimize(
        model(a.shape, "float32", scales=[1, 1, 2, 2], mode="linear", pre="Relu"), target="emulator"
    ).subgraphs
    assert len(sg.compiled.plan.kernels) == 2


def test_tables_keep_one_tap_per_point_for_nearest():
    t = axis_table(0, 4, 8, 2.0, ResizeSpec(mode=Mode.NEAREST), None)
    assert t.weight is None and t.index.shape == (8, 1)
    assert axis_table(0, 4, 4, 1.0, ResizeSpec(mode=Mode.CUBIC), None) is None  # identity axis


def test_bad_attributes_are_named():
    m = model((1, 1, 2, 2), "float32", scales=[1, 1, 2, 2], mode="bicubic")
    with pytest.raises(pn.OptionError, match="Resize .*bicubic"):
        _convert(m)
    m = model((1, 1, 2, 2), "float32", sizes=[1, 1, 3, 3], mode="linear", keep_aspect_ratio_policy="fit")
    with pytest.raises(pn.OptionError, match="keep_aspect_ratio_policy 'fit'"):
        _convert(m)
    x = pn.placeholder((4, 4), name="x")
    i = pn.placeholder((8, 2), "int64", name="i")
    with pytest.raises(pn.ShapeError, match="interpolate of 'x': axis 1 changes extent"):
        interpolate(x, (8, 8), [Taps(0, i)])
    with pytest.raises(pn.ShapeError, match="axis 0 weights"):
        interpolate(x, (8, 4), [Taps(0, i, pn.placeholder((8, 3), name="w"))])
    with pytest.raises(pn.AxisError, match="tap axis 2"):
        interpolate(x, (8, 4), [Taps(2, i)])


def _convert(m):
    from panamera.subgraph.model import load_model
    from panamera.subgraph.optimizer import build_subgraph_tensors

    om = load_model(m)
    return build_subgraph_tensors(om, [n for n in om.nodes if n.op_type == "Resize"])
