"""The tensor-core template: a contraction's tile as `nvcuda::wmma` m16n16k16 MMAs, or as
Hopper's warpgroup MMAs (`mma_op` wgmma: codegen/wgmma_kernel.py).

The mapping's `mma`, `mma_tile` and `mma_land` (schedule/tc_tiling.py) fix everything: block bx owns the
outputs rows [r0, r0 + BM) x columns [c0, c0 + BN) (column tiles fastest), block by the K range
[by * chunk, min(K, (by + 1) * chunk)). Each K slab of BK, every thread evaluates its share of the
two operand expressions (their fused producers too: a dequantized int8 / int4 weight is computed
in registers) at canonical indices (i, j) = (row * P, k) for the rows' factor and (column, k) for
the columns' factor (isl proved each reads one address along the other axis), converts it to the
MMA's type and stores it to shared memory, zero outside the tile and the K range (the tails).
Shared memory holds each 16-wide K step as a contiguous 16 x 16 block per fragment row or column
(256-bit aligned, ldm 16: wmma's rules for every operand type). After a barrier each warp runs
BK / 16 steps of `mma_sync` on its FM x FN 16 x 16 accumulators (each A fragment loaded once for
FN MMAs, each B fragment once for FM); a barrier guards the slab before it is refilled. A
warpgroup tile stages the same operands into wgmma's core matrices (tc_staging.py `slot`) in the block's shared
memory (PN_BLOCK_SHARED: the descriptors address it) and each of its 1-2 warpgroups issues BK / k
`wgmma.mma_async` m64nNk (k16 f16 / bf16, k32 s8) on its 64 x N columns, fenced, committed and
waited for within the slab.

The accumulators go through shared memory (`store_matrix_sync`, row-major): the code never reads
a fragment's elements, whose lane layout CUDA leaves unspecified. Then every thread finishes its
share of the tile's outputs as the reduction template does (codegen/reduce_kernel.py): stored
(with the epilogue group's element-wise statements), one atomic into the resident workspace, or a
partial; with a split, the last block to arrive (its flag in the K slab's storage) finishes and
resets the workspace or combines the partials in a fixed order, landed in shared memory by
cp.async where they fit (`land_partials`), else in register batches (`combine_partials`).

This module is the frame (the tile, its shared memory, the slab loop, the outputs' finish); one idea
a module around it: codegen/tc_staging.py stages the operands, codegen/wmma_kernel.py and
codegen/wgmma_kernel.py issue the MMAs, codegen/tc_partials.py combines a split's partials.
"""

from __future__ import annotations

import math

from ..schedule.int4_dequant import Nibbles, nibbles
from ..schedule.mapping import MergeMode
from ..schedule.tc_tiling import (
    FRAG,
    frags,
    grid_tiles,
    landed,
    loads_first,
    smem_bytes,
    staging_unroll,
    tiles,
    words_first,
)
from ..schedule.tensor_core import Mma, analyse
from ..schedule.warpgroup import MmaOp
from .reduce_kernel import _final, _reset, _write, apply_epilogue
from .tc_partials import combine_partials, land_partials, tile_outputs
from .tc_staging import stage_int4, stage_operand, stage_words
from .thread_loop import ThreadLoop, post
from .wgmma_kernel import wgmma_accumulators, wgmma_slab
from .wmma_kernel import wmma_accumulators, wmma_slab

INCLUDE = ("#ifndef PANAMERA_EMULATOR", "#include <mma.h>", "#include <cuda_pipeline.h>", "#endif")


def emit_tc(loop: ThreadLoop) -> list[str]:
    g, m = loop.g, loop.m
    ops = analyse(g)
    assert not isinstance(ops, str), ops
    st = g.statements[0]
    kind = Mma(m.mma)
    T, ACC = kind.ctype, kind.acc_ctype
    BM, BN, BK = tiles(m)
    _, NT = grid_tiles(ops, m)
    wn = m.mma_tile[1]
    FM, FN = frags(m)
    Q, P, K = ops.rows, ops.cols, ops.K
    threads = m.threads
    land = landed(m)
    smem = [
        f"  __shared__ __align__(32) {T} pn_sa[{BK // FRAG * BM * FRAG}];",
        f"  __shared__ __align__(32) {T} pn_sb[{BK // FRAG * BN * FRAG}];",
        f"  __shared__ __align__(32) {ACC} pn_sc[{BM * BN}];",
    ]
    if land:  # one buffer: the K slabs and the accumulators' tile, then the split's partials (`landing`)
        staging = (BM + BN) * BK * kind.itemsize
        smem = [
            f"  __shared__ __align__(32) unsigned char pn_sm[{land.bytes}];  // the K slabs and accumulators, then partials",
            f"  {T}* const pn_sa = reinterpret_cast<{T}*>(pn_sm);",
            f"  {T}* const pn_sb = pn_sa + {BK // FRAG * BM * FRAG};",
            f"  {ACC}* const pn_sc = reinterpret_cast<{ACC}*>(pn_sm + {staging});",
        ]
    wg = m.mma_op == MmaOp.WGMMA
    if wg:  # one buffer in the block's shared memory proper: the descriptors address it (PN_BLOCK_SHARED)
        staging = (BM + BN) * BK * kind.itemsize
        size = land.bytes if land else smem_bytes(kind, BM, BN, BK)
        smem = [
            f"  PN_BLOCK_SHARED(unsigned char, pn_sm, [{size}]);  // the K slabs (wgmma's core matrices) and accumulators",
            f"  {T}* const pn_sa = reinterpret_cast<{T}*>(pn_sm);",
            f"  {T}* const pn_sb = pn_sa + {BK // FRAG * BM * FRAG};",
            f"  {ACC}* const pn_sc = reinterpret_cast<{ACC}*>(pn_sm + {staging});",
        ]
    out = [
        f"  // tensor cores ({kind}{', wgmma' if wg else ''}): {BM} x {BN} outputs of {Q} x {P}, K slabs of {BK}, "
        f"K {m.chunk} per block",
        *smem,
        f"  const pn_idx pn_r0 = bx / {NT} * {BM}, pn_c0 = bx % {NT} * {BN};",
        f"  const pn_idx pn_k0 = by * (pn_idx){m.chunk};",
        f"  const pn_idx pn_k1 = pn_k0 + {m.chunk} < {K} ? pn_k0 + {m.chunk} : {K};",
        *(wgmma_accumulators(BN, wn, kind) if wg else wmma_accumulators(wn, FM, FN, ACC)),
        f"  for (pn_idx pn_ks = pn_k0; pn_ks < pn_k1; pn_ks += {BK}) {{",
    ]
    operands = ((BM, "a", ops.a, "pn_r0", Q, f"pn_x * {P}"), (BN, "b", ops.b, "pn_c0", P, "pn_x"))
    held = any(loads_first(e, m, g) for e in (ops.a, ops.b))
    staged = []
    for rows, tag, e, first, extent, i_of in operands:
        packed = nibbles(e, st, str(kind), m.vec, m.access[0])
        if isinstance(packed, Nibbles) or words_first(e, st, m):  # loads first, in flight while the other is staged
            stage = stage_int4 if isinstance(packed, Nibbles) else stage_words
            pre, loads, convert = stage(loop, kind, packed if isinstance(packed, Nibbles) else e, f"pn_s{tag}", rows,
                                        first, extent, i_of, tag)  # fmt: skip
            out[-1:-1] = pre  # before the slab loop: the first slab of a double buffer
            out += loads
            staged.append(convert)
        else:
            pragma = f"#pragma unroll {staging_unroll(e, rows, m, g, held)}  // loads in flight (the model's)"
            staged.append(
                [pragma, *stage_operand(loop, kind, e, f"pn_s{tag}", rows, BK, threads, first, extent, i_of, tag)]
            )
    out += [ln for lines in staged for ln in lines]
    out += wgmma_slab(BM, BN, BK, wn, kind) if wg else wmma_slab(BM, BN, BK, FM, FN, T)
    RM = min(BM, Q)  # the tile's rows that hold outputs (fewer than BM where M is): each thread's share of them
    mode = m.merges[0]
    joined = len(g.statements) > 1  # element-wise consumers applied where an output is final
    if mode == MergeMode.STORE and joined:
        finish = apply_epilogue(loop, 0, st, "o", post(st, "pn_v"))
    else:
        finish = _write(0, st, "o", "pn_v", mode, 0)
    out += tile_outputs(BN, RM, threads, P, Q, [f"const {st.acc.compute} pn_v = pn_sc[pn_e];", *finish])
    if m.needs_last_block:
        out += [
            "  __threadfence();",
            "  __syncthreads();",
            "  int* const pn_flag = reinterpret_cast<int*>(pn_sa);  // in the K slab's storage: 48 KB stay the tiles'",
            "  if (tx == 0) *pn_flag = atomicAdd(&pn_counter[bx], 1u) == gridDim.y - 1;",
            "  __syncthreads();",
            "  const int pn_is_last = *pn_flag;",
            "  __syncthreads();  // every thread has read the flag before the partials land over it",
            "  if (pn_is_last) {",
            "    __threadfence();",
        ]
        if mode == MergeMode.ATOMIC_WS:
            if joined and not m.epilogue:  # _final applies the consumers only in epilogue groups
                raise AssertionError("a stitched group's split merges partials")
            # the thread's merged outputs loaded together (one L2 round trip, not one per output), then finished
            pt = math.ceil(RM * BN / threads)
            load = ["pn_m[pn_u] = pn_ldcg(&ws0[o]);"]
            out.append(f"    decltype(pn_ldcg(&ws0[0])) pn_m[{pt}];")
            out += ["  " + ln for ln in tile_outputs(BN, RM, threads, P, Q, load, pt)]
            last = _final(loop, 0, st, "o", mode, 0, merged="pn_m[pn_u]") + _reset(0, st, "o", mode, 0)
            out += ["  " + ln for ln in tile_outputs(BN, RM, threads, P, Q, last, pt)]
        elif land:  # partials, every block's landed in shared memory at once, then folded in block order
            out += ["  " + ln for ln in land_partials(loop, st, BN, RM, threads, P, Q, land)]
        else:  # partials, combined in block order: each batch of blocks' partials loaded together, then folded
            out += ["  " + ln for ln in combine_partials(loop, st, BN, RM, threads, P, Q)]
        out.append("    if (tx == 0) pn_counter[bx] = 0u;  // resident: ready for the next call")
        out.append("  }")
    return out
