"""`torch.compile(model, backend="panamera")`: reductions, normalizations and softmax-family ops
(and their element-wise neighbours) as Panamera kernels, in the forward and the backward pass;
everything else in eager PyTorch.

How a graph is compiled:

1. dynamo captures the model's graph and guards it (shapes, dtypes, grad mode); `backend`
   receives it. A dynamic graph (after a shape changed, dynamo's automatic dynamic shapes, or
   `torch._dynamo.mark_dynamic`) has SymInt extents (s0, 5*s0): its Panamera subgraphs are built
   over those symbols and compiled ONCE each into a `DynamicCompiled` (kernels per size class,
   issue 22; torch_backend/symbolic.py); a subgraph the symbolic path refuses is compiled per
   concrete shape at call time (`Stats.specializations` says which and why).
2. AOTAutograd lowers it to ATen ops (static or symbolic shapes), decomposing the backward ops through
   torch's own tables (backward.DECOMPOSITIONS). A graph that needs autograd (an input requires
   grad under grad mode) is split by torch's min-cut partitioner into a forward graph (which
   saves what the backward reads) and a backward graph, compiled when the backward first runs;
   any other graph is one inference graph. Panamera compiles each the same way:
3. `partition.compile_partitions` partitions the ATen graph, compiles each Panamera subgraph
   with `pn.compile` (cached in memory by signature) and leaves the rest to eager PyTorch, each
   op with its reason.

`stats()` counts graphs (forward, backward and inference: `GraphReport.phase`), recompilations
(dynamo's recompiles of a frame and the backend's own shape specializations), Panamera subgraphs
and kernels, Panamera programs (`programs`: static, symbolic and per-shape ones) and the size
classes the symbolic ones compiled (`size_classes`), and lists the ops left to eager with their reasons (`Stats.eager`); each graph's
`GraphReport` shows the partition. Each compiled graph is logged to the "panamera.torch" logger
(`TORCH_LOGS="+panamera"` shows it through torch's logging). Registered as "panamera" through the
`torch_dynamo_backends` entry point (pyproject.toml: torch finds it at the first lookup of a name
it does not know), by importing this module, and by `import panamera` when torch is imported.

Options (`torch.compile(..., options={...})`): `target` ("cpu", "emulator" or "cuda"; by default
the device of the graph's tensors: CPU tensors run on the CPU target, OpenMP C++, a subgraph it
refuses in eager PyTorch with the reason in its report; "emulator" runs the CUDA source) and
`deterministic` (split reductions merge through ordered partials, not atomics, and scatter-adds
take owner computes or sorted segments: gradients are bit-identical run to run; also on under
`torch.use_deterministic_algorithms(True)`). `mode` takes torch.compile's documented modes (`MODES` says what each
means here); torch allows `mode` or `options`, not both.

>>> import torch, panamera  # doctest: +SKIP
>>> f = torch.compile(lambda x: torch.softmax(x, -1).sum(-1), backend="panamera")  # doctest: +SKIP
>>> f(torch.randn(4, 16, requires_grad=True)).sum().backward()  # doctest: +SKIP
>>> [r.phase for r in panamera.torch_backend.stats().reports]  # doctest: +SKIP
['forward', 'backward']
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .. import options as _options
from ..enums import StrEnum
from ..errors import EagerFallbackWarning, OptionError, PanameraWarning

if TYPE_CHECKING:
    from .partition import EagerOp, SubgraphReport

__all__ = ["MODES", "GraphReport", "Phase", "Stats", "backend", "register", "reset_stats", "stats"]

NAME = "panamera"
log = logging.getLogger("panamera.torch")

# torch.compile's documented modes, and what each means for Panamera's plans.
MODES = {
    "default": "the cost model's plans",
    "reduce-overhead": "the same plans: split reductions already merge in a resident workspace, so a warm call is "
    "one launch per kernel; CUDA graphs are not captured",
    "max-autotune": "the same plans: the cost model (and schedules/) chooses each mapping; no timed search",
    "max-autotune-no-cudagraphs": "the same plans as max-autotune",
}


class Phase(StrEnum):
    """Which graph AOTAutograd handed over."""

    INFERENCE = "inference"  # no input requires grad (or grad mode is off): one graph
    FORWARD = "forward"  # the forward of a training graph: it also returns what the backward saves
    BACKWARD = "backward"  # compiled at the first backward call


@dataclass(frozen=True)
class GraphReport:
    """One compiled ATen graph: its compile id, phase, input shapes, Panamera subgraphs and the
    ops left to eager PyTorch with their reasons."""

    compile_id: str
    shapes: tuple
    subgraphs: tuple[SubgraphReport, ...] = ()
    eager: tuple[EagerOp, ...] = ()
    phase: Phase = Phase.INFERENCE

    @property
    def kernels(self) -> int:
        return sum(s.kernels for s in self.subgraphs)

    @property
    def modeled_us(self) -> float:
        """The modeled time of its Panamera kernels per call (the eager ops' time not included)."""
        return sum(s.modeled_us for s in self.subgraphs)

    @property
    def eager_ops(self) -> tuple[str, ...]:
        """The ATen ops left to eager PyTorch, in graph order."""
        return tuple(e.op for e in self.eager)

    def describe(self) -> str:
        compiled = [s for s in self.subgraphs if s.compiled]
        return (
            f"{self.phase} graph {self.compile_id} {self.shapes}: {len(compiled)} Panamera subgraph(s), "
            f"{self.kernels} kernel(s) ({self.modeled_us:.1f} us modeled), {len(self.eager)} op(s) in eager PyTorch"
        )


@dataclass
class Stats:
    """What the backend did since the last `reset_stats()`."""

    graphs: int = 0  # graphs compiled (dynamo's compiles, the backend's specializations; forward and backward)
    recompiles: int = 0  # of them, recompilations of a frame or a new shape of a dynamic graph
    reports: list[GraphReport] = field(default_factory=list)
    # per-shape compilations of subgraphs the symbolic path refused: (subgraph, argument shapes, why)
    specializations: list[tuple[str, tuple, str]] = field(default_factory=list)

    @property
    def subgraphs(self) -> int:
        return sum(1 for r in self.reports for s in r.subgraphs if s.compiled)

    @property
    def symbolic_programs(self) -> int:
        """Distinct Panamera programs compiled over symbolic shapes (each serves every size)."""
        return len(self._dynamic())

    @property
    def programs(self) -> int:
        """Panamera programs compiled: one per static subgraph, one per symbolic subgraph (distinct
        programs), one per shape of a per-shape fallback."""
        static = sum(1 for r in self.reports for s in r.subgraphs if s.mode == "static" and s.kernels)
        return static + self.symbolic_programs + len(self.specializations)

    @property
    def size_classes(self) -> int:
        """Size classes the symbolic programs compiled kernels for (so far: they compile on first use)."""
        return sum(k.stats()["classes_compiled"] for k in self._dynamic())

    def _dynamic(self) -> list:
        return list({id(s.program): s.program for r in self.reports for s in r.subgraphs if s.program}.values())

    @property
    def kernels(self) -> int:
        return sum(r.kernels for r in self.reports)

    @property
    def eager(self) -> Counter:
        """(ATen op, reason) -> how many nodes of every graph were left to eager PyTorch for it."""
        return Counter((e.op, e.reason) for r in self.reports for e in r.eager)

    def describe(self) -> str:
        """One line per graph, then each op left to eager with its reason."""
        lines = [r.describe() for r in self.reports]
        lines += [f"  per shape: {name} at {shapes}: {why}" for name, shapes, why in self.specializations]
        lines += [f"  eager: {op} x{n}: {reason}" for (op, reason), n in sorted(self.eager.items())]
        return "\n".join(lines)


_stats = Stats()
_lock = threading.Lock()
_warned: set[str] = set()


def stats() -> Stats:
    """The backend's counters and one report per compiled graph."""
    return _stats


def reset_stats() -> None:
    global _stats
    with _lock:
        _stats = Stats()


def _warn_once(key: str, message: str, category) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, category, stacklevel=3)


def _compile_id() -> tuple[str, bool]:
    """dynamo's id of the graph being compiled, and whether it recompiles a frame."""
    try:
        cid = torch._guards.CompileContext.current_compile_id()
    except Exception:  # pragma: no cover - outside dynamo, or a torch without it
        cid = None
    if cid is None:
        return "-", False
    return str(cid), bool(getattr(cid, "frame_compile_id", 0))


def _shapes(inputs) -> tuple:
    return tuple(tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor))


def _target(options: dict, inputs) -> str:
    """The target of a graph: options' `target`, else cuda for GPU tensors and the CPU target for
    CPU tensors (panamera/options.py: host_target); a subgraph the CPU target refuses stays eager, the reason
    in its report."""
    target = options.get("target")
    if target is None:
        on_gpu = any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in inputs)
        target = "cuda" if on_gpu else str(_options.host_target())
    if target not in ("cpu", "emulator", "cuda"):
        raise OptionError(
            f"torch.compile(backend='panamera'): unknown target {target!r}; use 'cpu', 'emulator' or 'cuda'"
        )
    return target


def _record(report: GraphReport, recompile: bool) -> None:
    with _lock:
        _stats.graphs += 1
        _stats.recompiles += int(recompile)
        _stats.reports.append(report)
    log.info("%s", report.describe())
    for e in report.eager:
        log.debug("  %s (%s) in eager PyTorch: %s", e.op, e.node, e.reason)


def _specialized(name: str, shapes: tuple, reason: str) -> None:
    with _lock:
        _stats.specializations.append((name, shapes, reason))
    log.info("per-shape Panamera subgraph %s at %s: %s", name, shapes, reason)


def _static(gm: torch.fx.GraphModule, inputs: list, options: dict, compile_id: str, recompile: bool):
    """AOTAutograd's graphs of `gm` (inference, or forward and backward; at static shapes, or
    symbolic ones for a dynamic graph), each partitioned and compiled."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    from . import partition
    from .backward import DECOMPOSITIONS

    # torch.use_deterministic_algorithms(True) asks the same of every backend
    deterministic = bool(options.get("deterministic", False)) or torch.are_deterministic_algorithms_enabled()
    target = _target(options, inputs)
    shapes = _shapes(inputs)

    def compiler(phase: Phase):
        def compile_aten(aten_gm: torch.fx.GraphModule, aten_inputs):
            fused, reports, eager = partition.compile_partitions(aten_gm, target, deterministic, _specialized)
            for r in reports:
                if not r.compiled:
                    _warn_once(
                        r.eager_reason, f"a subgraph runs in eager PyTorch: {r.eager_reason}", EagerFallbackWarning
                    )
            shown = shapes if phase != Phase.BACKWARD else _shapes(aten_inputs)
            _record(GraphReport(compile_id, shown, tuple(reports), eager, phase), recompile and phase != Phase.BACKWARD)
            return make_boxed_func(fused.forward)

        return compile_aten

    return aot_autograd(
        fw_compiler=compiler(Phase.FORWARD),
        bw_compiler=compiler(Phase.BACKWARD),
        inference_compiler=compiler(Phase.INFERENCE),
        decompositions=DECOMPOSITIONS,
        partition_fn=min_cut_rematerialization_partition,
        # an inference graph's input mutations stay in it as `copy_`s at its end (not AOTAutograd's
        # copies after the call), so a foreach optimizer step can write them in place
        # (torch_backend/foreach_map.py)
        keep_inference_input_mutations=True,
    )(gm, inputs)


def _concrete(gm: torch.fx.GraphModule, args) -> torch.fx.GraphModule:
    """A copy of a dynamic graph with its integer (SymInt) inputs replaced by their values."""
    graph = torch.fx.Graph()
    env: dict = {}
    out = graph.graph_copy(gm.graph, env)
    graph.output(out)
    holders = [n for n in graph.nodes if n.op == "placeholder"]
    for node, a in zip(holders, args):
        if not isinstance(a, torch.Tensor):
            for user in list(node.users):
                user.args = torch.fx.node.map_arg(user.args, lambda n, node=node, a=a: a if n is node else n)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda n, node=node, a=a: a if n is node else n)
            graph.erase_node(node)
    return torch.fx.GraphModule(gm, graph)


class _Specializing:
    """A dynamic graph compiled per concrete shape at its first call with it (Panamera plans
    static extents); each new shape is a recompilation."""

    def __init__(self, gm: torch.fx.GraphModule, options: dict, compile_id: str):
        self.gm, self.options, self.compile_id = gm, options, compile_id
        self.compiled: dict = {}

    def __call__(self, *args):
        key = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)
        key += (torch.is_grad_enabled(),)
        fn = self.compiled.get(key)
        if fn is None:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            cid = f"{self.compile_id}/shape{len(self.compiled)}"
            fn = self.compiled[key] = _static(_concrete(self.gm, args), tensors, self.options, cid, True)
        return fn(*(a for a in args if isinstance(a, torch.Tensor)))


def _check_mode(mode: str | None) -> None:
    if mode is None:
        return
    if mode not in MODES:
        raise OptionError(
            f"torch.compile(backend='panamera'): unknown mode {mode!r}; use one of {', '.join(map(repr, MODES))}"
        )
    log.info("mode %r: %s", mode, MODES[mode])
    if mode != "default":  # a mode that asks for something Panamera does differently: said once
        _warn_once(f"mode:{mode}", f"torch.compile(backend='panamera', mode={mode!r}): {MODES[mode]}", PanameraWarning)


def backend(gm: torch.fx.GraphModule, example_inputs: list, options: dict | None = None, mode: str | None = None):
    """The torch.compile backend: `torch.compile(model, backend="panamera", options={...})` or
    `mode=` one of `MODES`."""
    options = dict(options or {})
    unknown = set(options) - {"target", "deterministic"}
    if unknown:
        raise OptionError(
            f"torch.compile(backend='panamera'): unknown option(s) {sorted(unknown)}; use target, deterministic"
        )
    _check_mode(mode)
    compile_id, recompile = _compile_id()
    dynamic = any(isinstance(a, torch.SymInt) for a in example_inputs) or any(
        not isinstance(s, int) for t in example_inputs if isinstance(t, torch.Tensor) for s in t.shape
    )
    if dynamic:
        try:
            return _static(gm, list(example_inputs), options, compile_id, recompile)
        except OptionError:
            raise
        except Exception as e:  # noqa: BLE001 - AOTAutograd could not trace it symbolically: per concrete shape
            log.info("dynamic graph %s compiled per shape: %s: %s", compile_id, type(e).__name__, e)
            return _Specializing(gm, options, compile_id)
    return _static(gm, list(example_inputs), options, compile_id, recompile)


def register() -> None:
    """Register `backend` as torch.compile's "panamera" (idempotent)."""
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

    # An entry point torch has discovered is torch's to load and register (loading imports this
    # package, and a second registration of the name is an error there).
    if NAME not in _COMPILER_FNS and _BACKENDS.get(NAME) is None:
        register_backend(backend, name=NAME)


register()
