"""The compiled program of `target="cpu"`: `CpuCompiled` (the CPU kernels, their C++ and the CPU
model's figures; `k(*arrays, threads=None)`), and `cpu_model`, this machine's CPU model. Its own
module so that both CPU compile paths build on it without importing each other: cpu_target.py
(the stages' kernel groups) and cpu_segments.py (a deterministic scatter-add alone), which
cpu_target.py calls while it ranks formulations.

>>> import numpy as np, panamera as pn
>>> k = pn.compile(pn.sum(pn.placeholder((2, 3), "float32"), axis=1), target="cpu")
>>> isinstance(k, CpuCompiled), k(np.ones((2, 3), np.float32)).tolist()
(True, [3.0, 3.0])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .codegen.cpu_kernel import CpuKernel
from .compiled import Compiled, _tensors, write_out
from .frontend.tensor import Tensor
from .model.cpu import Caches, CpuModel
from .runtime import cpu_probe, gemm_probe
from .runtime.cpu import CpuExecutor
from .schedule.cpu_cost import PlanTime, plan_time
from .schedule.cpu_mapper import CpuMachine
from .stages import rebind_stages


@dataclass(frozen=True, repr=False)
class CpuCompiled(Compiled):
    """A program compiled for the CPU: `k(*arrays, threads=None)`; `k.cpu_kernels` holds each
    group's decision and C++."""

    cpu_kernels: tuple[CpuKernel, ...] = ()
    cpu_source: str = ""
    cpu_model: CpuModel | None = None

    source = property(lambda self: self.cpu_source)
    decisions = property(lambda self: tuple(k.decision for k in self.cpu_kernels))

    def __call__(self, *arrays, threads: int | None = None, **named):
        """Run on the CPU with `threads` OpenMP threads (default: the machine's cores; a kernel
        runs on at most its decision's `threads`, fewer where the CPU model found a parallel
        region's entry outweighs the split); inputs,
        constant inputs and `out=` as `Compiled.__call__`. `order=` and `seed=` (the emulator's
        thread order) are accepted and have no effect: the CPU kernels' results do not depend on it."""
        fast = self.executor.fast()
        if fast is not None and not arrays and named.keys() == fast.names and len(fast.order) == len(fast.names):
            arrays, named = tuple(named[n] for n in fast.order), {}  # every input by name, no name shared
        if fast is not None and (not named or (len(named) == 1 and "out" in named and "out" not in fast.names)):
            outs = fast.call(arrays, threads, named.get("out"))  # plain numpy arrays: checked and run
            if outs is not None:
                return outs[0] if self.single else tuple(outs)
        args, out, _, _ = self._bind(arrays, named)
        outs = self.executor(args, threads=threads)
        if out is not None:
            return write_out(out, outs, self.single)
        return outs[0] if self.single else tuple(outs)

    def rebound(self, outs: tuple[Tensor, ...], single: bool) -> CpuCompiled:
        """This program (from the compile cache) for a graph of the same signature, with its own executor."""
        a = rebind_stages(self.stages, outs)
        ex = CpuExecutor(
            a.plan, self.cpu_source, self.executor.kernels, self.executor.threads, _bound(a), self.executor.blas
        )
        return dataclasses.replace(self, stages=a, single=single, executor=ex)

    def __repr__(self) -> str:
        """A few lines: inputs and outputs, the CPU kernels and the machine (never the source)."""
        names = [k.name for k in self.cpu_kernels]
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
        return (
            f"<Compiled ({_tensors(self.inputs)}) -> ({_tensors(self.outputs)})\n"
            f"  {len(names)} CPU kernel(s) [{shown}]; target cpu ({CpuMachine.detect().name}, "
            f"{CpuMachine.detect().cores} core(s)); {self.origin}>"
        )

    def modeled(self, threads: int | None = None) -> PlanTime:
        """The CPU model's time of this plan on `threads` threads (default: the decisions'), and its
        limit. Kernels run by numpy's BLAS are modeled at its probed speed (model/cpu_gemm.py)."""
        groups = [g for g in self.stages.groups if g.M * g.N or (g.M > 0 and g.N == 0)]
        pairs = [(g, k.decision) for g, k in zip(groups, self.cpu_kernels) if g.N]
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
        times = iter(p.kernels)  # one per kernel over a non-empty extent (modeled())
        for k in self.cpu_kernels:
            if k.decision.N == 0:
                lines.append(f"  kernel {k.name}: {k.describe()}; a reduction over nothing (its identity)")
                continue
            t = next(times)
            lines.append(
                f"  kernel {k.name}: {k.describe()}; modeled {t.total_us:.1f} us ({t.bound}-bound, "
                f"data in {t.level}, {t.threads} busy thread(s), fork {t.fork_us:.1f} + merge {t.merge_us:.1f} us)"
            )
        lines += [f"  formulation: {f.describe()}" for f in self.formulations]
        return "\n".join(lines)


def _bound(a) -> dict:
    """The arrays of the inputs the program supplies itself (constant masks), by input position."""
    return {k: t.attr("bound") for k, t in enumerate(a.program.inputs) if t.attr("bound") is not None}


def _compulsory(a) -> int:
    """Bytes no plan avoids: the program's inputs read once, its outputs written once."""
    return sum(t.size * t.dtype.itemsize for t in (*a.program.inputs, *a.graph))


def cpu_model(machine: CpuMachine | None = None) -> CpuModel:
    """This machine's CPU model: cores and SIMD of `machine`, caches from /sys, rates probed once
    (runtime/cpu_probe.py, cached on disk), numpy's BLAS speed likewise (runtime/gemm_probe.py)."""
    machine = machine or CpuMachine.detect()
    caches = Caches.detect()
    rates, gemm = cpu_probe.rates(machine.cores, caches), gemm_probe.rates(machine.cores, caches)
    return CpuModel(machine.cores, machine.simd_bytes, machine.name, caches, rates, gemm)
