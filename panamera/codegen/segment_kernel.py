"""CUDA C of the sorted-segment scatter-add (schedule/segments.py plans it): the deterministic
`out[ids[t]] += src[t]` for any table size.

Four kinds of kernel, launched in this order every call:

1. `tile`: each sort block sorts one tile of 64-bit keys `(row << 32) | position` in shared
   memory (each key's rank is the number of smaller keys of its tile); an id outside [0, rows)
   or equal to `skip` gets the class `rows`, after every row (never written); each other id
   marks its row (a byte per row); block 0 resets the bad-id slot to `N`;
2. `merge` (one launch per pass, run length doubling): each key's place is its rank in its run
   plus the number of keys of the partner run below it (a binary search).
   The merge launches and `part` also carry zeroing blocks, each launch a share of the rows,
   zeroing the rows no id marked: the table is written once (never zeroed, then written again),
   and its write streams while a merge waits on latencies;
3. `part`: the sorted positions are cut into pieces: aligned chunks of `SEGMENT_ROWS`, cut
   again where the row changes; each piece's source rows are summed in position order (the
   keys are unique, so the sorted order is one order), `UNROLL` rows loaded ahead, vectors
   across the row. A piece that is a whole segment writes its row; the others write a partial.
   Pieces of the class `rows` record the least position of an id outside the table in the
   bad-id slot (`atomicMin`: the same position whatever the order);
4. `own`: the first piece of each segment that runs past it owns the row: it adds the
   segment's later pieces (at the chunk boundaries) in order and writes the row. The first
   piece of every segment clears its row's mark, so the marks are zero between calls (the
   `clear` kernel zeroes them once, on the first call).

Every sum's order depends on the ids alone, never on blocks, threads or timing: the result is
bit-identical across runs, block counts and thread counts.

>>> from panamera.dtypes import as_dtype
>>> from panamera.schedule.segments import ScatterProblem, plan_segments
>>> p = plan_segments(ScatterProblem(6, 4, 3, as_dtype("int64"), as_dtype("float32")), tile=2, groups_per_block=2)
>>> [ln.split("(")[0].split()[-1] for ln in render_segments("pn_seg", p).splitlines() if "__global__" in ln]
['pn_seg_tile', 'pn_seg_merge2', 'pn_seg_merge4', 'pn_seg_part', 'pn_seg_own', 'pn_seg_clear']
"""

from __future__ import annotations

from ..schedule.segments import SEGMENT_ROWS, UNROLL, SegmentPlan, merge_blocks, merge_runs, share_rows  # the geometry


def render_segments(name: str, p: SegmentPlan) -> str:
    """The kernels' source (`{name}_tile`, `_merge{L}` per pass, `_part`, `_own`, `_clear`) of plan `p`:
    its problem (n ids into a `rows x width` table, the dtypes, `skip`), `tile` keys per sort block,
    `groups_per_block` chunks of SEGMENT_ROWS positions per block of `part` and `own`, `vec`
    elements per load (`vector_width`); the launch gives `p.threads` threads across a row there. The
    launches' grids (schedule/segments.py) add the zeroing blocks past the merge's and `part`'s own."""
    n, rows, width, ids, src, skip = p.n, p.rows, p.width, p.ids, p.src, p.skip
    tile, groups_per_block, vec, acc = p.tile, p.groups_per_block, p.vec, p.acc  # acc: float for 16-bit sources
    P, key = SEGMENT_ROWS, "unsigned long long"
    zero = f"({acc})0"
    drop = f" || id == {skip}LL" if skip is not None else ""
    bad = "(id < 0LL || id >= {r}LL){s}".format(r=rows, s=f" && id != {skip}LL" if skip is not None else "")
    bad = bad.replace("id", "pn_id")
    runs = merge_runs(n, tile)
    shares = 1 + len(runs)

    def zero_share(k: int, own_blocks: int) -> list[str]:
        """The blocks past the launch's `own_blocks` zero the rows of share k that no id marked
        (each merge launch and `part` carry one share: the table's write streams while the merge
        waits on its latencies, or beside the pieces' sums)."""
        lo, hi = min(rows, k * share_rows(rows, shares)), min(rows, (k + 1) * share_rows(rows, shares))
        return [
            f"  if (blockIdx.x >= {own_blocks}) {{  // zeroing blocks: rows [{lo}, {hi}) no id marked",
            f"    const long long t = (long long)(blockIdx.x - {own_blocks}) * blockDim.x + threadIdx.x;",
            f"    const long long stride = (long long)(gridDim.x - {own_blocks}) * blockDim.x;",
            f"    for (long long e = {lo * width}LL + t; e < {hi * width}LL; e += stride)",
            f"      if (!mark[e / {width}LL]) pn_st(&table[e], {zero});",
            "    return;",
            "  }",
        ]

    parts = [
        f'extern "C" __global__ void {name}_tile(const {ids.c_type}* __restrict__ ids, {key}* __restrict__ keys, '
        f"unsigned char* __restrict__ mark, long long* __restrict__ bad) {{",
        f"  __shared__ {key} pn_s[{tile}];",
        f"  if (blockIdx.x == 0 && threadIdx.x == 0) bad[0] = {n}LL;  // `part` records the least bad position",
        f"  const long long base = (long long)blockIdx.x * {tile};",
        f"  const int len = (int)({n}LL - base < {tile}LL ? {n}LL - base : {tile}LL);",
        "  for (int e = threadIdx.x; e < len; e += blockDim.x) {",
        "    const long long id = (long long)ids[base + e];",
        f"    const {key} row = (id < 0LL || id >= {rows}LL{drop}) ? {rows}ULL : ({key})id;",
        f"    pn_s[e] = (row << 32) | ({key})(base + e);",
        f"    if (row < {rows}ULL) mark[row] = 1;  // a row some id names: `part` or `own` writes it",
        "  }",
        "  __syncthreads();",
        "  for (int e = threadIdx.x; e < len; e += blockDim.x) {",
        f"    const {key} k = pn_s[e];",
        "    int r = 0;",
        "    for (int j = 0; j < len; ++j) r += pn_s[j] < k ? 1 : 0;",
        "    keys[base + r] = k;",
        "  }",
        "}",
    ]
    for k, L in enumerate(runs):
        parts += [
            f'extern "C" __global__ void {name}_merge{L}(const {key}* __restrict__ in, {key}* __restrict__ out, '
            f"{src.c_type}* __restrict__ table, const unsigned char* __restrict__ mark) {{",
            *zero_share(k, merge_blocks(n)),
            "  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
            f"  if (i >= {n}LL) return;",
            f"  const long long run = i / {L}LL, start = run * {L}LL, other = (run ^ 1LL) * {L}LL;",
            f"  const long long len = other >= {n}LL ? 0LL : ({n}LL - other < {L}LL ? {n}LL - other : {L}LL);",
            f"  const {key} k = in[i];",
            "  long long lo = 0, hi = len;",
            "  while (lo < hi) { const long long mid = (lo + hi) >> 1; if (in[other + mid] < k) lo = mid + 1; else hi = mid; }",
            "  out[(start < other ? start : other) + (i - start) + lo] = k;",
            "}",
        ]  # fmt: skip
    V, U, W = vec, UNROLL, width
    part_blocks = -(-n // (groups_per_block * P))
    chunks = f"const long long g0 = ((long long)blockIdx.x * {groups_per_block}) * {P}LL;"
    end = f"const long long g1 = g0 + {groups_per_block * P}LL < {n}LL ? g0 + {groups_per_block * P}LL : {n}LL;"
    lim = f"((k / {P}LL + 1LL) * {P}LL)"
    spans = f"({lim} < {n}LL && (keys[{lim}] >> 32) == row)"  # the segment runs past its first piece

    def load(ptr: str, reg: str) -> str:
        return f"pn_ldv({ptr}, {reg});" if V > 1 else f"{reg}[0] = pn_ld({ptr});"

    def store(ptr: str, value: str) -> str:
        return f"for (int c = 0; c < {V}; ++c) pn_st(&{ptr.format(c='c')}, {value});"

    out_row = f"out[(long long)row * {W}LL + d + {{c}}]"
    parts += [
        f'extern "C" __global__ void {name}_part(const {key}* __restrict__ keys, const {src.c_type}* __restrict__ src, '
        f"const {ids.c_type}* __restrict__ ids, {src.c_type}* __restrict__ out, {acc}* __restrict__ part, "
        "long long* __restrict__ bad, const unsigned char* __restrict__ mark) {",
        *[ln.replace("table[", "out[") for ln in zero_share(shares - 1, part_blocks)],
        f"  {chunks}",
        f"  {end}",
        f"  for (long long d = (long long)threadIdx.x * {V}; d < {W}LL; d += (long long)blockDim.x * {V}) {{",
        "    long long k = g0;",
        "    while (k < g1) {",
        f"      const {key} row = keys[k] >> 32;",
        f"      const long long stop = {lim} < g1 ? {lim} : g1;",
        "      long long e = k + 1;",
        "      while (e < stop && (keys[e] >> 32) == row) ++e;",
        f"      if (row >= {rows}ULL) {{  // ids outside the table, or the skipped id: the least bad position recorded",
        "        for (long long q = k; q < e && d == 0; ++q) {",
        "          const long long r = (long long)(keys[q] & 0xffffffffULL);",
        f"          if ({bad.replace('pn_id', '(long long)ids[r]')}) {{ atomicMin(bad, r); break; }}",
        "        }",
        "        k = e;",
        "        continue;",
        "      }",
        f"      {acc} acc[{V}];",
        f"      for (int c = 0; c < {V}; ++c) acc[c] = 0;",
        f"      for (long long q = k; q < e; q += {U}) {{  // {U} rows loaded ahead, added in position order",
        f"        {acc} v[{U}][{V}];",
        "        #pragma unroll",
        f"        for (int u = 0; u < {U}; ++u)",
        "          if (q + u < e) { const long long r = (long long)(keys[q + u] & 0xffffffffULL); "
        + load(f"&src[r * {W}LL + d]", "v[u]")
        + " }",
        "        #pragma unroll",
        f"        for (int u = 0; u < {U}; ++u)",
        f"          if (q + u < e) for (int c = 0; c < {V}; ++c) acc[c] += v[u][c];",
        "      }",
        f"      if ((k == 0 || (keys[k - 1] >> 32) != row) && !{spans}) {{  // a whole segment: the row",
        "        " + store(out_row, "acc[c]"),
        "      } else {",
        "        " + store(f"part[k * {W}LL + d + {{c}}]", "acc[c]"),
        "      }",
        "      k = e;",
        "    }",
        "  }",
        "}",
        f'extern "C" __global__ void {name}_own(const {key}* __restrict__ keys, const {acc}* __restrict__ part, '
        f"{src.c_type}* __restrict__ out, unsigned char* __restrict__ mark) {{",
        f"  {chunks}",
        f"  {end}",
        "  for (long long k = g0; k < g1; ++k) {",
        f"    const {key} row = keys[k] >> 32;",
        f"    if (row < {rows}ULL && (k == 0 || (keys[k - 1] >> 32) != row) && threadIdx.x == 0)",
        "      mark[row] = 0;  // every mark cleared for the next call (the row's first piece clears it)",
        f"    if (row >= {rows}ULL || (k > 0 && (keys[k - 1] >> 32) == row) || !{spans}) continue;",
        f"    for (long long d = (long long)threadIdx.x * {V}; d < {W}LL; d += (long long)blockDim.x * {V}) {{",
        f"      {acc} acc[{V}], v[{V}];",
        "      " + load(f"&part[k * {W}LL + d]", "acc"),
        f"      for (long long c = {lim}; c < {n}LL && (keys[c] >> 32) == row; c += {P}LL) {{",
        "        " + load(f"&part[c * {W}LL + d]", "v"),
        f"        for (int j = 0; j < {V}; ++j) acc[j] += v[j];",
        "      }",
        "      " + store(out_row, "acc[c]"),
        "    }",
        "  }",
        "}",
    ]
    parts += [
        f'extern "C" __global__ void {name}_clear(unsigned char* __restrict__ mark) {{  // the first call only',
        f"  for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < {rows}LL; "
        "r += (long long)gridDim.x * blockDim.x) mark[r] = 0;",
        "}",
    ]
    return "\n".join(parts) + "\n"
