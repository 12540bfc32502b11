"""The `nvcuda::wmma` part of the tensor-core template (codegen/tc_kernel.py): each warp's FM x FN
16 x 16 accumulators, a staged slab's `mma_sync` steps, and the accumulators stored to the tile in
shared memory. The warpgroup-MMA counterpart is codegen/wgmma_kernel.py.
"""

from __future__ import annotations

from ..schedule.tc_tiling import FRAG

W = "nvcuda::wmma"


def wmma_accumulators(wn: int, FM: int, FN: int, ACC: str) -> list[str]:
    """Each warp's FM x FN accumulator fragments (its place among the tile's `wn` warp columns), zeroed."""
    return [
        f"  const int pn_wr = (int)tx / 32 / {wn}, pn_wc = (int)tx / 32 % {wn};  // the warp's {FM} x {FN} fragments",
        f"  {W}::fragment<{W}::accumulator, 16, 16, 16, {ACC}> pn_acc[{FM}][{FN}];",
        "#pragma unroll",
        f"  for (int pn_i = 0; pn_i < {FM}; ++pn_i)",
        "#pragma unroll",
        f"    for (int pn_j = 0; pn_j < {FN}; ++pn_j) {W}::fill_fragment(pn_acc[pn_i][pn_j], ({ACC})0);",
    ]


def wmma_slab(BM: int, BN: int, BK: int, FM: int, FN: int, T: str) -> list[str]:
    """A staged slab's MMAs (each warp's FM x FN fragments), and after the slab loop the
    accumulators stored to the tile in shared memory (row-major, BN a row)."""
    return [
        "    __syncthreads();",
        "#pragma unroll 2  // two fragment pairs live (fully unrolled, ptxas spilled bf16 2 x 2 warps at BK 128 on sm_80)",
        f"    for (int pn_t = 0; pn_t < {BK // FRAG}; ++pn_t) {{  // each A fragment feeds {FN} MMAs, each B {FM}",
        f"      {W}::fragment<{W}::matrix_a, 16, 16, 16, {T}, {W}::row_major> pn_fa[{FM}];",
        f"      {W}::fragment<{W}::matrix_b, 16, 16, 16, {T}, {W}::col_major> pn_fb[{FN}];",
        "#pragma unroll",
        f"      for (int pn_i = 0; pn_i < {FM}; ++pn_i)",
        f"        {W}::load_matrix_sync(pn_fa[pn_i], &pn_sa[(pn_t * {BM} + (pn_wr * {FM} + pn_i) * 16) * 16], 16);",
        "#pragma unroll",
        f"      for (int pn_j = 0; pn_j < {FN}; ++pn_j)",
        f"        {W}::load_matrix_sync(pn_fb[pn_j], &pn_sb[(pn_t * {BN} + (pn_wc * {FN} + pn_j) * 16) * 16], 16);",
        "#pragma unroll",
        f"      for (int pn_i = 0; pn_i < {FM}; ++pn_i)",
        "#pragma unroll",
        f"        for (int pn_j = 0; pn_j < {FN}; ++pn_j)",
        f"          {W}::mma_sync(pn_acc[pn_i][pn_j], pn_fa[pn_i], pn_fb[pn_j], pn_acc[pn_i][pn_j]);",
        "    }",
        "    __syncthreads();  // the slab is refilled next step",
        "  }",
        "#pragma unroll",
        f"  for (int pn_i = 0; pn_i < {FM}; ++pn_i)",
        "#pragma unroll",
        f"    for (int pn_j = 0; pn_j < {FN}; ++pn_j)",
        f"      {W}::store_matrix_sync(&pn_sc[(pn_wr * {FM} + pn_i) * 16 * {BN} + (pn_wc * {FN} + pn_j) * 16],",
        f"                             pn_acc[pn_i][pn_j], {BN}, {W}::mem_row_major);",
        "  __syncthreads();",
    ]
