"""Loading an ONNX model: decode, check, fix symbolic input shapes, fold constants, infer shapes.

The result is an `OnnxModel`: the live nodes (those that depend on a graph input), the folded
constants (initializers, Constant nodes and every node computable from them, evaluated with
numpy where numpy_ops.py has the op, by onnx's reference evaluator otherwise; an If with a constant
condition inlined, a Loop with a constant trip count unrolled: unroll.py) and the static shape and dtype of every value.
A dequantization of an 8-bit weight (DequantizeLinear, or a Cast of an int8 / uint8 constant) is
not folded: it stays a live node, so that the kernel that reads the weight reads its bytes and
widens them in registers (folding it would make every reader stream 2 to 4 times the bytes).

>>> import onnx
>>> from onnx import helper, TensorProto
>>> g = helper.make_graph([helper.make_node("ReduceMax", ["x"], ["y"], axes=[1], keepdims=0)], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])])
>>> proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
>>> m = load_model(proto.SerializeToString(), shapes={"batch": (4,)})
>>> m.values["y"].shape
(4,)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ..errors import ModelError, Unsupported
from . import weights
from .numpy_ops import NUMPY_OPS, REFERENCE_FIXES, NotHere, evaluate
from .unroll import SEQUENCE_OPS, Unrolling, inline, loop_step, sequence_step

# The names of ONNX's standard operator domain: Panamera converts (and folds) only its ops.
DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})

# ONNX element types Panamera compiles; every other one stays with the array library.
SUPPORTED_ELEM = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.BOOL: "bool",
}


@dataclass(frozen=True)
class Value:
    """A tensor of the graph: static shape (None where unknown) and ONNX element type."""

    name: str
    shape: tuple[int, ...] | None
    elem: int

    @property
    def dtype(self) -> str | None:
        """Panamera's dtype name, or None where Panamera does not support the element type."""
        return SUPPORTED_ELEM.get(self.elem)

    @property
    def elem_name(self) -> str:
        return onnx.TensorProto.DataType.Name(self.elem) if self.elem else "UNDEFINED"


@dataclass(frozen=True)
class Node:
    """A live node of the graph with its attributes decoded."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]  # "" for an omitted optional input
    outputs: tuple[str, ...]
    attrs: dict = field(hash=False, compare=False)
    opset: int = 0

    @property
    def label(self) -> str:
        return self.name or f"{self.op_type}_{self.index}"


# What a model can be loaded from: a path, the serialized bytes or a ModelProto.
ModelSource = str | os.PathLike | bytes | onnx.ModelProto


@dataclass(frozen=True, eq=False)
class OnnxModel:
    """A loaded model: its live nodes, folded constants and the static shape of every value."""

    path: str
    proto: onnx.ModelProto  # the folded model: constants as initializers, live nodes only
    nodes: tuple[Node, ...]
    constants: dict  # value name -> np.ndarray
    values: dict  # value name -> Value
    inputs: tuple[str, ...]  # graph inputs that are not initializers
    outputs: tuple[str, ...]
    opset: int
    specialized: dict = field(default_factory=dict)  # graph inputs folded as constants

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.label == name or n.name == name:
                return n
        raise ModelError(f"{self.path}: no live node named {name!r}; nodes are {[n.label for n in self.nodes][:20]}")


def decode(source: ModelSource) -> tuple[str, onnx.ModelProto]:
    """(a name for messages, the ModelProto) of a path, bytes or ModelProto, unchecked."""
    if isinstance(source, onnx.ModelProto):
        return "<model>", source
    if isinstance(source, bytes):
        path, data = "<bytes>", source
    else:
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise ModelError(f"{path}: no such file")
        with open(path, "rb") as f:
            data = f.read()
    try:
        proto = onnx.load_model_from_string(data)
    except Exception as e:  # protobuf raises DecodeError (and others) for non-ONNX bytes
        raise ModelError(
            f"{path}: not an ONNX model ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'decode failed'})"
        ) from None
    if not proto.ir_version or not proto.HasField("graph"):
        raise ModelError(f"{path}: not an ONNX model (no IR version or graph; truncated or another format?)")
    return path, proto


def _set_input_shapes(proto: onnx.ModelProto, shapes: dict, path: str) -> None:
    """Give every symbolic input dimension a value. `shapes` maps an input name to its whole
    shape, or a symbolic dimension's name (dim_param, like "batch") to its one value."""
    inits = {i.name for i in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in inits]
    params = {d.dim_param for i in inputs for d in i.type.tensor_type.shape.dim if d.dim_param}
    unknown = set(shapes) - {i.name for i in inputs} - params
    if unknown:
        raise ModelError(
            f"{path}: --shape names {sorted(unknown)} are neither inputs {[i.name for i in inputs]} "
            f"nor symbolic dimensions {sorted(params)}"
        )
    for p in params & set(shapes):
        if len(shapes[p]) != 1:
            raise ModelError(f"{path}: --shape {p}=... names a symbolic dimension: give one value, like {p}=8")
    for inp in inputs:
        if not inp.type.HasField("tensor_type"):
            raise ModelError(
                f"{path}: input {inp.name!r} is not a tensor (sequences, maps and optionals are not supported)"
            )
        tt = inp.type.tensor_type
        if inp.name in shapes:
            want = tuple(int(s) for s in shapes[inp.name])
            if tt.HasField("shape"):
                if len(tt.shape.dim) != len(want):
                    raise ModelError(f"{path}: input {inp.name!r} has rank {len(tt.shape.dim)}, --shape gives {want}")
                for d, s in zip(tt.shape.dim, want):
                    if d.HasField("dim_value") and d.dim_value != s:
                        raise ModelError(f"{path}: input {inp.name!r} has static dim {d.dim_value}, --shape gives {s}")
            tt.ClearField("shape")
            for s in want:
                tt.shape.dim.add().dim_value = s
            continue
        if not tt.HasField("shape"):
            raise ModelError(f"{path}: input {inp.name!r} has no shape; give one with --shape {_arg(inp.name)}=2x128")
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                continue
            if d.dim_param and d.dim_param in shapes:
                d.dim_value = int(shapes[d.dim_param][0])
                continue
            example = "x".join(str(e.dim_value) if e.HasField("dim_value") else "8" for e in tt.shape.dim)
            hint = f"--shape {_arg(d.dim_param)}=8 or " if d.dim_param else ""
            raise ModelError(
                f"{path}: input {inp.name!r} has symbolic dimension {d.dim_param or '?'!r}; "
                f"give it with {hint}--shape {_arg(inp.name)}={example}"
            )


def _arg(name: str) -> str:
    return name if name.isidentifier() else repr(name)


def _node_attrs(n: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def _fold_numpy(n: onnx.NodeProto, consts: dict, path: str) -> list | None:
    """The outputs of a constant node folded with numpy (numpy_ops.py), or None where numpy_ops
    does not cover it and onnx's reference evaluator must."""
    if n.op_type not in NUMPY_OPS or n.domain not in DEFAULT_DOMAINS:
        return None
    try:
        return evaluate(n.op_type, _node_attrs(n), [consts[i] if i else None for i in n.input])
    except NotHere:
        return None
    except Exception as e:
        raise ModelError(f"{path}: folding constant node {n.name or n.op_type!r} ({n.op_type}) failed: {e}") from None


# The ops that widen an 8-bit weight: kept live (not folded) when they read an int8 / uint8 constant.
DEQUANTIZING = frozenset({"DequantizeLinear", "Cast"})


def _dequantizes(n: onnx.NodeProto, consts: dict) -> bool:
    """Whether `n` widens an int8 / uint8 constant of more than one element (a weight)."""
    a = consts.get(n.input[0]) if n.input else None
    return n.op_type in DEQUANTIZING and a is not None and a.dtype in (np.int8, np.uint8) and a.size > 1


def _fold(proto: onnx.ModelProto, path: str, shapes: dict | None = None, base: dict | None = None) -> tuple[dict, list]:
    """Evaluate every node whose inputs are all constant, and every Shape of a value whose
    shape is known (`shapes`). `base`: the initializers as arrays, when the caller has them
    (decoded once, not once per pass). Returns (constants, live node protos)."""
    shapes = shapes or {}
    consts = dict(base) if base is not None else {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    graph_inputs = {i.name for i in proto.graph.input} - set(consts)
    consts = {k: v for k, v in consts.items() if k not in graph_inputs}
    live = []
    opsets = list(proto.opset_import)
    todo = list(reversed(proto.graph.node))
    unrolling = Unrolling()
    while todo:
        n = todo.pop()
        if n.op_type == "If" and n.domain in DEFAULT_DOMAINS and n.input[0] in consts:
            todo += reversed(taken_branch(n, consts[n.input[0]], path))  # folded in turn, in place
            continue
        step = None
        if n.op_type == "Loop" and n.domain in DEFAULT_DOMAINS:  # unroll.py: one iteration, then n again
            step = loop_step(n, consts, unrolling, path)
        elif n.op_type in SEQUENCE_OPS and n.domain in DEFAULT_DOMAINS:
            step = sequence_step(n, consts, unrolling, path)
        if step is not None:
            todo += reversed(step)
            continue
        ins = [i for i in n.input if i]
        if n.op_type == "Shape" and n.input[0] in shapes and n.domain in DEFAULT_DOMAINS:
            a = _node_attrs(n)
            dims = np.array(shapes[n.input[0]], np.int64)
            consts[n.output[0]] = dims[a.get("start", 0) : a.get("end", len(dims))]
            continue
        if n.op_type == "Constant" or (
            ins and all(i in consts for i in ins) and n.domain in DEFAULT_DOMAINS and not _dequantizes(n, consts)
        ):
            outs = _fold_numpy(n, consts, path)
            if outs is not None:
                consts.update(zip([o for o in n.output if o], outs))
                continue
            g = helper.make_graph(
                [n], "fold", [helper.make_tensor_value_info(i, onnx.TensorProto.UNDEFINED, None) for i in ins],
                [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in n.output if o],
            )  # fmt: skip
            m = helper.make_model(g, opset_imports=opsets, ir_version=proto.ir_version)
            try:
                outs = ReferenceEvaluator(m, new_ops=REFERENCE_FIXES).run(None, {i: consts[i] for i in ins})
            except Exception as e:
                raise ModelError(f"{path}: folding constant node {n.name or n.op_type!r} failed: {e}") from None
            for o, v in zip([o for o in n.output if o], outs):
                consts[o] = np.asarray(v)
        else:
            live.append(n)
    return consts, live


def taken_branch(n: onnx.NodeProto, cond, path: str) -> list[onnx.NodeProto]:
    """The nodes that an If node with a constant condition runs: its taken branch's nodes, every
    value the branch makes renamed under the If's first output (`y/then/t`: unique in the graph),
    its initializers as Constant nodes, and an Identity from each branch output to the If's.
    Exports often guard a shape-dependent path this way; the condition folds once the shapes are
    known. Names of the enclosing graph that the branch reads stay as they are.

    >>> then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
    ...     [helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [2])])
    >>> n = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=then_g)
    >>> [(m.op_type, list(m.input), list(m.output)) for m in taken_branch(n, np.array(True), "m")]
    [('Relu', ['x'], ['y/then/t']), ('Identity', ['y/then/t'], ['y'])]
    """
    c = np.asarray(cond)
    if c.size != 1:
        raise ModelError(f"{path}: If {n.name or n.output[0]!r}: the condition has {c.size} elements, not one")
    which = "then_branch" if bool(c.reshape(-1)[0]) else "else_branch"
    g = next(a.g for a in n.attribute if a.name == which)
    prefix = f"{n.output[0]}/{which.removesuffix('_branch')}/"
    out = inline(g, {}, prefix)
    made = {o for m in out for o in m.output}
    if len(g.output) != len(n.output):
        raise ModelError(
            f"{path}: If {n.name or n.output[0]!r}: the {which} has {len(g.output)} outputs, the node {len(n.output)}"
        )
    out += [
        helper.make_node(
            "Identity", [prefix + o.name if prefix + o.name in made else o.name], [y], name=f"{prefix}out{k}"
        )
        for k, (o, y) in enumerate(zip(g.output, n.output))
        if y
    ]
    return out


def _with_weights(inferred: onnx.ModelProto, consts: dict) -> onnx.ModelProto:
    """`inferred` with the weights `_infer` passed as typed inputs made initializers again (the
    model's proto is complete: the reference, onnxruntime and the deployable folder read it; a
    memory-mapped weight as a stub naming its file: weights.py)."""
    names = [i.name for i in inferred.graph.input if i.name in consts]
    if not names:
        return inferred
    keep = [i for i in inferred.graph.input if i.name not in consts]
    del inferred.graph.input[:]
    inferred.graph.input.extend(keep)
    inferred.graph.initializer.extend(weights.initializer(k, consts[k]) for k in names)
    return inferred


def _specialize(proto: onnx.ModelProto, values: dict, path: str) -> None:
    names = {i.name for i in proto.graph.input}
    for name, v in values.items():
        if name not in names:
            raise ModelError(f"{path}: cannot specialize {name!r}: not a graph input")
        keep = [i for i in proto.graph.input if i.name != name]
        del proto.graph.input[:]
        proto.graph.input.extend(keep)
        proto.graph.initializer.append(numpy_helper.from_array(np.asarray(v), name))


def _dry_run_shapes(proto: onnx.ModelProto, values: dict, names: list, consts: dict) -> dict:
    """Shapes and types of `names` from running onnx's reference evaluator on zero inputs."""
    feeds = {}
    for i in proto.graph.input:
        v = values.get(i.name)
        if i.name in consts:  # a weight _infer passed as a typed input
            feeds[i.name] = consts[i.name]
            continue
        if v is None or v.shape is None or not v.elem:
            continue
        feeds[i.name] = np.zeros(v.shape, helper.tensor_dtype_to_np_dtype(v.elem))
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs = ReferenceEvaluator(proto, new_ops=REFERENCE_FIXES).run(names, feeds)
    except Exception:  # the shapes stay unknown and those nodes stay with the array library
        return {}
    found = {}
    for name, a in zip(names, outs):
        a = np.asarray(a)
        if a.dtype != object:
            found[name] = Value(name, tuple(a.shape), helper.np_dtype_to_tensor_dtype(a.dtype))
    return found


# Constants up to this many elements are initializers of the shape-inferred model (onnx's data
# propagation folds shapes from the small integer ones); larger ones (weights) are typed inputs
# until the last pass (`_with_weights`): each pass would copy every weight into the protobuf.
INFER_INLINE = 4096


def _infer(proto: onnx.ModelProto, consts: dict, live: list):
    """The model with live nodes only, its small constants as initializers and its weights as
    typed inputs (INFER_INLINE), shape-inferred, and the Value of everything onnx could infer."""
    used = {i for n in live for i in n.input} | {o.name for o in proto.graph.output}
    g = proto.graph
    big = [k for k, v in consts.items() if k in used and v.size > INFER_INLINE and v.dtype != object]
    folded = helper.make_graph(
        live, g.name or "main",
        [i for i in g.input if i.name not in consts]
        + [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(consts[k].dtype), consts[k].shape)
           for k in big],
        list(g.output),
        initializer=[numpy_helper.from_array(v, k) for k, v in consts.items() if k in used and k not in set(big)],
    )  # fmt: skip
    folded_proto = helper.make_model(folded, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(folded_proto, strict_mode=True, data_prop=True)
    except Exception:  # ops onnx cannot infer (custom domains): their outputs stay unknown
        inferred = onnx.shape_inference.infer_shapes(folded_proto, strict_mode=False, data_prop=True)
    values = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        shape = None
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shape = tuple(d.dim_value for d in tt.shape.dim)
        old = values.get(vi.name)
        if old is None or old.shape is None:
            values[vi.name] = Value(vi.name, shape, tt.elem_type)
    return inferred, values


def load_model(source: ModelSource, shapes: dict | None = None, specialize: dict | None = None) -> OnnxModel:
    """Load an ONNX model (a path, bytes or ModelProto), fix the input shapes given in `shapes`
    (input name or dim_param name -> shape), fold constants and infer every shape.
    `specialize` maps graph inputs to values compiled in as constants (see convert.shape_inputs)."""
    path, proto = decode(source)
    if isinstance(source, onnx.ModelProto):  # never mutate the caller's (a decoded file is ours)
        proto = onnx.ModelProto.FromString(proto.SerializeToString())
    newest = onnx.defs.onnx_opset_version()
    for o in proto.opset_import:
        if o.domain in DEFAULT_DOMAINS and o.version > newest:
            raise ModelError(
                f"{path}: the model declares opset {o.version}; the installed onnx {onnx.__version__} supports "
                f"opsets up to {newest}"
            )
    ext = weights.external(proto) or any(
        a.HasField("t") and a.t.data_location == onnx.TensorProto.EXTERNAL
        for n in proto.graph.node
        for a in n.attribute
    )
    if ext and not isinstance(source, (str, os.PathLike)):
        raise ModelError(f"{path}: the model keeps its weights in external files: load it from its path")
    if ext:
        weights.load_constants(proto, path)
    try:
        onnx.checker.check_model(path if ext else proto)  # by path: the checker finds the weight files
    except Exception as e:
        raise ModelError(f"{path}: onnx's checker rejects the model: {str(e).strip().splitlines()[0]}") from None
    _specialize(proto, specialize or {}, path)
    _set_input_shapes(proto, shapes or {}, path)
    for vi in list(proto.graph.output) + list(proto.graph.value_info):  # re-inferred from the inputs
        tt = vi.type.tensor_type
        if tt.HasField("shape") and not all(d.HasField("dim_value") for d in tt.shape.dim):
            tt.ClearField("shape")
    known, dry = {}, None
    inside = [i for i in proto.graph.initializer if i.data_location != onnx.TensorProto.EXTERNAL]
    base = {i.name: numpy_helper.to_array(i) for i in inside} | (weights.mapped(proto, path) if ext else {})
    for _ in range(8):  # Shape of a value whose shape became known folds, and so on downstream
        consts, live = _fold(proto, path, known, base)
        inferred, values = _infer(proto, consts, live)
        missing = [
            o for n in inferred.graph.node for o in n.output if o and (o not in values or values[o].shape is None)
        ]
        if missing and dry is None:  # onnx could not infer them (function ops such as GroupNormalization)
            dry = _dry_run_shapes(inferred, values, missing, consts)  # once: it runs the whole model
        values.update({k: v for k, v in (dry or {}).items() if k in missing})
        more = {n.input[0]: values[n.input[0]].shape for n in live if n.op_type == "Shape"
                and n.input[0] in values and values[n.input[0]].shape is not None}  # fmt: skip
        if not set(more) - set(known):
            break
        known.update(more)
    for n in live:  # onnx's reference cannot run a branch that reads the enclosing graph on its own
        if n.op_type == "If" and n.domain in DEFAULT_DOMAINS:
            raise Unsupported(f"{path}: unsupported op If (non-constant condition) at node {n.name or n.output[0]!r}")

    del proto.graph.initializer[:], base  # their arrays live on in consts
    inferred = _with_weights(inferred, consts)
    g = proto.graph
    for k, v in consts.items():
        values[k] = Value(k, tuple(v.shape), onnx.helper.np_dtype_to_tensor_dtype(v.dtype) if v.dtype != object else 0)
    opset = next((o.version for o in proto.opset_import if o.domain in DEFAULT_DOMAINS), 0)
    nodes = tuple(
        Node(k, n.name, n.op_type, n.domain, tuple(n.input), tuple(n.output), _node_attrs(n), opset)
        for k, n in enumerate(inferred.graph.node)
    )
    inputs = tuple(i.name for i in inferred.graph.input if i.name not in consts)
    outputs = tuple(o.name for o in g.output)
    spec = {k: np.asarray(v) for k, v in (specialize or {}).items()}
    model = OnnxModel(path, inferred, nodes, consts, values, inputs, outputs, opset, spec)
    from .validate import validate  # types and axis ranges, checked in one place (it reads OnnxModel)

    validate(model)
    return model
