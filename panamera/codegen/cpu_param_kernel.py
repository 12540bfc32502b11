"""CPU kernels of a symbolic program (issues 22 and 24): C++ with OpenMP + SIMD whose extents are
arguments, one source per size class plan.

A kernel of a parametric program (poly/param_stitch.py: a single statement, reductions sharing an
accumulator, a reduction with its epilogue, or a stitched ROW group) under its class decision
(schedule/cpu_param_mapping.py) is printed as the static CPU target prints a group
(codegen/cpu_kernel.py): rows (or COLUMN blocks of contiguous outputs) over the cores, the reduced
loop under `#pragma omp simd reduction(...)` in blocks of `inner` iterations into fresh block
accumulators (the rounding of long rows), Welford rows as shifted sums, a split reduction's
partials merged in chunk order, by the last task or by compare-and-swap, stitched groups making
one pass over the row per accumulator and a last one for the MAP. The differences: the extents
`pn_M`, `pn_N` and every symbol `pn_s_<name>` are read from the argument array `pn_x`; addresses
are the symbolic strides' (codegen/param_kernel.py `address`); the loop nests are isl's AST of the
boxes with those parameters; a split's chunk length is computed from the bound N (whole SIMD
vectors). `omp simd` loops have scalar tails, so every size is legal without an alignment proof.
A kernel runs on at most its decision's `threads` (a call asking for more is clamped); one whose
decision is one thread opens no parallel region (codegen/cpu_region.py `one_thread`, as a static
kernel: a region of one thread still ends in a futex call).

Entry point: `extern "C" void NAME(void** pn_a, const long long* pn_x, int pn_nt)`: the buffers
in the order of `CpuParamKernel.buffers`, the extents [M, N, symbols...], `pn_nt` threads.

>>> import panamera as pn
>>> from panamera.poly.params import build
>>> from panamera.schedule.cpu_param_mapping import CpuParamDecision
>>> p = build((pn.sum(pn.placeholder(("B", 64), name="x"), axis=1),))
>>> d = CpuParamDecision("S0", p.statements[0].form, "single", 1, 1, 8)
>>> k = render_cpu_group(p.statements, d, p, "pn_c0")
>>> "pn_s_B = pn_x[2]" in k.source, "#pragma omp simd reduction" in k.source, "omp parallel" in k.source
(True, True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import islpy as isl

from ..algebra import WELFORD
from ..errors import ScheduleError
from ..frontend.symbolic import Dim
from ..poly.params import ParamProgram, PRead, PStatement
from ..poly.statement import Form, StatementKind
from ..schedule.cpu_mapper import CpuMerge
from ..schedule.cpu_param_mapping import CpuParamDecision
from ..schedule.cpu_param_reuse import address as reuse_address
from ..schedule.cpu_param_reuse import varying
from ..schedule.cpu_reuse import nodes_with
from .cpu_kernel import _print, _scan, declare_reduction, reduction_name
from .cpu_merge import after_tasks, before_tasks, last_of, tasks_pragma
from .cpu_region import one_thread
from .cpu_rows import RowValues, _substitute, reciprocal
from .expr import ExprRenderer, convert
from .param_kernel import address, c_extent, finish
from .thread_loop import accumuland, identity_expr, post_dtype


@dataclass(frozen=True)
class CpuParamKernel:
    """One CPU kernel of a class: its C++, its buffers ("t:<uid>", in `pn_a` order) and the
    `#pragma omp declare reduction`s it needs (once per source file)."""

    name: str
    statement: str
    source: str
    buffers: tuple[str, ...]
    decision: CpuParamDecision
    reductions: tuple[str, ...] = ()


def scalars(program: ParamProgram) -> tuple[str, ...]:
    """The extents in `pn_x`, in order: the kernel's M and N, then every symbol."""
    return ("pn_M", "pn_N", *(f"pn_s_{n}" for n in program.parameters))


class _Kernel(RowValues):
    def __init__(self, members: tuple[PStatement, ...], d: CpuParamDecision, program: ParamProgram, name: str):
        self.members, self.d, self.program, self.name = members, d, program, name
        self.index = {m.name: k for k, m in enumerate(members)}
        self.held: dict[int, dict[int, str]] = {}  # member -> {node id: C expression of its value} (RowValues)
        self.rcp_flags: dict[int, dict[str, int]] = {}
        self.bodies: dict[int, object] = {}  # member -> its body with reciprocals (RowValues)
        own = {m.result.uid for m in members}
        self.inputs = list(
            dict.fromkeys(r.tensor.uid for m in members for r in m.reads if r.tensor.uid not in own and r.memory)
        )
        self.dtype_of = {r.tensor.uid: r.tensor.dtype for m in members for r in m.reads}
        self.regs: dict[int, str] = {}  # finished values by tensor uid (later passes and epilogues read them)
        self.reds = [k for k, m in enumerate(members) if m.kind == StatementKind.REDUCE]
        phases: dict[tuple, list[int]] = {}
        for k in self.reds:
            phases.setdefault(members[k].accumulator_key(), []).append(k)
        self.phases = list(phases.values())  # members sharing one accumulator, in launch order
        self.ctx = isl.DEFAULT_CONTEXT

    # -- values -------------------------------------------------------------------------------
    def value(self, s: PStatement, prefix: str, expr=None) -> tuple[list[str], str]:
        """The body of `s` (or its node `expr`) at the current (i, j): its SSA lines and value
        (loads through the symbolic strides, a finished value from its register, a value `held`); a
        producer of the decision's `reuse` stores the kept value to the MAP's output row at j."""
        lines: list[str] = []
        k = self.index[s.name]
        names = {u: f"in{k}" for k, u in enumerate(self.inputs)}

        def load(read: int, index: str | None = None) -> str:
            r = s.reads[read]
            if r.indirect is not None:  # a gather (poly/params.py): the loaded index, wrapped if negative, clamped
                (stride, n), q = (c_extent(e) for e in r.indirect), f"((pn_idx)({index}))"
                q = f"({q} + ({q} < 0 ? {n} : 0LL))"
                q = f"({q} < 0LL ? 0LL : ({q} >= {n} ? {n} - 1LL : {q}))"
                at = f"pn_ld(&{names[r.tensor.uid]}[{address(s, r)[0]} + {q} * {stride}])"
                zero = f"(({r.tensor.dtype.compute})0)"
                if isinstance(r.indirect[1], int):  # an empty axis: nothing to clamp to, no load
                    return at if r.indirect[1] > 0 else zero
                # a symbol bound to 0: no load (dynamic.py refuses a user's non-empty index; onehot.py's reads 0)
                return f"({n} > 0LL ? {at} : {zero})"
            if not r.memory:  # an iota (poly/params.py precondition 1): its value is its index
                return f"((long long){address(s, iota_view(r))[0]})"
            if r.tensor.uid in self.regs:
                return self.regs[r.tensor.uid]
            return f"pn_ld(&{names[r.tensor.uid]}[{address(s, r)[0]}])"

        extents = {id(e): c_extent(e.value) for e in s.body.walk() if e.op == "const" and isinstance(e.value, Dim)}
        r = ExprRenderer(lines, prefix, {**extents, **self.held.get(k, {})})
        if expr is not None:
            return lines, r.render(expr, load)
        for x in self.d.reuse if s.kind == StatementKind.REDUCE else ():
            if x.producer == k:
                kept = r.render(nodes_with(s, x.key, reuse_address)[0], load)
                lines.append(f"pn_st(&{self.out(x.into)}[i * pn_N + j], {kept});  // kept for the last pass")
        return lines, r.render(self.bodies.get(k, s.body), load)

    def out(self, k: int) -> str:
        return f"out{k}"

    # -- a pass over j ---------------------------------------------------------------------------
    def row_pass(self, phase: list[int], acc: str, lo: str, hi: str, target: Callable[[str], str] | None = None):
        """Accumulator `acc` of `phase` over j in [lo, hi) at row i, in blocks of `inner`
        iterations into fresh block accumulators under `omp simd` (a Welford accumulator as the
        shifted sums of its block, as cpu_kernel.row_pass). Under a decision's `lane_scan` W, a scalar
        accumulator scans a block's whole groups of W iterations into W lane accumulators folded by
        the fixed tree `pn_fold_lanes` (codegen/cpu_lanes.py, as the static kernels: the scan runs
        at the speed of its loads, not of one vector register's add latency), the last < W
        iterations under `omp simd reduction`."""
        s = self.members[phase[0]]
        t, f, inner = s.acc.compute, s.combiner.functor, self.d.inner
        ast = _scan(self.ctx, [("c0", "pn_lo", "pn_hi")], ["pn_lo", "pn_hi"], "0 <= pn_lo <= pn_hi")
        welford = s.combiner.name == WELFORD.name
        out = [
            f"for (pn_idx pn_b = {lo}; pn_b < {hi}; pn_b += {inner}LL) {{",
            f"  const pn_idx pn_lo = pn_b, pn_hi = pn_imin({hi}, pn_b + {inner}LL);",
        ]
        if welford:
            ft = s.acc.field.compute
            first, v = self.value(s, f"w{s.name}_")
            out += [f"  {ft} pn_sh, pn_s1 = 0, pn_s2 = 0;", "  { const pn_idx j = pn_lo;"]
            out += ["    " + ln for ln in first]
            out += [f"    const {ft} pn_v = ({ft})({convert(v, s.body.dtype, s.acc.field)});"]
            out += [f"    pn_sh = pn_v - pn_v == ({ft})0 ? pn_v : ({ft})0; }}"]
            pragma = "#pragma omp simd reduction(+ : pn_s1, pn_s2)"
        else:
            out.append(f"  {t} pn_blk = {identity_expr(s)};")
            pragma = f"#pragma omp simd reduction({reduction_name(s)} : pn_blk)"
            if self.d.lane_scan:
                out += ["  " + ln for ln in self.lanes(s)]

        def user(a: list[str]) -> list[str]:
            lines, val = self.value(s, f"e{s.name}_")
            if welford:
                ft = s.acc.field.compute
                lines += [f"const {ft} pn_dv = ({ft})({convert(val, s.body.dtype, s.acc.field)}) - pn_sh;"]
                lines += ["pn_s1 += pn_dv; pn_s2 += pn_dv * pn_dv;"]
            else:
                lines.append(f"pn_blk = {f}::apply(pn_blk, {accumuland(s, val)});")
            return ["{", f"  const pn_idx j = {a[0]};"] + ["  " + ln for ln in lines] + ["}"]

        scan = _print(ast, user, [pragma])
        if not welford and self.d.lane_scan:  # the last < W iterations
            scan = ["{ const pn_idx pn_lo = pn_c;"] + ["  " + ln for ln in scan] + ["}"]
        out += ["  " + ln for ln in scan]
        if welford:
            ft = s.acc.field.compute
            out += [
                f"  {{ {t} w; w.shift = pn_sh; w.n = ({ft})(pn_hi - pn_lo);",
                "    w.mean = pn_s1 / w.n; w.m2 = pn_s2 - pn_s1 * w.mean;",
                f"    {acc} = {f}::apply({acc}, w); }}",
            ]
        else:
            out.append(f"  {acc} = {f}::apply({acc}, pn_blk);")
        return out + ["}"]

    def lanes(self, s: PStatement) -> list[str]:
        """The block's whole groups of W iterations into W lane accumulators, folded into `pn_blk`
        (`pn_c`: the first iteration left)."""
        t, f, w = s.acc.compute, s.combiner.functor, self.d.lane_scan
        if self.d.arg_lanes:
            return self.arg_lanes(s)
        lines, val = self.value(s, f"l{s.name}_")
        body = ["{", "  const pn_idx j = pn_c + c0;"] + ["  " + ln for ln in lines]
        body += [f"  pn_lane[c0] = {f}::apply(pn_lane[c0], {accumuland(s, val)});", "}"]
        return [
            f"{t} pn_lane[{w}];",
            f"for (int q = 0; q < {w}; ++q) pn_lane[q] = {identity_expr(s)};",
            "pn_idx pn_c = pn_lo;",
            f"for (; pn_c + {w} <= pn_hi; pn_c += {w}) {{",
            "  #pragma omp simd",
            f"  for (pn_idx c0 = 0; c0 < {w}; ++c0)",
            *["  " + ln for ln in body],
            "}",
            f"if (pn_c > pn_lo) pn_blk = {f}::apply(pn_blk, pn_fold_lanes<{f}, {w}>(pn_lane));",
        ]

    def arg_lanes(self, s: PStatement) -> list[str]:
        """`lanes` of an argmax/argmin under the decision's `arg_lanes`: lane q keeps its best value
        and index (j, rising) in the value's type, replaced by a greater (argmin: less) value or the
        first NaN, so it holds the first index of its extreme; the lanes become keys once, folded in
        lane order (the keys' order resolves ties as numpy: the first index, the first NaN). The
        static kernels' LaneKind.ARG (codegen/cpu_lanes.py `arg_lane`)."""
        f, w, name = s.combiner.functor, self.d.lane_scan, s.combiner.name
        v = s.body.args[0].dtype.compute
        vl, val = self.value(s, f"v{s.name}_", expr=s.body.args[0])
        xl, idx = self.value(s, f"x{s.name}_", expr=s.body.args[1])
        keep, init = ("<=", "lowest") if name == "max" else (">=", "highest")
        body = ["{", "  const pn_idx j = pn_c + c0;", f"  {v} pn_v; long long pn_x;", "  {"]
        body += ["    " + ln for ln in vl] + [f"    pn_v = {val};", "  }", "  {"]
        body += ["    " + ln for ln in xl] + [f"    pn_x = (long long)({idx});", "  }"]
        body += [
            "  const bool pn_t = !(pn_v " + keep + " pn_lv[c0]) & (pn_lv[c0] == pn_lv[c0]);",
            "  pn_lv[c0] = pn_t ? pn_v : pn_lv[c0]; pn_li[c0] = pn_t ? pn_x : pn_li[c0];",
            "}",
        ]
        return [
            f"{v} pn_lv[{w}]; long long pn_li[{w}];",
            f"for (int q = 0; q < {w}; ++q) {{ pn_lv[q] = pn_lim<{v}>::{init}(); pn_li[q] = pn_lo + q; }}",
            "pn_idx pn_c = pn_lo;",
            f"for (; pn_c + {w} <= pn_hi; pn_c += {w}) {{",
            "  #pragma omp simd",
            f"  for (pn_idx c0 = 0; c0 < {w}; ++c0)",
            *["  " + ln for ln in body],
            "}",
            f"if (pn_c > pn_lo) for (int q = 0; q < {w}; ++q) pn_blk = {f}::apply(pn_blk, pn_argkey_{name}(pn_lv[q], pn_li[q]));",
        ]

    def finish(self, phase: list[int], acc: str, at: str = "i") -> list[str]:
        """The phase's reductions finished at output `at` from `acc`: a register each, stored."""
        out = []
        for k in phase:
            m = self.members[k]
            out.append(
                f"const {m.result.dtype.compute} pn_r{k} = {convert(finish(m, acc), post_dtype(m), m.result.dtype)};"
            )
            out.append(f"pn_st(&{self.out(k)}[{at}], pn_r{k});")
            self.regs[m.result.uid] = f"pn_r{k}"
        return out + self.epilogue(at)

    def epilogue(self, at: str) -> list[str]:
        """An epilogue group's MAP at output `at` (its flat index is the reduction's output index)."""
        if self.d.kind != "epilogue":
            return []
        e = self.members[-1]
        lines, val = self.value(e, f"p{e.name}_")
        store = f"pn_st(&{self.out(len(self.members) - 1)}[i], {convert(val, e.body.dtype, e.result.dtype)});"
        return ["{ const pn_idx j = 0; (void)j;"] + ["  " + ln for ln in lines] + ["  " + store, "}"]

    # -- templates -----------------------------------------------------------------------------
    def emit_map(self) -> list[str]:
        s = self.members[0]
        ast = _scan(self.ctx, [("c0", "0", "pn_M")], ["pn_M"], "pn_M >= 0")

        def user(a: list[str]) -> list[str]:
            lines, val = self.value(s, f"e{s.name}_")
            lines.append(f"pn_st(&out0[i], {convert(val, s.body.dtype, s.result.dtype)});")
            return (
                ["{", f"  const pn_idx i = {a[0]}; const pn_idx j = 0; (void)j;"] + ["  " + ln for ln in lines] + ["}"]
            )

        return _print(ast, user, ["#pragma omp parallel for simd schedule(static) num_threads(pn_nt)"])

    def emit_rows(self) -> list[str]:
        """Unsplit ROW/ALL: a row per iteration over the cores; each accumulator's pass, its
        finishes, and a stitched group's MAP pass over the row."""
        out = ["#pragma omp parallel for schedule(static) num_threads(pn_nt)", "for (pn_idx i = 0; i < pn_M; ++i) {"]
        for p, phase in enumerate(self.phases):
            s = self.members[phase[0]]
            out.append(f"  {s.acc.compute} acc{p} = {identity_expr(s)};")
            out += ["  " + ln for ln in self.row_pass(phase, f"acc{p}", "0", "pn_N")]
            out += ["  " + ln for ln in self.finish(phase, f"acc{p}")]
        if self.d.kind == "stitched":
            out += ["  " + ln for ln in self.map_pass()]
        return out + ["}"]

    def map_pass(self) -> list[str]:
        """A stitched group's MAP over row i, its reductions in registers (poly/param_stitch.py
        precondition 1: its flat index is i * N + j)."""
        last = len(self.members) - 1
        row = self.members[last].as_rows_of(self.members[self.reds[0]])
        ast = _scan(self.ctx, [("c0", "0", "pn_N")], ["pn_N"], "pn_N >= 0")
        for x in self.d.reuse:  # read back from the output row (schedule/cpu_param_reuse.py)
            for n in nodes_with(row, x.key, reuse_address):
                self.held.setdefault(last, {})[id(n)] = f"pn_ld(&{self.out(last)}[i * pn_N + j])"
        pre = self.param_reciprocals(last, row)

        def user(a: list[str]) -> list[str]:
            lines, val = self.value(row, f"e{row.name}_")
            lines.append(f"pn_st(&{self.out(last)}[i * pn_N + j], {convert(val, row.body.dtype, row.result.dtype)});")
            return ["{", f"  const pn_idx j = {a[0]};"] + ["  " + ln for ln in lines] + ["}"]

        return pre + self.unswitched([last], 1, lambda: _print(ast, user, ["#pragma omp simd"]))

    def param_reciprocals(self, k: int, s: PStatement) -> list[str]:
        """A float division by a row invariant in the MAP's body as a product with its reciprocal,
        computed once per row (codegen/cpu_rows.py `reciprocal`, as the static kernels; the pass
        unswitched on its flag by `RowValues.unswitched`)."""
        along, table, out = varying(s), {}, []
        for e in s.body.walk():
            if e.op == "div" and e.dtype.is_float and id(e.args[1]) not in along and id(e.args[0]) in along:
                lines, val = self.value(s, f"q{len(table)}_", expr=e.args[1])
                decl, code, table[id(e)] = reciprocal(self, k, e, f"pn_rcp{k}_{len(table)}", lines, val)
                out = decl + out + code
        if table:
            self.bodies[k] = _substitute(s.body, table)
        return out

    # -- a split reduction's partials -------------------------------------------------------------
    def partials(self, slots: str, counters: str) -> tuple[list[str], list[str]]:
        s = self.members[self.phases[0][0]]
        t, d = s.acc.compute, self.d
        if d.merge == CpuMerge.ATOMIC:
            alloc = [f"{t}* __restrict__ pn_acc = ({t}*)malloc(sizeof({t}) * pn_imax(1, pn_M));"]
        else:
            alloc = [f"{t}* __restrict__ pn_part = ({t}*)malloc(sizeof({t}) * pn_imax(1, {slots}));"]
        free = ["free(pn_acc);" if d.merge == CpuMerge.ATOMIC else "free(pn_part);"]
        if d.merge == CpuMerge.LAST:
            alloc.append(f"int* pn_cnt = (int*)calloc(pn_imax(1, {counters}), sizeof(int));")
            free.append("free(pn_cnt);")
        return alloc, free

    def before_tasks(self) -> list[str]:
        return before_tasks(self.d.merge, "pn_M", f"pn_acc[i] = {identity_expr(self.members[self.phases[0][0]])};")

    def deliver(self, acc: str) -> str:
        s = self.members[self.phases[0][0]]
        if self.d.merge == CpuMerge.ATOMIC:
            return f"pn_atomic_combine<{s.combiner.functor}>(&pn_acc[i], {acc});"
        return f"pn_part[pn_p * pn_M + i] = {acc};"  # chunk-major, as codegen/cpu_merge.py's partials

    def combine(self) -> list[str]:
        """Output i's partials combined in chunk order (or its shared accumulator), finished."""
        s = self.members[self.phases[0][0]]
        t, f, split = s.acc.compute, s.combiner.functor, self.d.split
        if self.d.merge == CpuMerge.ATOMIC:
            out = [f"{t} pn_m = pn_acc[i];"]
        else:
            out = [f"{t} pn_m = pn_part[i];",
                   f"for (int q = 1; q < {split}; ++q) pn_m = {f}::apply(pn_m, pn_part[q * pn_M + i]);"]  # fmt: skip
        return out + self.finish(self.phases[0], "pn_m")

    def after_tasks(self) -> list[str]:
        return after_tasks(self.d.merge, "pn_M", self.combine() if self.d.merge == CpuMerge.ATOMIC else [])

    def chunk(self) -> list[str]:
        """A split's chunk length from the bound N: whole SIMD vectors (the chunks past N are empty)."""
        S, L = self.d.split, self.d.lanes  # noqa: N806
        return [f"const pn_idx pn_chunk = ((pn_N + {S - 1}) / {S} + {L - 1}) / {L} * {L};"]

    def emit_split_rows(self) -> list[str]:
        d = self.d
        s = self.members[self.phases[0][0]]
        alloc, free = self.partials(f"pn_M * {d.split}", "pn_M")
        out = self.chunk() + alloc + ["#pragma omp parallel num_threads(pn_nt)", "{", *self.before_tasks()]
        out += [tasks_pragma(self.d.merge), f"for (pn_idx pn_t = 0; pn_t < pn_M * {d.split}; ++pn_t) {{"]
        out.append(f"  const pn_idx i = pn_t / {d.split}, pn_p = pn_t % {d.split};")
        out.append("  const pn_idx pn_j0 = pn_imin(pn_N, pn_p * pn_chunk), pn_j1 = pn_imin(pn_N, pn_j0 + pn_chunk);")
        out.append(f"  {s.acc.compute} acc0 = {identity_expr(s)};")
        out += ["  " + ln for ln in self.row_pass(self.phases[0], "acc0", "pn_j0", "pn_j1")]
        out.append("  " + self.deliver("acc0"))
        if d.merge == CpuMerge.LAST:
            out += ["  " + last_of("pn_cnt[i]", d.split)] + ["    " + ln for ln in self.combine()] + ["  }"]
        out.append("}")
        return out + self.after_tasks() + ["}"] + free

    def emit_column(self) -> list[str]:
        """COLUMN: a task per (block of B contiguous outputs, chunk of j); i innermost under `omp simd`."""
        d = self.d
        s = self.members[self.phases[0][0]]
        B, S, t, f = d.block, d.split, s.acc.compute, s.combiner.functor  # noqa: N806
        ast = _scan(
            self.ctx,
            [("c0", "pn_lo", "pn_hi"), ("c1", "pn_i0", f"pn_i0 + {B}")],
            ["pn_lo", "pn_hi", "pn_i0", "pn_M"],
            "0 <= pn_lo <= pn_hi and 0 <= pn_i0 < pn_M",
            extra="c1 < pn_M",  # the last block clipped to M
        )

        def user(a: list[str]) -> list[str]:
            lines, val = self.value(s, f"e{s.name}_")
            lines.append(f"pn_blk[i - pn_i0] = {f}::apply(pn_blk[i - pn_i0], {accumuland(s, val)});")
            return ["{", f"  const pn_idx j = {a[0]}; const pn_idx i = {a[1]};"] + ["  " + ln for ln in lines] + ["}"]

        alloc, free = self.partials(f"pn_M * {S}", "pn_nb") if S > 1 else ([], [])
        out = [f"const pn_idx pn_nb = (pn_M + {B - 1}) / {B};"] + (self.chunk() if S > 1 else [])
        out += alloc + ["#pragma omp parallel num_threads(pn_nt)", "{", *self.before_tasks()]
        out += [tasks_pragma(self.d.merge), f"for (pn_idx pn_t = 0; pn_t < pn_nb * {S}; ++pn_t) {{"]
        out.append(f"  const pn_idx pn_i0 = pn_t / {S} * {B}, pn_nq = pn_imin({B}, pn_M - pn_i0);")
        if S > 1:
            out.append(f"  const pn_idx pn_p = pn_t % {S};")
            out.append(
                "  const pn_idx pn_j0 = pn_imin(pn_N, pn_p * pn_chunk), pn_j1 = pn_imin(pn_N, pn_j0 + pn_chunk);"
            )
        else:
            out.append("  const pn_idx pn_j0 = 0, pn_j1 = pn_N;")
        ident = identity_expr(s)
        out += [f"  {t} acc[{B}];", f"  for (pn_idx q = 0; q < pn_nq; ++q) acc[q] = {ident};"]
        out.append(f"  for (pn_idx pn_b = pn_j0; pn_b < pn_j1; pn_b += {d.inner}LL) {{")
        out.append(f"    const pn_idx pn_lo = pn_b, pn_hi = pn_imin(pn_j1, pn_b + {d.inner}LL);")
        out += [f"    {t} pn_blk[{B}];", f"    for (pn_idx q = 0; q < pn_nq; ++q) pn_blk[q] = {ident};"]
        out += ["    " + ln for ln in _print(ast, user, ["", "#pragma omp simd"])]
        out.append(f"    for (pn_idx q = 0; q < pn_nq; ++q) acc[q] = {f}::apply(acc[q], pn_blk[q]);")
        out.append("  }")
        block = "for (pn_idx i = pn_i0; i < pn_i0 + pn_nq; ++i) {"
        out.append("  " + block)
        if S == 1:
            out += ["    " + ln for ln in self.finish(self.phases[0], "acc[i - pn_i0]")]
        else:
            out.append("    " + self.deliver("acc[i - pn_i0]"))
        out.append("  }")
        if d.merge == CpuMerge.LAST:
            out += ["  " + last_of(f"pn_cnt[pn_t / {S}]", S), "    " + block]
            out += ["      " + ln for ln in self.combine()] + ["    }", "  }"]
        out.append("}")
        if S > 1:
            out += self.after_tasks()
        return out + ["}"] + free

    def render(self) -> CpuParamKernel:
        m0 = self.members[0]
        keys = [f"t:{u}" for u in self.inputs] + [f"t:{m.result.uid}" for m in self.members]
        lines = [
            f'extern "C" void {self.name}(void** pn_a, const long long* pn_x, int pn_nt) {{',
            "  typedef long long pn_idx;",
            f"  if (pn_nt > {self.d.threads}) pn_nt = {self.d.threads};  // the class decision's threads",
        ]
        for n, u in enumerate(self.inputs):
            ct = self.dtype_of[u].c_type
            lines.append(f"  const {ct}* __restrict__ in{n} = (const {ct}*)pn_a[{n}];")
        for k, m in enumerate(self.members):
            ct = m.result.dtype.c_type
            lines.append(f"  {ct}* __restrict__ {self.out(k)} = ({ct}*)pn_a[{len(self.inputs) + k}];")
        for n, x in enumerate(scalars(self.program)):
            lines.append(f"  const long long {x} = pn_x[{n}]; (void){x};")
        if m0.kind == StatementKind.MAP:
            body = self.emit_map()
        elif m0.form == Form.COLUMN:
            body = self.emit_column()
        elif self.d.split > 1:
            body = self.emit_split_rows()
        else:
            body = self.emit_rows()
        lines += ["  " + ln for ln in (one_thread(body) if self.d.threads == 1 else body)] + ["}"]
        decls = sorted({declare_reduction(self.members[p[0]]) for p in self.phases})
        return CpuParamKernel(self.name, self.d.statement, "\n".join(lines), tuple(keys), self.d, tuple(decls))


def iota_view(r: PRead) -> PRead:
    """An iota read as the read whose address is its value: the flat C-order index of its view
    (axis None), or its coordinate along its axis (a view of that axis alone, stride 1)."""
    axis = r.tensor.attr("axis")
    if axis is None:
        return r
    live = iter(r.axes)
    at = [None if isinstance(e, int) and e == 1 else next(live) for e in r.shape]
    if at[axis] is None:  # an extent-1 axis: index 0
        return PRead(r.tensor, (), ())
    return PRead(r.tensor, (r.shape[axis],), (at[axis],))


def render_cpu_group(
    members: tuple[PStatement, ...], d: CpuParamDecision, program: ParamProgram, name: str
) -> CpuParamKernel:
    """The C++ of one kernel of a parametric program under its class decision."""
    if d.split > 1 and (d.kind == "stitched" or members[0].kind == StatementKind.MAP):
        raise ScheduleError(f"{d.statement}: a {d.kind} {members[0].form} kernel cannot be split (split={d.split})")
    return _Kernel(tuple(members), d, program, name).render()
