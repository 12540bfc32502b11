"""One kernel group + its mapping → CUDA C source; and the init kernels that fill buffers.

Codegen reads the program (the group's statements) and the mapping, nothing else: the template
(map, reduce, stitched), the parameters and their roles, the merge mode of every output and the
load of every read are the mapping's. The loop nest comes from thread_loop.py; the reduction
epilogue (warp shuffles, shared memory, one atomic per block per output) from header.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..dtypes import float32
from ..enums import StrEnum
from ..poly.program import KernelGroup
from ..poly.statement import Form
from ..runtime.plan import BufferRole, BufferSpec, Fill
from ..schedule.decision import Completion
from ..schedule.mapping import Mapping, MergeMode
from . import islast
from .expr import literal
from .map_kernel import emit_map
from .mbarrier import HELPERS as MBARRIER_HELPERS
from .pipeline import INCLUDE as PIPELINE_INCLUDE
from .reduce_kernel import emit_reduce, workspace_identity
from .stitched_kernel import CLUSTER_INCLUDE, emit_stitched
from .tc_kernel import INCLUDE as MMA_INCLUDE
from .tc_kernel import emit_tc
from .thread_loop import ThreadLoop, address_ast
from .wgmma_kernel import sm90a_only, wgmma_helpers


@dataclass(frozen=True)
class InitKernel:
    """A kernel that fills buffers with values in one launch: the identities of atomic outputs
    and workspaces, zeroed counters, or the result of an empty reduction."""

    name: str
    fills: tuple[Fill, ...]
    source: str

    @property
    def signature(self) -> list[str]:
        return [f"{f.ctype}*" for f in self.fills]


@dataclass(frozen=True)
class RenderedKernel:
    name: str
    source: str
    params: tuple[BufferSpec, ...]
    fills: tuple[Fill, ...]  # the resident workspaces and counters, initialised once
    modes: tuple[MergeMode, ...]  # per statement
    init: InitKernel | None = None  # the kernel that performs `fills` in one launch (first call only)

    @property
    def signature(self) -> list[str]:
        return [f"{'const ' if p.role == BufferRole.INPUT else ''}{p.ctype}*" for p in self.params]


def index_bound(group: KernelGroup, m: Mapping) -> int:
    """An upper bound of every value a generated index expression can take, from the mapping.

    Tensor sizes alone are not enough: the task mappings cover each loop with whole blocks,
    threads and serial steps, so a loop counter runs up to its task extent (an element-wise op
    over 2**31 - 3 floats scans i up to 2146467840 + 256 * bx + tx > 2**31). On top of that, a
    loop's counter is tested one step past its end, and an unrolled loop tests `unroll` steps
    ahead (codegen/islast.py: u + (unroll - 1) * inc after u += unroll * inc), and a strided
    counter's step is at most its task extent: counters stay below extent * (unroll + 1);
    element indices (counter * vec + lane) below (extent + 1) * vec; partials below split * M;
    addresses below the tensors' sizes. The factor 2 absorbs isl's intermediate sums (guards
    such as `256*bx + tx + c` are values of a counter too, but leave some room).
    """
    extent = max(t.extent for t in m.tasks.values())
    # a tensor-core kernel never forms the canonical linear index i * N + j: its counters are tile rows,
    # columns and K slabs (codegen/tc_kernel.py), its addresses bounded below (a 64 x 14336 x 4096
    # contraction's 3.8e9 canonical points asked for 64-bit indices, whose registers spilled on sm_80)
    sizes = [] if m.mma else [group.M * group.N]
    sizes += [m.split * group.M, m.rtile * m.rstride * (m.tile_rows + 1)]
    sizes += [s.result.size for s in group.statements]
    sizes += [r.tensor.size for s in group.statements for r in s.reads if r.memory]
    if group.columns:  # column partials: ws[b * N + j] over the launched blocks
        sizes.append(m.blocks * group.N)
    return max(2 * extent * (m.unroll + 1), (extent + 1) * m.vec, *sizes, address_bound(group))


def address_bound(group: KernelGroup) -> int:
    """The largest intermediate value of any address expression, the canonical indices taken up
    to twice their extents (vector lanes and tile rows step past a guard before it is tested).
    Not the address but the terms isl writes it with: a pulled-back batch index can read
    `768 * i - 768 * ((32767 * i + 32767) / 32768)`, whose products exceed 2**31 long before the
    address does (a (2, 1, 128, 3) @ (5, 3, 256) matmul: i < 327680)."""
    ranges = {"i": (0, 2 * group.M), "j": (0, 2 * group.N)}
    addrs = [r.addr for s in group.statements for r in s.reads] + [s.write for s in group.statements]
    return max((islast.magnitude(address_ast(group, a), ranges) for a in addrs), default=0)


def index_type(group: KernelGroup, m: Mapping) -> str:
    """The C type of the kernel's indices: int while every index expression fits, else long long
    (64-bit index arithmetic costs registers and issue slots, so only where needed).

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> a = lower(pn.sum(pn.placeholder((4, 100), "float32"), axis=1), stop_after="mappings", target="emulator")
    >>> index_type(a.groups[0], a.mappings[0])
    'int'
    """
    return "int" if index_bound(group, m) < 2**31 - 1 else "long long"


def resident_fills(group: KernelGroup, m: Mapping) -> tuple[Fill, ...]:
    """The first call's values of the resident buffers: workspaces at the identity, counters 0.
    (Partials need none: every block writes its own before the last block reads them.)"""
    fills = []
    for b in m.buffers:
        if b.role == BufferRole.WORKSPACE:
            s = group.statements[b.statement]
            fills.append(Fill(b.key, b.ctype, s.combiner.identity(s.acc), workspace_identity(s)))
    fills += [Fill(b.key, b.ctype, 0, "0u") for b in m.buffers if b.role == BufferRole.COUNTER]
    return tuple(fills)


class Template(StrEnum):
    """The kernel templates: one emitter each, over the shared thread loop."""

    MAP = "map"
    REDUCE = "reduce"
    STITCHED = "stitched"
    TENSOR_CORE = "tensor_core"  # a contraction's tiles as wmma MMAs (codegen/tc_kernel.py)


EMITTERS = {
    Template.MAP: emit_map,
    Template.REDUCE: emit_reduce,
    Template.STITCHED: emit_stitched,
    Template.TENSOR_CORE: emit_tc,
}


def template(group: KernelGroup, m: Mapping | None = None) -> Template:
    if m is not None and m.mma:  # the mapper chose tensor cores (schedule/tc_tiling.py)
        return Template.TENSOR_CORE
    if group.form == Form.MAP:
        return Template.MAP
    return Template.STITCHED if group.stitched else Template.REDUCE


def render_kernel(name: str, group: KernelGroup, m: Mapping) -> RenderedKernel:
    """The CUDA C of one kernel group under its mapping (`m.name` is the kernel's name)."""
    idx = index_type(group, m)
    sig = []
    for p in m.buffers:
        const = "const " if p.role == BufferRole.INPUT else ""
        sig.append(f"{const}{p.ctype}* __restrict__ {p.param}")
    # At least 1024 resident threads per SM: ptxas may use 64 registers per thread (without a
    # minimum it sometimes caps at 32 and spills the unrolled loop's vectors).
    bounds = f"{m.threads}, {m.min_blocks}"  # fewer with a register tile (schedule/mapping.py)
    lines = list(PIPELINE_INCLUDE) if m.stages > 1 else []  # cuda_pipeline.h only where used
    lines += list(MMA_INCLUDE) if m.mma else []  # and mma.h
    lines += wgmma_helpers(m)  # and a warpgroup MMA's PTX (codegen/wgmma_kernel.py)
    dims = ""
    if m.cluster > 1:  # a thread-block cluster of the split row's blocks (schedule/cluster.py)
        lines += CLUSTER_INCLUDE
        lines += [MBARRIER_HELPERS] if m.completion == Completion.MBARRIER else []  # codegen/mbarrier.py
        dims = f"PN_CLUSTER_DIMS(1, {m.cluster}, 1) "
    lines.append(f'extern "C" __global__ void {dims}__launch_bounds__({bounds}) {name}({", ".join(sig)}) {{')
    lines.append(f"  typedef {idx} pn_idx;")
    lines.append("  const pn_idx bx = blockIdx.x, by = blockIdx.y, tx = threadIdx.x, ty = threadIdx.y;")
    lines += sm90a_only(m, EMITTERS[template(group, m)](ThreadLoop(group, m, idx)))  # wgmma: sm_90a's alone
    lines.append("}")
    fills = resident_fills(group, m)
    init = render_init(f"{name}_init", fills, {p.key: p for p in m.buffers}) if fills else None
    return RenderedKernel(name, "\n".join(lines), m.buffers, fills, m.merges, init)


def render_empty(name: str, group: KernelGroup, specs: dict) -> InitKernel:
    """The results of reductions over nothing: the identity (sum 0, prod 1, all True), NaN for a
    mean or variance, as numpy."""
    fills = []
    for s in group.statements:
        res = s.result
        value = math.nan if res.attr("mean") or s.combiner.struct else s.combiner.identity(s.acc)
        value = np.array(value).astype(res.dtype.np).item()
        if res.dtype.is_16bit_float:  # a float value converted to 16 bits in the kernel
            fn = "__float2half_rn" if res.dtype.name == "float16" else "__float2bfloat16_rn"
            c_value = f"{fn}({literal(value, float32)})"
        else:
            c_value = literal(value, res.dtype)
        fills.append(Fill(f"out:{res.uid}", res.dtype.c_type, value, c_value))
    return render_init(name, fills, specs)


def render_zero(name: str, group: KernelGroup, specs: dict) -> InitKernel | None:
    """Every call, before the group's kernel: its indirect writes' outputs zeroed (the atomic adds
    of a scatter accumulate into them); None when the group has none."""
    fills = [
        Fill(f"out:{s.result.uid}", s.result.dtype.c_type, 0, literal(0, s.result.dtype))
        for s in group.statements
        if s.scatter is not None
    ]
    return render_init(name, fills, specs) if fills else None


def render_init(name: str, fills, specs: dict) -> InitKernel:
    """One kernel that writes every fill's value over its whole buffer."""
    sig = ", ".join(f"{specs[f.buffer].ctype}* __restrict__ b{k}" for k, f in enumerate(fills))
    lines = [
        f'extern "C" __global__ void {name}({sig}) {{',
        "  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
        "  const long long stride = (long long)gridDim.x * blockDim.x;",
    ]
    for k, f in enumerate(fills):
        lines.append(f"  for (long long e = t; e < {specs[f.buffer].size}LL; e += stride) b{k}[e] = {f.c_value};")
    return InitKernel(name, tuple(fills), "\n".join(lines + ["}"]))
