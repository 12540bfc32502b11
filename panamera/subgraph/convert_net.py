"""ONNX converters of whole networks' memory-bound ops: data movement, pooling and activations.

They join convert.py's one table CONVERTERS (convert.py imports `NET_CONVERTERS`). Each maps its
node onto the frontend's access-relation ops (frontend/movement.py), windowed reductions
(frontend/pool.py) or element-wise activations (frontend/activations.py); no node of these
ops is refused (`refuse` is None for each): Resize in every mode has its per-axis tap tables
computed here on the host (subgraph/resize.py), MaxPool's Indices output is an argmax over the
window (frontend/pool.max_pool_indices).

>>> sorted(op for op in NET_CONVERTERS if "Pool" in op)
['AveragePool', 'GlobalAveragePool', 'GlobalMaxPool', 'MaxPool']
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..errors import OptionError, ShapeError
from ..frontend import activations as act
from ..frontend import gather as gt
from ..frontend import movement as mv
from ..frontend import ops, pool
from ..frontend.interpolate import Taps, compute_dtype, interpolate
from ..frontend.tensor import constant, iota, reshape, transpose, where
from . import resize as rs
from .constants import const_input, int_tuple
from .model import Node


def _s(v, default: str) -> str:
    if v is None:
        return default
    return v.decode() if isinstance(v, bytes) else str(v)


def _arg(args, k):
    return args[k] if len(args) > k else None


# -- data movement ----------------------------------------------------------------------------
def _transpose(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    perm = node.attrs.get("perm")
    return [transpose(x, tuple(perm) if perm is not None else None)]


def _slice(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    if node.opset < 10:
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes"), None
    else:
        starts, ends = int_tuple(node, args[1], "starts"), int_tuple(node, args[2], "ends")
        axes, steps = int_tuple(node, _arg(args, 3), "axes"), int_tuple(node, _arg(args, 4), "steps")
    return [mv.slice(x, starts, ends, axes, steps)]


def _concat(node: Node, args, ctx):
    return [mv.concatenate([ctx.tensor(a) for a in args if a is not None], axis=node.attrs["axis"])]


def _split(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    axis = node.attrs.get("axis", 0)
    sizes = int_tuple(node, _arg(args, 1), "split") if node.opset >= 13 else node.attrs.get("split")
    if sizes is None:
        sizes = node.attrs.get("num_outputs", len(node.outputs))
    return list(mv.split(x, sizes, axis))


def _pad(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    mode = _s(node.attrs.get("mode"), "constant")
    if node.opset < 11:
        pads, value, axes = node.attrs["pads"], node.attrs.get("value", 0.0), None
    else:
        pads = int_tuple(node, args[1], "pads")
        v = const_input(node, _arg(args, 2), "constant_value")
        value = 0 if v is None or v.size == 0 else v.reshape(-1)[0].item()
        axes = int_tuple(node, _arg(args, 3), "axes")
    axes = tuple(range(x.ndim)) if axes is None else tuple(a % x.ndim for a in axes)
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"Pad {node.label!r}: {len(pads)} pads for {len(axes)} axes (need begins then ends)")
    pairs = [(0, 0)] * x.ndim
    for k, a in enumerate(axes):
        pairs[a] = (pads[k], pads[k + len(axes)])
    return [mv.pad(x, pairs, mode, value)]


def _tile(node: Node, args, ctx):
    return [mv.tile(ctx.tensor(args[0]), int_tuple(node, args[1], "repeats"))]


def _trilu(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    k = int_tuple(node, _arg(args, 1), "k")
    k = k[0] if k else 0
    return [mv.triu(x, k) if node.attrs.get("upper", 1) else mv.tril(x, k)]


def _depth_to_space(node: Node, args, ctx):
    return [mv.depth_to_space(ctx.tensor(args[0]), node.attrs["blocksize"], _s(node.attrs.get("mode"), "DCR"))]


def _space_to_depth(node: Node, args, ctx):
    return [mv.space_to_depth(ctx.tensor(args[0]), node.attrs["blocksize"], _s(node.attrs.get("mode"), "DCR"))]


_AFFINE_NEAREST = {m.value for m in mv.CoordMode}


def _resize(node: Node, args, ctx):
    """Nearest with an affine coordinate map: a quasi-affine access; everything else: per-axis
    tap tables computed here (subgraph/resize.py) and a weighted sum of gathers on the device."""
    x = ctx.tensor(args[0])
    a = node.attrs
    old = node.opset < 11
    try:
        spec = rs.ResizeSpec(
            mode=rs.Mode(_s(a.get("mode"), "nearest")),
            coord=rs.Coord("asymmetric" if old else _s(a.get("coordinate_transformation_mode"), "half_pixel")),
            nearest=rs.Nearest("floor" if old else _s(a.get("nearest_mode"), "round_prefer_floor")),
            cubic_a=float(a.get("cubic_coeff_a", -0.75)),
            exclude_outside=bool(a.get("exclude_outside", 0)),
            antialias=bool(a.get("antialias", 0)),
            extrapolation=float(a.get("extrapolation_value", 0.0)),
        )
    except ValueError as e:
        raise OptionError(f"Resize {node.label!r}: {e}") from None
    if old:
        scales, sizes, roi = const_input(node, args[1], "scales"), None, None
    else:
        scales, sizes = const_input(node, _arg(args, 2), "scales"), int_tuple(node, _arg(args, 3), "sizes")
        roi = const_input(node, _arg(args, 1), "roi") if spec.coord == rs.Coord.TF_CROP_AND_RESIZE else None
    axes = a.get("axes")
    axes = tuple(range(x.ndim)) if axes is None else tuple(k % x.ndim for k in axes)
    try:
        shape, scale = rs.output_shape(x.shape, scales, sizes, axes, _s(a.get("keep_aspect_ratio_policy"), "stretch"))
    except ShapeError as e:
        raise ShapeError(f"Resize {node.label!r}: {e}") from None
    if spec.mode == rs.Mode.NEAREST and spec.coord.value in _AFFINE_NEAREST:
        return [mv.resize_nearest(x, shape, [Fraction(s) for s in scale], spec.coord.value, spec.nearest.value)]
    if roi is not None:
        roi = roi.reshape(-1).astype(np.float64)
        if roi.size != 2 * len(axes):
            raise ShapeError(f"Resize {node.label!r}: roi has {roi.size} values for {len(axes)} axes")
        full = [0.0] * x.ndim + [1.0] * x.ndim
        for k, ax in enumerate(axes):
            full[ax], full[ax + x.ndim] = roi[k], roi[k + len(axes)]
        roi = full
    cd = compute_dtype(x.dtype).np
    taps = [
        Taps(
            t.axis,
            ctx.tensor(t.index.astype(np.int32 if x.shape[t.axis] < 2**31 else np.int64)),
            None if t.weight is None else ctx.tensor(t.weight.astype(cd)),
            None if t.outside is None else ctx.tensor(t.outside),
        )
        for t in rs.tables(x.shape, shape, scale, spec, roi)
    ]
    return [interpolate(x, shape, taps, spec.extrapolation)]


def _gather(node: Node, args, ctx):
    x, ind = ctx.tensor(args[0]), ctx.tensor(args[1])
    axis = node.attrs.get("axis", 0)
    if node.op_type == "GatherElements":
        return [gt.take_along_axis(x, ind, axis)]
    if node.op_type == "GatherND":
        return [gt.gather_nd(x, ind, node.attrs.get("batch_dims", 0))]
    return [gt.take(x, ind, axis)]


# -- pooling ----------------------------------------------------------------------------------
def _pool(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    if node.op_type == "GlobalAveragePool":
        return [pool.global_avg_pool(x)]
    if node.op_type == "GlobalMaxPool":
        return [pool.global_max_pool(x)]
    kernel = tuple(node.attrs["kernel_shape"])
    strides = tuple(node.attrs.get("strides") or (1,) * len(kernel))
    dil = tuple(node.attrs.get("dilations") or (1,) * len(kernel))
    auto = _s(node.attrs.get("auto_pad"), "NOTSET")
    pads = pool.auto_pads(x, kernel, strides, dil, auto, node.op_type) or node.attrs.get("pads")
    ceil = bool(node.attrs.get("ceil_mode", 0))
    if node.op_type == "MaxPool":
        out = [pool.max_pool(x, kernel, strides, pads, dil, ceil)]
        if len(node.outputs) > 1 and node.outputs[1]:  # the argmax positions, on the device too
            order = int(node.attrs.get("storage_order", 0))
            out.append(pool.max_pool_indices(x, kernel, strides, pads, dil, ceil, order))
        return out
    include = bool(node.attrs.get("count_include_pad", 0))
    return [pool.avg_pool(x, kernel, strides, pads, dil, ceil, include)]


# -- activations and math ---------------------------------------------------------------------
def _act(fn, **defaults):
    def conv(node: Node, args, ctx):
        kw = {
            k: (_s(node.attrs.get(k), v) if isinstance(v, str) else node.attrs.get(k, v)) for k, v in defaults.items()
        }
        return [fn(ctx.tensor(args[0]), **kw)]

    conv.__name__ = f"_{fn.__name__}"
    return conv


def _mod(node: Node, args, ctx):
    a, b = ctx.tensor(args[0]), ctx.tensor(args[1])
    return [act.fmod(a, b) if node.attrs.get("fmod", 0) else act.mod(a, b)]


def _isinf(node: Node, args, ctx):
    x = ctx.tensor(args[0])
    return [act.isinf(x, bool(node.attrs.get("detect_positive", 1)), bool(node.attrs.get("detect_negative", 1)))]


def _cumsum(node: Node, args, ctx):
    """CumSum as a reduction over a triangle of the (i, k) square of its axis:
    y[..., i] = sum over k of x[..., k] where k <= i (k < i exclusive; k >= i, k > i reversed).
    A rectangular domain with a select, so quadratic in the axis' length: meant for the
    sequence axes of masks and position ids (BLOOM's ALiBi positions), not long scans.

    >>> import panamera as pn
    >>> from panamera.subgraph.model import Node
    >>> n = Node(0, "c", "CumSum", "", ("x", "a"), ("y",), {}, 18)
    >>> y = _cumsum(n, [pn.placeholder((2, 5), "int64", name="x"), np.array(1)], None)[0]
    >>> pn.compile(y, target="emulator")(np.ones((2, 5), np.int64)).tolist()
    [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]]
    """
    x = args[0] if ctx is None else ctx.tensor(args[0])
    (axis,) = int_tuple(node, args[1], "axis") or (0,)
    if not -max(x.ndim, 1) <= axis < max(x.ndim, 1):
        raise ShapeError(f"CumSum {node.label!r}: axis {axis} is out of range for rank {x.ndim}")
    if x.ndim == 0:
        return [x]
    axis %= x.ndim
    perm = [a for a in range(x.ndim) if a != axis] + [axis]
    xt = transpose(x, tuple(perm))
    n = x.shape[axis]
    square = xt.shape[:-1] + (n, n)  # (..., i, k)
    i, k = iota(square, x.ndim - 1), iota(square, x.ndim)
    lo, hi = (i, k) if node.attrs.get("reverse", 0) else (k, i)
    inside = lo < hi if node.attrs.get("exclusive", 0) else lo <= hi
    y = ops.sum(where(inside, reshape(xt, xt.shape[:-1] + (1, n)), constant(0, x.dtype)), axis=-1)
    return [transpose(y, tuple(int(p) for p in np.argsort(perm)))]


def _conv(node: Node, args, ctx):
    """Conv as a windowed reduction (frontend/pool.conv); the router (route.py) decides by the
    model whether Panamera or the library's convolution runs it."""
    from .conv import geometry  # the library's geometry check, shared

    x, w = ctx.tensor(args[0]), ctx.tensor(args[1])
    win, group = geometry(x.shape, w.shape, node.attrs)
    y = pool.conv(x, w, win, group)
    b = _arg(args, 2)
    if b is not None:
        y = y + ctx.tensor(b).reshape((1, w.shape[0]) + (1,) * len(win.kernel))
    return [y]


# op -> (convert, constant inputs, refuse)
NET_CONVERTERS: dict = {
    "Transpose": (_transpose, (), None),
    "Slice": (_slice, (1, 2, 3, 4), None),
    "Concat": (_concat, (), None),
    "Split": (_split, (1,), None),
    "Pad": (_pad, (1, 2, 3), None),
    "Tile": (_tile, (1,), None),
    "Trilu": (_trilu, (1,), None),
    "Conv": (_conv, (), None),
    "CumSum": (_cumsum, (1,), None),
    "DepthToSpace": (_depth_to_space, (), None),
    "SpaceToDepth": (_space_to_depth, (), None),
    "Resize": (_resize, (1, 2, 3), None),
    "Gather": (_gather, (), None),
    "GatherElements": (_gather, (), None),
    "GatherND": (_gather, (), None),
    "GlobalAveragePool": (_pool, (), None),
    "GlobalMaxPool": (_pool, (), None),
    "AveragePool": (_pool, (), None),
    "MaxPool": (_pool, (), None),
    "Gelu": (_act(act.gelu, approximate="none"), (), None),
    "Softplus": (_act(act.softplus), (), None),
    "HardSigmoid": (_act(act.hard_sigmoid, alpha=0.2, beta=0.5), (), None),
    "HardSwish": (_act(act.hard_swish), (), None),
    "LeakyRelu": (_act(act.leaky_relu, alpha=0.01), (), None),
    "Elu": (_act(act.elu, alpha=1.0), (), None),
    "Selu": (_act(act.selu, alpha=act.SELU_ALPHA, gamma=act.SELU_GAMMA), (), None),
    "Sign": (_act(act.sign), (), None),
    "IsNaN": (_act(act.isnan), (), None),
    "IsInf": (_isinf, (), None),
    "Mod": (_mod, (), None),
    "Sin": (_act(act.sin), (), None),
    "Cos": (_act(act.cos), (), None),
}
