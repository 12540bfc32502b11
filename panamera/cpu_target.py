"""`target="cpu"`: the stages up to the kernel groups as for every target, then the CPU mapper
(schedule/cpu_mapper.py) with the CPU model (model/cpu.py: this machine's caches and probed
rates, runtime/cpu_probe.py) choosing splits and formulations, C++ with OpenMP + SIMD per group
(codegen/cpu_kernel.py) and the CPU backend (runtime/cpu.py).

Covered: element-wise groups, ROW / COLUMN / ALL reductions with fused element-wise producers
and epilogues, split across cores when their outputs cannot occupy them (merged in chunk
order, by the last task, or by atomics: schedule/cpu_mapper.py), stitched ROW groups (softmax,
layer_norm rows) and ALL groups (x - mean(x): one row, on one core), reductions over an empty
extent (numpy's values), contractions (generated as reductions, K split when the outputs are
few; large float ones read straight from their operands run in numpy's BLAS:
schedule/cpu_blas.py) and attention (as its chain: the CPU has no fused attention template).
One-hot selections summed over their axis (cross_entropy's and nll_loss's target logit) are read
as gathers, one element per row (schedule/onehot.py), before the model ranks formulations.
A deterministic scatter-add of rows compiled alone has CPU kernels of its own (cpu_segments.py:
privatized tables or sorted segments). Refused with CpuUnsupportedError: replaying a GPU
`schedule=`, and the group kinds cpu_kernel.py's `check` names (indirect writes: the atomic
scatter-add).

>>> import numpy as np, panamera as pn
>>> k = pn.compile(pn.sum(pn.placeholder((4, 100), "float32"), axis=1), target="cpu")
>>> k(np.ones((4, 100), np.float32)).tolist()
[100.0, 100.0, 100.0, 100.0]
"""

from __future__ import annotations

import dataclasses
import math

from . import cpu_segments
from . import segments as sorted_segments
from .codegen import islast
from .codegen.cpu_host_kernels import host_blas, render_cpu_empty
from .codegen.cpu_kernel import CpuKernel, CpuUnsupportedError, render_cpu
from .codegen.cpu_lanes import LANE_FOLD
from .codegen.cpu_merge import ATOMIC_COMBINE
from .codegen.cpu_tile import TILE_SOURCE
from .codegen.header import prelude
from .compiler import TARGET_COMPILERS
from .cpu_compiled import CpuCompiled, _bound, _compulsory, cpu_model
from .frontend.tensor import Tensor
from .launch_plan import _output_specs, _result_spec
from .options import Options, Target
from .poly import attention as fused_attention
from .poly.statement import Form
from .runtime import cpu_gemm
from .runtime.cpu import SIMD_MATH, CpuExecutor
from .runtime.cpu_call import program_entry
from .runtime.plan import BufferRole, InputSpec, Launch, LaunchPlan, LaunchRole
from .schedule import onehot
from .schedule.cpu_contraction import cpu_plans
from .schedule.cpu_cost import plan_time
from .schedule.cpu_mapper import CpuMachine
from .schedule.formulation import choose_formulations, nondeterministic, substitute
from .stages import kernel_name, run_stages


def cpu_source(parts: list[str]) -> str:
    """The C++ of a CPU library (a static program's or a symbolic class's, dynamic_cpu.py): the
    preamble every kernel may need (the ATOMIC merge's compare-and-swap, codegen/cpu_merge.py; the
    lane folds, codegen/cpu_lanes.py; the SIMD math, runtime/cpu.py; the header's prelude of what
    the body uses, codegen/header.py), then isl's helpers and the `parts` (declared reductions,
    kernels, entry points)."""
    body = islast.HELPERS + "\n".join(parts) + "\n"
    return "#include <cstdlib>\n" + ATOMIC_COMBINE + LANE_FOLD + SIMD_MATH + prelude(body) + body


def _unfused(outs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Fused attention nodes replaced by their chains (q @ k.T, a softmax per query row, @ v):
    the CPU target has no fused attention template; the chain's contractions and stitched rows
    are CPU kernels (materialized scores, not an online softmax)."""
    nodes = fused_attention.chains_in(outs)
    return substitute(outs, {t.uid: fused_attention.chain_of(t) for t in nodes}) if nodes else outs


def _cpu_graph(outs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """The graph the CPU plans: attention as its chain (`_unfused`), one-hot selections summed
    over their axis read as gathers (schedule/onehot.py: cross_entropy's target logit, one read per row)."""
    return onehot.gathers(_unfused(outs))


def _launch(k: CpuKernel) -> Launch:
    """One CPU kernel as a record of the plan (what reports and `repr` count; the CPU executor
    calls the kernel itself): no grid, `threads` in the block's place, no modeled time here (the CPU
    model's figures are `CpuCompiled.modeled()` and `explain()`)."""
    d = k.decision
    empty = d.N == 0
    return Launch(
        k.name,
        (1, 1, 1),
        (d.threads, 1, 1),
        tuple(("buf", p.key) for p in k.params),
        role=LaunchRole.INIT if empty else LaunchRole.MAP if d.form == Form.MAP else LaunchRole.REDUCE,
        form="" if empty else d.form,
        blocks_per_reduction=d.split,
        bytes_read=sum(p.nbytes for p in k.params if p.role == BufferRole.INPUT),
        bytes_written=sum(p.nbytes for p in k.params if p.role == BufferRole.OUTPUT),
        mapping=k.describe(),
    )


def compile_cpu(outs: tuple[Tensor, ...], options: Options, single: bool) -> CpuCompiled:
    """The stages through `groups`, then one CPU kernel per group."""
    if options.schedule is not None:
        raise CpuUnsupportedError("target='cpu': schedule= replays GPU decisions; it does not apply to the CPU")
    machine = CpuMachine.detect()
    model = cpu_model(machine)
    mapping = (options.split, options.deterministic)

    def cost(alternative: tuple[Tensor, ...]) -> float:  # formulations ranked by the CPU model (us)
        if fused_attention.chains_in(alternative):  # no fused attention template on the CPU
            return math.inf
        if (scatter := cpu_segments.cost_us(outs, alternative, model)) is not None:
            return scatter  # a deterministic scatter-add alone: its own CPU plan (cpu_segments.py)
        if nondeterministic(alternative) is not None:
            return math.inf  # no indirect writes on the CPU (cpu_kernel.py `check`)
        # staged as the plan below renders it (its options: no stitching under split=, no column partials,
        # operands stored), so the cost is the rendered plan's modeled time
        a = run_stages(_cpu_graph(alternative), options, stop_after="groups")
        pairs = [  # the groups as the plan below renders them: BLAS-able contractions alone, tile epilogues fused
            (g, d) for group in a.groups for g, d in cpu_plans(group, machine, model, *mapping) if d is not None
        ]
        return plan_time(pairs, model, _compulsory(a), None, len(a.graph)).total_us

    graph, chosen = choose_formulations(outs, cost)
    if sorted_segments.recognize(graph) is not None:  # the scatter alone, else Unsupported (its precondition 1)
        return cpu_segments.compile_cpu_scatter(graph, outs, options, single, chosen, model)
    a = run_stages(_cpu_graph(graph), options, stop_after="groups")
    # each group's kernels (BLAS's alone) and decisions, made once and carried to the rendering
    pairs = tuple(p for g in a.groups for p in cpu_plans(g, machine, model, *mapping))
    a = dataclasses.replace(a, outputs=outs, formulations=chosen, groups=tuple(g for g, _ in pairs))
    kernels = []
    buffers = _output_specs(a.groups)
    for k, (g, d) in enumerate(pairs):
        if g.M > 0 and g.N == 0:  # reductions over nothing
            kernels.append(render_cpu_empty(kernel_name(k, g), g, buffers, machine.cores))
        elif d is not None:  # the mapper's decision; a contraction's BLAS or tile kernel is its `gemm` plan
            if d.gemm is not None:
                kernels.append(host_blas(kernel_name(k, g), g, d, cpu_gemm.blas() is not None))
            else:
                kernels.append(render_cpu(kernel_name(k, g), g, d))
    for kern in kernels:
        for p in kern.params:
            buffers.setdefault(p.key, p)
    inputs = a.program.inputs
    plan = LaunchPlan(
        tuple(_launch(kern) for kern in kernels),
        buffers,
        tuple(InputSpec(t.name, f"in:{t.uid}", t.shape, t.dtype) for t in inputs),
        tuple(_result_spec(t, inputs) for t in a.graph),
    )
    calls = tuple((k.name, tuple(p.key for p in k.params), k.by_numpy) for k in kernels)
    decls = sorted({r for k in kernels for r in k.reductions})
    decls += [cpu_gemm.GEMM_SOURCE] if any(k.calls_blas and k.source for k in kernels) else []
    decls += [TILE_SOURCE] if any(k.tile is not None for k in kernels) else []
    entry = [program_entry(plan, calls)]  # runtime/cpu_call.py
    source = cpu_source([*decls, *(k.source for k in kernels if k.source), *entry])
    a = dataclasses.replace(a, plan=plan, source=source)
    ex = CpuExecutor(plan, source, calls, machine.cores, _bound(a), any(k.calls_blas for k in kernels))
    return CpuCompiled(a, options, single, ex, "chosen by the CPU model", tuple(kernels), source, model)


TARGET_COMPILERS[Target.CPU] = compile_cpu
