"""The array library: how the nodes Panamera does not compile run.

MatMul and Gemm run through the arrays' own module (CuPy's cuBLAS on a GPU, numpy on the CPU),
Conv through CuPy's cuDNN or an im2col Panamera kernel feeding that matmul (conv.py);
the data-movement and shape ops of numpy_ops.py run with numpy, on the host; every other node
runs through onnx's reference evaluator (with numpy_ops' corrections), on the host.

>>> import numpy as np
>>> ARRAY_OPS["Gemm"](np, {"transB": 1, "alpha": 2.0}, np.ones((2, 3), np.float32), np.ones((4, 3), np.float32))
array([[6., 6., 6., 6.],
       [6., 6., 6., 6.]], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from ..errors import ModelError, PanameraError
from .conv import conv
from .conv_fuse import FusedConv
from .conv_kernels import NO_EPILOGUE
from .conv_step import HostConvStep
from .model import DEFAULT_DOMAINS, Node, OnnxModel
from .numpy_ops import NUMPY_OPS, REFERENCE_FIXES, NotHere, evaluate


def is_device_array(a) -> bool:
    """Whether `a` is a CuPy array (checked by module name: CuPy need not be installed)."""
    return type(a).__module__.startswith("cupy")


def to_host(a) -> np.ndarray:
    """`a` as a numpy array, copied from the GPU if it is a CuPy array."""
    return a.get() if is_device_array(a) else np.asarray(a)


def _array_module(args) -> ModuleType:
    if any(is_device_array(a) for a in args):
        import cupy

        return cupy
    return np


def _gemm(xp, attrs, a, b, c=None):
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    y = attrs.get("alpha", 1.0) * xp.matmul(xp.asarray(a), xp.asarray(b))
    if c is not None:
        y = y + attrs.get("beta", 1.0) * xp.asarray(c)
    return y.astype(a.dtype, copy=False)


# The compute-bound ops the array library runs natively (ONNX semantics: numpy's matmul), as
# f(array module, node attributes, *inputs) -> output. The partitioner derives its NATIVE set from it.
ARRAY_OPS: dict[str, Callable] = {
    "MatMul": lambda xp, attrs, a, b: xp.matmul(xp.asarray(a), xp.asarray(b)),
    "Gemm": _gemm,
    # cuDNN through CuPy when present, else an im2col Panamera kernel feeding xp.matmul (conv.py)
    "Conv": conv,
}


def _value_info(model: OnnxModel, name: str) -> onnx.ValueInfoProto:
    v = model.values.get(name)
    return helper.make_tensor_value_info(name, v.elem if v else onnx.TensorProto.UNDEFINED, v.shape if v else None)


@dataclass(frozen=True, eq=False)
class LibraryNode:
    """A node the array library runs: MatMul and Gemm through the arrays' own module (CuPy's
    cuBLAS on a GPU, numpy on the CPU), every other op through onnx's reference evaluator (on
    the host)."""

    node: Node
    reason: str
    _session: list = field(default_factory=list, repr=False)  # the reference evaluator, made on first run
    fused: FusedConv | None = None  # a host Conv's epilogue nodes, run in its step (conv_fuse.py)
    _conv_steps: dict = field(default_factory=dict, repr=False)  # a host Conv's steps, per input shapes

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The graph nodes this step runs: the node, then the epilogue nodes fused into it."""
        return (self.node,) + (self.fused.nodes if self.fused else ())

    @property
    def inputs(self) -> tuple[str, ...]:
        """The values the step reads (present inputs, then a fused epilogue's residual operands)."""
        return tuple(i for i in self.node.inputs if i) + (self.fused.residuals if self.fused else ())

    @property
    def outputs(self) -> tuple[str, ...]:
        """The values the step writes (a fused epilogue's: its last node's output)."""
        return (self.fused.output,) if self.fused else tuple(o for o in self.node.outputs if o)

    @property
    def host(self) -> bool:
        """True when the node runs on the host (numpy or onnx's reference evaluator) even with a
        GPU: every op but the arrays' own (MatMul, Gemm, Conv: CuPy on a GPU)."""
        return not (self.node.op_type in ARRAY_OPS and self.node.domain in DEFAULT_DOMAINS)

    def run(self, model: OnnxModel, args: list) -> list:
        """The node's outputs (its present ones, in order) for its present inputs `args`; a
        ModelError naming the node where the library fails on them (the model's fault: Panamera
        checked what it could at load, subgraph/validate.py)."""
        try:
            return self._run(model, args)
        except PanameraError:
            raise
        except Exception as e:
            n = self.node
            raise ModelError(
                f"{n.op_type} {n.label!r}: the array library failed on it: {type(e).__name__}: {e}"
            ) from None

    def _host_conv(self, args: list):
        """The Conv (and its fused epilogue) on the host: its step planned once per input shapes
        (conv_step.py); args are the Conv's present inputs, then the epilogue's residuals."""
        k = len(args) - (len(self.fused.residuals) if self.fused else 0)
        key = (args[0].shape, args[1].shape)
        step = self._conv_steps.get(key)
        if step is None:
            epi = self.fused.epilogue if self.fused else NO_EPILOGUE
            pool = self.fused.pool if self.fused else ()
            step = HostConvStep.plan(args[0].shape, args[1].shape, self.node.attrs, k == 3, epi, pool)
            self._conv_steps[key] = step
        return step(*args[:2], args[2] if k == 3 else None, *args[k:])

    def _run(self, model: OnnxModel, args: list) -> list:
        if self.node.op_type == "Conv" and self.node.domain in DEFAULT_DOMAINS and _array_module(args) is np:
            return [self._host_conv(args)]
        if self.fused:  # a Conv and its epilogue elsewhere: args are the Conv's inputs, then the residuals
            k = len(args) - len(self.fused.residuals)
            epi = {"epilogue": self.fused.epilogue, "residuals": tuple(args[k:])}
            return [conv(_array_module(args), self.node.attrs, *args[:k], **epi)]
        if self.node.op_type in ARRAY_OPS and self.node.domain in DEFAULT_DOMAINS:
            xp = _array_module(args)
            return [ARRAY_OPS[self.node.op_type](xp, self.node.attrs, *args)]
        host = [to_host(a) for a in args]
        if self.node.op_type in NUMPY_OPS and self.node.domain in DEFAULT_DOMAINS:
            n = self.node
            full = iter(host)
            try:  # numpy where it has the op (numpy_ops.py), onnx's reference evaluator otherwise
                return evaluate(n.op_type, n.attrs, [next(full) if i else None for i in n.inputs])
            except NotHere:
                pass
        if not self._session:
            n = self.node
            ins = [i for i in n.inputs if i]
            g = helper.make_graph(
                [helper.make_node(n.op_type, list(n.inputs), list(n.outputs), name=n.name, domain=n.domain, **n.attrs)],
                "library", [_value_info(model, i) for i in ins], [_value_info(model, o) for o in n.outputs if o],
            )  # fmt: skip
            m = helper.make_model(g, opset_imports=list(model.proto.opset_import), ir_version=model.proto.ir_version)
            try:
                self._session.append((ReferenceEvaluator(m, new_ops=REFERENCE_FIXES), ins))
            except NotImplementedError:  # a custom domain's op, or one the evaluator lacks
                raise ModelError(
                    f"node {n.label!r} ({n.domain or 'ai.onnx'}::{n.op_type}): nothing here can run it "
                    "(Panamera has no such op and onnx's reference evaluator does not know it)"
                ) from None
        sess, ins = self._session[0]
        return sess.run(None, dict(zip(ins, host)))
