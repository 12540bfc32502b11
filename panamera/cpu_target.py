"""`target="cpu"`: the stages up to the kernel groups as for every target, then the CPU mapper
(schedule/cpu_mapper.py) with the CPU model (model/cpu.py: this machine's caches and probed
rates, runtime/cpu_probe.py) choosing splits and formulations, C++ with OpenMP + SIMD per group
(codegen/cpu_kernel.py) and the CPU backend (runtime/cpu.py).

Covered: element-wise groups, ROW / COLUMN / ALL reductions with fused element-wise producers
and epilogues, split across cores when their outputs cannot occupy them, and stitched ROW groups
(softmax, layer_norm rows) and ALL groups (x - mean(x): one row, on one core). Refused with
CpuUnsupportedError: fused attention, contractions (matmul, einsum), stitched COLUMN groups,
reductions over an empty extent, indirect writes (the atomic scatter-add), and replaying a GPU `schedule=`.

>>> import numpy as np, panamera as pn
>>> k = pn.compile(pn.sum(pn.placeholder((4, 100), "float32"), axis=1), target="cpu")
>>> k(np.ones((4, 100), np.float32)).tolist()
[100.0, 100.0, 100.0, 100.0]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .codegen import islast
from .codegen.cpu_kernel import CpuKernel, CpuUnsupportedError, render_cpu
from .codegen.header import prelude
from .compiler import (
    TARGET_COMPILERS,
    Compiled,
    Options,
    Target,
    _output_specs,
    _result_spec,
    kernel_name,
    rebind_stages,
    run_stages,
    write_out,
)
from .frontend.tensor import Tensor
from .model.cpu import Caches, CpuModel
from .runtime import cpu_probe
from .runtime.cpu import SIMD_MATH, CpuExecutor
from .runtime.plan import InputSpec, LaunchPlan
from .schedule.contraction import contraction_info
from .schedule.cpu_cost import PlanTime, plan_time
from .schedule.cpu_mapper import CpuDecision, CpuMachine, map_cpu
from .schedule.formulation import choose_formulations


@dataclass(frozen=True)
class CpuCompiled(Compiled):
    """A program compiled for the CPU: `k(*arrays, threads=None)`; `k.cpu_kernels` holds each
    group's decision and C++."""

    cpu_kernels: tuple[CpuKernel, ...] = ()
    cpu_source: str = ""
    cpu_model: CpuModel | None = None

    source = property(lambda self: self.cpu_source)
    decisions = property(lambda self: tuple(k.decision for k in self.cpu_kernels))

    def __call__(self, *arrays, threads: int | None = None, **named):
        """Run on the CPU with `threads` OpenMP threads (default: the machine's cores); inputs,
        constant inputs and `out=` as `Compiled.__call__`. `order=` and `seed=` (the emulator's
        thread order) are accepted and have no effect: the CPU kernels' results do not depend on it."""
        args, out, _, _ = self._bind(arrays, named)
        outs = self.executor(args, threads=threads)
        if out is not None:
            return write_out(out, outs, self.single)
        return outs[0] if self.single else tuple(outs)

    def rebound(self, outs: tuple[Tensor, ...], single: bool) -> CpuCompiled:
        """This program (from the compile cache) for a graph of the same signature, with its own executor."""
        a = rebind_stages(self.stages, outs)
        ex = CpuExecutor(a.plan, self.cpu_source, self.executor.kernels, self.executor.threads)
        return dataclasses.replace(self, stages=a, single=single, executor=ex)

    def modeled(self, threads: int | None = None) -> PlanTime:
        """The CPU model's time of this plan on `threads` threads (default: the decisions'), and its limit."""
        pairs = [(g, k.decision) for g, k in zip((g for g in self.stages.groups if g.M * g.N), self.cpu_kernels)]
        return plan_time(pairs, self.cpu_model, _compulsory(self.stages), threads, len(self.stages.graph))

    def explain(self, section=None) -> str:
        """The CPU kernels, their decisions and modeled times against the limit, and the
        formulations chosen (one section: `section` is accepted for the GPU explain's signature
        and ignored)."""
        m = self.cpu_model
        p = self.modeled()
        lines = [
            f"Panamera plan: {len(self.cpu_kernels)} CPU kernel(s), target cpu",
            f"  machine: {m.describe()}",
            f"  modeled {p.total_us:.1f} us on {m.cores} thread(s); limit {p.limit_us:.1f} us (ratio {p.ratio:.2f})",
        ]
        for k, t in zip(self.cpu_kernels, p.kernels):
            lines.append(
                f"  kernel {k.name}: {k.decision.describe()}; modeled {t.total_us:.1f} us ({t.bound}-bound, "
                f"data in {t.level}, {t.threads} busy thread(s), fork {t.fork_us:.1f} + merge {t.merge_us:.1f} us)"
            )
        lines += [f"  formulation: {f.describe()}" for f in self.formulations]
        return "\n".join(lines)


def _refuse(a) -> None:
    if a.fused is not None:
        raise CpuUnsupportedError("target='cpu': fused attention is not supported yet; use target='emulator'")
    for g in a.groups:
        if g.M > 0 and g.N == 0:
            raise CpuUnsupportedError(
                f"target='cpu': a reduction over an empty extent ({g.names}) is not supported yet"
            )
        if g.M * g.N and contraction_info(g) is not None:
            raise CpuUnsupportedError(
                f"target='cpu': contractions (matmul, einsum: {g.names}) are not supported yet; use target='emulator'"
            )


def _compulsory(a) -> int:
    """Bytes no plan avoids: the program's inputs read once, its outputs written once."""
    return sum(t.size * t.dtype.itemsize for t in (*a.program.inputs, *a.graph))


def cpu_model(machine: CpuMachine | None = None) -> CpuModel:
    """This machine's CPU model: cores and SIMD of `machine`, caches from /sys, rates probed once
    (runtime/cpu_probe.py, cached on disk)."""
    machine = machine or CpuMachine.detect()
    caches = Caches.detect()
    return CpuModel(machine.cores, machine.simd_bytes, machine.name, caches, cpu_probe.rates(machine.cores, caches))


def compile_cpu(outs: tuple[Tensor, ...], options: Options, single: bool) -> CpuCompiled:
    """The stages through `groups`, then one CPU kernel per group."""
    if options.schedule is not None:
        raise CpuUnsupportedError("target='cpu': schedule= replays GPU decisions; it does not apply to the CPU")
    machine = CpuMachine.detect()
    model = cpu_model(machine)
    alone = Options(Target.EMULATOR, False, options.gpu)

    def cost(alternative: tuple[Tensor, ...]) -> float:  # formulations ranked by the CPU model (us)
        a = run_stages(alternative, alone, stop_after="groups")
        pairs = [(g, map_cpu(g, machine, options.split, model)) for g in a.groups if g.M * g.N]
        return plan_time(pairs, model, _compulsory(a), None, len(a.graph)).total_us

    graph, chosen = choose_formulations(outs, cost)
    a = run_stages(graph, options, stop_after="groups")
    a = dataclasses.replace(a, outputs=outs, formulations=chosen)
    _refuse(a)
    kernels = []
    for k, g in enumerate(a.groups):
        if g.M * g.N:
            d: CpuDecision = map_cpu(g, machine, options.split, model)
            kernels.append(render_cpu(kernel_name(k, g), g, d))
    buffers = _output_specs(a.groups)
    for kern in kernels:
        for p in kern.params:
            buffers.setdefault(p.key, p)
    inputs = a.program.inputs
    plan = LaunchPlan(
        (),
        buffers,
        tuple(InputSpec(t.name, f"in:{t.uid}", t.shape, t.dtype) for t in inputs),
        tuple(_result_spec(t, inputs) for t in a.graph),
    )
    decls = sorted({r for k in kernels for r in k.reductions})
    body = islast.HELPERS + "\n".join([*decls, *(k.source for k in kernels)]) + "\n"
    source = "#include <cstdlib>\n" + SIMD_MATH + prelude(body) + body
    calls = tuple((k.name, tuple(p.key for p in k.params)) for k in kernels)
    a = dataclasses.replace(a, plan=plan, source=source)
    ex = CpuExecutor(plan, source, calls, machine.cores)
    return CpuCompiled(a, options, single, ex, "chosen by the CPU model", tuple(kernels), source, model)


TARGET_COMPILERS[Target.CPU] = compile_cpu
