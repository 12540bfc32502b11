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
warpgroup tile stages the same operands into wgmma's core matrices (`_slot`) in the block's shared
memory (PN_BLOCK_SHARED: the descriptors address it) and each of its 1-2 warpgroups issues BK / 16
`wgmma.mma_async` m64nNk16 on its 64 x N columns, fenced, committed and waited for within the slab.

The accumulators go through shared memory (`store_matrix_sync`, row-major): the code never reads
a fragment's elements, whose lane layout CUDA leaves unspecified. Then every thread finishes its
share of the tile's outputs as the reduction template does (codegen/reduce_kernel.py): stored
(with the epilogue group's element-wise statements), one atomic into the resident workspace, or a
partial; with a split, the last block to arrive (its flag in the K slab's storage) finishes and
resets the workspace or combines the partials in a fixed order, landed in shared memory by
cp.async where they fit (`_land_partials`), else in register batches (`_combine_partials`).
"""

from __future__ import annotations

import math

from ..poly.access import AccessKind
from ..schedule.int4_dequant import Nibbles, nibbles
from ..schedule.mapping import MergeMode
from ..schedule.tc_tiling import (
    FRAG,
    Landing,
    frags,
    grid_tiles,
    landed,
    loads_first,
    partial_batch,
    raw_copy,
    smem_bytes,
    staging_steps,
    staging_unroll,
    tiles,
    words_first,
)
from ..schedule.tensor_core import Mma, analyse
from ..schedule.warpgroup import MmaOp
from .expr import ExprRenderer
from .reduce_kernel import _final, _reset, _write, apply_epilogue
from .thread_loop import ThreadLoop, identity_expr, post
from .wgmma_kernel import wgmma_accumulators, wgmma_slab

INCLUDE = ("#ifndef PANAMERA_EMULATOR", "#include <mma.h>", "#include <cuda_pipeline.h>", "#endif")
W = "nvcuda::wmma"


def _convert(kind: Mma, v: str) -> str:
    if kind is Mma.S8:
        return f"(signed char)({v})"
    return f"{'__float2half_rn' if kind is Mma.F16 else '__float2bfloat16_rn'}((float)({v}))"


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
        *(wgmma_accumulators(BN, wn) if wg else _wmma_accumulators(wn, FM, FN, ACC)),
        f"  for (pn_idx pn_ks = pn_k0; pn_ks < pn_k1; pn_ks += {BK}) {{",
    ]
    operands = ((BM, "a", ops.a, "pn_r0", Q, f"pn_x * {P}"), (BN, "b", ops.b, "pn_c0", P, "pn_x"))
    held = any(loads_first(e, m, g) for e in (ops.a, ops.b))
    staged = []
    for rows, tag, e, first, extent, i_of in operands:
        packed = nibbles(e, st, str(kind), m.vec, m.access[0])
        if isinstance(packed, Nibbles) or words_first(e, st, m):  # loads first, in flight while the other is staged
            stage = _stage_int4 if isinstance(packed, Nibbles) else _stage_words
            pre, loads, convert = stage(loop, kind, packed if isinstance(packed, Nibbles) else e, f"pn_s{tag}", rows,
                                        first, extent, i_of, tag)  # fmt: skip
            out[-1:-1] = pre  # before the slab loop: the first slab of a double buffer
            out += loads
            staged.append(convert)
        else:
            pragma = f"#pragma unroll {staging_unroll(e, rows, m, g, held)}  // loads in flight (the model's)"
            staged.append([pragma, *_stage(loop, kind, e, f"pn_s{tag}", rows, BK, threads, first, extent, i_of, tag)])
    out += [ln for lines in staged for ln in lines]
    out += wgmma_slab(BM, BN, BK, wn, T) if wg else _wmma_slab(BM, BN, BK, FM, FN, T)
    RM = min(BM, Q)  # the tile's rows that hold outputs (fewer than BM where M is): each thread's share of them
    mode = m.merges[0]
    joined = len(g.statements) > 1  # element-wise consumers applied where an output is final
    if mode == MergeMode.STORE and joined:
        finish = apply_epilogue(loop, 0, st, "o", post(st, "pn_v"))
    else:
        finish = _write(0, st, "o", "pn_v", mode, 0)
    out += _outputs(BN, RM, threads, P, Q, [f"const {st.acc.compute} pn_v = pn_sc[pn_e];", *finish])
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
            out += ["  " + ln for ln in _outputs(BN, RM, threads, P, Q, load, pt)]
            last = _final(loop, 0, st, "o", mode, 0, merged="pn_m[pn_u]") + _reset(0, st, "o", mode, 0)
            out += ["  " + ln for ln in _outputs(BN, RM, threads, P, Q, last, pt)]
        elif land:  # partials, every block's landed in shared memory at once, then folded in block order
            out += ["  " + ln for ln in _land_partials(loop, st, BN, RM, threads, P, Q, land)]
        else:  # partials, combined in block order: each batch of blocks' partials loaded together, then folded
            out += ["  " + ln for ln in _combine_partials(loop, st, BN, RM, threads, P, Q)]
        out.append("    if (tx == 0) pn_counter[bx] = 0u;  // resident: ready for the next call")
        out.append("  }")
    return out


def _wmma_accumulators(wn: int, FM: int, FN: int, ACC: str) -> list[str]:
    return [
        f"  const int pn_wr = (int)tx / 32 / {wn}, pn_wc = (int)tx / 32 % {wn};  // the warp's {FM} x {FN} fragments",
        f"  {W}::fragment<{W}::accumulator, 16, 16, 16, {ACC}> pn_acc[{FM}][{FN}];",
        "#pragma unroll",
        f"  for (int pn_i = 0; pn_i < {FM}; ++pn_i)",
        "#pragma unroll",
        f"    for (int pn_j = 0; pn_j < {FN}; ++pn_j) {W}::fill_fragment(pn_acc[pn_i][pn_j], ({ACC})0);",
    ]


def _wmma_slab(BM: int, BN: int, BK: int, FM: int, FN: int, T: str) -> list[str]:
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


def _combine_partials(loop: ThreadLoop, st, BN: int, BM: int, threads: int, P: int, Q: int) -> list[str]:
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
        *("  " + ln for ln in _outputs(BN, BM, threads, P, Q, load, pt)),
        *("  " + ln for ln in _outputs(BN, BM, threads, P, Q, fold, pt)),
        "  }",
        *_outputs(BN, BM, threads, P, Q, done, pt),
        *_discard_partials(S, BN, BM, threads, P, Q),
    ]


def _land_partials(loop: ThreadLoop, st, BN: int, BM: int, threads: int, P: int, Q: int, land: Landing) -> list[str]:
    """The last block's combine of the split's partials in one L2 round trip (schedule/
    tc_tiling.py `landing`, carried as `mma_land`): the first `land.blocks` blocks' partials of each of the thread's
    outputs (contiguous: ws0[o * S + b]) copied to shared memory with `__pipeline_memcpy_async`
    (no registers held), the other `land.held` blocks' loaded into registers, all in flight
    together; the thread then folds its own outputs' partials in block order (deterministic, the
    order of `_combine_partials`), so no barrier is needed between its copies and its reads. The
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
        *_outputs(BN, BM, threads, P, Q, issue, pt),
        "  __pipeline_commit();",
        "  __pipeline_wait_prior(0);  // every partial landed or loaded: one L2 round trip",
        *_outputs(BN, BM, threads, P, Q, fold, pt),
        *_discard_partials(S, BN, BM, threads, P, Q),
    ]


def _discard_partials(S: int, BN: int, BM: int, threads: int, P: int, Q: int) -> list[str]:
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


def _slot(m, buf: str, rows: int, x: str, k: str, lane: str = "") -> str:
    """Element (x, k) of an operand's slab of `rows` x BK in shared memory (plus `lane`, the
    consecutive k of a step's `vec` lanes, within k's 16, or k's 8 for wgmma): the one place the
    staging loops write the layout the MMAs read. For wmma each 16-wide K step is a contiguous
    `rows` x 16 block, row-major (fragments load it with ldm 16); for a warpgroup MMA (`m.mma_op`)
    the slab is wgmma's core matrices of 8 rows x 8 k (16 bytes a row, 128 contiguous bytes each),
    the `rows` / 8 of each 8 k consecutive: the descriptor's stride (SBO) between row groups is
    128 bytes, its leading offset (LBO) between the two k halves of a step `rows` x 16 bytes.

    >>> from types import SimpleNamespace as NS
    >>> _slot(NS(mma_op=""), "pn_sa", 32, "pn_q", "pn_p", " + v")
    'pn_sa[(pn_p / 16 * 32 + pn_q) * 16 + pn_p % 16 + v]'
    >>> _slot(NS(mma_op="wgmma"), "pn_sa", 64, "pn_q", "pn_p", " + v")
    'pn_sa[(pn_p / 8 * 8 + pn_q / 8) * 64 + pn_q % 8 * 8 + pn_p % 8 + v]'
    """
    if m.mma_op == MmaOp.WGMMA:
        return f"{buf}[({k} / 8 * {rows // 8} + {x} / 8) * 64 + {x} % 8 * 8 + {k} % 8{lane}]"
    return f"{buf}[({k} / 16 * {rows} + {x}) * 16 + {k} % 16{lane}]"


def _stage(loop: ThreadLoop, kind: Mma, e, buf: str, rows: int, BK: int, threads: int, r0: str, extent: int,
           i_of: str, tag: str) -> list[str]:  # fmt: skip
    """The loop that fills one operand's slab: element (x, k) of the tile at
    buf[(k / 16 * rows + x) * 16 + k % 16]; each step a thread takes `vec` consecutive k (the
    operands' contiguous axis), its contiguous reads loaded as one vector each (the mapping's
    access kinds), the others per lane."""
    st, V = loop.g.statements[0], loop.m.vec
    reads = sorted({n.read for n in e.walk() if n.op == "load"})
    vector = [r for r in reads if V > 1 and loop.m.access[0][r] == AccessKind.CONTIG and st.reads[r].memory]
    if raw_copy(e, st, kind, V, loop.m.access[0]):
        return _stage_raw(loop, kind, e.read, buf, rows, BK, threads, r0, extent, i_of)
    lines: list[str] = []

    def load(read: int, index: str | None = None) -> str:
        r = st.reads[read]
        if read in vector:
            return f"pn_{tag}v{read}[v]"
        if not r.memory:  # iota: the index itself
            return f"((long long)({loop.address(r.addr)}))"
        return f"pn_ld(&{loop.in_name[r.tensor.uid]}[{loop.address(r.addr)}])"

    value = ExprRenderer(lines, f"pn_{tag}").render(e, load)
    zero = _convert(kind, "0")
    out = [
        f"    for (int pn_e = tx; pn_e < {rows * BK // V}; pn_e += {threads}) {{",
        f"      const int pn_q = pn_e / {BK // V}, pn_p = pn_e % {BK // V} * {V};",
        f"      const pn_idx pn_x = {r0} + pn_q, pn_k = pn_ks + pn_p;",
        f"      {kind.ctype} pn_val[{V}];",
        f"      if (pn_x < {extent} && pn_k < pn_k1) {{  // k1 and the vector width divide K: all lanes in range",
        f"        const pn_idx i = {i_of}; (void)i;",
    ]
    if vector:
        for r in vector:
            out.append(f"        {st.reads[r].tensor.dtype.compute} pn_{tag}v{r}[{V}];")
        out.append("        { const pn_idx j = pn_k;")
        for r in vector:
            addr = loop.address(st.reads[r].addr)
            out.append(f"          pn_ldv(&{loop.in_name[st.reads[r].tensor.uid]}[{addr}], pn_{tag}v{r});")
        out.append("        }")
    out += [
        "#pragma unroll",
        f"        for (int v = 0; v < {V}; ++v) {{",
        "          const pn_idx j = pn_k + v; (void)j;",
        *("          " + ln for ln in lines),
        f"          pn_val[v] = {_convert(kind, value)};",
        "        }",
        "      } else {",
        f"        for (int v = 0; v < {V}; ++v) pn_val[v] = {zero};",
        "      }",
        f"      for (int v = 0; v < {V}; ++v) {_slot(loop.m, buf, rows, 'pn_q', 'pn_p', ' + v')} = pn_val[v];",
        "    }",
    ]
    return out


def _stage_raw(loop: ThreadLoop, kind: Mma, read: int, buf: str, rows: int, BK: int, threads: int, r0: str,
               extent: int, i_of: str) -> list[str]:  # fmt: skip
    """`_stage` for an operand that is a contiguous read of the MMA's type (`raw_copy`): each step
    copies its vec lanes' bytes from global to shared memory as one vector, no conversion."""
    r, V = loop.g.statements[0].reads[read], loop.m.vec
    vt = {4: "unsigned", 8: "uint2", 16: "uint4"}[V * kind.itemsize]
    dst = f"&{_slot(loop.m, buf, rows, 'pn_q', 'pn_p')}"
    return [
        f"    for (int pn_e = tx; pn_e < {rows * BK // V}; pn_e += {threads}) {{",
        f"      const int pn_q = pn_e / {BK // V}, pn_p = pn_e % {BK // V} * {V};",
        f"      const pn_idx pn_x = {r0} + pn_q, pn_k = pn_ks + pn_p;",
        f"      {vt} pn_raw = {vt}{{}};  // zero outside the tile and the K range (the tails)",
        f"      if (pn_x < {extent} && pn_k < pn_k1) {{  // {V} lanes of {kind.ctype}, copied as they are",
        f"        const pn_idx i = {i_of}, j = pn_k; (void)i;",
        f"        pn_raw = pn_vload<{vt}>(&{loop.in_name[r.tensor.uid]}[{loop.address(r.addr)}]);",
        "      }",
        f"      pn_vstore({dst}, pn_raw);",
        "    }",
    ]


def _stage_int4(loop: ThreadLoop, kind: Mma, nib: Nibbles, buf: str, rows: int, r0: str, extent: int, i_of: str,
                tag: str) -> tuple[list[str], list[str], list[str]]:  # fmt: skip
    """`_stage` for a packed int4 operand (schedule/int4_dequant.py): each step's vec / 8 words of
    packed bytes (one vector load) and its scale held in registers, double-buffered
    (`_double_buffered`); then `pn_i4x8` turns each word into 8 weights of the MMA's type (the
    exponent trick), in k order (`flip`: low nibble at odd k), stored to the slab."""
    st, m = loop.g.statements[0], loop.m
    V, BK = m.vec, tiles(m)[2]
    T, words = kind.ctype, V // 8
    pair = {Mma.F16: ("__half2", "pn_h2_bits", "__half2half2"), Mma.BF16: ("__nv_bfloat162", "pn_b2_bits",
            "__bfloat162bfloat162")}[kind]  # fmt: skip
    pk, sc = st.reads[nib.packed], st.reads[nib.scale]
    vtype = {1: "unsigned", 2: "uint2"}[words]
    fields = ["pn_wv"] if words == 1 else ["pn_wv.x", "pn_wv.y"]
    zero = _convert(kind, "0")
    total, steps = rows * BK // V, staging_steps(rows, m)

    def fill(into: str) -> list[str]:
        return [
            f"{into}w[pn_u] = pn_vload<{vtype}>(&{loop.in_name[pk.tensor.uid]}[{loop.address(pk.addr)}]);",
            f"{into}sc[pn_u] = {loop.in_name[sc.tensor.uid]}[{loop.address(sc.addr)}];",
        ]

    pre, top, where = _double_buffered(loop, tag, rows, r0, extent, i_of, [(vtype, "w"), (T, "sc")], fill)
    w, s = f"pn_{tag}w", f"pn_{tag}sc"
    convert = [
        f"    const {pair[0]} pn_z2 = {pair[1]}(0x{nib.bias_bits(str(kind)):08x}u);  // 1024 (fp16) or 128 (bf16) + zero point",
        "#pragma unroll",
        f"    for (int pn_u = 0; pn_u < {steps}; ++pn_u) {{  // the words by the exponent trick (pn_i4x8)",
        *("  " + ln for ln in where),
        f"      if (pn_e < {total}) {{",
        f"        {T} pn_val[{V}];",
        f"        const {vtype} pn_wv = {w}[pn_u];",
        f"        const {pair[0]} pn_s2 = {pair[2]}({s}[pn_u]);",
    ]
    for k, f in enumerate(fields):
        convert += [
            f"        {{ {T} pn_n[8];",
            f"          pn_i4x8({f}, pn_z2, pn_s2, pn_n);",
            "#pragma unroll",
            f"          for (int v = 0; v < 8; ++v) pn_val[{8 * k} + v] = pn_in ? pn_n[v ^ {nib.flip}] : {zero};",
            "        }",
        ]
    convert += [
        f"        for (int v = 0; v < {V}; ++v) {_slot(loop.m, buf, rows, 'pn_q', 'pn_p', ' + v')} = pn_val[v];",
        "      }",
        "    }",
    ]
    return pre, top, convert


def _double_buffered(loop: ThreadLoop, tag: str, rows: int, r0: str, extent: int, i_of: str, held: list[tuple[str, str]],
                     fill) -> tuple[list[str], list[str], list[str]]:  # fmt: skip
    """The loads of a `loads_first` operand, double-buffered: `held` the (type, name) register
    arrays of a slab's steps, `fill(into)` the lines loading one step's values into
    `into{name}[pn_u]` where `pn_in`. Returns (before the slab loop: the first slab's loads into
    the next-slab buffer; at the top of the loop: this slab's values from it and the next slab's
    loads issued; the `where` lines that place step pn_u of this slab)."""
    m = loop.m
    V, BK, threads = m.vec, tiles(m)[2], m.threads
    total, steps = rows * BK // V, staging_steps(rows, m)

    def where(slab: str) -> list[str]:
        return [
            f"    const int pn_e = tx + pn_u * {threads};",
            f"    const int pn_q = pn_e / {BK // V}, pn_p = pn_e % {BK // V} * {V};",
            f"    const pn_idx pn_x = {r0} + pn_q, pn_k = {slab} + pn_p;",
            f"    const bool pn_in = pn_e < {total} && pn_x < {extent} && pn_k < pn_k1;  // the tails: zeros",
        ]

    def load(slab: str, into: str) -> list[str]:
        return [
            "#pragma unroll",
            f"    for (int pn_u = 0; pn_u < {steps}; ++pn_u) {{",
            *("  " + ln for ln in where(slab)),
            *(f"      {into}{n}[pn_u] = {t}{{}};" for t, n in held),
            "      if (pn_in) {",
            f"        const pn_idx i = {i_of}, j = pn_k; (void)i;",
            *("        " + ln for ln in fill(into)),
            "      }",
            "    }",
        ]

    cur, nxt = f"pn_{tag}", f"pn_{tag}n"  # this slab's values; the next slab's, loaded while this one is used
    decl = [f"    {t} {{0}}{n}[{steps}];" for t, n in held]
    pre = [ln[2:] if ln.startswith("  ") else ln for ln in [*(d.format(nxt) for d in decl), *load("pn_k0", nxt)]]
    top = [
        "    // the slab's loads, all in flight before any is used, double-buffered",
        *(d.format(cur) for d in decl),
        "#pragma unroll",
        f"    for (int pn_u = 0; pn_u < {steps}; ++pn_u) {{ "
        + " ".join(f"{cur}{n}[pn_u] = {nxt}{n}[pn_u];" for _, n in held)
        + " }",
        f"    if (pn_ks + {BK} < pn_k1) {{  // the next slab's loads in flight during this one",
        *("  " + ln for ln in load(f"(pn_ks + {BK})", nxt)),
        "    }",
    ]
    return pre, top, where("pn_ks")


def _stage_words(loop: ThreadLoop, kind: Mma, e, buf: str, rows: int, r0: str, extent: int, i_of: str,
                 tag: str) -> tuple[list[str], list[str], list[str]]:  # fmt: skip
    """`_stage` for a `words_first` operand (schedule/tc_tiling.py): each step's contiguous reads
    loaded as raw vectors and its uniform reads as one value, double-buffered
    (`_double_buffered`); then each lane's expression over them, converted to the MMA's type."""
    st, m = loop.g.statements[0], loop.m
    V, BK = m.vec, tiles(m)[2]
    total, steps = rows * BK // V, staging_steps(rows, m)
    reads = sorted({n.read for n in e.walk() if n.op == "load"})
    contig = [r for r in reads if m.access[0][r] == AccessKind.CONTIG]
    vt = {4: "unsigned", 8: "uint2", 16: "uint4"}
    held = [(vt[V * st.reads[r].tensor.dtype.itemsize], f"c{r}") for r in contig]
    held += [(st.reads[r].tensor.dtype.c_type, f"u{r}") for r in reads if r not in contig]

    def fill(into: str) -> list[str]:
        out = []
        for r in reads:
            rd, name = st.reads[r], loop.in_name[st.reads[r].tensor.uid]
            if r in contig:
                out.append(
                    f"{into}c{r}[pn_u] = pn_vload<{vt[V * rd.tensor.dtype.itemsize]}>(&{name}[{loop.address(rd.addr)}]);"
                )
            else:
                out.append(f"{into}u{r}[pn_u] = {name}[{loop.address(rd.addr)}];")
        return out

    pre, top, where = _double_buffered(loop, tag, rows, r0, extent, i_of, held, fill)
    cur = f"pn_{tag}"

    def load(read: int, index: str | None = None) -> str:
        if read in contig:
            c = st.reads[read].tensor.dtype.c_type
            return f"pn_ld(&reinterpret_cast<const {c}*>(&{cur}c{read}[pn_u])[v])"
        return f"pn_ld(&{cur}u{read}[pn_u])"

    lines: list[str] = []
    value = ExprRenderer(lines, f"pn_{tag}").render(e, load)
    zero = _convert(kind, "0")
    convert = [
        "#pragma unroll",
        f"    for (int pn_u = 0; pn_u < {steps}; ++pn_u) {{  // each lane's value from the held loads",
        *("  " + ln for ln in where),
        f"      if (pn_e < {total}) {{",
        f"        {kind.ctype} pn_val[{V}];",
        "#pragma unroll",
        f"        for (int v = 0; v < {V}; ++v) {{",
        *("          " + ln for ln in lines),
        f"          pn_val[v] = pn_in ? {_convert(kind, value)} : {zero};",
        "        }",
        f"        for (int v = 0; v < {V}; ++v) {_slot(loop.m, buf, rows, 'pn_q', 'pn_p', ' + v')} = pn_val[v];",
        "      }",
        "    }",
    ]
    return pre, top, convert


def _outputs(BN: int, BM: int, threads: int, P: int, Q: int, body: list[str], unrolled: int = 0) -> list[str]:
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
