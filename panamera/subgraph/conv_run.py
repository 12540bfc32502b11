"""A library Conv of a CPU model run with its weights bound once (`OptimizedModel.run`), beside
cpu_run.py's subgraphs: the run's general path for a library node (LibraryNode.run: the error
wrapper, the array-module test, the step lookup, four array checks, four address writes) cost
about 10 us a Conv around an 8-20 us C call on the exported VGG, and a model with a library
unit showed a progress bar (~5 us) on every run.

`bind_conv` makes, once per library Conv whose weight (and bias) are model constants, a
`BoundConv`: per input shape, the Conv's step (conv_step.HostConvStep) planned once and, where it
is one C call (conv_direct.py), that call with the weights' addresses in its own table, so a run
checks and writes only x, the residuals and the output; other forms call the step with the bound
weights. A value it was not planned for (not a float32 C-contiguous numpy array: a CuPy array on a
GPU, a view) answers None and the run takes the unit's general path, which explains a failure.

>>> from onnx import helper, TensorProto
>>> import numpy as np
>>> from panamera.subgraph.optimizer import optimize
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> w = helper.make_tensor("w", TensorProto.FLOAT, (8, 4, 3, 3), [1.0] * 288)
>>> g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
...     [v("x", [1, 4, 16, 16])], [v("y", [1, 8, 16, 16])], [w])
>>> opt = optimize(helper.make_model(g).SerializeToString(), target="cpu")
>>> run = bind_conv(opt.units[0], opt.model.constants)
>>> run.x, float(run({"x": np.ones((1, 4, 16, 16), np.float32)}, 1)[0][0, 0, 4, 4])
('x', 36.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import PanameraError
from .conv_kernels import NO_EPILOGUE
from .conv_step import HostConvStep
from .library import LibraryNode
from .model import DEFAULT_DOMAINS


@dataclass(frozen=True, eq=False)
class BoundConv:
    """A library Conv (and its fused epilogue) with its weight `w` and bias `b` bound: `x` the
    input it reads from a run's values, `residuals` its epilogue's operands."""

    unit: LibraryNode
    x: str
    residuals: tuple[str, ...]
    w: np.ndarray
    b: np.ndarray | None
    _calls: dict = field(default_factory=dict, repr=False)  # per input shape: call(x, residuals, threads)

    def __call__(self, env: dict, threads: int | None) -> list | None:
        """The Conv's output on the values in `env` (threads None: one), or None: the general path."""
        x = env[self.x]
        if type(x) is not np.ndarray:
            return None
        call = self._calls.get(x.shape)
        if call is None:
            call = self._calls[x.shape] = self._plan(x)
            if call is None:
                return None
        y = call(x, tuple(env[r] for r in self.residuals), threads or 1)
        return None if y is None else [y]

    def _plan(self, x: np.ndarray):
        u = self.unit
        epi = u.fused.epilogue if u.fused else NO_EPILOGUE
        try:
            pool = u.fused.pool if u.fused else ()
            step = HostConvStep.plan(x.shape, self.w.shape, u.node.attrs, self.b is not None, epi, pool)
        except PanameraError:  # the general path raises it, naming the node
            return None
        call = step.with_weights(self.w, self.b)
        if call is None:
            w, b = self.w, self.b

            def call(x, residuals, threads):
                return step(x, w, b, *residuals)

        return call


def bind_conv(unit, constants: dict) -> BoundConv | None:
    """`unit`'s bound Conv where it is a library Conv of the standard domain whose weight (and
    bias) are float32 numpy constants among `constants` (the model's), else None."""
    if not isinstance(unit, LibraryNode) or unit.node.op_type != "Conv" or unit.node.domain not in DEFAULT_DOMAINS:
        return None
    ins = unit.node.inputs
    if len(ins) < 2 or not all(i in constants for i in ins[1:] if i):
        return None
    w = constants[ins[1]]
    b = constants[ins[2]] if len(ins) > 2 and ins[2] else None
    if any(a is not None and (type(a) is not np.ndarray or a.dtype != np.float32) for a in (w, b)):
        return None
    return BoundConv(unit, ins[0], unit.fused.residuals if unit.fused else (), w, b)
