"""The warpgroup-MMA part of the tensor-core template (codegen/tc_kernel.py; schedule/warpgroup.py):
the accumulators, a staged slab's wgmma.mma_async group, and the file-scope PTX of a kernel that
issues them (m64nNk16 f16 / bf16 into f32, m64nNk32 s8 into s32). The emulator runs the same calls
(runtime/wgmma_emulation.h).
"""

from __future__ import annotations

from ..schedule.tc_tiling import tiles
from ..schedule.tensor_core import Mma
from ..schedule.warpgroup import WGMMA_K, MmaOp, wgmma_vec


def _acc(kind: Mma) -> str:
    """The accumulators' pn_wgacc template arguments after N: none for f32 (the default), int for s32."""
    return ", int" if kind.acc_ctype == "int" else ""


def wgmma_accumulators(BN: int, G: int, kind: Mma) -> list[str]:
    """The warpgroup's accumulator registers (f32, or s32 for s8 operands), zeroed.

    >>> wgmma_accumulators(64, 1, Mma.S8)[0].split(";")[0]
    '  pn_wgacc<32, int> pn_d'
    """
    n = BN // G
    zero = "0" if kind.acc_ctype == "int" else "0.0f"
    return [
        f"  pn_wgacc<{n // 2}{_acc(kind)}> pn_d;  // the warpgroup's 64 x {n} accumulators (columns tx / 128 x {n} on), "
        f"{n // 2} a thread",
        "#pragma unroll",
        f"  for (int pn_i = 0; pn_i < {n // 2}; ++pn_i) pn_d[pn_i] = {zero};",
    ]


def wgmma_slab(BM: int, BN: int, BK: int, G: int, kind: Mma) -> list[str]:
    """A staged slab's warpgroup MMAs (`wgmma_helpers`): the slab's stores made visible to the
    async proxy, a barrier, then each of the G warpgroups' BK / k MMAs of m64nNk (k `WGMMA_K`: 16,
    or s8's 32; N = BN / G, its columns from tx / 128 x N: B's core matrices from there on) in one
    group, waited for before the barrier that lets the slab be refilled. After the slab loop each
    thread stores its accumulators to the tile in shared memory (row-major, BN a row) by wgmma's
    fragment layout."""
    n, k, row = BN // G, WGMMA_K[kind], wgmma_vec(kind)  # row: the k of a core matrix's 16-byte row
    return [
        "    pn_fence_proxy_async();  // this thread's stores to the slab, visible to the MMAs (async proxy)",
        "    __syncthreads();",
        "    pn_wgmma_fence();",
        "#pragma unroll",
        f"    for (int pn_t = 0; pn_t < {BK // k}; ++pn_t)  // LBO: the step's second {row} k; SBO: 8 rows on",
        f"      pn_wgmma<{n}, {kind.ctype}>(pn_d, pn_wgmma_desc(&pn_sa[pn_t * {BM * k}], {BM * 16}, 128),",
        f"                          pn_wgmma_desc(&pn_sb[pn_t * {BN * k} + (int)tx / 128 * {n * row}], {BN * 16}, 128));",
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


# each kind's PTX: m64nNk16 of 16-bit floats into f32 (scale-d, scale-a, scale-b, no transposes),
# m64nNk32 of s8 into s32 (scale-d only; wrapping, not .satfinite, as numpy's int32 sum)
_PTX = {
    Mma.F16: ("k16.f32.f16.f16", "p, 1, 1, 0, 0", "f"),
    Mma.BF16: ("k16.f32.bf16.bf16", "p, 1, 1, 0, 0", "f"),
    Mma.S8: ("k32.s32.s8.s8", "p", "r"),
}


def wgmma_helpers(m) -> list[str]:
    """File-scope CUDA of a warpgroup-MMA kernel (`m.mma_op`): the accumulators' type, the
    descriptor, the fences and the group ops as PTX (PTX ISA 8.0, sm_90a), and the MMA of its
    shape; compiled for another architecture they only trap (no wgmma in sm_80 or sm_90 code).
    The emulator has its own (runtime/wgmma_emulation.h). Guarded: a source may hold several."""
    if m.mma_op != MmaOp.WGMMA:
        return []
    kind = Mma(m.mma)
    T, BN = kind.ctype, tiles(m)[1] // m.mma_tile[1]  # a warpgroup's N
    n, (shape, scales, reg) = BN // 2, _PTX[kind]
    regs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+{reg}"(d.v[{i}])' for i in range(n))
    guard = f"PN_WGMMA_{BN}_{kind.value.upper()}"
    return [
        "#ifndef PANAMERA_EMULATOR",
        "#ifndef PN_WGMMA",
        "#define PN_WGMMA",
        "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)",
        "#define PN_WGMMA_ASM(...) asm volatile(__VA_ARGS__)",
        "#else",
        "#define PN_WGMMA_ASM(...) __trap()",
        "#endif",
        "template <int N, class A = float> struct pn_wgacc {",
        "  A v[N];",
        "  __device__ __forceinline__ A& operator[](int i) { return v[i]; }",
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
        "template <int N, class T, class A>",
        "__device__ void pn_wgmma(pn_wgacc<N / 2, A>& d, unsigned long long a, unsigned long long b);",
        "#endif",
        f"#ifndef {guard}",
        f"#define {guard}",
        "template <>",
        f"__device__ __forceinline__ void pn_wgmma<{BN}, {T}>(pn_wgacc<{n}{_acc(kind)}>& d, unsigned long long a,",
        "                                                  unsigned long long b) {",
        '  PN_WGMMA_ASM("{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"',
        f'               "wgmma.mma_async.sync.aligned.m64n{BN}{shape} {{{regs}}}, %{n}, %{n + 1}, {scales};\\n}}"',
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
