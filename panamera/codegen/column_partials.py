"""Column partials in the stitched row kernel (poly/row_columns.py, schedule/persistent.py):
LayerNorm backward's dgamma and dbeta accumulated in the pass that computes dx.

The mapping's persistent grid: block b loops over the row tiles b, b + gridDim.x, ... Every
thread keeps, per COLUMN statement k, `pn_ck[S * V]` register partials: one per column it
touches, j = (s * tx_count + tx) * V + v, s < S = chunk / tx (the same columns in every row
it owns). The pass that holds the columns scans the thread's S steps in a loop of constant trip
count, fully unrolled, so every partial's index is a constant (isl's loop nest would leave it a
run-time counter, and the partials in local memory):

    float pn_c5[S * V] = identity;                    // before the row loop
    for (tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      ... pass p:  for s < S: for v < V: dx[i, j] = ...;  pn_c5[s * V + v] += dy[i, j] * xhat[i, j];
    }
    pn_reduce_y_all over the block's rows (shared memory, `tree_chunk` partials at a time), then
    per column j, by the rows' leaders:
      ATOMIC_WS  atomicAdd(&ws5[j], partial)         the workspace is resident, at the identity
      PARTIALS   ws5[blockIdx.x * N + j] = partial
    __threadfence; the block arrives on pn_counter[0]; the last block to arrive:
      ATOMIC_WS  out5[j] = ws5[j]; ws5[j] = identity  (ready for the next call)
      PARTIALS   out5[j] = sum over b = 0, 1, ... gridDim.x - 1 of ws5[b * N + j]: one fixed order,
                 bit-identical whatever the blocks' order
      and resets the counter.
    PARTIALS_GRID (a cooperative launch): the partials written, a grid-wide wait
    (pn_grid_sync), then every block sums its share of the columns, `combine_lanes` threads per
    column (schedule/persistent.py), each over every lanes-th block in block order, then a fixed
    shuffle tree: one order whatever the blocks' arrival, so bit-identical run to run. Where each
    block's columns are whole L2 lines (schedule/derived.py `combine_owns_lines`), a barrier of the
    block's own, then it drops the lines it read (`pn_discard_range`: never written back); else,
    from 1 MiB of partials (`discards_partials`), a second wait, then every thread drops its share
    of all the lines; the last block to depart resets the arrival and departure counters.
"""

from __future__ import annotations

from ..algebra import AtomicStrategy
from ..schedule.derived import (
    combine_columns,
    combine_lanes,
    combine_owns_lines,
    drops_column_partials,
    tree_buffers,
    tree_chunk,
)
from ..schedule.mapping import MergeMode
from .expr import convert
from .reduce_kernel import workspace_identity
from .thread_loop import ThreadLoop, c_ident, identity_expr, post, post_dtype


def _owners(loop: ThreadLoop) -> list[int]:
    g = loop.g
    return [k for k in g.columns if g.accumulator_of[k] == k]


def _steps(loop: ThreadLoop) -> int:
    return loop.m.chunk // loop.m.tx


def _cols(loop: ThreadLoop) -> int:
    """The columns the threads span at once: N, or one column group's (schedule/derived.py
    `group_columns`; the group's first column is `pn_cg * _cols`)."""
    return loop.g.N // loop.m.cgroups


def column(loop: ThreadLoop, local: str) -> str:
    """Column `local` of the columns the threads span, as a column of the row: with column groups,
    offset by the group's first (codegen/column_stitch.py's `pn_cg` loop)."""
    return local if loop.m.cgroups == 1 else f"(pn_idx)pn_cg * {_cols(loop)} + {local}"


def declare(loop: ThreadLoop) -> list[str]:
    """The register partials of every column owner, at the identity (before the row loop)."""
    out = []
    n = _steps(loop) * loop.m.vec
    for k in _owners(loop):
        s = loop.g.statements[k]
        out.append(f"  {s.acc.compute} pn_c{k}[{n}];  // column partials of {s.name}: this thread's columns")
    return out + reset(loop)


def reset(loop: ThreadLoop) -> list[str]:
    """Every owner's register partials at the identity: before the row loop, and again at each
    column group's start."""
    n = _steps(loop) * loop.m.vec
    return [
        f"  for (int v = 0; v < {n}; ++v) pn_c{k}[v] = {identity_expr(loop.g.statements[k])};" for k in _owners(loop)
    ]


def column_pass(loop: ThreadLoop, here: list[int]) -> list[str]:
    """The pass of statements `here` (column statements among them) over row `o`: the thread's
    S steps along the row, unrolled, each a vector iteration of every statement of the pass (the
    columns accumulate into their register partials; the loads are shared)."""
    g, m = loop.g, loop.m
    V, G = m.vec, _cols(loop) // m.vec
    for k in g.columns:
        loop.accs[k] = f"pn_c{k}[pn_s * {V} + v]" if V > 1 else f"pn_c{k}[pn_s]"
    local = f"(pn_idx)pn_s * {m.tx} + tx"
    guard = f"o < {g.M}" + ("" if G % m.tx == 0 else f" && {local} < {G}")
    first = local if m.cgroups == 1 else f"(pn_idx)pn_cg * {G} + {local}"  # the group's first vector
    out = [
        "#pragma unroll",
        f"  for (int pn_s = 0; pn_s < {_steps(loop)}; ++pn_s) {{",
        f"    const pn_idx pn_g = {first};",
        f"    if ({guard}) {{",
    ]
    out += ["    " + ln for ln in loop.iteration_at("o", "pn_g", here)]
    return out + ["    }", "  }"]


def merge(loop: ThreadLoop, depart: bool = True) -> list[str]:
    """After the row loop: each partial reduced over the block's rows and merged, then the last
    block's finish (module docstring). `depart`: a grid-wide combine ends the kernel (False: a
    pass after it reads the columns, codegen/column_stitch.py, and departs itself)."""
    g, m = loop.g, loop.m
    V, N, S = m.vec, g.N, _steps(loop)
    Nc = _cols(loop)
    out = ["  // column partials: reduced over the block's rows, one merge per block per column"]
    nbuf = tree_buffers(g)
    chunk = {k: tree_chunk(m.threads, S * V, g.statements[k].acc.itemsize, nbuf) for k in _owners(loop)}
    if m.ty > 1:
        sizes: dict[str, int] = {}
        for k in _owners(loop):
            ct = g.statements[k].acc.compute
            sizes[ct] = max(sizes.get(ct, 0), m.tx * m.ty * chunk[k])
        out += [f"  __shared__ {ct} pn_csmem_{c_ident(ct)}[{n}];" for ct, n in sizes.items()]
    for k in _owners(loop):
        s = g.statements[k]
        if m.ty > 1:
            tmpl = f"<{s.combiner.functor}, {m.tx}, {m.ty}, {S * V}, {chunk[k]}>"
            out.append(f"  pn_reduce_y_all{tmpl}(pn_c{k}, pn_csmem_{c_ident(s.acc.compute)});")
        if m.merges[k] in (MergeMode.PARTIALS, MergeMode.PARTIALS_GRID):
            write = f"ws{k}[(pn_idx)bx * {N} + j] = pn_p;"
        elif s.combiner.atomic(s.acc) == AtomicStrategy.ORDERED:
            write = f"pn_atomic_ordered({s.combiner.functor}(), &ws{k}[j], pn_p);"
        else:
            write = f"pn_atomic({s.combiner.functor}(), &ws{k}[j], pn_p);"
        out += [
            "#pragma unroll",
            f"  for (int pn_s = 0; pn_s < {S}; ++pn_s)",
            "#pragma unroll",
            f"  for (int v = 0; v < {V}; ++v) {{",
            f"    const pn_idx pn_jl = ((pn_idx)pn_s * {m.tx} + tx) * {V} + v, j = {column(loop, 'pn_jl')};",
            f"    const {s.acc.compute} pn_p = pn_c{k}[pn_s * {V} + v];",
            f"    if (ty == 0 && pn_jl < {Nc}) {write}",
            "  }",
        ]
    if MergeMode.PARTIALS_GRID in m.merges:
        return out + _grid_combine(loop, depart)
    if MergeMode.ATOMIC_GRID in m.merges:  # codegen/column_stitch.py waits and reads them back
        return out
    out += [
        "  __threadfence();",
        "  __syncthreads();",
        "  __shared__ int pn_is_last;",
        "  if (tx == 0 && ty == 0) pn_is_last = atomicAdd(&pn_counter[0], 1u) == gridDim.x - 1;",
        "  __syncthreads();",
        "  if (pn_is_last) {  // the last block: every column's final value",
        "    __threadfence();",
        f"    for (pn_idx j = (pn_idx)ty * {m.tx} + tx; j < {N}; j += {m.tx * m.ty}) {{",
    ]
    for k in _owners(loop):
        s = g.statements[k]
        if m.merges[k] == MergeMode.PARTIALS:
            out += ["  " + ln for ln in _in_block_order(loop, k)]
        else:
            merged = f"pn_ldcg(&ws{k}[j])"
            if s.combiner.atomic(s.acc) == AtomicStrategy.ORDERED:
                merged = f"pn_unordered({merged})"
            out += [f"      const {s.acc.compute} pn_f{k} = {merged};", f"      ws{k}[j] = {workspace_identity(s)};"]
    out += ["  " + ln for ln in _stores(loop)]
    return out + [
        "    }",
        "    if (tx == 0 && ty == 0) pn_counter[0] = 0u;  // resident: ready for the next call",
        "  }",
    ]


def _in_block_order(loop: ThreadLoop, k: int) -> list[str]:
    """Column j of owner k: its blocks' partials summed in block order (bit-identical), one thread
    per column."""
    s = loop.g.statements[k]
    return [
        f"    {s.acc.compute} pn_f{k} = {identity_expr(s)};",
        f"    for (pn_idx b = 0; b < (pn_idx)gridDim.x; ++b) "
        f"pn_f{k} = {s.combiner.functor}::apply(pn_f{k}, pn_ldcg(&ws{k}[b * {loop.g.N} + j]));",
    ]


def _in_lanes(loop: ThreadLoop, lanes: int) -> list[str]:
    """Column j of every owner, `lanes` > 1 threads per column: lane l sums the blocks l, l + lanes,
    ... in block order, then a fixed shuffle tree combines the lanes (lane 0 holds the value;
    `pn_ok`: j is a column, else the lane adds nothing). The owners share one unrolled loop of
    constant trip count, so every load of the lane, of every owner, issues before the first sum
    (schedule/cost.py `joined_cost`: one batch of loads per sweep), and one shuffle loop, so the
    owners' shuffle trees overlap. Each owner's order is its own: the bits are those of one
    owner combined alone."""
    g, B = loop.g, loop.m.blocks
    owners = _owners(loop)
    out = [f"    {g.statements[k].acc.compute} pn_f{k} = {identity_expr(g.statements[k])};" for k in owners]
    out += [
        "#pragma unroll  // a constant trip count: every load of the lane issued before the first sum",
        f"    for (int pn_b = 0; pn_b < {-(-B // lanes)}; ++pn_b) {{",
        f"      const pn_idx b = pn_lane + (pn_idx)pn_b * {lanes};",
        f"      if (pn_ok && b < {B}) {{",
    ]
    for k in owners:
        f = g.statements[k].combiner.functor
        out.append(f"        pn_f{k} = {f}::apply(pn_f{k}, pn_ldcg(&ws{k}[b * {g.N} + j]));")
    out += ["      }", "    }", f"    for (int o = {lanes // 2}; o > 0; o >>= 1) {{"]
    for k in owners:
        f = g.statements[k].combiner.functor
        out.append(f"      pn_f{k} = {f}::apply(pn_f{k}, pn_shfl_down(pn_f{k}, o, {lanes}));")
    return out + ["    }"]


def _stores(loop: ThreadLoop) -> list[str]:
    """Every column statement's final value of column j (a shared accumulator: its owner's),
    stored if read outside the kernel, then the columns' epilogue statements at index j
    (poly/row_columns.py `with_epilogues`: torch's cast of dgamma back to bf16), in registers,
    each stored."""
    g = loop.g
    out = []
    for k in g.columns:
        s = g.statements[k]
        final = convert(post(s, f"pn_f{g.accumulator_of[k]}"), post_dtype(s), s.result.dtype)
        if not g.column_epilogues:
            out.append(f"    pn_st(&out{k}[j], {final});")
            continue
        out.append(f"    const {s.result.dtype.compute} pn_r{k} = {final};")
        loop.regs[s.result.uid] = f"pn_r{k}"
        if s.result.uid in g.external:
            out.append(f"    pn_st(&out{k}[j], pn_r{k});")
    if g.column_epilogues:  # an epilogue statement's instance (i, 0) is column i
        out.append("    { const pn_idx i = j; { const pn_idx j = 0; (void)j;")
        for e in g.column_epilogues:
            st = g.statements[e]
            body, val = loop.body_lines(e, None)
            out += ["      " + ln for ln in body]
            out.append(
                f"      const {st.result.dtype.compute} pn_r{e} = {convert(val, st.body.dtype, st.result.dtype)};"
            )
            out.append(f"      pn_st(&out{e}[{loop.address(st.write)}], pn_r{e});")
            loop.regs[st.result.uid] = f"pn_r{e}"
        out.append("    } }")
    return out


def _grid_combine(loop: ThreadLoop, depart: bool = True) -> list[str]:
    """PARTIALS_GRID: every block's partials written, a grid-wide wait (a cooperative launch),
    then block b sums the columns b * threads + t, stepping by every thread of the grid, each in
    block order; the last block to depart resets both counters."""
    m = loop.m
    T, Nc = m.tx * m.ty, _cols(loop)
    L = combine_lanes(m.blocks, T, Nc)
    target = "gridDim.x" if m.cgroups == 1 else "(2u * pn_cg + 1u) * gridDim.x"  # two waits per column group
    out = [f"  pn_grid_sync(&pn_counter[0], {target});  // every block's partials are written"]
    if L == 1:
        out.append(
            f"  for (pn_idx pn_jl = (pn_idx)bx * {T} + ty * {m.tx} + tx; pn_jl < {Nc}; pn_jl += (pn_idx)gridDim.x * {T}) {{"
        )
        out.append(f"    const pn_idx j = {column(loop, 'pn_jl')};")
        for k in _owners(loop):
            out += _in_block_order(loop, k)
        out += _stores(loop)
        return out + ["  }"] + (_wait_and_discard(loop) + departure() if depart else [])
    # L lanes per column; every thread sweeps the same count, so whole warps shuffle together
    out += [
        f"  const pn_idx pn_t = (pn_idx)bx * {T} + ty * {m.tx} + tx, pn_lane = pn_t % {L};",
        f"  for (pn_idx pn_j0 = 0; pn_j0 < {Nc}; pn_j0 += (pn_idx)gridDim.x * {T // L}) {{",
        f"    const pn_idx pn_jl = pn_j0 + pn_t / {L}, j = {column(loop, 'pn_jl')};",
        f"    const bool pn_ok = pn_jl < {Nc};",
    ]
    out += _in_lanes(loop, L)
    out.append("    if (pn_ok && pn_lane == 0) {")
    out += ["  " + ln for ln in _stores(loop)]
    return out + ["    }", "  }"] + (_wait_and_discard(loop) + departure() if depart else [])


def discarded(loop: ThreadLoop) -> bool:
    """Whether this PARTIALS_GRID merge drops its partials once read: the model's decision
    (schedule/derived.py `drops_column_partials`), not made again here."""
    return drops_column_partials(loop.g, loop.m)


def discard(loop: ThreadLoop) -> list[str]:
    """Every whole 128-byte line of the partials dropped from L2 without a write-back, a share per
    thread of the grid (`pn_discard_range`); only after a wait that every block passes once it has
    read its share (the next call writes every partial before any block reads one)."""
    g, m = loop.g, loop.m
    T = m.tx * m.ty
    tid = f"(int)((pn_idx)blockIdx.x * {T} + threadIdx.y * {m.tx} + threadIdx.x)"
    return [
        f"  pn_discard_range(&ws{k}[0], &ws{k}[(pn_idx)gridDim.x * {g.N}], {tid}, (int)gridDim.x * {T});"
        for k in _owners(loop)
    ]


def _drop_own(loop: ThreadLoop) -> list[str]:
    """The lines of the partials this block alone read (schedule/derived.py `combine_owns_lines`):
    after a barrier of the block's own, each of its threads drops the whole lines of the block's
    columns in one row of partials (b = thread, thread + threads, ...), sweep by sweep. Never a
    line of another block's columns, so no second grid-wide wait."""
    g, m = loop.g, loop.m
    T, N = m.tx * m.ty, g.N
    W = combine_columns(m.blocks, T, N)
    out = [
        "  __syncthreads();  // the block has read its columns' partials: no other block reads their lines",
        f"  for (pn_idx pn_j0 = (pn_idx)bx * {W}; pn_j0 < {N}; pn_j0 += (pn_idx)gridDim.x * {W}) {{",
        f"    const pn_idx pn_hi = pn_j0 + {W} < {N} ? pn_j0 + {W} : (pn_idx){N};",
        f"    for (pn_idx b = (pn_idx)ty * {m.tx} + tx; b < (pn_idx)gridDim.x; b += {T}) {{",
    ]
    out += [f"      pn_discard_range(&ws{k}[b * {N} + pn_j0], &ws{k}[b * {N} + pn_hi], 0, 1);" for k in _owners(loop)]
    return out + ["    }", "  }"]


def _wait_and_discard(loop: ThreadLoop) -> list[str]:
    """LayerNorm backward's merge: the drop of the partials once read, by each block of its own
    lines (`_drop_own`), else after a second wait (every block has summed its columns) by every
    thread of a share of all of them."""
    if not discarded(loop):
        return []
    if combine_owns_lines(loop.g, loop.m):
        return _drop_own(loop)
    return ["  pn_grid_sync(&pn_counter[0], 2u * gridDim.x);  // every partial read: dropped, never written back"] + (
        discard(loop)
    )


def departure(resets: list[str] = ()) -> list[str]:
    """A grid-wide combine's end: the last block to depart resets the arrival and departure
    counters (every block has passed its last wait, so none reads them any more), and runs
    `resets` with all its threads."""
    if not resets:
        return [
            "  __syncthreads();",
            "  if (tx == 0 && ty == 0 && atomicAdd(&pn_counter[1], 1u) == gridDim.x - 1) {  // the last to depart",
            "    pn_counter[0] = 0u;",
            "    pn_counter[1] = 0u;",
            "  }",
        ]
    return [
        "  __syncthreads();",
        "  __shared__ int pn_is_last;",
        "  if (tx == 0 && ty == 0) pn_is_last = atomicAdd(&pn_counter[1], 1u) == gridDim.x - 1;",
        "  __syncthreads();",
        "  if (pn_is_last) {  // the last to depart",
        "    __threadfence();",
        *resets,
        "    if (tx == 0 && ty == 0) { pn_counter[0] = 0u; pn_counter[1] = 0u; }",
        "  }",
    ]
