"""Building a group of ONNX nodes as Panamera tensors: live inputs become placeholders, folded
constants become scalars in the code or kernel inputs (weights), each output is cast to the ONNX
type. The optimizer compiles what this builds; the partitioner's router (route.py) plans single
nodes with it.

>>> from onnx import helper, TensorProto
>>> from panamera.subgraph.model import load_model
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> g = helper.make_graph([helper.make_node("Exp", ["x"], ["y"])], "g", [v("x", [4])], [v("y", [4])])
>>> m = load_model(helper.make_model(g).SerializeToString())
>>> names, tensors, live, weights = build_subgraph_tensors(m, m.nodes)
>>> names, tensors[0].shape, live, weights
(('y',), (4,), ('x',), {})
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from ..errors import ShapeError
from ..frontend.tensor import Tensor, placeholder
from .convert import Ctx, convert_node
from .model import Node, OnnxModel

# Quantized element types: Panamera dtypes that only the ops widening them in registers may read
# (partition.py's WIDENING), so that an int8 weight is read as one byte per element.
QUANTIZED = {onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8"}


def _placeholder_for(model: OnnxModel, name: str) -> Tensor:
    v = model.values[name]
    return placeholder(v.shape, v.dtype or QUANTIZED[v.elem], name=name)


def build_subgraph_tensors(
    model: OnnxModel, nodes: Sequence[Node], outputs: tuple[str, ...] | None = None
) -> tuple[tuple[str, ...], list[Tensor], tuple[str, ...], dict[str, np.ndarray]]:
    """Convert `nodes` into Panamera tensors. Returns (output names, output tensors, live input
    names, weights)."""
    env: dict = {}
    live, weights, by_id = [], {}, {}  # by_id: id of a constant array -> its placeholder
    names_by_id: dict = {}  # id of a model constant -> its name

    def weight(a: np.ndarray) -> Tensor:
        """A non-scalar constant becomes a kernel input, named after the model's constant (or
        numbered, for an array a converter made)."""
        if id(a) not in by_id:
            name = names_by_id.get(id(a), f"const{len(weights)}")
            by_id[id(a)] = placeholder(a.shape, str(a.dtype), name=name)
            weights[name] = a
        return by_id[id(a)]

    ctx = Ctx(weight)
    for n in nodes:
        args = []
        for i in n.inputs:
            if not i:
                args.append(None)
            elif i in env:
                args.append(env[i])
            elif i in model.constants:
                a = model.constants[i]
                names_by_id[id(a)] = i
                args.append(a)
            else:
                env[i] = _placeholder_for(model, i)
                live.append(i)
                args.append(env[i])
        outs = convert_node(n, args, ctx)
        for name, t in zip(n.outputs, outs):
            if not name:
                continue
            v = model.values.get(name)
            if v is not None and v.dtype is not None and t.dtype.name != v.dtype:
                t = t.astype(v.dtype)
            if v is not None and v.shape is not None and t.shape != v.shape:
                raise ShapeError(f"{n.op_type} {n.label!r}: output {name!r} has shape {t.shape}, onnx infers {v.shape}")
            env[name] = t
    if outputs is None:
        inside = {m.index for m in nodes}  # by index: a list's `in` compares nodes field by field, quadratic
        users = {i for m in model.nodes if m.index not in inside for i in m.inputs}
        outputs = tuple(
            o for o in dict.fromkeys(o for n in nodes for o in n.outputs) if o and (o in users or o in model.outputs)
        )
    return tuple(outputs), [env[o] for o in outputs], tuple(live), weights
