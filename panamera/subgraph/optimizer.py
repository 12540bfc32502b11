"""The optimizer: compile the partitioned subgraphs of an ONNX model, run the whole model
(Panamera kernels and library nodes in a topological order) and verify it.

>>> from onnx import helper, TensorProto
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> g = helper.make_graph([helper.make_node("Exp", ["x"], ["e"]),
...     helper.make_node("ReduceSum", ["e"], ["y"], keepdims=0)], "g", [v("x", [4, 8])], [v("y", [])])
>>> opt = optimize(helper.make_model(g).SerializeToString(), target="emulator")
>>> [len(sg.nodes) for sg in opt.subgraphs], str(opt.subgraphs[0].compiled.plan.kernels[0].form)
([2], 'ALL')
>>> all(r.ok for r in opt.verify())
True
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import networkx as nx
import numpy as np
from onnx import helper

from .. import compile as pn_compile
from .. import logs
from .. import options as _options
from ..cache import placeholders
from ..compiled import Compiled
from ..errors import DTypeError, InputError, OptionError, PanameraError, ScheduleError, TargetRefused
from ..frontend.tensor import Tensor
from ..model.gpu import H100, GPUSpec
from ..options import Target
from ..schedule.saved import Schedule
from . import cpu_chain
from .build import build_subgraph_tensors
from .conv_run import bind_conv
from .convert import VIEWS
from .cpu_run import bind_constants
from .library import LibraryNode, to_host
from .model import ModelSource, Node, OnnxModel, load_model
from .partition import Partition, graph, partition
from .plans import Plans
from .route import Routing
from .verify import Check, Reference, random_inputs, verify_values

_log = logs.get("onnx")


@dataclass(frozen=True, eq=False)
class Subgraph:
    """A group of ONNX nodes compiled together by Panamera."""

    id: int
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]  # live values read from outside the subgraph
    weights: dict  # constant (non-scalar) values fed as kernel inputs: name -> array
    outputs: tuple[str, ...]  # values used outside the subgraph or graph outputs
    compiled: Compiled  # the GPU plan (cuda, or the emulator without a GPU): reports, schedules, deploy folders
    compile_s: float
    signature: str  # what it computes (ops, input dtypes and shapes): a saved schedule must match
    on_cpu: bool = False  # run by the CPU target's kernels (compiled at the first run), not by `compiled`

    @cached_property
    def _cpu(self) -> tuple[Compiled | None, str]:
        if not self.on_cpu:
            return None, ""
        try:
            return pn_compile(list(self.compiled.outputs), target="cpu"), ""
        except TargetRefused as e:  # the plan's emulator runs it; the reason is kept
            _log.info("subgraph %d runs on the emulator: %s", self.id, e)
            return None, str(e)

    @property
    def runner(self) -> Compiled | None:
        """The CPU target's program of this subgraph (compiled on first use), or None: not
        `on_cpu`, or refused by the CPU target (`runner_note` says why)."""
        return self._cpu[0]

    @property
    def runner_note(self) -> str:
        """Why the CPU target does not run this `on_cpu` subgraph ("" where it does)."""
        return self._cpu[1]

    @property
    def runs(self) -> Compiled:
        """The compiled program that runs this subgraph (`runner`, else the plan itself)."""
        return self.runner if self.runner is not None else self.compiled

    @property
    def label(self) -> str:
        ops = [n.op_type for n in self.nodes if n.op_type not in VIEWS] or [self.nodes[0].op_type]
        return f"sg{self.id}_" + "_".join(dict.fromkeys(ops))[:40]


def signature(nodes: Sequence[Node], tensors: Sequence[Tensor]) -> str:
    """Ops and the (name-sorted) input dtypes and shapes of a subgraph's Panamera program."""
    ins = ",".join(f"{t.dtype}{list(t.shape)}" for t in sorted(tensors, key=lambda t: t.name))
    return f"{'+'.join(n.op_type for n in nodes)}({ins})"


# Where saved schedules come from: (subgraph number, signature) -> the Schedule to replay, or None.
ScheduleSource = Callable[[int, str], Schedule | None]


def compile_subgraph(
    model: OnnxModel,
    k: int,
    nodes: Sequence[Node],
    target: str,
    gpu: GPUSpec,
    schedules: ScheduleSource | None = None,
) -> Subgraph:
    """Convert and compile one group; `schedules(k, signature)` may return a saved Schedule."""
    t0 = time.perf_counter()
    outputs, tensors, live, weights = build_subgraph_tensors(model, nodes)
    sig = signature(nodes, placeholders(tuple(tensors)))
    schedule = schedules(k, sig) if schedules is not None else None
    plan_target, on_cpu = plan_and_run(target)
    compiled = pn_compile(tensors, target=plan_target, gpu=gpu, schedule=schedule)
    dt = time.perf_counter() - t0
    return Subgraph(k, tuple(nodes), live, weights, outputs, compiled, dt, sig, on_cpu)


def plan_and_run(target: str) -> tuple[str, bool]:
    """The target a subgraph is planned for (its schedule, CUDA source and modeled times: what
    reports and deploy folders hold) and whether the CPU target runs it: "auto" without a GPU
    and "cpu" plan on the emulator and run on the CPU (options.auto_target).

    >>> plan_and_run("emulator"), plan_and_run("cpu")
    (('emulator', False), ('emulator', True))
    """
    chosen = Target(target) if target != "auto" else _options.auto_target()  # looked up here: tests pin it
    if chosen == Target.CPU:
        return "emulator", True
    return target, False


def unfused_baseline(model: OnnxModel, sg: Subgraph, gpu: GPUSpec, plans: Plans | None = None) -> tuple[float, int]:
    """Modeled µs and launches of the same nodes run one kernel per ONNX node (views free),
    each reading its inputs from and writing its outputs to DRAM: what a runtime without
    cross-op fusion does. `plans` (plans.py: the partition's, on `gpu`) gives the figures of a
    node the router or an earlier baseline already planned, under any name."""
    plans = Plans(gpu) if plans is None or plans.gpu != gpu else plans
    us, launches = 0.0, 0
    for n in sg.nodes:
        if n.op_type in VIEWS:
            continue
        fig = plans.figures(model, (n,), tuple(o for o in n.outputs if o))
        us += fig.modeled_us
        launches += fig.launches
    return us, launches


@dataclass(frozen=True)
class Measured:
    """Wall-clock times of whole-model runs on one backend (measured, not modeled), after
    `warmup` untimed runs.

    >>> m = Measured("emulator", (0.3, 0.1, 0.2), warmup=1)
    >>> m.repeat, m.median_s, m.min_s, round(m.p90_s, 2)
    (3, 0.2, 0.1, 0.28)
    """

    backend: str  # "emulator" (the CPU), "cuda" (the GPU) or "none" (no Panamera subgraph)
    times_s: tuple[float, ...]  # every timed run, in order
    warmup: int = 1

    repeat = property(lambda self: len(self.times_s))
    median_s = property(lambda self: self.percentile(50))
    p90_s = property(lambda self: self.percentile(90))
    min_s = property(lambda self: min(self.times_s))

    def percentile(self, q: float) -> float:
        """The q-th percentile of the timed runs (numpy's linear interpolation)."""
        return float(np.percentile(self.times_s, q))

    def to_dict(self) -> dict:
        """The figures as JSON-ready values (seconds)."""
        return {"backend": self.backend, "warmup": self.warmup, "repeat": self.repeat, "p50_s": self.median_s,
                "p90_s": self.p90_s, "min_s": self.min_s, "times_s": list(self.times_s), "clock": "wall"}  # fmt: skip

    def describe(self) -> str:
        """One line: the backend and the percentiles."""
        where = {"emulator": "the CPU emulator", "cuda": "the GPU (CUDA)", "cpu": "the CPU (OpenMP C++)"}.get(
            self.backend, "the CPU (OpenMP C++) and the emulator" if "+" in self.backend else "the array library"
        )
        return (
            f"measured on {where} ({self.backend} backend): p50 {self.median_s * 1e3:.3f} ms, "
            f"p90 {self.p90_s * 1e3:.3f} ms, min {self.min_s * 1e3:.3f} ms over {self.repeat} run(s) "
            f"after {self.warmup} warm-up run(s), wall clock"
        )


@dataclass(frozen=True, eq=False)
class OptimizedModel:
    """A model split into compiled Panamera subgraphs and library nodes, in run order."""

    model: OnnxModel
    units: tuple[Subgraph | LibraryNode, ...]
    target: str
    gpu: GPUSpec
    partition: Partition | None = None  # the partitioner's decisions (routes, why a group is alone)

    def __repr__(self) -> str:
        """One line (the model and its compiled kernels are attributes, not the repr)."""
        return (
            f"<OptimizedModel {self.model.path}: {len(self.subgraphs)} Panamera subgraph(s), {len(self.library)} "
            f"library node(s); target {self.target}, {self.gpu.name}>"
        )

    @property
    def subgraphs(self) -> tuple[Subgraph, ...]:
        return tuple(u for u in self.units if isinstance(u, Subgraph))

    @property
    def backend(self) -> str:
        """Where the Panamera kernels run ("cpu", "emulator" or "cuda"; "cpu+emulator" where the
        CPU target refused some subgraphs; "none" without subgraphs)."""
        return "+".join(dict.fromkeys(sg.runs.target for sg in self.subgraphs)) or "none"

    @property
    def library(self) -> tuple[LibraryNode, ...]:
        return tuple(u for u in self.units if isinstance(u, LibraryNode))

    def subgraph_of(self, node_name: str) -> Subgraph | LibraryNode:
        node = self.model.node(node_name)
        for u in self.units:
            if node in u.nodes:
                return u
        raise AssertionError(f"node {node_name!r} is in no unit")  # every live node is in one

    @cached_property
    def _feed_dtypes(self) -> dict:
        """Each model input's numpy dtype (looked up once, not per run)."""
        return {name: helper.tensor_dtype_to_np_dtype(self.model.values[name].elem) for name in self.model.inputs}

    @cached_property
    def _signature(self) -> tuple:
        """(name, shape, numpy dtype) per model input: what a run's feeds are compared against."""
        return tuple((n, self.model.values[n].shape, self._feed_dtypes[n]) for n in self.model.inputs)

    def _check_feeds(self, feeds: dict) -> dict:
        """`feeds` checked against the compiled inputs: the model's inputs (the caller's dict
        itself where it holds exactly numpy arrays of the compiled shapes and dtypes: one compare
        each per run), else an InputError or DTypeError naming the input (`_check_feeds_in_full`)."""
        sig = self._signature
        if len(feeds) != len(sig) or self.model.specialized:
            return self._check_feeds_in_full(feeds)
        for name, shape, dt in sig:
            a = feeds.get(name)
            if type(a) is not np.ndarray or a.shape != shape or (a.dtype is not dt and a.dtype != dt):
                return self._check_feeds_in_full(feeds)
        return feeds

    def _check_feeds_in_full(self, feeds: dict) -> dict:
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
            want = self._feed_dtypes[name]
            if a.dtype != want and np.dtype(a.dtype) != want:
                raise DTypeError(f"model input {name!r}: expected dtype {want}, got {np.dtype(a.dtype)}")
            out[name] = a
        return out

    def run(self, feeds: dict, keep: tuple[str, ...] = (), threads: int | None = None) -> dict:
        """Run the whole model: Panamera kernels for the subgraphs, the array library for the
        rest. Returns the graph outputs (and the values named in `keep`). `threads`: the CPU
        target's thread count (default: the machine's cores; numpy's BLAS keeps its own pool)."""
        checked = self._check_feeds(feeds)
        chain = self._chain
        names = self._outputs + tuple(keep) if keep else self._outputs
        if len(chain) == 2 and chain[1] is not None and (got := chain[1].run(checked, names, threads)) is not None:
            return got  # every unit in one C call (cpu_chain.py)
        env = dict(self.model.constants)
        env.update(checked)
        steps = self._steps
        if all(st[4] is not None for st in steps):  # every unit one C entry (cpu_run.py): no progress report
            for st in steps:
                self._unit(st, env, threads)
        else:
            with logs.steps("running unit", len(self.units), _log) as bar:
                for st in steps:
                    bar.step(st[1])
                    self._unit(st, env, threads)
        if len(chain) < 2:  # the second run builds the chain from its values (cpu_chain.py)
            chain.append(cpu_chain.build(self, env) if chain else None)
        return {o: env[o] for o in names}

    @cached_property
    def _outputs(self) -> tuple[str, ...]:
        return tuple(self.model.outputs)

    @cached_property
    def _chain(self) -> list:
        """[] before any run, [None] after one, then [None, the Chain or None] (cpu_chain.build)."""
        return []

    def _unit(self, step: tuple, env: dict, threads: int | None) -> None:
        """Run one unit of `_steps` on the values in `env`, adding its outputs to `env`."""
        u, _, ins, outs_of, bound = step
        if bound is not None and (outs := bound(env, threads)) is not None:  # cpu_run.py
            env.update(zip(outs_of, outs))
        elif isinstance(u, Subgraph):
            # converter-made constants (e.g. Resize's tap tables) are the subgraph's own weights
            named = {i: env[i] if i in env else u.weights[i] for i in ins}
            outs = u.runs(**named) if threads is None or u.runner is None else u.runner(**named, threads=threads)
            env.update(zip(outs_of, outs if isinstance(outs, tuple) else (outs,)))
        else:
            env.update(zip(outs_of, u.run(self.model, [env[i] for i in ins])))

    @cached_property
    def _steps(self) -> tuple:
        """Per unit in run order, what `run` needs, found once: (unit, progress label, the names
        it reads, the names it writes, its CPU program with the constants bound or None: cpu_run.py).
        A subgraph's runner is compiled here (CPU target)."""
        out = []
        for u in self.units:
            if isinstance(u, Subgraph):
                bound = bind_constants(u, self.model.constants)
                out.append((u, u.label, tuple(t.name for t in u.runs.inputs), tuple(u.outputs), bound))
            else:
                what = "+".join(n.op_type for n in u.nodes)
                out.append((u, f"{what} (library)", u.inputs, u.outputs, bind_conv(u, self.model.constants)))
        return tuple(out)

    def measure(self, feeds: dict, repeat: int = 10, warmup: int = 1) -> Measured:
        """Time `repeat` runs of the whole model on `feeds` after `warmup` untimed ones, wall
        clock, outputs copied to the host (so a GPU run is complete). The backend is part of the
        result: an emulator time says nothing about a GPU's."""
        if repeat < 1:
            raise OptionError(f"repeat must be at least 1, got {repeat}")
        if warmup < 0:
            raise OptionError(f"warmup must be at least 0, got {warmup}")
        times = []
        with logs.steps("timed run", warmup + repeat, _log) as bar:
            for k in range(warmup + repeat):
                bar.step("warm-up" if k < warmup else f"{self.backend} backend")
                t0 = time.perf_counter()
                outs = self.run(feeds)
                for a in outs.values():
                    to_host(a)
                if k >= warmup:
                    times.append(time.perf_counter() - t0)
        return Measured(self.backend, tuple(times), warmup)

    def verify(
        self,
        feeds: dict | None = None,
        seed: int = 0,
        rtol: float | None = None,
        atol: float | None = None,
        against: Reference | str = Reference.REFERENCE,
    ) -> list[Check]:
        """Run the model on `feeds` (else `random_inputs(model, seed)`) and compare every graph
        output and every subgraph output with the float64 reference (verify.py derives each
        tolerance; `rtol`/`atol` widen it), and with onnxruntime too for `against="onnxruntime"`."""
        if str(against) == "onnxruntime":  # before the work, not after it
            logs.require_extra(logs.Extra.ONNXRUNTIME, "verify against onnxruntime")
        feeds = random_inputs(self.model, seed) if feeds is None else feeds
        inner = tuple(o for sg in self.subgraphs for o in sg.outputs if o not in self.model.outputs)
        with logs.steps("verify", 2, _log) as bar:
            bar.step(f"running the model ({self.backend} backend)")
            ours = self.run(feeds, keep=inner)
            feeds = {k: v for k, v in feeds.items() if k not in self.model.specialized}
            bar.step(f"the float64 reference{' and onnxruntime' if str(against) == 'onnxruntime' else ''}")
            return verify_values(self.model, feeds, ours, rtol, atol, against)


def _routing(routing: Routing | str) -> Routing:
    try:
        return Routing(routing)
    except ValueError:
        raise OptionError(f"routing must be one of {[r.value for r in Routing]}, got {routing!r}") from None


def optimize(
    source: ModelSource | OnnxModel,
    shapes: dict | None = None,
    specialize: dict | None = None,
    target: str = "auto",
    gpu: GPUSpec = H100,
    schedules: ScheduleSource | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    compile_views: bool = False,
    routing: Routing | str = Routing.MODEL,
) -> OptimizedModel:
    """Load, partition and compile an ONNX model. `schedules(k, signature)` may return a saved
    Schedule for subgraph k; a subgraph Panamera cannot compile falls back to the library with
    the reason (a ScheduleError is raised, never swallowed: a saved schedule must fit).
    `routing`: who runs each MatMul / Gemm Panamera can plan: "model" (the faster, modeled on
    `gpu`: route.py), or "panamera" / "library" to pin it."""
    model = source if isinstance(source, OnnxModel) else load_model(source, shapes, specialize)
    part = partition(model, compile_views, gpu, _routing(routing), host=plan_and_run(target)[1])
    fused = {f.conv.index: f for f in part.fused}  # a host Conv's epilogue nodes: units of their own no more
    inside = {n.index for f in part.fused for n in f.nodes}
    units: dict[int, Subgraph | LibraryNode] = {
        n.index: LibraryNode(n, why, fused=fused.get(n.index)) for n, why in part.library if n.index not in inside
    }
    _log.debug("partitioned: %d subgraph(s), %d library node(s)", len(part.groups), len(part.library))
    with logs.steps("compiling subgraph", len(part.groups), _log) as bar:
        for k, nodes in enumerate(part.groups):
            what = "+".join(n.op_type for n in nodes)
            bar.step(what[:40])
            if progress:
                progress(k, len(part.groups), what)
            try:
                sg = compile_subgraph(model, k, nodes, target, gpu, schedules)
            except ScheduleError:
                raise
            except PanameraError as e:
                _log.debug("subgraph %d (%s) left to the library: %s", k, what, e)
                for n in nodes:
                    units[n.index] = LibraryNode(n, f"Panamera could not compile its subgraph: {e}")
                continue
            _log.debug("subgraph %d (%s): %d kernel(s) in %.3f s", k, what, len(sg.compiled.plan.kernels), sg.compile_s)
            units[nodes[0].index] = sg
    # Run order: a topological order of the units (convex groups make it a DAG).
    unit_of = {}
    for key, u in units.items():
        for n in u.nodes:
            unit_of[n.index] = key
    dag = nx.DiGraph()
    dag.add_nodes_from(units)
    dag.add_edges_from((unit_of[a], unit_of[b]) for a, b in graph(model).edges if unit_of[a] != unit_of[b])
    order = nx.lexicographical_topological_sort(dag)
    return OptimizedModel(model, tuple(units[k] for k in order), target, gpu, part)
