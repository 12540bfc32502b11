"""A stitched cluster's exchange completed by mbarriers that count bytes (schedule/cluster.py
`Completion.MBARRIER`, as QuACK's cluster reduction): the PTX helpers and the lines of the
stitched kernel (codegen/stitched_kernel.py) that set them up, announce, push and wait.

Exchange e has its own mbarrier `pn_mbar[e - 1]`, used for one phase (parity 0). One thread per
block initializes them all (arrival count 1), fences the initialization to the cluster and
announces each exchange's bytes the block will receive (its W x S warps' partials of each row and
reduction, from the S blocks: mbarrier.arrive.expect_tx), as QuACK arms them, before the split
cluster barrier of the kernel's start: a peer pushes only after that barrier's wait. In the
exchange every warp's lanes b < S push the warp's partial into block b with st.async, which completes its bytes on block b's
mbarrier, and every thread waits on its own block's mbarrier (mbarrier.try_wait.parity). A
block exits only after every byte aimed at it has landed, so no barrier precedes the exit.

The helpers are sm_90 PTX; compiled for an older GPU their bodies are empty (the kernel traps
before it reaches them). The emulator (runtime/cuda_emulation.h) implements the same four calls:
bytes counted per mbarrier phase, a wait that never completes reported as a deadlock, a push into
a block that has exited or into an mbarrier not initialized reported.

>>> expected(["float", "float"], 16)
'16u * (sizeof(float) + sizeof(float))'
>>> print(push("pn_dsm1_0[ty][0]", "acc0", 1, 4))
  if (tx % 32u < 4u) pn_push(&pn_dsm1_0[ty][0], acc0, &pn_mbar[0], tx % 32u);
"""

from __future__ import annotations

from collections.abc import Sequence

HELPERS = r"""#ifndef PN_MBARRIER_HELPERS
#define PN_MBARRIER_HELPERS
#ifndef PANAMERA_EMULATOR
// mbarriers counting the bytes of st.async pushes (sm_90; codegen/mbarrier.py)
__device__ __forceinline__ unsigned pn_smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void pn_mbar_init(unsigned long long* bar, unsigned arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(pn_smem_u32(bar)), "r"(arrivals) : "memory");
#endif
}
__device__ __forceinline__ void pn_mbar_fence_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void pn_mbar_expect(unsigned long long* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(pn_smem_u32(bar)), "r"(bytes) : "memory");
#endif
}
// v into `slot` of the cluster's block `rank` (this block's address mapped there), its bytes
// completed on that block's copy of `bar`
template <class T> __device__ __forceinline__ void pn_push(T* slot, T v, unsigned long long* bar, unsigned rank) {
  static_assert(sizeof(T) % 4 == 0, "st.async pushes 4-byte words");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned s, b, w[sizeof(T) / 4];
  memcpy(w, &v, sizeof(T));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(s) : "r"(pn_smem_u32(slot)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(b) : "r"(pn_smem_u32(bar)), "r"(rank));
#pragma unroll
  for (unsigned i = 0; i < sizeof(T) / 4; ++i)
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 ::"r"(s + 4u * i), "r"(w[i]), "r"(b) : "memory");
#endif
}
__device__ __forceinline__ void pn_mbar_wait(unsigned long long* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(pn_smem_u32(bar)), "r"(parity) : "memory");
#endif
}
#endif
#endif"""


def setup(expected: Sequence[str], where: str = "") -> list[str]:
    """The kernel's start: one mbarrier per exchange, initialized by one thread, fenced to the
    cluster and armed with the bytes that will land in this block (`expected`: a C expression per
    exchange), before the split cluster barrier's arrival, which the caller prints next (QuACK's
    `_initialize_cluster` arms them there too). `where`: a further condition on the blocks that
    receive (a reduce kernel's rank 0, codegen/reduce_kernel.py); the others' stay unused.

    >>> for ln in setup(["32u * (sizeof(float))"]): print(ln)
      PN_BLOCK_SHARED(unsigned long long, pn_mbar, [1]);  // one mbarrier per exchange
      if (tx == 0 && ty == 0) {
        for (int e = 0; e < 1; ++e) pn_mbar_init(&pn_mbar[e], 1u);
        pn_mbar_fence_init();
        pn_mbar_expect(&pn_mbar[0], 32u * (sizeof(float)));  // the bytes of exchange 1 that land here
      }
    """
    n = len(expected)
    out = [
        f"  PN_BLOCK_SHARED(unsigned long long, pn_mbar, [{n}]);  // one mbarrier per exchange",
        f"  if (tx == 0 && ty == 0{' && ' + where if where else ''}) {{",
        f"    for (int e = 0; e < {n}; ++e) pn_mbar_init(&pn_mbar[e], 1u);",
        "    pn_mbar_fence_init();",
    ]
    out += [
        f"    pn_mbar_expect(&pn_mbar[{e}], {b});  // the bytes of exchange {e + 1} that land here"
        for e, b in enumerate(expected)
    ]
    return out + ["  }"]


def expected(types: Sequence[str], partials: int) -> str:
    """An exchange's bytes: `partials` values of each accumulator type in `types` land in a block
    (its rows' W warps' partials from each of the S blocks)."""
    return f"{partials}u * (" + " + ".join(f"sizeof({t})" for t in types) + ")"


def push(slot: str, value: str, e: int, blocks: int) -> str:
    """A warp's partial `value` pushed into `slot` of each of the `blocks` blocks (lane b: block b)."""
    return f"  if (tx % 32u < {blocks}u) pn_push(&{slot}, {value}, &pn_mbar[{e - 1}], tx % 32u);"


def wait(e: int) -> str:
    """Every thread waits until exchange e's bytes have all landed in its block."""
    return f"  pn_mbar_wait(&pn_mbar[{e - 1}], 0u);  // every block's partials have landed here"
