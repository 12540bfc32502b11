"""C++ (OpenMP) of the CPU's deterministic scatter-add (schedule/cpu_segments.py plans it): one
function `name(void** a, int nt)` in the CPU target's calling convention (runtime/cpu_call.py),
its parameters: ids, src, out, the bad-id slot, then the scratch of its form (`PARAMS`). It runs
on at most the plan's `threads`; a one-thread plan's body opens no parallel region (`one_thread`).

- privatized: one parallel region; `omp for` over the plan's fixed chunks of ids (each zeroes its
  table, adds its source rows in position order), the barrier, `omp for` over rows: each output
  row the sum of the chunks' rows in chunk order;
- sorted segments: one parallel region; `omp single` runs the stable counting sort (histogram
  of the rows into `off`, its prefix sum, the positions placed in order into `ord`), the barrier,
  `omp for` over rows: each row sums its segment's source rows in position order.

Either way an id equal to `skip` adds nothing, and an id outside [0, rows) adds nothing and its
least position is recorded in the bad-id slot (reset to `n` first; runtime/plan.py's IndexCheck
turns it into an InputError when the scatter checks its ids). Sums are kept in the plan's
accumulator type (float for 16-bit sources) and stored once (`pn_st` rounds).

>>> from panamera.dtypes import as_dtype
>>> from panamera.model.cpu import CpuModel
>>> from panamera.schedule.cpu_segments import CpuScatterForm, ScatterProblem, plan_cpu_scatter
>>> i64, f32, m = as_dtype("int64"), as_dtype("float32"), CpuModel.nominal(2, 32)
>>> p = plan_cpu_scatter(ScatterProblem(6, 4, 3, i64, f32), m, form=CpuScatterForm.SORTED)
>>> PARAMS[p.form], "omp single" in render_cpu_scatter("pn_sc", p)
(('ids', 'src', 'out', 'bad', 'off', 'ord'), True)
"""

from __future__ import annotations

from ..schedule.cpu_segments import CpuScatterForm, CpuScatterPlan
from .cpu_region import one_thread

BLOCK = 64  # elements of a row summed at once in registers (a row longer than this: in blocks)
AHEAD = 8  # sorted segments: the source row this many terms ahead is prefetched
PARAMS = {
    CpuScatterForm.PRIVATIZED: ("ids", "src", "out", "bad", "tables"),
    CpuScatterForm.SORTED: ("ids", "src", "out", "bad", "off", "ord"),
}
HELPER = """#include <atomic>
static inline void pn_scatter_bad(long long* p, long long v) {  // the least bad position, any thread order
  std::atomic_ref<long long> r(*p);
  long long o = r.load(std::memory_order_relaxed);
  while (v < o && !r.compare_exchange_weak(o, v, std::memory_order_relaxed)) {}
}
"""


def _row_sum(p: CpuScatterPlan, out_row: str, terms: str, first: str, indent: str, ahead: str = "") -> list[str]:
    """Lines summing a row block by block (BLOCK elements, then the tail: constant trip counts,
    so that g++ keeps each block in vector registers): each element starts at `first` (an
    expression of `d`), then the terms of the rows `terms` iterates (a `for (...)` header naming
    k; the term is ROW_TERM, filled in by the caller), in order; the sums stored to `out_row`.
    `ahead`: the address of a later term's block to prefetch (a gather's rows are not a stream)."""
    acc, W = p.acc, p.width
    step = max(1, 64 // p.src.itemsize)  # elements per cache line
    blocks = [(f"pn_idx d0 = 0; d0 < {W // BLOCK * BLOCK}LL; d0 += {BLOCK}", BLOCK)] if W >= BLOCK else []
    blocks += [(f"pn_idx d0 = {W // BLOCK * BLOCK}LL; d0 < {W}LL; d0 += {W % BLOCK}", W % BLOCK)] if W % BLOCK else []
    lines = []
    for header, dn in blocks:
        fetch = f"for (int l = 0; l < {dn}; l += {step}) __builtin_prefetch({ahead} + l);" if ahead else ""
        lines += [
            f"{indent}for ({header}) {{",
            f"{indent}  {acc} a[{dn}];",
            f"{indent}  for (pn_idx d = 0; d < {dn}; ++d) a[d] = {first};",
            f"{indent}  {terms} {{",
            *([f"{indent}    {fetch}"] if fetch else []),
            f"{indent}    #pragma omp simd",
            f"{indent}    for (pn_idx d = 0; d < {dn}; ++d) a[d] += ROW_TERM;",
            f"{indent}  }}",
            f"{indent}  for (pn_idx d = 0; d < {dn}; ++d) pn_st(&{out_row}[d0 + d], a[d]);",
            f"{indent}}}",
        ]
    return lines


def render_cpu_scatter(name: str, p: CpuScatterPlan) -> str:
    """The C++ of plan `p` as function `name` (with HELPER, which it calls, before it)."""
    W, R, N, acc = p.width, p.rows, p.n, p.acc
    skip = f"id == {p.skip}LL" if p.skip is not None else "false"
    head = [
        f'extern "C" void {name}(void** pn_a, int pn_nt) {{',
        "  typedef long long pn_idx;",
        f"  const {p.ids.c_type}* __restrict__ ids = (const {p.ids.c_type}*)pn_a[0];",
        f"  const {p.src.c_type}* __restrict__ src = (const {p.src.c_type}*)pn_a[1];",
        f"  {p.src.c_type}* __restrict__ out = ({p.src.c_type}*)pn_a[2];",
        "  long long* __restrict__ bad = (long long*)pn_a[3];",
        f"  bad[0] = {N}LL;",
        f"  if (pn_nt > {p.threads}) pn_nt = {p.threads};  // the plan's threads (its model's choice)",
    ]
    cls = (  # the id's row, or -1: skipped (nothing added), or outside the table (recorded, nothing added)
        f"const long long id = (long long)ids[q]; "
        f"const long long row = ({skip}) ? -1LL : (id < 0 || id >= {R}LL) ? (pn_scatter_bad(bad, q), -1LL) : id;"
    )
    if p.form == CpuScatterForm.PRIVATIZED:
        C, table = p.chunks, R * W
        body = [
            f"  {acc}* __restrict__ tab = ({acc}*)pn_a[4];",
            "  #pragma omp parallel num_threads(pn_nt)",
            "  {",
            "    #pragma omp for schedule(static)",
            f"    for (pn_idx c = 0; c < {C}; ++c) {{  // the chunks are fixed: the bits never depend on pn_nt",
            f"      {acc}* __restrict__ t = tab + c * {table}LL;",
            f"      for (pn_idx e = 0; e < {table}LL; ++e) t[e] = ({acc})0;",
            f"      const pn_idx lo = c * {N}LL / {C}, hi = (c + 1) * {N}LL / {C};",
            "      for (pn_idx q = lo; q < hi; ++q) {",
            f"        {cls}",
            "        if (row < 0) continue;",
            f"        {acc}* __restrict__ r = t + row * {W}LL;",
            f"        const {p.src.c_type}* __restrict__ s = src + q * {W}LL;",
            "        #pragma omp simd",
            f"        for (pn_idx d = 0; d < {W}LL; ++d) r[d] += ({acc})pn_ld(&s[d]);",
            "      }",
            "    }",
            "    #pragma omp for schedule(static)",
            f"    for (pn_idx row = 0; row < {R}LL; ++row) {{  // the chunks' rows added in chunk order",
            *_row_sum(
                p, f"(out + row * {W}LL)", f"for (pn_idx k = 1; k < {C}; ++k)", f"tab[row * {W}LL + d0 + d]", "      "
            ),
            "    }",
            "  }",
            "}",
        ]
        term = f"tab[k * {table}LL + row * {W}LL + d0 + d]"
    else:
        body = [
            "  long long* __restrict__ off = (long long*)pn_a[4];  // rows + 2: off[r] the start of row r's segment",
            "  long long* __restrict__ ord = (long long*)pn_a[5];  // the positions sorted by id, stably",
            "  #pragma omp parallel num_threads(pn_nt)",
            "  {",
            "    #pragma omp single",
            "    {  // the stable counting sort: a histogram, its prefix sum, the positions placed in order",
            f"      for (pn_idx r = 0; r < {R + 2}LL; ++r) off[r] = 0;",
            f"      for (pn_idx q = 0; q < {N}LL; ++q) {{ {cls} if (row >= 0) ++off[row + 2]; }}",
            f"      for (pn_idx r = 2; r < {R + 2}LL; ++r) off[r] += off[r - 1];",
            f"      for (pn_idx q = 0; q < {N}LL; ++q) {{",
            "        const long long id = (long long)ids[q];",
            f"        if (!({skip}) && id >= 0 && id < {R}LL) ord[off[id + 1]++] = q;",
            "      }",
            "    }",
            "    #pragma omp for schedule(static)",
            f"    for (pn_idx row = 0; row < {R}LL; ++row) {{  // whole segments per thread, each in position order",
            "      const pn_idx b = off[row], e = off[row + 1];",
            *_row_sum(
                p,
                f"(out + row * {W}LL)",
                "for (pn_idx k = b; k < e; ++k)",
                f"({acc})0",
                "      ",
                f"(src + ord[k + {AHEAD} < e ? k + {AHEAD} : k] * {W}LL + d0)",
            ),  # fmt: skip
            "    }",
            "  }",
            "}",
        ]
        term = f"({acc})pn_ld(&src[ord[k] * {W}LL + d0 + d])"
    body = one_thread(body) if p.threads == 1 else body  # no region, no closing futex wake (codegen/cpu_region.py)
    return "\n".join(head + body).replace("ROW_TERM", term) + "\n"
