"""`torch.compile(model, backend="panamera")`: reductions, normalizations and softmax-family ops
(and their element-wise neighbours) as Panamera kernels, everything else in eager PyTorch.

How a graph is compiled:

1. dynamo captures the model's graph and guards it (shapes, dtypes, grad mode); `backend`
   receives it. A graph that needs autograd (an input requires grad under grad mode) runs in
   eager PyTorch, with one `EagerFallbackWarning` giving the reason: Panamera compiles inference.
2. AOTAutograd lowers it to ATen ops (functional, inference graph) with static shapes. When
   dynamo hands over a dynamic graph (after a shape changed, dynamo's automatic dynamic shapes),
   the backend specializes it per concrete shape at its first call instead: Panamera's kernels
   are planned for static extents.
3. `partition.compile_partitions` partitions the ATen graph, compiles each Panamera subgraph
   with `pn.compile` (cached in memory by signature) and leaves the rest to eager PyTorch.

`stats()` counts graphs, recompilations (dynamo's recompiles of a frame and the backend's own
shape specializations), Panamera subgraphs and kernels, and the ops left to eager; each graph's
`GraphReport` shows the partition. Registered as "panamera" through the `torch_dynamo_backends`
entry point (pyproject.toml: torch finds it at the first lookup of a name it does not know), by
importing this module, and by `import panamera` when torch is already imported.

Options (`torch.compile(..., options={...})`): `target` ("emulator" or "cuda"; by default the
device of the graph's tensors: CPU tensors run on the emulator, a correctness tool) and
`deterministic`.

>>> import torch, panamera  # doctest: +SKIP
>>> f = torch.compile(lambda x: torch.softmax(x, -1).sum(-1), backend="panamera")  # doctest: +SKIP
>>> with torch.no_grad():  # doctest: +SKIP
...     f(torch.randn(4, 16))
>>> panamera.torch_backend.stats().kernels  # doctest: +SKIP
1
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..enums import StrEnum
from ..errors import EagerFallbackWarning, EmulatorWarning, OptionError

if TYPE_CHECKING:
    from .partition import SubgraphReport

__all__ = ["GraphReport", "Stats", "backend", "register", "reset_stats", "stats"]

NAME = "panamera"


class Reason(StrEnum):
    """Why a whole graph runs in eager PyTorch."""

    AUTOGRAD = "autograd"


@dataclass(frozen=True)
class GraphReport:
    """One compiled graph: its compile id, input shapes, Panamera subgraphs and eager ops."""

    compile_id: str
    shapes: tuple
    subgraphs: tuple[SubgraphReport, ...] = ()
    eager_ops: tuple[str, ...] = ()
    fallback: str = ""  # the reason the whole graph runs eagerly, if it does

    @property
    def kernels(self) -> int:
        return sum(s.kernels for s in self.subgraphs)

    def describe(self) -> str:
        if self.fallback:
            return f"graph {self.compile_id}: eager ({self.fallback})"
        compiled = [s for s in self.subgraphs if s.kernels]
        return (
            f"graph {self.compile_id} {self.shapes}: {len(compiled)} Panamera subgraph(s), {self.kernels} kernel(s), "
            f"{len(self.eager_ops)} op(s) in eager PyTorch"
        )


@dataclass
class Stats:
    """What the backend did since the last `reset_stats()`."""

    graphs: int = 0  # graphs compiled (dynamo's compiles and the backend's specializations)
    recompiles: int = 0  # of them, recompilations of a frame or a new shape of a dynamic graph
    fallbacks: int = 0  # graphs run entirely in eager PyTorch
    reports: list[GraphReport] = field(default_factory=list)

    @property
    def subgraphs(self) -> int:
        return sum(1 for r in self.reports for s in r.subgraphs if s.kernels)

    @property
    def kernels(self) -> int:
        return sum(r.kernels for r in self.reports)


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
    target = options.get("target")
    if target is None:
        on_gpu = any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in inputs)
        target = "cuda" if on_gpu else "emulator"
        if not on_gpu:
            _warn_once(
                "emulator",
                "torch.compile(backend='panamera') with CPU tensors runs Panamera's kernels on the CPU emulator, a "
                "correctness tool, not a fast CPU path; options={'target': 'emulator'} says so and silences this",
                EmulatorWarning,
            )
    if target not in ("emulator", "cuda"):
        raise OptionError(f"torch.compile(backend='panamera'): unknown target {target!r}; use 'emulator' or 'cuda'")
    return target


def _needs_autograd(inputs) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)


def _record(report: GraphReport, recompile: bool) -> None:
    with _lock:
        _stats.graphs += 1
        _stats.recompiles += int(recompile)
        _stats.fallbacks += int(bool(report.fallback))
        _stats.reports.append(report)


def _static(gm: torch.fx.GraphModule, inputs: list, options: dict, compile_id: str, recompile: bool):
    """AOTAutograd's inference graph of `gm` at static shapes, partitioned and compiled."""
    from torch._functorch.aot_autograd import aot_module_simplified

    from . import partition

    target, deterministic = _target(options, inputs), bool(options.get("deterministic", False))

    def compile_aten(aten_gm: torch.fx.GraphModule, aten_inputs):
        fused, reports = partition.compile_partitions(aten_gm, target, deterministic)
        for r in reports:
            if not r.kernels:
                _warn_once(r.eager_reason, f"a subgraph runs in eager PyTorch: {r.eager_reason}", EagerFallbackWarning)
        eager = partition.eager_ops(fused, reports)
        _record(GraphReport(compile_id, _shapes(inputs), tuple(reports), eager), recompile)
        return fused.forward

    return aot_module_simplified(gm, inputs, fw_compiler=compile_aten)


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
        fn = self.compiled.get(key)
        if fn is None:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            cid = f"{self.compile_id}/shape{len(self.compiled)}"
            fn = self.compiled[key] = _static(_concrete(self.gm, args), tensors, self.options, cid, True)
        return fn(*(a for a in args if isinstance(a, torch.Tensor)))


def backend(gm: torch.fx.GraphModule, example_inputs: list, options: dict | None = None, mode: str | None = None):
    """The torch.compile backend: `torch.compile(model, backend="panamera", options={...})`;
    `mode` is accepted and unused."""
    options = dict(options or {})
    unknown = set(options) - {"target", "deterministic"}
    if unknown:
        raise OptionError(
            f"torch.compile(backend='panamera'): unknown option(s) {sorted(unknown)}; use target, deterministic"
        )
    compile_id, recompile = _compile_id()
    if _needs_autograd(example_inputs):
        reason = (
            "torch.compile(backend='panamera'): this graph needs autograd (inputs require grad under grad mode), "
            "so it runs in eager PyTorch; Panamera compiles inference (use torch.no_grad() or torch.inference_mode())"
        )
        warnings.warn(reason, EagerFallbackWarning, stacklevel=2)
        _record(GraphReport(compile_id, _shapes(example_inputs), fallback=str(Reason.AUTOGRAD)), recompile)
        return gm.forward
    dynamic = any(isinstance(a, torch.SymInt) for a in example_inputs) or any(
        not isinstance(s, int) for t in example_inputs if isinstance(t, torch.Tensor) for s in t.shape
    )
    if dynamic:
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
