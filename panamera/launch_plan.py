"""The pieces of a launch plan (runtime/plan.py) that the `plan` stage (stages.py) and the CPU
target (cpu_target.py) assemble: output buffers, input alignments, result specs, and the launches
of init and mapped kernels with their modeled times.

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> a = lower(pn.sum(pn.placeholder((4, 100), "float32", name="x"), axis=1), target="emulator")
>>> sorted(_output_specs(a.groups))[0].startswith("out:")
True
>>> list(vector_alignments([g for g in a.groups if g.M * g.N], a.mappings).values())
[16]
"""

from __future__ import annotations

import dataclasses
import math

from .codegen.kernel import InitKernel, RenderedKernel
from .frontend.tensor import Tensor
from .model.gpu import GPUSpec
from .model.kernel_cost import kernel_time
from .poly.access import AccessKind
from .poly.program import KernelGroup
from .poly.statement import Form
from .runtime.plan import BufferRole, BufferSpec, Launch, LaunchRole, ResultSpec
from .schedule.mapping import Mapping


def view_source(t: Tensor) -> Tensor:
    """The tensor whose buffer holds `t`: an output reshape is a view, never a kernel."""
    while t.op == "reshape":
        t = t.inputs[0]
    return t


def _output_specs(groups) -> dict[str, BufferSpec]:
    out = {}
    for grp in groups:
        for s in grp.statements:
            res = s.result
            out[f"out:{res.uid}"] = BufferSpec(
                f"out:{res.uid}", res.dtype.c_type, res.dtype, res.size, BufferRole.OUTPUT
            )
    return out


def vector_alignments(groups, mappings) -> dict[int, int]:
    """Per tensor uid, the alignment in bytes its buffer needs: the widest vector load any kernel
    makes of it (vector width x item size; a contiguous read at width `vec` starts at a multiple
    of `vec` elements, which isl checked when it classified the read)."""
    out: dict[int, int] = {}
    for grp, m in zip(groups, mappings):
        for s, kinds in zip(grp.statements, m.access):
            for r, kind in zip(s.reads, kinds):
                if kind == AccessKind.CONTIG and m.vec > 1:
                    uid = r.tensor.uid
                    out[uid] = max(out.get(uid, 1), m.vec * r.tensor.dtype.itemsize)
    return out


def _result_spec(t: Tensor, inputs: tuple[Tensor, ...]) -> ResultSpec:
    src = view_source(t)
    if src.op == "placeholder":
        return ResultSpec(t.shape, src.size, input_index=[i.uid for i in inputs].index(src.uid))
    return ResultSpec(t.shape, src.size, key=f"out:{src.uid}")


def _queued(launches: list[Launch], gpu: GPUSpec) -> tuple[Launch, ...]:
    """Every launch of a call after its first is queued behind another: its modeled time pays the
    gap of a queued launch, not the per-kernel floor (model/estimate.py does the same)."""
    saving = (gpu.launch_s - gpu.queued_s) * 1e6
    out, first = [], True
    for ln in launches:
        if ln.role != LaunchRole.INIT_ONCE:
            ln = ln if first else dataclasses.replace(ln, modeled_us=ln.modeled_us - saving)
            first = False
        out.append(ln)
    return tuple(out)


def _init_launch(init: InitKernel, buffers: dict, gpu: GPUSpec, role: LaunchRole) -> Launch:
    """The one launch that initialises a kernel's atomic outputs, workspaces and counters."""
    specs = [buffers[f.buffer] for f in init.fills]
    nbytes = sum(p.nbytes for p in specs)
    threads, blocks = 256, min(math.ceil(max(p.size for p in specs) / 256), 1024)
    cost = kernel_time(
        gpu, dram_bytes=nbytes, write_bytes=nbytes, blocks=blocks, threads=threads, bytes_in_flight_per_thread=4
    )
    return Launch(
        init.name,
        (blocks, 1, 1),
        (threads, 1, 1),
        tuple(("buf", f.buffer) for f in init.fills),
        role=role,
        atomic_outputs=tuple((f.buffer, f.value) for f in init.fills),
        bytes_written=nbytes,
        modeled_us=cost.total_s * 1e6,
        cost_features=cost.features,
    )


def _kernel_launch(rk: RenderedKernel, grp: KernelGroup, m: Mapping) -> Launch:
    return Launch(
        rk.name,
        (*m.launch_grid, 1),
        (m.tx, m.ty, 1),
        tuple(("buf", p.key) for p in rk.params),
        role=LaunchRole.MAP if grp.form == Form.MAP else LaunchRole.REDUCE,
        form=grp.form,
        blocks_per_reduction=m.split,
        atomic_outputs=tuple((f.buffer, f.value) for f in rk.fills if f.buffer != f"cnt:{rk.name}"),
        modes=rk.modes,
        bytes_read=sum(p.size * p.dtype.itemsize for p in rk.params if p.role == BufferRole.INPUT),
        bytes_written=sum(p.size * p.dtype.itemsize for p in rk.params if p.role == BufferRole.OUTPUT),
        mapping=m.describe(),
        modeled_us=m.cost.total_s * 1e6,
        cost_features=m.cost.features,
        cooperative=m.cooperative,
        cluster=m.cluster,
        dynamic_smem_bytes=m.dynamic_smem,  # schedule/dynsmem.py: stated by the stage that carves it
    )
