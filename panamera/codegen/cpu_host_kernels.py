"""The CPU kernels of a group that are no scan of its loop nest (codegen/cpu_kernel.py prints those):
a contraction run as its decision's `gemm` plan (`host_blas`: the BLAS's gemm called from C, the
register tile, or numpy between the entries) and a reduction over an empty extent
(`render_cpu_empty`: each result filled with its identity).
"""

from __future__ import annotations

import math

from ..poly.program import KernelGroup
from ..runtime.plan import BufferRole
from ..schedule.cpu_mapper import CpuDecision
from ..schedule.mapping import MergeMode, kernel_buffers
from .cpu_kernel import CpuKernel
from .cpu_tile import plan_calls
from .cpu_tile_epilogue import epilogue_lambda
from .kernel import render_empty


def host_blas(name: str, group: KernelGroup, d: CpuDecision, in_c: bool = False) -> CpuKernel:
    """A contraction group run as its decision's `gemm` plan says (schedule/cpu_contraction.py: read
    here, never chosen), its buffers as a kernel's. BLAS: `in_c` (the BLAS's gemm is callable from
    C: runtime/cpu_gemm.py) and the call a `Gemm`: a C function calling `pn_gemm` (the program's C
    entry runs it in line); else no C++, and numpy runs it between the entries. TILE:
    `pn_tile_gemm` with the plan's tile, the register-tiled kernel (codegen/cpu_tile.py).

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> from panamera.model.cpu_tile import GemmKernel
    >>> from panamera.schedule.cpu_blas import blas_call
    >>> from panamera.schedule.cpu_contraction import GemmPlan
    >>> g = lower(pn.placeholder((64, 64)) @ pn.placeholder((64, 32)), stop_after="groups", target="emulator").groups[0]
    >>> d = CpuDecision(g.form, g.M, g.N, 1, g.N, 1, 1, 1, gemm=GemmPlan(GemmKernel.BLAS, blas_call(g), 4))
    >>> print(host_blas("k0", g, d, in_c=True).source.splitlines()[2].strip())
    pn_gemm<float>(0, 0, 64LL, 32LL, 64LL, (const float*)pn_a[0], 64LL, (const float*)pn_a[1], 32LL, (float*)pn_a[2], 32LL, 1, pn_t);
    """
    params = kernel_buffers(group, name, (MergeMode.STORE,) * len(group.statements), 1, (1, 1))
    call, tile, ep = d.gemm.call, d.gemm.tile, d.gemm.epilogue
    gm = call.gemm
    if gm is None or (not in_c and tile is None):
        return CpuKernel(name, "", params, d, (), call)
    # the plans by the call's threads (GemmPlan.fewer), fewest first; without a BLAS callable from C, the one plan
    plans = (*reversed(d.gemm.fewer), d.gemm) if in_c else (d.gemm,)
    slot = {p.key: n for n, p in enumerate(params)}
    a, b = (slot[op.key] for op in call.operands)
    a, b = (b, a) if gm.swap else (a, b)
    t = params[a].ctype
    # the product's buffer; with a fused epilogue and no buffer (on chip), a scratch the tile sums K blocks in
    c = f"({t}*)pn_a[{slot[call.out_key]}]" if call.out_key in slot else "pn_cs.data()"
    table = ", ".join(f"{x}LL" for call_ in gm.calls for x in call_)
    args = (
        f"{int(gm.ta)}, {int(gm.tb)}, {gm.m}LL, {gm.n}LL, {gm.k}LL, (const {t}*)pn_a[{a}], {gm.lda}LL, "
        f"(const {t}*)pn_a[{b}], {gm.ldb}LL, {c}, {gm.ldc}LL, {len(gm.calls)}, pn_t"
    )
    lines = [f'extern "C" void {name}(void** pn_a, int pn_nt) {{', f"  static const long long pn_t[] = {{{table}}};"]
    if ep is not None:  # schedule/cpu_epilogue.py: the consumer applied by the tile at its store
        lines.append("  typedef long long pn_idx;")
        for n, p in enumerate(params):
            const = "const " if p.role == BufferRole.INPUT else ""
            lines.append(f"  {const}{p.ctype}* __restrict__ {p.param} = ({const}{p.ctype}*)pn_a[{n}];")
        if call.out_key not in slot:
            size = math.prod(call.out_shape)
            lines.append(f"  static thread_local std::vector<{t}> pn_cs({size}LL);")
        lines += ["  " + ln for ln in epilogue_lambda(group, params, ep)]
    lines += plan_calls(plans, t, args, ep is not None)
    source = "\n".join([*lines, "}"])
    tiles = [p.tile for p in plans if p.tile is not None]
    shown = tile if tile is not None else (tiles[0] if tiles else None)
    return CpuKernel(name, source, params, d, (), call, shown, plans)


def render_cpu_empty(name: str, group: KernelGroup, specs: dict, threads: int) -> CpuKernel:
    """A group of reductions over an empty extent: each result filled with what numpy gives (the
    combiner's identity: sum 0, prod 1, all True; NaN for a mean or variance), the values the
    emulator's init kernel writes (codegen/kernel.py's render_empty)."""
    fills = render_empty(name, group, specs).fills
    params = tuple(specs[f.buffer] for f in fills)
    lines = [f'extern "C" void {name}(void** pn_a, int pn_nt) {{']
    for n, (f, p) in enumerate(zip(fills, params)):
        lines.append(f"  {p.ctype}* __restrict__ b{n} = ({p.ctype}*)pn_a[{n}];")
        lines.append("  #pragma omp parallel for simd schedule(static) num_threads(pn_nt)")
        lines.append(f"  for (long long e = 0; e < {p.size}LL; ++e) b{n}[e] = {f.c_value};")
    d = CpuDecision(group.form, group.M, 0, 1, 0, 1, threads, 1)
    return CpuKernel(name, "\n".join(lines + ["}"]), params, d)
