"""The tensor-core template's outputs (codegen/tc_kernel.py): `tile_outputs`, the loop over a block's
tile; with a split, the last block's combine of every block's partials in block order, landed in
shared memory by cp.async where they fit (`land_partials`), else loaded in register batches
(`combine_partials`), and their L2 lines dropped once read (`discard_partials`).
"""

from __future__ import annotations

import math

from ..schedule.tc_tiling import Landing, partial_batch
from .reduce_kernel import apply_epilogue
from .thread_loop import ThreadLoop, identity_expr, post


def combine_partials(loop: ThreadLoop, st, BN: int, BM: int, threads: int, P: int, Q: int) -> list[str]:
    """The last block's combine of the split's partials, for each of its `pt` outputs in block
    order (deterministic): `partial_batch` blocks' partials of all `pt` outputs are loaded into
    registers first (one L2 round trip per batch, the model's), then folded in."""
    S, pt = loop.m.split, math.ceil(BM * BN / threads)
    nb = partial_batch(pt, S)
    T, F = st.acc.compute, st.combiner.functor
    load = [
        "#pragma unroll",
        f"for (int pn_j = 0; pn_j < {nb}; ++pn_j)",
        f"  if (pn_b0 + pn_j < {S}) pn_m[pn_u][pn_j] = pn_ldcg(&ws0[o * {S} + pn_b0 + pn_j]);",
    ]
    fold = [
        "#pragma unroll",
        f"for (int pn_j = 0; pn_j < {nb}; ++pn_j)",
        f"  if (pn_b0 + pn_j < {S}) pn_p[pn_u] = {F}::apply(pn_p[pn_u], pn_m[pn_u][pn_j]);",
    ]
    value = post(st, "pn_p[pn_u]")
    done = apply_epilogue(loop, 0, st, "o", value) if len(loop.g.statements) > 1 else [f"pn_st(&out0[o], {value});"]
    return [
        f"  {T} pn_p[{pt}];",
        f"  for (int pn_u = 0; pn_u < {pt}; ++pn_u) pn_p[pn_u] = {identity_expr(st)};",
        f"  for (int pn_b0 = 0; pn_b0 < {S}; pn_b0 += {nb}) {{  // {nb} blocks' partials of each output in flight",
        f"    {T} pn_m[{pt}][{nb}];",
        *("  " + ln for ln in tile_outputs(BN, BM, threads, P, Q, load, pt)),
        *("  " + ln for ln in tile_outputs(BN, BM, threads, P, Q, fold, pt)),
        "  }",
        *tile_outputs(BN, BM, threads, P, Q, done, pt),
        *discard_partials(S, BN, BM, threads, P, Q),
    ]


def land_partials(loop: ThreadLoop, st, BN: int, BM: int, threads: int, P: int, Q: int, land: Landing) -> list[str]:
    """The last block's combine of the split's partials in one L2 round trip (schedule/
    tc_tiling.py `landing`, carried as `mma_land`): the first `land.blocks` blocks' partials of each of the thread's
    outputs (contiguous: ws0[o * S + b]) copied to shared memory with `__pipeline_memcpy_async`
    (no registers held), the other `land.held` blocks' loaded into registers, all in flight
    together; the thread then folds its own outputs' partials in block order (deterministic, the
    order of `combine_partials`), so no barrier is needed between its copies and its reads. The
    copies see every block's partials for the reason plain loads would: a (non-bulk) cp.async
    reads global memory as weak loads issued after the last block's acquire pattern (the
    counter's atomic, then `__threadfence()`), which pairs with each writer's fence before its
    atomic. Not because no block of this SM read the lines before: a 128-byte line can hold two
    tiles' partials where P x S x 4 bytes is not a multiple of 128."""
    S, pt, L, R = loop.m.split, math.ceil(BM * BN / threads), land.blocks, land.held
    T, F = st.acc.compute, st.combiner.functor
    step = land.copy // st.acc.itemsize
    issue = [
        "#pragma unroll",
        f"for (int pn_j = 0; pn_j < {L}; pn_j += {step})",
        f"  __pipeline_memcpy_async(&pn_sp[pn_e * {L} + pn_j], &ws0[o * {S} + pn_j], {land.copy});",
    ]
    fold = [
        f"{T} pn_p = {identity_expr(st)};",
        "#pragma unroll",
        f"for (int pn_j = 0; pn_j < {L}; ++pn_j) pn_p = {F}::apply(pn_p, pn_sp[pn_e * {L} + pn_j]);",
    ]
    if R:
        issue += [
            "#pragma unroll",
            f"for (int pn_j = 0; pn_j < {R}; ++pn_j) pn_m[pn_u][pn_j] = pn_ldcg(&ws0[o * {S} + {L} + pn_j]);",
        ]
        fold += [
            "#pragma unroll",
            f"for (int pn_j = 0; pn_j < {R}; ++pn_j) pn_p = {F}::apply(pn_p, pn_m[pn_u][pn_j]);",
        ]
    value = post(st, "pn_p")
    fold += apply_epilogue(loop, 0, st, "o", value) if len(loop.g.statements) > 1 else [f"pn_st(&out0[o], {value});"]
    return [
        f"  {T}* const pn_sp = reinterpret_cast<{T}*>(pn_sm);  // {L} blocks' partials of each output; {R} in registers",
        *([f"  {T} pn_m[{pt}][{R}];"] if R else []),
        *tile_outputs(BN, BM, threads, P, Q, issue, pt),
        "  __pipeline_commit();",
        "  __pipeline_wait_prior(0);  // every partial landed or loaded: one L2 round trip",
        *tile_outputs(BN, BM, threads, P, Q, fold, pt),
        *discard_partials(S, BN, BM, threads, P, Q),
    ]


def discard_partials(S: int, BN: int, BM: int, threads: int, P: int, Q: int) -> list[str]:
    """Once every thread of the last block has read them, the 128-byte L2 lines that hold only this
    tile's partials (ws0[o * S ...] of each row's outputs) are dropped without a write-back
    (`pn_discard_range`): the next call writes every partial before any is read, so the workspace
    never costs DRAM bandwidth where it fits in L2 (model/workspace.py `discarded`)."""
    end = f"(pn_c0 + {BN} < {P} ? pn_c0 + {BN} : {P})"
    return [
        "  __syncthreads();  // every partial of the tile read: its lines are dropped, never written back",
        f"  for (pn_idx pn_r = pn_r0; pn_r < pn_r0 + {BM} && pn_r < {Q}; ++pn_r)",
        f"    pn_discard_range(&ws0[(pn_r * {P} + pn_c0) * {S}], &ws0[(pn_r * {P} + {end}) * {S}], tx, {threads});",
    ]


def tile_outputs(BN: int, BM: int, threads: int, P: int, Q: int, body: list[str], unrolled: int = 0) -> list[str]:
    """`body` for each output o of the block's tile in range (pn_e its place in the tile); with
    `unrolled` the loop's iterations (pn_u) are unrolled."""
    head = [f"  for (int pn_e = tx; pn_e < {BM * BN}; pn_e += {threads}) {{"]
    if unrolled:
        head = ["#pragma unroll", f"  for (int pn_u = 0, pn_e = tx; pn_u < {unrolled}; ++pn_u, pn_e += {threads}) {{"]
    return [
        *head,
        f"    const pn_idx pn_row = pn_r0 + pn_e / {BN}, pn_col = pn_c0 + pn_e % {BN};",
        f"    if (pn_e < {BM * BN} && pn_row < {Q} && pn_col < {P}) {{",
        f"      const pn_idx o = pn_row * {P} + pn_col;",
        *("      " + ln for ln in body),
        "    }",
        "  }",
    ]
