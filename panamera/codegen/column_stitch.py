"""Stitched COLUMN reductions and their consumers in one cooperative launch (poly/column_stitch.py):
BatchNorm backward in NHWC, the per-channel sums and dx.

The mapping is schedule/persistent.py's persistent row loop (block b owns the row tiles b,
b + gridDim.x, ...), with the columns merged by PARTIALS_GRID (the only legal merge: every block
needs the final columns)::

    float pn_c0[S * V] = 0, pn_c1[S * V] = 0;          // column partials (column_partials.py)
    for (tile = blockIdx.x; ...) pass 0: pn_c0[s * V + v] += dy[i, j]; ...
    partials reduced over ty, written to ws[b * N + j]; pn_grid_sync (arrivals = gridDim.x)
    block b sums its share of the columns in block order, stores out_k[j]
    pn_grid_sync (arrivals = 2 gridDim.x): every column is final; the partials' lines dropped
    float pn_fin0[S * V] = out0[j], ...                 // the thread's columns, once, from L2
    for (tile = its last; tile >= blockIdx.x; tile -= gridDim.x)   // backwards: the L2's tiles first
      pass 1: dx[i, j] = f(x[i, j], dy[i, j], pn_fin0[s * V + v], ...)
    departure: the last block resets both counters (resident, ready for the next call)

Or (ATOMIC_GRID, not deterministic) one atomic per block per column into a resident workspace,
one grid-wide wait, every thread reads the merged values back (block 0 stores the outputs), and
the last block to depart resets the workspace. Either way every block reads the same values.

Every block reads the same stored values, so dx is the same whatever the blocks' order.

With column groups (`cgroups` > 1, schedule/persistent.py precondition 6) all of the above but the
departure runs once per group, `for (pn_cg ...)`, over the group's N / cgroups columns (the threads
span one group; partials reset at its start), and the waits count every group's arrivals before it
(targets 2 (cg + 1) gridDim.x, or cg + 1 under atomics): each group's dx pass re-reads the L2 lines
its own columns' pass left.
"""

from __future__ import annotations

from ..algebra import AtomicStrategy
from ..poly.statement import StatementKind
from ..schedule import dynsmem
from ..schedule.hold import held_tensors, region_bytes
from ..schedule.mapping import MergeMode, passes
from . import column_partials
from .expr import convert
from .reduce_kernel import workspace_identity
from .thread_loop import ThreadLoop, post, post_dtype


def _tiles(loop: ThreadLoop, body: list[str], backwards: bool = False) -> list[str]:
    """The block's row tiles: blockIdx.x, + gridDim.x, ... (`backwards`: the last first, so the
    tiles the columns' pass read last, still in L2, are re-read first)."""
    m = loop.m
    T = m.grid[0]
    loop_head = (
        f"  for (pn_idx pn_tile = blockIdx.x + ({T} - 1 - (pn_idx)blockIdx.x) / (pn_idx)gridDim.x * (pn_idx)gridDim.x;"
        f" pn_tile >= (pn_idx)blockIdx.x; pn_tile -= (pn_idx)gridDim.x) {{"
        if backwards
        else f"  for (pn_idx pn_tile = blockIdx.x; pn_tile < {T}; pn_tile += gridDim.x) {{"
    )
    return [
        loop_head,
        "    const pn_idx bx = pn_tile;  // the row tile",
        *(
            ["    const pn_idx pn_k = (pn_tile - (pn_idx)blockIdx.x) / (pn_idx)gridDim.x;  // the block's k-th"]
            if m.hold
            else []
        ),
        f"    const pn_idx o = bx * {m.ty} + ty;  // the row this thread works on",
        *["  " + ln for ln in body],
        "  }",
    ]


def _atomic(loop: ThreadLoop) -> bool:
    return MergeMode.ATOMIC_GRID in loop.m.merges


def _merged(loop: ThreadLoop, k: int) -> str:
    """Column k's final value at j, from memory: the stored output (PARTIALS_GRID), or its finish
    of the owner's merged workspace (ATOMIC_GRID)."""
    g = loop.g
    s, own = g.statements[k], g.accumulator_of[k]
    if not _atomic(loop):
        return f"pn_ldcg(&out{k}[j])"
    merged = f"pn_ldcg(&ws{own}[j])"
    if s.combiner.atomic(s.acc) == AtomicStrategy.ORDERED:
        merged = f"pn_unordered({merged})"
    return convert(post(s, merged), post_dtype(s), s.result.dtype)


def _finals(loop: ThreadLoop) -> list[str]:
    """After the last wait: each column the consumers read, the thread's S * V values of it
    loaded once into registers (L2: written by other blocks in this launch); under atomics, the
    row-0 threads of block 0 store the columns that are outputs."""
    g, m = loop.g, loop.m
    V, S, N = m.vec, m.chunk // m.tx, g.N // m.cgroups
    read = {r.tensor.uid for k, s in enumerate(g.statements) if k not in g.columns for r in s.reads}
    waits = "gridDim.x" if _atomic(loop) else "2u * gridDim.x"
    if m.cgroups > 1:  # the waits of every column group before count too
        waits = "(pn_cg + 1u) * gridDim.x" if _atomic(loop) else "(2u * pn_cg + 2u) * gridDim.x"
    out = [f"  pn_grid_sync(&pn_counter[0], {waits});  // every column is final"]
    if not _atomic(loop) and column_partials.discarded(loop):  # every partial has been read: dropped
        out += column_partials.discard(loop)
    for k in g.columns:
        s = g.statements[k]
        if s.result.uid not in read and not _atomic(loop):
            continue
        ct = s.result.dtype.compute
        store = f"    if (blockIdx.x == 0 && ty == 0 && pn_jl < {N}) pn_st(&out{k}[j], pn_fin{k}[pn_s * {V} + v]);"
        out += [
            f"  {ct} pn_fin{k}[{S * V}];  // {s.name} at this thread's columns",
            "#pragma unroll",
            f"  for (int pn_s = 0; pn_s < {S}; ++pn_s)",
            "#pragma unroll",
            f"  for (int v = 0; v < {V}; ++v) {{",
            f"    const pn_idx pn_jl = ((pn_idx)pn_s * {m.tx} + tx) * {V} + v, j = {column_partials.column(loop, 'pn_jl')};",
            f"    pn_fin{k}[pn_s * {V} + v] = pn_jl < {N} ? {_merged(loop, k)} : ({ct})0;",
            *([store] if _atomic(loop) and s.result.uid in g.external else []),
            "  }",
        ]
        loop.regs[s.result.uid] = f"pn_fin{k}[pn_s * {V} + v]" if V > 1 else f"pn_fin{k}[pn_s]"
    return out


def emit(loop: ThreadLoop) -> list[str]:
    """The kernel body (module docstring): the columns' pass, the grid-wide merge, the consumers'."""
    g, m = loop.g, loop.m
    level = m.levels
    cols = set(g.columns)
    assert passes(g, level) == 2 and all(level[k] == 0 for k in cols), "columns in pass 0, consumers in pass 1"
    assert not any(s.kind == StatementKind.REDUCE and k not in cols for k, s in enumerate(g.statements))
    first = [k for k in range(len(g.statements)) if level[k] == 0]
    second = [k for k in range(len(g.statements)) if level[k] == 1]
    out = column_partials.declare(loop) + _hold(loop)
    body = ["  // pass 0: " + ", ".join(g.statements[k].name for k in first)]
    loop.held_store = True
    body += _tiles(loop, column_partials.column_pass(loop, first))
    loop.held_store = False
    body += column_partials.merge(loop, depart=False)
    body += _finals(loop)
    body += ["  // pass 1: " + ", ".join(g.statements[k].name for k in second)]
    body += _tiles(loop, column_partials.column_pass(loop, second), backwards=True)
    if m.cgroups > 1:  # the column groups in turn, each its two passes and its merge
        body = (
            [f"  for (int pn_cg = 0; pn_cg < {m.cgroups}; ++pn_cg) {{  // column group: its {g.N // m.cgroups} columns"]
            + ["  " + ln for ln in column_partials.reset(loop) + body]
            + ["  }"]
        )
    return out + body + column_partials.departure(_resets(loop))


def _hold(loop: ThreadLoop) -> list[str]:
    """The row tiles each block holds (`hold`, schedule/hold.py), carved from the launch's dynamic
    shared memory (schedule/dynsmem.py `layout`: one region per held tensor): the block's first
    `hold` tiles of its column group, each thread's S vectors of V lanes, which the same thread
    stores in the columns' pass and reads back in the consumers'."""
    g, m = loop.g, loop.m
    held = held_tensors(g, m) if m.hold else []
    if not held:
        return []
    S, T, V = m.chunk // m.tx, m.tx * m.ty, m.vec
    offsets, total = dynsmem.layout(region_bytes(g, m))
    assert total == m.dynamic_smem, "the decision states the bytes the held tiles carve"
    out = [f"  PN_DYNAMIC_SHARED(pn_dsmem);  // {total} bytes a block (the launch's), across the waits"]
    for n, (t, at) in enumerate(zip(held, offsets)):
        ct = t.dtype.compute
        out.append(f"  {ct}* const pn_hold{n} = reinterpret_cast<{ct}*>(pn_dsmem + {at});  // {t.name}")
        loop.held[t.uid] = f"pn_hold{n}"
    loop.held_at = f"(((pn_idx)pn_k * {S} + pn_s) * {T} + (pn_idx)ty * {m.tx} + tx) * {V}"
    loop.held_if = f"pn_k < {m.hold}"
    return out


def _resets(loop: ThreadLoop) -> list[str]:
    """Under atomics, the last block to depart puts every workspace back at the identity (every
    block has read it after the wait)."""
    g, m = loop.g, loop.m
    if not _atomic(loop):
        return []
    out = [f"    for (pn_idx j = (pn_idx)ty * {m.tx} + tx; j < {g.N}; j += {m.tx * m.ty}) {{"]
    out += [f"      ws{k}[j] = {workspace_identity(g.statements[k])};" for k in g.accumulators]
    return out + ["    }"]
