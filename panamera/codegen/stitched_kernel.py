"""The stitched template: reductions and their consumers over whole rows (poly/stitch.py).

A block owns whole rows and makes one pass over each row per level of the mapping's `levels`:
the pass's reductions are all-reduced across the row and broadcast through shared memory, so the
next pass reads them from registers; a row epilogue runs on the row's leader thread once the
values it reads are final.

Split rows (`split` = gridDim.y > 1, a cooperative launch: every block resident). The S blocks
of a row group (same blockIdx.x) each own a chunk of the rows. After each pass with reductions,
a grid-wide exchange (`pn_grid_sync`, codegen/header.py):

    each block reduces its chunk; the row's leader writes the partial ws_k[row * S + by]
    arrival: thread 0 fences, adds 1 to pn_counter[bx], waits until it reaches S * (e + 1)
    every thread strides over the row's S partials in one fixed order, combines, all-reduces

so every block of a row holds the bit-identical row value, and the next pass reads it from
registers. Only the blocks with by == 0 store row results and run row epilogues. After the last
pass each block adds 1 to its departure counter pn_counter[gridDim.x + bx]; the last of the S to
depart resets both counters to zero (resident: the next call starts from zero; every block has
passed its last wait, so no block reads them any more). Column partials (a group with COLUMN statements, codegen/column_partials.py): the passes run in a
persistent loop over the row tiles (`bx` is the tile, blockIdx.x + t * gridDim.x), the pass
that holds the columns accumulates their register partials, and after the loop the block merges
them. The contract the emulator relies on:
shared memory carries no value across an exchange (every use of pn_smem / pn_bcast is written
and read between two of them).
"""

from __future__ import annotations

from ..poly.statement import StatementKind
from ..poly.stitch import is_epilogue
from ..schedule.decision import Completion, Residence
from ..schedule.mapping import passes
from ..schedule.onchip import kept_reads, steps
from . import column_partials, column_stitch, mbarrier
from .expr import convert
from .row_finish import finish_pass, shared_buffers
from .thread_loop import ThreadLoop, c_ident, identity_expr, post, post_dtype

CLUSTER_INCLUDE = ("#ifndef PANAMERA_EMULATOR", "#include <cooperative_groups.h>", "#endif")


def emit_stitched(loop: ThreadLoop) -> list[str]:
    if loop.g.consumed:  # columns read in the kernel: codegen/column_stitch.py
        return column_stitch.emit(loop)
    if loop.m.rtile * loop.m.ctile > 1:
        return _emit_tiled(loop)
    g, m = loop.g, loop.m
    level = m.levels
    split = m.split > 1
    leader = "by == 0 && tx == 0" if split else "tx == 0"  # who stores a row's values
    epilogues = [k for k, s in enumerate(g.statements) if is_epilogue(s)]
    columns = set(g.columns)  # column partials (codegen/column_partials.py): a persistent row loop
    head, out = [], [f"  const pn_idx o = bx * {m.ty} + ty;  // the row this thread works on"]
    head += shared_buffers(g.statements, m.tx, m.ty)
    clustered = m.cluster > 1
    if clustered:  # schedule/cluster.py: sm_90 only
        head = [
            "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900",
            "  __trap();  // a thread-block cluster needs sm_90",
            "#else",
            *head,
        ]
        out.append("  const cooperative_groups::cluster_group pn_cluster = cooperative_groups::this_cluster();")
        # every block of the cluster has started before a peer pushes into its shared memory: the
        # barrier is split around the first pass, whose loads hide it (schedule/cluster.py)
        setup_at = len(out)  # the mbarriers' set-up (codegen/mbarrier.py) goes before the arrival
        out.append("  pn_cluster.barrier_arrive();  // this block has started")
    out += _keep_rows(loop)
    exchange, expected = 0, []  # under mbarriers: each exchange's bytes (codegen/mbarrier.py)
    for lv in range(passes(g, level)):
        here = [k for k in range(len(g.statements)) if level[k] == lv and k not in epilogues]
        out.append(f"  // pass {lv}: " + ", ".join(g.statements[k].name for k in here))
        own = g.accumulator_of  # a statement that shares an accumulator reads its owner's
        for k in here:
            s = g.statements[k]
            if s.kind == StatementKind.REDUCE and own[k] == k and k not in columns:
                out.append(f"  {s.acc.compute} acc{k} = {identity_expr(s)};")
        if columns & set(here):
            out += column_partials.column_pass(loop, here)
        elif m.onchip != Residence.MEMORY:
            out += _kept_loop(loop, here)
        else:
            out += loop.loops(lambda call, here=here: loop.iteration(call, here))
        reduces = [k for k in here if g.statements[k].kind == StatementKind.REDUCE and k not in columns]
        owners = [k for k in reduces if own[k] == k]
        if split and owners:
            exchange += 1
            out += (
                _cluster_exchange(loop, owners, exchange, expected) if clustered else _exchange(loop, owners, exchange)
            )
        lines, regs = finish_pass(
            g.statements, reduces, own, m.tx, m.ty, leader, g.M, g.external, post, reduced=clustered and split
        )
        out += lines
        loop.regs.update(regs)
        for k in epilogues:  # the row's leader, once every value the epilogue reads is final
            s = g.statements[k]
            if level[k] != lv + 1 or k in g.column_epilogues:  # a column's: where it is final
                continue
            body, val = loop.body_lines(k, None)
            out.append(f"  if ({leader} && o < {g.M}) {{")
            out.append("    const pn_idx i = o; const pn_idx j = 0;")
            out += ["    " + ln for ln in body]
            out.append(f"    pn_st(&out{k}[{loop.address(s.write)}], {convert(val, s.body.dtype, s.result.dtype)});")
            out.append("  }")
    if m.persistent:  # block b's row tiles: b, b + gridDim.x, ...; then the columns' merge
        tiles = f"  for (pn_idx pn_tile = blockIdx.x; pn_tile < {m.grid[0]}; pn_tile += gridDim.x) {{"
        out = [tiles, "    const pn_idx bx = pn_tile;  // the row tile"] + ["  " + ln for ln in out] + ["  }"]
    if columns:
        head += column_partials.declare(loop)
        out += column_partials.merge(loop)
    if clustered and m.completion == Completion.MBARRIER and exchange:
        out[setup_at:setup_at] = mbarrier.setup(expected)
    if clustered:  # no peer reads this block's shared memory: its pushes all landed before the last barrier
        return head + out + ["#endif"]
    if split:
        out += [
            "  // departure: the last block of the row group resets its counters for the next call",
            "  __syncthreads();",
            f"  if (tx == 0 && ty == 0 && atomicAdd(&pn_counter[gridDim.x + bx], 1u) == {m.split}u - 1u) {{",
            "    pn_counter[bx] = 0u;",
            "    pn_counter[gridDim.x + bx] = 0u;",
            "  }",
        ]
    return head + out


def _cluster_exchange(loop: ThreadLoop, reduces: list[int], e: int, expected: list[str]) -> list[str]:
    """Exchange number e of a split row that is one thread-block cluster (schedule/cluster.py,
    QuACK's cluster reduction): every warp reduces its partial with shuffles, and its lanes b < S
    push it into slot [ty][rank * W + warp] of block b's shared memory (one buffer per exchange,
    so no barrier guards its reuse); after the cluster barrier every warp combines the W * S
    partials of its row from its own shared memory (lane l: slots l, l + 32, ...; then shuffles)
    and hands lane 0's value to its lanes. Every warp of every block of the row computes the
    same bits, so no block barrier and no all-reduce follow (finish_pass `reduced`). Under
    `Completion.MBARRIER` (the exchange's bytes appended to `expected`, announced at the start) the pushes are st.async onto the peer's mbarrier of exchange e and the
    cluster barrier becomes a wait on the block's own mbarrier (codegen/mbarrier.py): the same
    slots, the same combine order, the same bits."""
    g, m = loop.g, loop.m
    S, W = m.cluster, m.tx // 32
    mbar = m.completion == Completion.MBARRIER  # completed by mbarriers counting bytes (codegen/mbarrier.py)
    out = [
        f"  // exchange {e}: each warp's partial pushed into the {S} blocks of the row's cluster "
        f"(distributed shared memory{', st.async onto their mbarriers' if mbar else ''})"
    ]
    if e == 1:
        out.append("  pn_cluster.barrier_wait();  // every block of the cluster has started")
    pushes = []
    for k in reduces:
        s = g.statements[k]
        ct = s.acc.compute
        out.append(
            f"  acc{k} = pn_shfl0(pn_reduce_x<{s.combiner.functor}, 32, {m.ty}>(acc{k}, pn_smem_{c_ident(ct)}));"
        )
        out.append(f"  PN_BLOCK_SHARED({ct}, pn_dsm{e}_{k}, [{m.ty}][{W * S}]);")
        slot = f"pn_dsm{e}_{k}[ty][pn_cluster.block_rank() * {W}u + tx / 32u]"
        if mbar:
            pushes.append(mbarrier.push(slot, f"acc{k}", e, S))
        else:
            pushes.append(f"  if (tx % 32u < {S}u) *pn_cluster.map_shared_rank(&{slot}, tx % 32u) = acc{k};")
    if mbar:  # its bytes announced at the kernel's start (mbarrier.setup), as QuACK's
        expected.append(mbarrier.expected([g.statements[k].acc.compute for k in reduces], m.ty * W * S))
    out += pushes
    out.append(mbarrier.wait(e) if mbar else "  pn_cluster.sync();  // every block's partials are written")
    for k in reduces:
        s = g.statements[k]
        f = s.combiner.functor
        out.append(f"  acc{k} = {identity_expr(s)};")
        out.append(
            f"  for (unsigned i = tx % 32u; i < {W * S}u; i += 32u) acc{k} = {f}::apply(acc{k}, pn_dsm{e}_{k}[ty][i]);"
        )
        out.append(f"  acc{k} = pn_shfl0(pn_reduce_x<{f}, 32, {m.ty}>(acc{k}, pn_smem_{c_ident(s.acc.compute)}));")
    return out


def _keep_rows(loop: ThreadLoop) -> list[str]:
    """The storage of the rows kept on chip (schedule/onchip.py), one per kept value: each thread's
    `steps` vectors in registers, or the block's in shared memory ([ty][k][tx][vec]: a thread
    reads back only what it wrote, so no barrier); `loop.kept` names each (statement, read)'s."""
    g, m = loop.g, loop.m
    if m.onchip == Residence.MEMORY:
        return []
    out = [f"  // rows kept in {m.onchip}: pass 0 loads each vector once, later passes read it back"]
    level = m.levels
    for n, pairs in enumerate(kept_reads(g, m.vec)):
        k, ri = pairs[0]
        ct = g.statements[k].reads[ri].tensor.dtype.compute
        if m.onchip == Residence.REGISTERS:
            out.append(f"  {ct} pn_row{n}[{steps(m)}][{m.vec}];")
            name = f"pn_row{n}[pn_k]"
        else:
            out.append(f"  PN_BLOCK_SHARED({ct}, pn_rows{n}, [{m.ty}][{steps(m)}][{m.tx}][{m.vec}]);")
            name = f"pn_rows{n}[ty][pn_k][tx]"
        for pair in pairs:
            loop.kept[pair] = name
            if level[pair[0]] == 0:
                loop.kept_loads.add(pair)
    return out


def _kept_loop(loop: ThreadLoop, here: list[int]) -> list[str]:
    """One pass over the thread's vectors of its row when the row is kept on chip: the k loop of
    the binding (g = by * chunk + k * tx + tx, schedule/mapping.py) written out and unrolled in
    full, so that the kept vector of step k is a register (or a fixed shared-memory slot)."""
    g, m = loop.g, loop.m
    full = m.onchip == Residence.REGISTERS
    out = ["#pragma unroll" if full else f"#pragma unroll {m.unroll}"]
    out.append(f"  for (int pn_k = 0; pn_k < {steps(m)}; ++pn_k) {{")
    out.append(f"    const pn_idx pn_g = by * {m.chunk} + pn_k * {m.tx} + tx;")
    out.append(f"    if (o < {g.M} && pn_g < {m.N // m.vec}) {{")
    out += ["      " + ln for ln in loop.iteration_at("o", "pn_g", here)]
    return out + ["    }", "  }"]


def _exchange(loop: ThreadLoop, reduces: list[int], e: int) -> list[str]:
    """Exchange number e (from 1) of split rows: this block's partials out, every block's in
    (`reduces`: the accumulators of the pass, each once)."""
    g, m = loop.g, loop.m
    S = m.split
    out = [f"  // exchange {e}: the {S} blocks of each row combine their partials"]
    for k in reduces:
        s = g.statements[k]
        tmpl = f"<{s.combiner.functor}, {m.tx}, {m.ty}>"
        out.append(f"  acc{k} = pn_reduce_x{tmpl}(acc{k}, pn_smem_{c_ident(s.acc.compute)});")
        out.append(f"  if (tx == 0 && o < {g.M}) ws{k}[o * {S} + by] = acc{k};")
    out.append(f"  pn_grid_sync(&pn_counter[bx], {S * e}u);")
    for k in reduces:
        s = g.statements[k]
        out.append(f"  acc{k} = {identity_expr(s)};")
        out.append(
            f"  if (o < {g.M}) for (pn_idx b = tx; b < {S}; b += {m.tx}) "
            f"acc{k} = {s.combiner.functor}::apply(acc{k}, pn_ldcg(&ws{k}[o * {S} + b]));"
        )
    return out


def _emit_tiled(loop: ThreadLoop) -> list[str]:
    """Whole rows under a register tile (schedule/rtile.py; never split): as above, with one
    accumulator and one register per row of the thread's tile, indexed pn_v = r * ctile + c
    (the tiled iteration defines it; the per-row loops here run it), each row all-reduced, stored
    and finished by its row epilogues on its own."""
    g, m = loop.g, loop.m
    T = m.rtile * m.ctile
    level = m.levels
    epilogues = [k for k, s in enumerate(g.statements) if is_epilogue(s)]
    row, valid = loop.tile_row("pn_t", f"pn_v / {m.ctile}", f"pn_v % {m.ctile}")
    out = [f"  const pn_idx pn_t = bx * {m.ty} + ty;  // the tile row this thread works on"]
    for ct in dict.fromkeys(s.acc.compute for s in g.statements if s.kind == StatementKind.REDUCE):
        safe = c_ident(ct)
        out.append(f"  __shared__ {ct} pn_smem_{safe}[{m.ty * max(1, m.tx // 32)}];")
        out.append(f"  __shared__ {ct} pn_bcast_{safe}[{m.ty}];")

    def per_row(body: list[str]) -> list[str]:
        head = [f"  for (int pn_v = 0; pn_v < {T}; ++pn_v) {{", f"    const pn_idx o = {row};"]
        return head + ["  " + ln for ln in body] + ["  }"]

    for lv in range(passes(g, level)):
        here = [k for k in range(len(g.statements)) if level[k] == lv and k not in epilogues]
        out.append(f"  // pass {lv}: " + ", ".join(g.statements[k].name for k in here))
        own = g.accumulator_of
        for k in here:
            s = g.statements[k]
            if s.kind == StatementKind.REDUCE and own[k] == k:
                out.append(f"  {s.acc.compute} acc{k}[{T}];")
                out.append(f"  for (int v = 0; v < {T}; ++v) acc{k}[v] = {identity_expr(s)};")
        out += loop.loops(lambda call, here=here: loop.iteration(call, here))
        for k in [k for k in here if g.statements[k].kind == StatementKind.REDUCE]:
            s = g.statements[k]
            if own[k] == k:
                safe = c_ident(s.acc.compute)
                tmpl = f"<{s.combiner.functor}, {m.tx}, {m.ty}>"
                out.append(
                    f"  for (int v = 0; v < {T}; ++v) "
                    f"acc{k}[v] = pn_allreduce_x{tmpl}(acc{k}[v], pn_smem_{safe}, pn_bcast_{safe});"
                )
            final = convert(post(s, f"acc{own[k]}[v]"), post_dtype(s), s.result.dtype)
            out.append(f"  {s.result.dtype.compute} r{k}[{T}];")
            out.append(f"  for (int v = 0; v < {T}; ++v) r{k}[v] = {final};")
            loop.regs[s.result.uid] = f"r{k}[pn_v]"
            if s.result.uid in g.external:
                out += per_row([f"  if (tx == 0 && {valid}) pn_st(&out{k}[o], r{k}[pn_v]);"])
        for k in epilogues:  # each row's leader, once every value the epilogue reads is final
            s = g.statements[k]
            if level[k] != lv + 1:
                continue
            body, val = loop.body_lines(k, None)
            lines = [f"  if (tx == 0 && {valid}) {{", "    const pn_idx i = o; const pn_idx j = 0;"]
            lines += ["    " + ln for ln in body]
            lines.append(f"    pn_st(&out{k}[{loop.address(s.write)}], {convert(val, s.body.dtype, s.result.dtype)});")
            out += per_row(lines + ["  }"])
    return out
