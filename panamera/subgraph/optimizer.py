"""Compile the partitioned subgraphs of an ONNX model, run the whole model, verify it.

>>> from onnx import helper, TensorProto
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> g = helper.make_graph([helper.make_node("Exp", ["x"], ["e"]),
...     helper.make_node("ReduceSum", ["e"], ["y"], keepdims=0)], "g", [v("x", [4, 8])], [v("y", [])])
>>> opt = optimize(helper.make_model(g).SerializeToString(), target="emulator")
>>> [len(sg.nodes) for sg in opt.subgraphs], opt.subgraphs[0].compiled.plan.kernels[0].form
([2], 'ALL')
>>> all(r.ok for r in opt.verify())
True
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx
import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from .. import compile as pn_compile
from ..compiler import Compiled
from ..errors import DTypeError, InputError, PanameraError, ShapeError
from ..frontend.tensor import Tensor, placeholder
from ..model.gpu import H100, GPUSpec
from ..schedule.saved import Schedule
from .convert import VIEWS, Ctx, convert_node
from .model import Node, OnnxModel, load_model
from .partition import graph, partition


@dataclass(frozen=True, eq=False)
class Subgraph:
    """A group of ONNX nodes compiled together by Panamera."""

    id: int
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]  # live values read from outside the subgraph
    weights: dict  # constant (non-scalar) values fed as kernel inputs: name -> array
    outputs: tuple[str, ...]  # values used outside the subgraph or graph outputs
    compiled: Compiled
    compile_s: float
    signature: str  # what it computes (ops, input dtypes and shapes): a saved schedule must match

    @property
    def label(self) -> str:
        ops = [n.op_type for n in self.nodes if n.op_type not in VIEWS] or [self.nodes[0].op_type]
        return f"sg{self.id}_" + "_".join(dict.fromkeys(ops))[:40]


def _placeholders(tensors) -> list[Tensor]:
    seen, found, stack = set(), [], list(tensors)
    while stack:
        t = stack.pop()
        if t.uid in seen:
            continue
        seen.add(t.uid)
        if t.op == "placeholder":
            found.append(t)
        stack += t.inputs
    return found


def signature(nodes, tensors) -> str:
    """Ops and the (name-sorted) input dtypes and shapes of a subgraph's Panamera program."""
    ins = ",".join(f"{t.dtype}{list(t.shape)}" for t in sorted(tensors, key=lambda t: t.name))
    return f"{'+'.join(n.op_type for n in nodes)}({ins})"


@dataclass(frozen=True, eq=False)
class LibraryNode:
    """A node the array library runs: MatMul and Gemm through the arrays' own module (CuPy's
    cuBLAS on a GPU, numpy on the CPU), every other op through onnx's reference evaluator (on
    the host)."""

    node: Node
    reason: str
    _session: list = field(default_factory=list, repr=False)

    def run(self, model: OnnxModel, args: list):
        if self.node.op_type in ARRAY_OPS and self.node.domain in ("", "ai.onnx"):
            xp = _array_module(args)
            return [ARRAY_OPS[self.node.op_type](xp, self.node.attrs, *args)]
        if not self._session:
            n = self.node
            ins = [i for i in n.inputs if i]
            g = helper.make_graph(
                [helper.make_node(n.op_type, list(n.inputs), list(n.outputs), name=n.name, domain=n.domain, **n.attrs)],
                "library", [_value_info(model, i) for i in ins], [_value_info(model, o) for o in n.outputs if o],
            )  # fmt: skip
            m = helper.make_model(g, opset_imports=list(model.proto.opset_import), ir_version=model.proto.ir_version)
            self._session.append((ReferenceEvaluator(m), ins))
        sess, ins = self._session[0]
        host = [a.get() if type(a).__module__.startswith("cupy") else a for a in args]
        return sess.run(None, dict(zip(ins, host)))


def _array_module(args):
    if any(type(a).__module__.startswith("cupy") for a in args):
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


# The compute-bound ops the array library runs natively (ONNX semantics: numpy's matmul);
# partition.NATIVE names the same ops.
ARRAY_OPS = {
    "MatMul": lambda xp, attrs, a, b: xp.matmul(xp.asarray(a), xp.asarray(b)),
    "Gemm": _gemm,
}


def _value_info(model: OnnxModel, name: str):
    v = model.values.get(name)
    return helper.make_tensor_value_info(name, v.elem if v else onnx.TensorProto.UNDEFINED, v.shape if v else None)


@dataclass(frozen=True)
class Check:
    value: str
    ok: bool
    max_abs_err: float
    detail: str = ""


def _placeholder_for(model: OnnxModel, name: str) -> Tensor:
    v = model.values[name]
    return placeholder(v.shape, v.dtype, name=name)


def build_subgraph_tensors(model: OnnxModel, nodes, outputs=None):
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
        users = {i for m in model.nodes if m not in nodes for i in m.inputs}
        outputs = tuple(
            o for o in dict.fromkeys(o for n in nodes for o in n.outputs) if o and (o in users or o in model.outputs)
        )
    return tuple(outputs), [env[o] for o in outputs], tuple(live), weights


def compile_subgraph(model, k, nodes, target, gpu, schedules=None) -> Subgraph:
    """Convert and compile one group; `schedules(k, signature)` may return a saved Schedule."""
    t0 = time.perf_counter()
    outputs, tensors, live, weights = build_subgraph_tensors(model, nodes)
    sig = signature(nodes, _placeholders(tensors))
    schedule = schedules(k, sig) if schedules is not None else None
    compiled = pn_compile(tensors, target=target, gpu=gpu, schedule=schedule)
    return Subgraph(k, tuple(nodes), live, weights, outputs, compiled, time.perf_counter() - t0, sig)


def unfused_baseline(model: OnnxModel, sg: Subgraph, gpu: GPUSpec) -> tuple[float, int]:
    """Modeled µs and launches of the same nodes run one kernel per ONNX node (views free),
    each reading its inputs from and writing its outputs to DRAM: what a runtime without
    cross-op fusion does."""
    us, launches = 0.0, 0
    for n in sg.nodes:
        if n.op_type in VIEWS:
            continue
        outs = tuple(o for o in n.outputs if o)
        _, tensors, _, _ = build_subgraph_tensors(model, (n,), outs)
        c = pn_compile(tensors, target="emulator", gpu=gpu)
        us += c.plan.modeled_us
        launches += len(c.plan.per_call)
    return us, launches


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing a Panamera result with onnx's reference evaluator."""
    name = np.dtype(dtype).name
    return {"float64": (1e-9, 1e-12), "float32": (2e-4, 1e-5), "float16": (1e-2, 1e-3), "bfloat16": (5e-2, 1e-2)}.get(
        name, (0.0, 0.0)
    )


def compare(name: str, got, want, rtol=None, atol=None) -> Check:
    got = got.get() if type(got).__module__.startswith("cupy") else np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return Check(name, False, float("inf"), f"shape {got.shape} != reference {want.shape}")
    r, a = tolerance(want.dtype)
    r, a = max(r, rtol or 0.0), max(a, atol or 0.0)
    if want.dtype.kind not in "biu":  # floats, including ml_dtypes' bfloat16 and float8 types
        g64, w64 = got.astype(np.float64), want.astype(np.float64)
        ok = bool(np.allclose(g64, w64, rtol=r, atol=a, equal_nan=True))
        fin = np.isfinite(g64) & np.isfinite(w64)
        err = float(np.max(np.abs(g64[fin] - w64[fin]), initial=0.0))
    else:
        ok = bool(np.array_equal(got, want))
        err = 0.0 if ok else float(np.max(np.abs(got.astype(np.int64) - want.astype(np.int64)), initial=0))
    return Check(name, ok, err, "" if ok else f"max |error| {err:.3g} (rtol {r:g}, atol {a:g})")


def random_inputs(model: OnnxModel, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in model.inputs:
        v = model.values[name]
        dt = helper.tensor_dtype_to_np_dtype(v.elem)
        if dt == np.bool_:
            feeds[name] = rng.random(v.shape) < 0.5
        elif np.issubdtype(dt, np.integer):
            feeds[name] = rng.integers(-10, 10, v.shape).astype(dt)
        else:
            feeds[name] = rng.standard_normal(v.shape).astype(dt)
    return feeds


@dataclass(frozen=True, eq=False)
class OptimizedModel:
    """A model split into compiled Panamera subgraphs and library nodes, in run order."""

    model: OnnxModel
    units: tuple  # Subgraph | LibraryNode
    target: str
    gpu: GPUSpec

    @property
    def subgraphs(self) -> tuple[Subgraph, ...]:
        return tuple(u for u in self.units if isinstance(u, Subgraph))

    @property
    def backend(self) -> str:
        """Where the Panamera kernels run ("emulator" or "cuda"; "none" without subgraphs)."""
        return self.subgraphs[0].compiled.target if self.subgraphs else "none"

    @property
    def library(self) -> tuple[LibraryNode, ...]:
        return tuple(u for u in self.units if isinstance(u, LibraryNode))

    def subgraph_of(self, node_name: str) -> Subgraph | LibraryNode:
        node = self.model.node(node_name)
        for u in self.units:
            if node in (u.nodes if isinstance(u, Subgraph) else (u.node,)):
                return u
        raise AssertionError(f"node {node_name!r} is in no unit")  # every live node is in one

    def _check_feeds(self, feeds: dict) -> dict:
        for name, v in self.model.specialized.items():
            if name in feeds and not np.array_equal(np.asarray(feeds[name]), v):
                raise InputError(f"model input {name!r} was compiled in as {v.tolist()}; got a different value")
        feeds = {k: a for k, a in feeds.items() if k not in self.model.specialized}
        missing = [i for i in self.model.inputs if i not in feeds]
        if missing:
            raise InputError(f"missing model input(s) {missing}")
        extra = sorted(set(feeds) - set(self.model.inputs))
        if extra:
            raise InputError(f"unknown model input(s) {extra}; inputs are {list(self.model.inputs)}")
        out = {}
        for name in self.model.inputs:
            a, v = feeds[name], self.model.values[name]
            if not hasattr(a, "shape") or not hasattr(a, "dtype"):
                raise InputError(f"model input {name!r}: expected an array, got {type(a).__name__}")
            if tuple(a.shape) != v.shape:
                raise InputError(f"model input {name!r}: expected shape {v.shape}, got {tuple(a.shape)}")
            want = helper.tensor_dtype_to_np_dtype(v.elem)
            if np.dtype(a.dtype) != want:
                raise DTypeError(f"model input {name!r}: expected dtype {want}, got {np.dtype(a.dtype)}")
            out[name] = a
        return out

    def run(self, feeds: dict, keep: tuple[str, ...] = ()) -> dict:
        """Run the whole model: Panamera kernels for the subgraphs, the array library for the
        rest. Returns the graph outputs (and the values named in `keep`)."""
        env = dict(self.model.constants)
        env.update(self._check_feeds(feeds))
        for u in self.units:
            if isinstance(u, Subgraph):
                named = {t.name: env[t.name] for t in u.compiled.inputs}
                outs = u.compiled(**named)
                outs = outs if isinstance(outs, tuple) else (outs,)
                env.update(zip(u.outputs, outs))
            else:
                outs = u.run(self.model, [env[i] for i in u.node.inputs if i])
                env.update(zip([o for o in u.node.outputs if o], outs))
        return {o: env[o] for o in tuple(self.model.outputs) + tuple(keep)}

    @cached_property
    def _reference(self) -> ReferenceEvaluator:
        return ReferenceEvaluator(self.model.proto)

    def verify(self, feeds: dict | None = None, seed: int = 0, rtol=None, atol=None) -> list[Check]:
        """Run the model and onnx's reference evaluator on the same inputs; compare every graph
        output and every subgraph output."""
        feeds = random_inputs(self.model, seed) if feeds is None else feeds
        inner = tuple(o for sg in self.subgraphs for o in sg.outputs if o not in self.model.outputs)
        ours = self.run(feeds, keep=inner)
        names = tuple(self.model.outputs) + inner
        ref = dict(zip(names, self._reference.run(list(names), feeds)))
        return [compare(n, ours[n], ref[n], rtol, atol) for n in names]


def optimize(
    source,
    shapes: dict | None = None,
    specialize: dict | None = None,
    target: str = "auto",
    gpu: GPUSpec = H100,
    schedules: Callable[[int, str], Schedule | None] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    compile_views: bool = False,
) -> OptimizedModel:
    """Load, partition and compile an ONNX model. `schedules(k, signature)` may return a saved
    Schedule for subgraph k; a subgraph Panamera cannot compile falls back to the library with
    the reason (a ScheduleError is raised, never swallowed: a saved schedule must fit)."""
    from ..errors import ScheduleError

    model = source if isinstance(source, OnnxModel) else load_model(source, shapes, specialize)
    part = partition(model, compile_views)
    units: dict[int, object] = {n.index: LibraryNode(n, why) for n, why in part.library}
    for k, nodes in enumerate(part.groups):
        if progress:
            progress(k, len(part.groups), "+".join(n.op_type for n in nodes))
        try:
            sg = compile_subgraph(model, k, nodes, target, gpu, schedules)
        except ScheduleError:
            raise
        except PanameraError as e:
            for n in nodes:
                units[n.index] = LibraryNode(n, f"Panamera could not compile its subgraph: {e}")
            continue
        units[nodes[0].index] = sg
    # Run order: a topological order of the units (convex groups make it a DAG).
    unit_of = {}
    for key, u in units.items():
        for n in u.nodes if isinstance(u, Subgraph) else (u.node,):
            unit_of[n.index] = key
    dag = nx.DiGraph()
    dag.add_nodes_from(units)
    dag.add_edges_from((unit_of[a], unit_of[b]) for a, b in graph(model).edges if unit_of[a] != unit_of[b])
    order = nx.lexicographical_topological_sort(dag)
    return OptimizedModel(model, tuple(units[k] for k in order), target, gpu)
