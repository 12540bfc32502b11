"""Row scans of the CPU target in W accumulator lanes (`lanes_pass`, called by codegen/cpu_kernel.py's
`row_pass`): W = LANE_VECTORS x the decision's SIMD lanes accumulators per reduction, so that a
scan runs at the speed of its loads rather than of one vector register's add latency (one register
of lanes in a pass that evaluates exp or another transcendental: the decision's `vectors`, decided
by schedule/cpu_lane_kind.py's `group_vectors`), folded by an explicit pairwise tree (no -ffast-math); argmax/argmin kept per lane as (value, offset in the block) in the
value's own type (LaneKind.ARG), turned into ordered keys (header.py's pn_argkey_*) once per block;
a float max/min with plain compares and a NaN watch (LaneKind.FLAGGED). The kinds: schedule/cpu_lane_kind.py.

`kern` is cpu_kernel's `_Kernel` (its group, decision, ThreadLoop, bodies and accumulators);
`scan` and `emit` are its isl helpers (`_scan`, `_print`), passed in: this module sits beside it.
"""

from __future__ import annotations

import functools

from ..model.cpu import LANE_VECTORS  # noqa: F401 (a cheap pass's registers of lanes; tests import it here)
from ..schedule.cpu_lane_kind import LANE_TYPES, LaneKind, lane_kind
from .cpu_runs import block_head
from .thread_loop import identity_expr

# The fold of W lanes l[0..W) (W a power of two) as the tree l[q] = l[q] op l[q + W/2], W/2 -> 1, in
# that order (a float sum's rounding is that of this fixed tree): while a half is wider than a vector
# register (PN_VEC_BYTES, from the compiler's ISA macros: 64 AVX-512, 32 AVX, else 16), a loop over
# register-wide GCC vector chunks; then halves of GCC vector types, so
# each step is one vector operation on a register and its upper half (`F::apply` on vector types:
# the combiners' expressions are element-wise there, a max's `a != a || a > b` included, so NaN
# semantics are the scalar ones), the last step scalar. log2(W) dependent vector steps a row
# instead of the W - 1 scalar, branchy (NaN-aware max) steps g++ made of the generic loop. Never a
# vector type wider than the register: on AVX2 g++ 12 split a 64-byte `a > b ? a : b` into 16
# scalar compares and cmovs, and left a scalar loop of the wider-than-register step unvectorized
# (vmaxss a lane): max row 768x768 130 -> 62 us at 1 thread once every step is register-wide
# (AMD EPYC AVX2, 2026-11-25, CPU time, medians of 15 interleaved rounds, load 4.7-7.6).
LANE_FOLD = """#include <cstring>
#if defined(__AVX512F__)
#define PN_VEC_BYTES 64
#elif defined(__AVX__)
#define PN_VEC_BYTES 32
#else
#define PN_VEC_BYTES 16
#endif
template <class F, int N, class T> static inline T pn_fold_lanes(const T* l) {
  static_assert(N >= 2 && (N & (N - 1)) == 0, "pn_fold_lanes: N a power of two");
  if constexpr (N == 2) {
    return F::apply(l[0], l[1]);
  } else if constexpr (N / 2 * sizeof(T) > PN_VEC_BYTES) {
    typedef T V __attribute__((vector_size(PN_VEC_BYTES)));
    constexpr int n = PN_VEC_BYTES / sizeof(T);
    T t[N / 2];
    for (int q = 0; q < N / 2; q += n) {
      V a, b;
      std::memcpy(&a, l + q, sizeof(V));
      std::memcpy(&b, l + q + N / 2, sizeof(V));
      const V r = F::apply(a, b);
      std::memcpy(t + q, &r, sizeof(V));
    }
    return pn_fold_lanes<F, N / 2>(t);
  } else {
    typedef T H __attribute__((vector_size(N / 2 * sizeof(T))));
    H a, b;
    std::memcpy(&a, l, sizeof(H));
    std::memcpy(&b, l + N / 2, sizeof(H));
    const H r = F::apply(a, b);
    T t[N / 2];
    std::memcpy(t, &r, sizeof(H));
    return pn_fold_lanes<F, N / 2>(t);
  }
}
struct pn_op_max_num { template <class T> static inline T apply(T a, T b) { return a > b ? a : b; } };
struct pn_op_min_num { template <class T> static inline T apply(T a, T b) { return a < b ? a : b; } };
"""


# A floating-point max/min's lanes (LaneKind.FLAGGED) step with the plain compare `a > b ? a : b`
# (one vmaxps, one latency a step, no mask or/blend on the chain) and watch for a NaN on the side:
# each lane also sums its values (one vaddps a step, no compare, off the chain), and that sum is
# NaN where the lane saw a NaN (or, rarely, both +inf and -inf, or sums overflowing both ways: then
# the block is only scanned again for nothing). Their fold is the same tree of plain compares
# (branch-free). Without a NaN both give what the NaN-aware combiner (`(a != a || a > b) ? a : b`)
# gives, bit for bit: the compares are the same. A block whose sums are NaN is scanned again with
# the NaN-aware combiner in j order (the first NaN wins; rare, and only that block). softmax
# [6144x128]: the row's max, on the critical path before its exp pass, was a 4-op chain a step and
# a ~6-step NaN-aware fold; an int flag a lane (`|= x != x`: a compare and a masked move a step)
# cost 6 % more than this sum (411 -> 387 us, 1 thread, CPU time).
_NUMERIC = {"max": "pn_op_max_num", "min": "pn_op_min_num"}
CACHE_LINE = 64  # bytes: one software prefetch a line (prefetch_lines)


def lanes_pass(
    kern, here: list[int], lo: str, hi: str, owners: list[int], scan, emit, rows: int = 1, bind=None
) -> list[str]:
    """`row_pass` with W = LANE_VECTORS x lanes accumulators per reduction: each block of
    `inner` iterations scans j in steps of W under `omp simd`, lane q accumulating j = c + q
    (W independent chains, several vector registers: the loop runs at the speed of the
    loads, not of one register's add latency), then folds its lanes pairwise into the
    block accumulator (LANE_FOLD: log2 W vector steps); the last < W iterations run as `row_pass` runs them. Every combiner
    of algebra.py is associative, and a float sum's rounding stays that of a tree of short
    sums (no -ffast-math: the tree is explicit).

    An argmax/argmin whose index rises with j keeps per lane its best value, in the value's own
    type, and that value's offset j - pn_lo in the block (LaneKind.ARG; 32-bit where the block
    fits): a lane takes a value greater (less) than its best, or the first NaN, so it holds the
    first offset of its extreme; the offsets become indices and the lanes keys (pn_argkey_*)
    only once, at the fold, and the keys' order resolves ties across lanes as numpy does (the
    first index, the first NaN).

    `rows` > 1 (codegen/cpu_interleave.py): that many rows in one scan, their lanes side by side
    in each step (independent chains the core overlaps), `bind(r)` the lines naming row r's
    registers (i, its earlier passes' values, its scratch rows); no ARG lanes there."""
    g, d = kern.g, kern.d
    if rows > 1:
        return _rows_pass(kern, here, lo, hi, owners, scan, emit, rows, bind)
    ctx = g.statements[0].domain.get_ctx()
    W, B = d.vectors[kern.level[here[0]]] * d.lanes, d.inner
    lane_ast = scan(ctx, [("q", "0", str(W))], [], "true")
    tail_ast = scan(ctx, [("c0", "pn_lo", "pn_hi")], ["pn_lo", "pn_hi"], f"0 <= pn_lo <= pn_hi <= {d.N}")
    arg = [k for k in owners if lane_kind(g.statements[k]) == LaneKind.ARG]
    flagged = [k for k in owners if lane_kind(g.statements[k]) == LaneKind.FLAGGED]

    flag_step = functools.partial(_flag_step, g)

    def lane(q: str) -> list[str]:
        out = [f"const pn_idx j = pn_c + {q};"]
        for k in here:
            if k in arg:
                out += arg_lane(kern, k, q)
            else:
                out += kern.body([k], lambda k: f"pn_lane{k}[{q}]", step=flag_step if k in flagged else None)
        return ["{"] + ["  " + ln for ln in out] + ["}"]

    def tail(a: list[str]) -> list[str]:
        body = kern.body(here, lambda k: f"pn_blk{k}")
        return ["{", f"  const pn_idx j = {a[0]};"] + ["  " + ln for ln in body] + ["}"]

    out = block_head(kern.run, lo, hi, B)
    out += ["  " + ln for ln in kern.acc_decls(owners, name="pn_blk")]
    for k in owners:
        s = g.statements[k]
        if k in arg:
            v = s.body.args[0].dtype.compute
            init = "lowest" if s.combiner.name == "max" else "highest"
            out += [f"  {v} pn_lv{k}[{W}]; {_offset_type(d)} pn_lj{k}[{W}];"]
            out += [f"  for (int q = 0; q < {W}; ++q) {{ pn_lv{k}[q] = pn_lim<{v}>::{init}(); pn_lj{k}[q] = q; }}"]
        else:
            out += [f"  {s.acc.compute} pn_lane{k}[{W}];"]
            out += [f"  for (int q = 0; q < {W}; ++q) pn_lane{k}[q] = {identity_expr(s)};"]
            if k in flagged:
                t = s.acc.compute
                out += [f"  {t} pn_nan{k}[{W}];", f"  for (int q = 0; q < {W}; ++q) pn_nan{k}[q] = ({t})0;"]
    out += ["  pn_idx pn_c = pn_lo;", f"  for (; pn_c + {W} <= pn_hi; pn_c += {W}) {{"]
    out += ["    " + ln for ln in prefetch_lines(kern, here, W)]
    if arg:
        out.append(f"    const {_offset_type(d)} pn_cb = ({_offset_type(d)})(pn_c - pn_lo);")
    out += ["    " + ln for ln in emit(lane_ast, lambda a: lane(a[0]), ["#pragma omp simd"])]
    out += ["  }", "  if (pn_c > pn_lo) {"]
    for k in owners:
        s = g.statements[k]
        f = s.combiner.functor
        if k in arg:  # each lane's index at its offset, and its key
            lines, x = kern.loop.body_lines(k, None, expr=s.body.args[1])
            key = f"pn_argkey_{s.combiner.name}(pn_lv{k}[q], (long long)({x}))"
            out += [f"    for (int q = 0; q < {W}; ++q) {{", f"      const pn_idx j = pn_lo + pn_lj{k}[q];"]
            out += ["      " + ln for ln in lines] + [f"      pn_blk{k} = {f}::apply(pn_blk{k}, {key});", "    }"]
            continue
        if k in flagged:  # the plain tree, or the NaN-aware combiner again over a block whose sums are NaN
            rescan = kern.body([k], lambda k: f"pn_blk{k}")
            t = s.acc.compute
            out += [f"    const {t} pn_sn{k} = pn_fold_lanes<pn_op_sum, {W}>(pn_nan{k});"]
            out += [f"    const bool pn_any{k} = pn_sn{k} != pn_sn{k};"]
            out += [f"    if (pn_any{k}) {{", "      for (pn_idx j = pn_lo; j < pn_c; ++j) {"]
            out += ["        " + ln for ln in rescan] + ["      }", "    } else {"]
            out += [
                f"      pn_blk{k} = {f}::apply(pn_blk{k}, pn_fold_lanes<{_NUMERIC[s.combiner.name]}, {W}>(pn_lane{k}));"
            ]
            out += ["    }"]
            continue
        if s.acc.compute in LANE_TYPES:  # the tree in vector registers (LANE_FOLD)
            out.append(f"    pn_blk{k} = {f}::apply(pn_blk{k}, pn_fold_lanes<{f}, {W}>(pn_lane{k}));")
            continue
        out.append(f"    for (int w = {W // 2}; w > 0; w /= 2)")
        out.append(f"      for (int q = 0; q < w; ++q) pn_lane{k}[q] = {f}::apply(pn_lane{k}[q], pn_lane{k}[q + w]);")
        out.append(f"    pn_blk{k} = {f}::apply(pn_blk{k}, pn_lane{k}[0]);")
    out += ["  }", "  { const pn_idx pn_lo = pn_c;  // the last < W iterations"]
    pragma = f"#pragma omp simd {kern.simd_clause(owners, lambda k: f'pn_blk{k}')}"
    out += ["    " + ln for ln in emit(tail_ast, tail, [pragma])] + ["  }"]
    for k in owners:
        out.append(f"  acc{k} = {g.statements[k].combiner.functor}::apply(acc{k}, pn_blk{k});")
    return out + ["}"]


def prefetch_lines(kern, here: list[int], W: int) -> list[str]:
    """The decision's prefetches (schedule/cpu_prefetch.py) of statements `here` in a step of W
    iterations at j = pn_c: each read's cache lines of the step, `ahead` bytes further on.

    A prefetch never faults, so the lines past a row's end (the next row's first) need no bound."""
    d, g = kern.d, kern.g
    if d.prefetch is None:
        return []
    out = []
    for k, n in d.prefetch.reads:
        if k not in here:
            continue
        r = g.statements[k].reads[n]
        size = r.tensor.dtype.itemsize
        per_line = max(1, CACHE_LINE // size)
        for t in range(max(1, W * size // CACHE_LINE)):
            at = f"{kern.loop.in_name[r.tensor.uid]}[{kern.loop.address(r.addr)}]"
            out.append(
                f"{{ const pn_idx j = pn_c + {d.prefetch.ahead // size + t * per_line}LL; __builtin_prefetch(&{at}); }}"
            )
    return out


def _flag_step(g, k: int, a: str, v: str) -> list[str]:
    """A FLAGGED lane's step of statement `k` (accumulator `a`, value `v`): a plain compare
    (`_NUMERIC`), the values summed into the lane's NaN watch `pn_nan<k>`."""
    t, q = g.statements[k].acc.compute, a[a.index("[") :]
    return [
        f"{{ const {t} pn_x = {v};",
        f"  pn_nan{k}{q} += pn_x;",
        f"  {a} = {_NUMERIC[g.statements[k].combiner.name]}::apply({a}, pn_x); }}",
    ]


def _offset_type(d) -> str:
    """The C type of an ARG lane's index: its offset j - pn_lo in a block of at most `inner`
    iterations, 32-bit where that fits (a blend as wide as a float value's: on AVX2 a 64-bit
    index took two registers and a widened mask each step, argmax [64x30522] 662 -> 337 us)."""
    return "int" if d.inner < 2**31 else "long long"


def arg_lane(kern, k: int, q: str) -> list[str]:
    """Lane q of an argmax/argmin (LaneKind.ARG) at the current j: its value and its offset
    j - pn_lo in the block (`pn_cb + q`: the index itself is made once, at the fold), the
    lane's best replaced when the value is greater (argmin: less), or a NaN first seen."""
    s = kern.g.statements[k]
    v = s.body.args[0].dtype.compute
    vl, val = kern.loop.body_lines(k, None, expr=s.body.args[0])
    keep = "<=" if s.combiner.name == "max" else ">="
    best, at = f"pn_lv{k}[{q}]", f"pn_lj{k}[{q}]"
    return [
        f"{{ {v} pn_v;",
        "  {",
        *["    " + ln for ln in vl],
        f"    pn_v = {val};",
        "  }",
        f"  const bool pn_t = !(pn_v {keep} {best}) & ({best} == {best});",
        f"  {best} = pn_t ? pn_v : {best}; {at} = pn_t ? pn_cb + ({_offset_type(kern.d)})({q}) : {at}; }}",
    ]


def _rows_pass(kern, here: list[int], lo: str, hi: str, owners: list[int], scan, emit, rows: int, bind) -> list[str]:
    """`lanes_pass` over `rows` rows at once: the lanes, block accumulators and NaN watches of each
    row in arrays over the rows (`..._R[r]`, a scope binding row r's names to them: the bodies are
    the one-row ones), the main loop stepping every row's lanes in turn, the folds and the last
    < W iterations row after row. Each row's values and their rounding are the one-row scan's."""
    g, d = kern.g, kern.d
    ctx = g.statements[0].domain.get_ctx()
    W, B = d.vectors[kern.level[here[0]]] * d.lanes, d.inner
    lane_ast = scan(ctx, [("q", "0", str(W))], [], "true")
    tail_ast = scan(ctx, [("c0", "pn_lo", "pn_hi")], ["pn_lo", "pn_hi"], f"0 <= pn_lo <= pn_hi <= {d.N}")
    flagged = [k for k in owners if lane_kind(g.statements[k]) == LaneKind.FLAGGED]
    assert all(lane_kind(g.statements[k]) != LaneKind.ARG for k in owners), "rows > 1: no ARG lanes"
    names = [f"pn_blk{k}" for k in owners] + [f"pn_lane{k}" for k in owners] + [f"pn_nan{k}" for k in flagged]

    def row(r: int, lines: list[str]) -> list[str]:  # lines in a scope where row r's names are bound
        own = [f"auto& {n} = {n}_R[{r}];" for n in names]
        return ["{"] + ["  " + ln for ln in bind(r) + own + lines] + ["}"]

    flag_step = functools.partial(_flag_step, g)

    def lane(q: str) -> list[str]:
        out = [f"const pn_idx j = pn_c + {q};"]
        for r in range(rows):
            lines = []
            for k in here:
                lines += kern.body([k], lambda k: f"pn_lane{k}[{q}]", step=flag_step if k in flagged else None)
            out += row(r, lines)
        return ["{"] + ["  " + ln for ln in out] + ["}"]

    def tail(a: list[str]) -> list[str]:
        body = kern.body(here, lambda k: f"pn_blk{k}")
        return ["{", f"  const pn_idx j = {a[0]};"] + ["  " + ln for ln in body] + ["}"]

    out = block_head(kern.run, lo, hi, B)
    init = []
    for k in owners:
        s = g.statements[k]
        t = s.acc.compute
        out += [f"  {t} pn_blk{k}_R[{rows}];", f"  {t} pn_lane{k}_R[{rows}][{W}];"]
        init += [
            f"pn_blk{k} = {identity_expr(s)};",
            f"for (int q = 0; q < {W}; ++q) pn_lane{k}[q] = {identity_expr(s)};",
        ]
        if k in flagged:
            out += [f"  {t} pn_nan{k}_R[{rows}][{W}];"]
            init += [f"for (int q = 0; q < {W}; ++q) pn_nan{k}[q] = ({t})0;"]
    for r in range(rows):
        out += ["  " + ln for ln in row(r, init)]
    out += ["  pn_idx pn_c = pn_lo;", f"  for (; pn_c + {W} <= pn_hi; pn_c += {W}) {{"]
    if ahead := prefetch_lines(kern, here, W):  # each row's lines of the step, ahead
        out += ["    " + ln for r in range(rows) for ln in row(r, ahead)]
    out += ["    " + ln for ln in emit(lane_ast, lambda a: lane(a[0]), ["#pragma omp simd"])]
    out += ["  }"]
    after = ["if (pn_c > pn_lo) {"]
    for k in owners:
        s = g.statements[k]
        f = s.combiner.functor
        if k in flagged:
            t = s.acc.compute
            after += [f"  const {t} pn_sn{k} = pn_fold_lanes<pn_op_sum, {W}>(pn_nan{k});"]
            after += [f"  if (pn_sn{k} != pn_sn{k}) {{", "    for (pn_idx j = pn_lo; j < pn_c; ++j) {"]
            after += ["      " + ln for ln in kern.body([k], lambda k: f"pn_blk{k}")] + ["    }", "  } else {"]
            fold = f"pn_fold_lanes<{_NUMERIC[s.combiner.name]}, {W}>(pn_lane{k})"
            after += [f"    pn_blk{k} = {f}::apply(pn_blk{k}, {fold});", "  }"]
        elif s.acc.compute in LANE_TYPES:
            after.append(f"  pn_blk{k} = {f}::apply(pn_blk{k}, pn_fold_lanes<{f}, {W}>(pn_lane{k}));")
        else:
            after.append(f"  for (int w = {W // 2}; w > 0; w /= 2)")
            after.append(
                f"    for (int q = 0; q < w; ++q) pn_lane{k}[q] = {f}::apply(pn_lane{k}[q], pn_lane{k}[q + w]);"
            )
            after.append(f"  pn_blk{k} = {f}::apply(pn_blk{k}, pn_lane{k}[0]);")
    after += ["}", "{ const pn_idx pn_lo = pn_c;  // the last < W iterations"]
    pragma = f"#pragma omp simd {kern.simd_clause(owners, lambda k: f'pn_blk{k}')}"
    after += ["  " + ln for ln in emit(tail_ast, tail, [pragma])] + ["}"]
    after += [f"acc{k} = {g.statements[k].combiner.functor}::apply(acc{k}, pn_blk{k});" for k in owners]
    for r in range(rows):
        out += ["  " + ln for ln in row(r, after)]
    return out + ["}"]
