"""What a loaded ONNX model must satisfy before anything converts or runs it, checked in one
place (`validate`, the last step of model.load_model), each refusal naming the node, tensor or
attribute at fault:

  1. no graph input or output is complex (the kernels compute real numbers, and the array library
     beside them would drop the imaginary part silently): `DTypeError`;
  2. every node input's element type is one its ONNX schema allows at the model's opset (onnx's
     own type constraints: Gather's indices are int32 or int64): `DTypeError`;
  3. every `axis` / `axes` attribute lies in the range its op allows for the rank of the tensor
     it indexes ([-r, r-1]; Flatten [-r, r]; Unsqueeze and OneHot count the output's rank), and a
     Transpose's `perm` is a permutation of its input's axes: `AxisError`;
  4. a window's `kernel_shape`, `strides` and `dilations` (pools, Conv) are positive and its `pads`
     non-negative (onnx's reference would divide by a zero stride): `ShapeError`.

The converters and the array library may then take types and axes as given.

>>> from onnx import helper, TensorProto
>>> from panamera.subgraph.model import load_model
>>> g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=5, name="sm")], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
>>> load_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
Traceback (most recent call last):
panamera.errors.AxisError: <model>: Softmax 'sm': attribute axis 5 is out of range for input 'x' of rank 2 (allowed -2 to 1)
"""

from __future__ import annotations

import onnx

from ..errors import AxisError, DTypeError, ShapeError
from .model import DEFAULT_DOMAINS, Node, OnnxModel

# Element types no part of Panamera computes correctly (strings are left to the array library whole).
REFUSED_ELEM = frozenset({onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128})

WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "MaxUnpool"})

# Ops whose axis ranges are not [-r, r-1] of their first input's rank r: (extra output rank, end inclusive).
_AXIS_RANGE = {"Flatten": (0, True), "OneHot": (1, False)}


def _type_name(elem: int) -> str:
    return onnx.TensorProto.DataType.Name(elem).lower()


def validate(model: OnnxModel) -> None:
    """Preconditions 1 to 4 of the module docstring; the first failure is raised."""
    for name in (*model.inputs, *model.outputs):
        v = model.values.get(name)
        if v is not None and v.elem in REFUSED_ELEM:
            role = "input" if name in model.inputs else "output"
            raise DTypeError(
                f"{model.path}: graph {role} {name!r} has element type {v.elem_name}; Panamera computes real "
                "numbers only"
            )
    for n in model.nodes:
        if n.domain in DEFAULT_DOMAINS:
            _check_types(model, n)
            _check_axes(model, n)
            if n.op_type in WINDOW_OPS:
                _check_window(model, n)


def _schema(n: Node) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(n.op_type, n.opset, "")
    except onnx.defs.SchemaError:  # an op onnx does not know: the converters refuse it by name
        return None


def _check_types(model: OnnxModel, n: Node) -> None:
    schema = _schema(n)
    if schema is None or not schema.inputs:
        return
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    for k, name in enumerate(n.inputs):
        v = model.values.get(name) if name else None
        if v is None or not v.elem:
            continue
        formal = schema.inputs[min(k, len(schema.inputs) - 1)]
        if k >= len(schema.inputs) and formal.option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
            continue
        types = allowed.get(formal.type_str, {formal.type_str})
        if f"tensor({_type_name(v.elem)})" not in types and not any(t.startswith(("seq(", "optional(")) for t in types):
            names = ", ".join(sorted(t.removeprefix("tensor(").removesuffix(")") for t in types))
            raise DTypeError(
                f"{model.path}: {n.op_type} {n.label!r}: input {k} ({formal.name}, {name!r}) has element type "
                f"{v.elem_name}; ONNX opset {n.opset} allows {names}"
            )


def _check_axes(model: OnnxModel, n: Node) -> None:
    first = model.values.get(n.inputs[0]) if n.inputs and n.inputs[0] else None
    if first is None or first.shape is None:
        return
    if n.op_type == "Transpose" and "perm" in n.attrs:
        perm = list(n.attrs["perm"])
        if sorted(perm) != list(range(len(first.shape))):
            raise AxisError(
                f"{model.path}: Transpose {n.label!r}: attribute perm {perm} is not a permutation of the "
                f"{len(first.shape)} axes of input {n.inputs[0]!r}"
            )
    for attr in ("axis", "axes"):
        if attr not in n.attrs:
            continue
        value = n.attrs[attr]
        axes = [value] if isinstance(value, int) else list(value) if isinstance(value, (list, tuple)) else []
        extra, inclusive = _AXIS_RANGE.get(n.op_type, (0, False))
        if n.op_type == "Unsqueeze":
            extra = len(axes)
        r = len(first.shape) + extra
        lo, hi = -r, r if inclusive else r - 1
        for a in axes:
            if not isinstance(a, int) or not lo <= a <= hi:
                raise AxisError(
                    f"{model.path}: {n.op_type} {n.label!r}: attribute {attr} {a} is out of range for input "
                    f"{n.inputs[0]!r} of rank {len(first.shape)} (allowed {lo} to {hi})"
                )


def _check_window(model: OnnxModel, n: Node) -> None:
    for attr, least in (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("pads", 0)):
        vals = n.attrs.get(attr)
        if vals is not None and any(not isinstance(v, int) or v < least for v in vals):
            what = "positive" if least else "non-negative"
            raise ShapeError(f"{model.path}: {n.op_type} {n.label!r}: attribute {attr} {list(vals)} must be {what}")
