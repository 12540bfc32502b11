"""`target="cpu"` for a deterministic scatter-add of rows (frontend/scatter.py
`scatter_add_sorted`, or the form of that name `scatter_add_rows` offers): recognized as the
whole computation by segments.py (its preconditions 1-3), planned by schedule/cpu_segments.py
(privatized tables or sorted segments, the CPU model's choice), rendered by
codegen/cpu_segments.py, run by the CPU backend like every CPU program (runtime/cpu.py). The
bits depend on the ids alone, never on the call's thread count.

cpu_target.py calls `cost_us` while it ranks formulations and `compile_cpu_scatter` when the
chosen graph is a sorted scatter.

>>> import numpy as np, panamera as pn
>>> from panamera.frontend.scatter import scatter_add_sorted
>>> ids = pn.placeholder((4,), "int64", name="ids")
>>> k = pn.compile(scatter_add_sorted(ids, pn.placeholder((4, 2), name="g"), rows=3), target="cpu")
>>> k(np.array([2, 0, 2, 2]), np.ones((4, 2), np.float32)).tolist()
[[1.0, 1.0], [0.0, 0.0], [3.0, 3.0]]
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

from . import segments as sorted_segments
from .codegen.cpu_segments import HELPER, PARAMS, render_cpu_scatter
from .codegen.header import prelude
from .compiled import _tensors
from .cpu_compiled import CpuCompiled, cpu_model
from .dtypes import as_dtype
from .errors import Unsupported
from .frontend.tensor import Tensor
from .launch_plan import view_source
from .model.cpu import CpuModel, call_us, limit_us
from .options import Options
from .runtime.cpu import CpuExecutor
from .runtime.cpu_call import program_entry
from .runtime.plan import BufferRole, BufferSpec, IndexCheck, InputSpec, Launch, LaunchPlan, LaunchRole, ResultSpec
from .schedule.cpu_cost import PlanTime
from .schedule.cpu_segments import CpuScatterPlan, plan_cpu_scatter, scratch
from .stages import run_stages


def plan_of(node: Tensor, model: CpuModel, **pinned) -> CpuScatterPlan:
    """The CPU plan of sorted-scatter node `node` (`pinned`: `form`, `chunks`)."""
    return plan_cpu_scatter(sorted_segments.problem_of(node), model, **pinned)


def cost_us(graph: tuple[Tensor, ...], alternative: tuple[Tensor, ...], model: CpuModel) -> float | None:
    """The modeled µs of a call of `alternative` (a formulation of one choice point of `graph`)
    when it holds a sorted scatter: infinite where it cannot be compiled there (segments.py's
    preconditions); None when it holds none (the CPU kernels' cost applies)."""
    if not sorted_segments.recognize_any(alternative):
        return None
    if not sorted_segments.fits(graph, alternative):
        return math.inf
    try:
        node = sorted_segments.recognize(alternative)
    except Unsupported:
        return math.inf
    return call_us(1) + plan_of(node, model).modeled_us


@dataclass(frozen=True, repr=False)
class CpuScatterCompiled(CpuCompiled):
    """A scatter-add compiled for the CPU: `k(*arrays, threads=None)` as every CPU program;
    `k.scatter` holds its plan (the form, the modeled time of each form offered)."""

    scatter: CpuScatterPlan | None = None

    def modeled(self, threads: int | None = None) -> PlanTime:
        """The plan's modeled time (on every core: `threads` moves only the limit) and its limit."""
        m, node = self.cpu_model, self.stages.segment
        return PlanTime((), call_us(1) + self.scatter.modeled_us, limit_us(_compulsory(node), m, threads))

    def explain(self, section=None) -> str:
        """The plan, its modeled time against the limit, and the formulations chosen."""
        p = self.modeled()
        lines = [
            "Panamera plan: 1 CPU kernel, target cpu (a deterministic scatter-add)",
            f"  machine: {self.cpu_model.describe()}",
            f"  modeled {p.total_us:.1f} us on {self.cpu_model.cores} thread(s); limit {p.limit_us:.1f} us "
            f"(ratio {p.ratio:.2f})",
            f"  kernel {self.plan.launches[0].kernel}: {self.scatter.describe()}",
        ]
        return "\n".join(lines + [f"  formulation: {f.describe()}" for f in self.formulations])

    def __repr__(self) -> str:
        return (
            f"<Compiled ({_tensors(self.inputs)}) -> ({_tensors(self.outputs)})\n"
            f"  1 CPU kernel [{self.plan.launches[0].kernel}: {self.scatter.form.value}]; target cpu; {self.origin}>"
        )


def compile_pinned(outputs, **pinned) -> CpuScatterCompiled:
    """`outputs` (a sorted scatter alone) compiled for the CPU with the plan's choices `pinned`
    (`form`, `chunks`): the tests show every choice gives the bits of its form at any thread count.

    >>> import panamera as pn
    >>> from panamera.frontend.scatter import scatter_add_sorted
    >>> from panamera.schedule.cpu_segments import CpuScatterForm
    >>> s = scatter_add_sorted(pn.placeholder((4,), "int64"), pn.placeholder((4, 2)), rows=3)
    >>> compile_pinned(s, form=CpuScatterForm.PRIVATIZED, chunks=3).scatter.chunks
    3
    """
    graph = tuple(outputs) if isinstance(outputs, list | tuple) else (outputs,)
    options = Options.make(target="cpu")
    return compile_cpu_scatter(graph, graph, options, len(graph) == 1, (), cpu_model(), **pinned)


def compile_cpu_scatter(graph, outs, options, single: bool, chosen, model: CpuModel, **pinned) -> CpuScatterCompiled:
    """The CPU program of `graph`, a sorted scatter alone (segments.py preconditions 1-3), for the
    caller's outputs `outs` with the formulations `chosen`; `pinned`: the plan's `form`, `chunks`."""
    a = run_stages(graph, options, stop_after="groups")
    p = plan_of(a.segment, model, **pinned)
    plan, source, calls = launch_plan(a.segment, p, a.graph, a.program.inputs)
    source = "#include <cstdlib>\n" + source + program_entry(plan, calls) + "\n"
    a = dataclasses.replace(a, outputs=outs, formulations=chosen, plan=plan, source=source)
    ex = CpuExecutor(plan, source, calls, model.cores)
    return CpuScatterCompiled(a, options, single, ex, "chosen by the CPU model", (), source, model, p)


def _compulsory(node: Tensor) -> int:
    ids, src = node.inputs
    return ids.size * ids.dtype.itemsize + src.size * src.dtype.itemsize + node.size * node.dtype.itemsize


def launch_plan(node: Tensor, p: CpuScatterPlan, graph: tuple[Tensor, ...], inputs: tuple[Tensor, ...]):
    """(the LaunchPlan, the C++ source, the executor's kernel table) of plan `p`."""
    ids, src = (view_source(t) for t in node.inputs)
    digest = hashlib.sha1(repr((p.form, p.n, p.rows, p.width, p.ids.name, p.src.name, p.skip, p.chunks)).encode())
    name = f"pn_cpu_scatter_{digest.hexdigest()[:8]}"
    acc, i64 = p.problem.acc_dtype, as_dtype("int64")
    keys = {"ids": f"in:{ids.uid}", "src": f"in:{src.uid}", "out": f"out:{node.uid}"}
    buffers = {
        keys["ids"]: BufferSpec(keys["ids"], ids.dtype.c_type, ids.dtype, p.n, BufferRole.INPUT, "ids", uid=ids.uid),
        keys["src"]: BufferSpec(
            keys["src"], src.dtype.c_type, src.dtype, src.size, BufferRole.INPUT, "src", uid=src.uid
        ),
        keys["out"]: BufferSpec(keys["out"], p.src.c_type, p.src, node.size, BufferRole.OUTPUT, "out", uid=node.uid),
        "scatter:bad": BufferSpec("scatter:bad", "long long", i64, 1, BufferRole.PARTIALS, "bad"),
    }
    for what, size in scratch(p).items():
        key, dt = f"scatter:{what}", acc if what == "tables" else i64
        buffers[key] = BufferSpec(key, dt.c_type, dt, size, BufferRole.PARTIALS, what)
    params = tuple(keys.get(what, f"scatter:{what}") for what in PARAMS[p.form])
    launch = Launch(name, (1, 1, 1), (1, 1, 1), tuple(("buf", k) for k in params), LaunchRole.MAP,
                    form=p.form.value.upper(), mapping=p.describe())  # fmt: skip
    order = [t.uid for t in inputs]
    specs = tuple(InputSpec(t.name, f"in:{t.uid}", t.shape, t.dtype) for t in inputs)
    label = node.attr("index") or ids.label
    checks = (IndexCheck("scatter:bad", order.index(ids.uid), label, p.rows, p.n, "scatter-add"),)
    out = graph[0]
    plan = LaunchPlan(
        (launch,), buffers, specs, (ResultSpec(out.shape, out.size, keys["out"]),), checks if node.attr("check") else ()
    )
    body = HELPER + render_cpu_scatter(name, p)
    return plan, prelude(body) + body, ((name, params, None),)
