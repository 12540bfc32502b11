"""The warpgroup-MMA part of the tensor-core template (codegen/tc_kernel.py; schedule/warpgroup.py):
the accumulators, a staged slab's wgmma.mma_async group, and the file-scope PTX of a kernel that
issues them. The emulator runs the same calls (runtime/wgmma_emulation.h).
"""

from __future__ import annotations

from ..schedule.tc_tiling import FRAG, tiles
from ..schedule.tensor_core import Mma
from ..schedule.warpgroup import MmaOp


def wgmma_accumulators(BN: int, G: int) -> list[str]:
    n = BN // G
    return [
        f"  pn_wgacc<{n // 2}> pn_d;  // the warpgroup's 64 x {n} accumulators (columns tx / 128 x {n} on), {n // 2} a thread",
        "#pragma unroll",
        f"  for (int pn_i = 0; pn_i < {n // 2}; ++pn_i) pn_d[pn_i] = 0.0f;",
    ]


def wgmma_slab(BM: int, BN: int, BK: int, G: int, T: str) -> list[str]:
    """A staged slab's warpgroup MMAs (`wgmma_helpers`): the slab's stores made visible to the
    async proxy, a barrier, then each of the G warpgroups' BK / 16 MMAs of m64nNk16 (N = BN / G,
    its columns from tx / 128 x N: B's core matrices from there on) in one group, waited for
    before the barrier that lets the slab be refilled. After the slab loop each thread stores its
    accumulators to the tile in shared memory (row-major, BN a row) by wgmma's fragment layout."""
    n = BN // G
    return [
        "    pn_fence_proxy_async();  // this thread's stores to the slab, visible to the MMAs (async proxy)",
        "    __syncthreads();",
        "    pn_wgmma_fence();",
        "#pragma unroll",
        f"    for (int pn_t = 0; pn_t < {BK // FRAG}; ++pn_t)  // LBO: the step's second 8 k; SBO: 8 rows on",
        f"      pn_wgmma<{n}, {T}>(pn_d, pn_wgmma_desc(&pn_sa[pn_t * {BM * FRAG}], {BM * 16}, 128),",
        f"                          pn_wgmma_desc(&pn_sb[pn_t * {BN * FRAG} + (int)tx / 128 * {n * 8}], {BN * 16}, 128));",
        "    pn_wgmma_commit();",
        "    pn_wgmma_wait<0>();",
        "    __syncthreads();  // the slab is refilled next step",
        "  }",
        "  {",
        f"    const int pn_w = (int)tx / 32 % 4, pn_l = (int)tx % 32, pn_g = (int)tx / 128 * {n};",
        "#pragma unroll",
        f"    for (int pn_i = 0; pn_i < {n // 2}; ++pn_i)",
        f"      pn_sc[(16 * pn_w + pn_l / 4 + 8 * (pn_i / 2 % 2)) * {BN} + pn_g + 8 * (pn_i / 4) + 2 * (pn_l % 4) + pn_i % 2] =",
        "          pn_d[pn_i];",
        "  }",
        "  __syncthreads();",
    ]


_TYPES = {"__half": "f16", "__nv_bfloat16": "bf16"}


def wgmma_helpers(m) -> list[str]:
    """File-scope CUDA of a warpgroup-MMA kernel (`m.mma_op`): the accumulators' type, the
    descriptor, the fences and the group ops as PTX (PTX ISA 8.0, sm_90a), and the MMA of its
    shape; compiled for another architecture they only trap (no wgmma in sm_80 or sm_90 code).
    The emulator has its own (runtime/wgmma_emulation.h). Guarded: a source may hold several."""
    if m.mma_op != MmaOp.WGMMA:
        return []
    T, BN = Mma(m.mma).ctype, tiles(m)[1] // m.mma_tile[1]  # a warpgroup's N
    n, ptx = BN // 2, _TYPES[T]
    regs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(d.v[{i}])' for i in range(n))
    guard = f"PN_WGMMA_{BN}_{ptx.upper()}"
    return [
        "#ifndef PANAMERA_EMULATOR",
        "#ifndef PN_WGMMA",
        "#define PN_WGMMA",
        "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)",
        "#define PN_WGMMA_ASM(...) asm volatile(__VA_ARGS__)",
        "#else",
        "#define PN_WGMMA_ASM(...) __trap()",
        "#endif",
        "template <int N> struct pn_wgacc {",
        "  float v[N];",
        "  __device__ __forceinline__ float& operator[](int i) { return v[i]; }",
        "};",
        "__device__ __forceinline__ unsigned long long pn_wgmma_desc(const void* p, unsigned lbo, unsigned sbo) {",
        "  const unsigned long long a = (unsigned long long)__cvta_generic_to_shared(p);",
        "  return ((a & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32);",
        "}",
        '__device__ __forceinline__ void pn_fence_proxy_async() { PN_WGMMA_ASM("fence.proxy.async.shared::cta;" ::: "memory"); }',
        '__device__ __forceinline__ void pn_wgmma_fence() { PN_WGMMA_ASM("wgmma.fence.sync.aligned;" ::: "memory"); }',
        '__device__ __forceinline__ void pn_wgmma_commit() { PN_WGMMA_ASM("wgmma.commit_group.sync.aligned;" ::: "memory"); }',
        "template <int Pending> __device__ __forceinline__ void pn_wgmma_wait() {",
        '  PN_WGMMA_ASM("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");',
        "}",
        "template <int N, class T> __device__ void pn_wgmma(pn_wgacc<N / 2>& d, unsigned long long a, unsigned long long b);",
        "#endif",
        f"#ifndef {guard}",
        f"#define {guard}",
        "template <>",
        f"__device__ __forceinline__ void pn_wgmma<{BN}, {T}>(pn_wgacc<{n}>& d, unsigned long long a, unsigned long long b) {{",
        '  PN_WGMMA_ASM("{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"',
        f'               "wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{ptx}.{ptx} {{{regs}}}, %{n}, %{n + 1}, p, 1, 1, 0, 0;\\n}}"',
        f"               : {outs}",
        '               : "l"(a), "l"(b));',
        "}",
        "#endif",
        "#endif",
    ]


def sm90a_only(m, body: list[str]) -> list[str]:
    """A warpgroup-MMA kernel's body (`m.mma_op`), compiled only where wgmma exists (sm_90a), in
    the emulator and in the host pass; compiled for any other target the kernel only traps, so
    its sm_80 / sm_90 code holds neither wgmma nor the staging that feeds it (which ptxas would
    otherwise fit, without the MMAs, under the launch bounds meant for sm_90a). Other kernels'
    bodies are returned as they are."""
    if m.mma_op != MmaOp.WGMMA:
        return body
    where = "defined(PANAMERA_EMULATOR) || !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)"
    return [f"#if {where}", *body, "#else", "  __trap();  // no warpgroup MMAs on this target", "#endif"]
