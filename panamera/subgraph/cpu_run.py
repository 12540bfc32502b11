"""A model's CPU subgraphs called with their constant inputs bound once (`OptimizedModel.run`).

A subgraph's program takes the model's weights as inputs (its placeholders). Called by name on
every run, its one-table call path (runtime/cpu_call.py's FastCall) checked each of them (type,
shape, dtype, contiguity) and wrote its pointer: on the exported BERT, ~100 weights cost about
45 us a run around a 30 us C entry. `bind_constants` makes, once per subgraph, a FastCall of the
same C entries whose table holds the weights' pointers (the arrays kept alive by it), so a run
checks and writes only the live inputs (the feeds and other units' outputs).

The model's constants are never written by a run (they are program inputs), and the results
are fresh arrays per call (FastCall.call): a run's outputs are never overwritten by a later run.

>>> from onnx import helper, TensorProto
>>> from panamera.subgraph.optimizer import optimize
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> w = helper.make_tensor("w", TensorProto.FLOAT, (4,), [1.0, 2.0, 3.0, 4.0])
>>> g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "g", [v("x", [4])], [v("y", [4])], [w])
>>> opt = optimize(helper.make_model(g).SerializeToString(), target="cpu")
>>> run = bind_constants(opt.subgraphs[0], opt.model.constants)
>>> run.live, run({"x": np.ones(4, np.float32)}, None)[0].tolist()
(('x',), [1.0, 2.0, 3.0, 4.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.cpu_call import FastCall


@dataclass(frozen=True, eq=False)
class BoundRun:
    """A subgraph's C entries with its constant inputs in the table; `live` the names of the
    inputs each run passes, in the table's order."""

    fast: FastCall
    live: tuple[str, ...]

    def __call__(self, env: dict, threads: int | None) -> list | None:
        """The subgraph's outputs on the live values in `env`, or None where a check fails (the
        caller then takes the subgraph's general call, which explains the failure)."""
        return self.fast.call(tuple(env[n] for n in self.live), threads, None)


def bind_constants(sg, constants: dict) -> BoundRun | None:
    """`sg`'s (optimizer.Subgraph) CPU program with every input found in `constants` (the model's)
    or among its own weights bound in its table, or None: no static CPU program, or no one-table path."""
    ex = getattr(sg.runner, "executor", None)  # a symbolic program (dynamic_cpu.py) has none: its general call
    fast = ex.fast() if ex is not None else None
    if fast is None:
        return None
    bound, live = dict(ex.bound), []
    for k in fast.free:
        spec = ex.plan.inputs[k]
        a = constants[spec.name] if spec.name in constants else sg.weights.get(spec.name)
        if a is None:
            live.append(spec.name)
        elif type(a) is np.ndarray and a.shape == spec.shape and a.dtype == spec.dtype.np:
            bound[k] = a
        else:  # a constant the general call converts: that path for every run
            return None
    return BoundRun(FastCall(ex.plan, fast.steps, bound, fast.threads, fast.blas), tuple(live))
