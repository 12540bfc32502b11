"""ONNX models with symbolic dims (dim_param) kept symbolic (issue 22, item 4).

`optimize_dynamic(model)` loads and optimizes the model at a size hint per dim_param (the
report's modeled figures are at the hint), then infers which values' extents follow which
dim_params: the model is loaded a second time with every dim_param scaled by its own prime, and
an extent that changes is fitted as a monomial `coef * prod(dim_params)` (`symbolic_shapes`).
Each Panamera subgraph is rebuilt over those symbols: one the symbolic path compiles becomes a
`DynamicCompiled`, serving every size; the others (and any subgraph whose extents are not
monomials) are compiled per call shape, cached, each with its reason. `run(feeds)` binds the
dim_params from the feeds' shapes, loads the model at those sizes once (constants and library
nodes are per size) and runs the hint's partition there.

>>> import numpy as np
>>> from onnx import helper, TensorProto
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "g",
...     [v("x", ["batch", 8])], [v("y", ["batch", 8])])
>>> dm = optimize_dynamic(helper.make_model(g).SerializeToString(), target="emulator")
>>> [dm.run({"x": np.zeros((n, 8), np.float32)})["y"].shape for n in (2, 3)]
[(2, 8), (3, 8)]
>>> dm.stats()["symbolic_subgraphs"], dm.stats()["per_shape_compiles"]
(1, 0)
"""

from __future__ import annotations

import dataclasses
import math
import threading

from .. import compile as pn_compile
from .. import logs
from ..dynamic import DynamicCompiled
from ..errors import PanameraError, ScheduleError, SymbolBindingError
from ..frontend.symbolic import NAME, Dim, make
from ..model.gpu import H100, GPUSpec
from ..schedule.param_schedule import SymbolicSchedule
from .build import build_subgraph_tensors
from .library import LibraryNode
from .model import ModelError, ModelSource, OnnxModel, decode, load_model
from .optimizer import OptimizedModel, Subgraph, compile_subgraph, optimize

_log = logs.get("onnx")

DEFAULT_HINT = 8  # a dim_param's size hint when none is given
PROBE_PRIMES = (3, 5, 7, 11, 13, 17, 19, 23)  # each dim_param scaled by its own prime in the probe load


def dim_params(source: ModelSource) -> dict[str, tuple[tuple[str, int], ...]]:
    """The model's symbolic dims: dim_param name -> the (input, axis) pairs it names."""
    _, proto = decode(source)
    inits = {i.name for i in proto.graph.initializer}
    found: dict[str, list] = {}
    for i in proto.graph.input:
        if i.name in inits:
            continue
        for axis, d in enumerate(i.type.tensor_type.shape.dim):
            if d.dim_param:
                found.setdefault(d.dim_param, []).append((i.name, axis))
    return {p: tuple(v) for p, v in found.items()}


def fit(a: int, b: int, sizes: dict[str, int], scale: dict[str, int]) -> int | Dim | None:
    """An extent that is `a` at `sizes` and `b` at the sizes scaled by the primes `scale` as a
    monomial over the dim_params, or None when it is not one.

    >>> fit(24, 72, {"B": 8}, {"B": 3})
    3*B
    >>> fit(9, 27, {"B": 8}, {"B": 3}) is None  # B + 1
    True
    """
    if a == b:
        return a
    if a <= 0 or b % a:
        return None
    ratio, syms = b // a, []
    for p, prime in scale.items():
        while ratio % prime == 0:
            ratio //= prime
            syms.append(p)
    base = math.prod(sizes[p] for p in syms)
    if ratio != 1 or a % base:
        return None
    return make(a // base, syms)


def symbolic_shapes(a: OnnxModel, b: OnnxModel, sizes: dict[str, int], scale: dict[str, int]) -> dict[str, tuple]:
    """Every value whose shape is a monomial of the dim_params in both loads, with that shape."""
    out = {}
    for name, v in a.values.items():
        w = b.values.get(name)
        if v.shape is None or w is None or w.shape is None or len(v.shape) != len(w.shape):
            continue
        shape = tuple(fit(x, y, sizes, scale) for x, y in zip(v.shape, w.shape))
        if None not in shape:
            out[name] = shape
    return out


def bind(params: dict, feeds: dict) -> dict[str, int]:
    """Each dim_param's size from the feeds' shapes (`params`: `dim_params`); a dim_param given two
    sizes is a SymbolBindingError naming both inputs."""
    sizes: dict[str, tuple[int, str, int]] = {}
    for p, where in params.items():
        for name, axis in where:
            a = feeds.get(name)
            if a is None or not hasattr(a, "shape") or len(a.shape) <= axis:
                continue  # run() says what is missing or malformed
            n = int(a.shape[axis])
            if p in sizes and sizes[p][0] != n:
                n0, name0, axis0 = sizes[p]
                raise SymbolBindingError(
                    f"dim_param {p!r} is {n} at input {name!r} axis {axis} but {n0} at input {name0!r} axis {axis0}"
                )
            sizes.setdefault(p, (n, name, axis))
    return {p: v[0] for p, v in sizes.items()}


@dataclasses.dataclass
class _Unit:
    """How one unit of the hint's partition runs at any size."""

    kind: str  # "symbolic" (one DynamicCompiled), "per-shape" (compiled per size) or "library"
    hinted: Subgraph | LibraryNode
    compiled: DynamicCompiled | None = None
    weights: dict | None = None
    reason: str = ""  # of a per-shape one: why the symbolic path refused it


class DynamicModel:
    """An ONNX model optimized once for every size of its dim_params (see the module doc)."""

    def __init__(self, source: ModelSource, hints: dict[str, int], target: str, gpu: GPUSpec,
                 schedules: dict[str, SymbolicSchedule] | None = None, **options):  # fmt: skip
        self.source, self.target, self.gpu, self.options = source, target, gpu, options
        self.replay = dict(schedules or {})  # a symbolic subgraph's class plans by label (a deploy folder's)
        self.params = dim_params(source)
        bad = [p for p in self.params if not NAME.match(p)]
        if bad:
            raise ModelError(f"dim_param name(s) {bad} cannot name a symbol (letters, digits and _ only)")
        unknown = sorted(set(hints) - set(self.params))
        if unknown:
            raise ModelError(f"size hint(s) for {unknown}: the model's dim_params are {sorted(self.params)}")
        self.hints = {p: int(hints.get(p, DEFAULT_HINT)) for p in self.params}
        if len(self.params) > len(PROBE_PRIMES):
            raise ModelError(f"{len(self.params)} dim_params: at most {len(PROBE_PRIMES)} are kept symbolic")
        self.hinted: OptimizedModel = optimize(load_model(source, self._shapes(self.hints)), target=target, gpu=gpu,
                                               **options)  # fmt: skip
        scale = dict(zip(self.params, PROBE_PRIMES))
        probe = load_model(source, self._shapes({p: n * scale[p] for p, n in self.hints.items()}))
        shapes = symbolic_shapes(self.hinted.model, probe, self.hints, scale)
        values = {k: dataclasses.replace(v, shape=shapes.get(k, v.shape)) for k, v in self.hinted.model.values.items()}
        symbolic_model = dataclasses.replace(self.hinted.model, values=values)
        self.units = tuple(self._unit(symbolic_model, u) for u in self.hinted.units)
        self._at: dict[tuple, OptimizedModel] = {}
        self._lock = threading.Lock()
        self.counters = {"per_shape_compiles": 0, "sizes": 0}

    def _shapes(self, sizes: dict[str, int]) -> dict:
        return {p: (n,) for p, n in sizes.items()}  # load_model's dim_param -> one value

    def _unit(self, symbolic_model: OnnxModel, u) -> _Unit:
        if isinstance(u, LibraryNode):
            return _Unit("library", u)
        schedule = self.replay.get(u.label)
        try:
            _, tensors, _, weights = build_subgraph_tensors(symbolic_model, u.nodes, u.outputs)
            k = pn_compile(list(tensors), target=self.target, gpu=self.gpu, schedule=schedule)
        except ScheduleError as e:  # a saved schedule that does not fit its subgraph: never replanned silently
            raise ModelError(f"{u.label}: its saved symbolic schedule does not replay: {e}") from None
        except Exception as e:  # noqa: BLE001 - refused symbolically: compiled per call shape instead
            reason = str(e) if isinstance(e, PanameraError) else f"{type(e).__name__}: {e}"
            return _Unit("per-shape", u, reason=reason)
        if not isinstance(k, DynamicCompiled):
            return _Unit("per-shape", u, reason="its extents do not depend on a dim_param")
        return _Unit("symbolic", u, k, weights)

    # -- public ----------------------------------------------------------------------------------
    def bind(self, feeds: dict) -> dict[str, int]:
        """Each dim_param's size from the feeds' shapes (`bind`)."""
        return bind(self.params, feeds)

    def at(self, sizes: dict[str, int]) -> OptimizedModel:
        """The model at concrete sizes: loaded there, the hint's partition with its symbolic
        programs, per-shape subgraphs compiled there (cached by the sizes)."""
        key = tuple(sorted(sizes.items()))
        with self._lock:
            if key not in self._at:
                self._at[key] = self._build(sizes)
                self.counters["sizes"] += 1
            return self._at[key]

    def sizes(self, feeds: dict) -> dict[str, int]:
        """The dim_params' sizes at these feeds (a hint where no feed binds one)."""
        return {**self.hints, **self.bind(feeds)}

    def run(self, feeds: dict, keep: tuple[str, ...] = ()) -> dict:
        """Run at the feeds' sizes (see `at`)."""
        return self.at(self.sizes(feeds)).run(feeds, keep)

    def stats(self) -> dict[str, int]:
        """Symbolic subgraphs (one program each), per-shape subgraphs and their compilations,
        library nodes, sizes met, and the size classes the symbolic programs compiled."""
        kinds = [u.kind for u in self.units]
        return {
            "symbolic_subgraphs": kinds.count("symbolic"),
            "per_shape_subgraphs": kinds.count("per-shape"),
            "library_nodes": kinds.count("library"),
            "per_shape_compiles": self.counters["per_shape_compiles"],
            "sizes": self.counters["sizes"],
            "size_classes": sum(u.compiled.stats()["classes_compiled"] for u in self.units if u.compiled),
        }

    def schedules(self, plan: tuple[dict[str, int], ...] = ()) -> dict[str, SymbolicSchedule]:
        """Each symbolic subgraph's class plans by label (what a deploy folder saves, replayed by
        `DynamicModel(..., schedules=)`), after planning the classes of the hints and of `plan`'s sizes."""
        out = {}
        for u in self.units:
            if u.kind == "symbolic":
                for sizes in (self.hints, *plan):
                    u.compiled.plan(u.compiled.size_class({p: sizes[p] for p in u.compiled.symbols}))
                out[u.hinted.label] = u.compiled.schedule
        return out

    def describe(self) -> str:
        """One line per Panamera subgraph: symbolic, or per shape with the reason."""
        lines = [f"dim_params {self.hints} (size hints; the modeled figures are at them)"]
        for u in self.units:
            if u.kind == "symbolic":
                lines.append(f"  {u.hinted.label}: one symbolic program over {', '.join(u.compiled.symbols)}")
            elif u.kind == "per-shape":
                lines.append(f"  {u.hinted.label}: compiled per shape: {u.reason}")
        return "\n".join(lines)

    def _build(self, sizes: dict[str, int]) -> OptimizedModel:
        model = load_model(self.source, self._shapes(sizes))
        if sizes == self.hints:
            model = self.hinted.model
        by_outputs = {n.outputs: n for n in model.nodes}
        try:
            units = [x for u in self.units for x in self._unit_at(model, by_outputs, u)]
        except KeyError as e:  # the model folds differently at these sizes: optimized there afresh
            _log.debug("sizes %s: node %s differs from the hint's partition; optimized afresh", sizes, e)
            self.counters["per_shape_compiles"] += 1
            return optimize(model, target=self.target, gpu=self.gpu, **self.options)
        return OptimizedModel(model, tuple(units), self.target, self.gpu, self.hinted.partition)

    def _unit_at(self, model: OnnxModel, by_outputs: dict, u: _Unit) -> list:
        if u.kind == "library":
            h = u.hinted
            fused = h.fused and dataclasses.replace(
                h.fused, conv=by_outputs[h.node.outputs], nodes=tuple(by_outputs[n.outputs] for n in h.fused.nodes)
            )
            return [LibraryNode(by_outputs[h.node.outputs], h.reason, fused=fused)]
        nodes = tuple(by_outputs[n.outputs] for n in u.hinted.nodes)
        if u.kind == "symbolic":
            return [dataclasses.replace(u.hinted, nodes=nodes, compiled=u.compiled, weights=u.weights)]
        if model is self.hinted.model:
            return [u.hinted]
        try:
            sg = compile_subgraph(model, u.hinted.id, nodes, self.target, self.gpu)
        except PanameraError as e:  # in node order: a group's nodes are topologically ordered
            return [LibraryNode(n, f"Panamera could not compile its subgraph at these sizes: {e}") for n in nodes]
        self.counters["per_shape_compiles"] += 1
        return [sg]


def unfixed(source: ModelSource, shapes: dict) -> tuple[str, ...]:
    """The model's dim_params that `shapes` (load_model's: input or dim_param name -> shape) leave
    symbolic."""
    return tuple(
        p for p, where in dim_params(source).items() if p not in shapes and not any(i in shapes for i, _ in where)
    )


def optimize_dynamic(
    source: ModelSource, hints: dict[str, int] | None = None, target: str = "auto", gpu: GPUSpec = H100, **options
) -> DynamicModel:
    """`optimize` keeping the model's dim_params symbolic; `hints` (dim_param -> size, default
    8) are where the report's figures are modeled."""
    return DynamicModel(source, dict(hints or {}), target, gpu, **options)


__all__ = [
    "DEFAULT_HINT",
    "DynamicModel",
    "dim_params",
    "fit",
    "optimize_dynamic",
    "symbolic_shapes",
    "unfixed",
    "bind",
]
