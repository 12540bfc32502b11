"""One kernel group + its CPU decision (schedule/cpu_mapper.py) → C++ with OpenMP and SIMD.

The innermost loop nests are printed from isl's AST of the canonical domain restricted to one
task (`_scan`): a ROW/ALL task scans j over its chunk under `#pragma omp simd reduction(...)`, a
COLUMN task scans j over its chunk and, inside, i over its block of contiguous outputs under
`#pragma omp simd` (one accumulator per output; where its blocks are in L1, in steps of the
decision's `column_rows` rows per load and store of the block: codegen/cpu_column.py), a MAP group
scans i under `#pragma omp parallel for simd`. Tasks run under `#pragma omp for schedule(static)`. Bodies, loads, finishes and the
combiners are the CUDA codegen's (thread_loop.py, expr.py, the functors of header.py generated
from algebra.py): the reduction algebra is defined once.

Stitched ROW groups make one pass over a row per level (schedule/mapping.py's `levels`), the
row in cache; a row epilogue (and every element-wise statement of an epilogue group) runs once
the values it reads are final, at (i, j = 0). A value an earlier pass evaluates per element and
a later one needs again (the decision's `reuse`, schedule/cpu_reuse.py: softmax's exp(x - m)) is
stored by the earlier pass to a row of scratch per thread (`pn_cseK`, allocated once per
thread and call) and read back by the later ones. A later pass's division by a row invariant
(softmax's / s) multiplies by its reciprocal, computed once per row (`pn_rcp`), as onnxruntime
and torch do: at most one more rounding (<= 1.5 ulp instead of 0.5), one division per row
instead of one per element. A split reduction (decision.split > 1) writes one
partial per (output, chunk), merged as its decision's `merge` says (schedule/cpu_mapper.py:
in chunk order by the last task of the output, or by atomic compare-and-swap into a shared
accumulator; codegen/cpu_merge.py), then finished.

Entry point of a kernel: `extern "C" void NAME(void** pn_a, int pn_nt)`, the buffers in the order
of `CpuKernel.params`, `pn_nt` threads. A kernel the mapper runs on one thread opens no parallel
region (codegen/cpu_region.py: a region of one thread still ends in a futex call).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import islpy as isl

from ..algebra import WELFORD
from ..errors import TargetRefused
from ..model.cpu_tile import GemmKernel
from ..poly.expr import Expr
from ..poly.program import KernelGroup
from ..poly.statement import Form, Statement, StatementKind
from ..poly.stitch import levels
from ..runtime.plan import BufferRole, BufferSpec
from ..schedule.cpu_blas import BlasCall
from ..schedule.cpu_exp_range import marked
from ..schedule.cpu_lane_kind import LaneKind, lane_kind
from ..schedule.cpu_mapper import CpuDecision, CpuMerge
from ..schedule.mapping import MergeMode, kernel_buffers
from . import islast
from .cpu_column import column_steps
from .cpu_interleave import rows_region
from .cpu_lanes import lanes_pass
from .cpu_merge import SplitMerge
from .cpu_region import one_thread
from .cpu_rows import RowValues
from .cpu_runs import RunLoop, block_head, map_head, row_run, split_invariant
from .cpu_tile import TileShape
from .expr import convert
from .thread_loop import accumuland, c_ident, identity_expr, post, post_dtype


class CpuUnsupportedError(TargetRefused):
    """A program kind the CPU target does not cover yet."""


@dataclass(frozen=True)
class CpuKernel:
    name: str
    source: str
    params: tuple[BufferSpec, ...]
    decision: CpuDecision
    reductions: tuple[str, ...] = ()  # its `#pragma omp declare reduction`s: once per source file
    host: BlasCall | None = None  # a BLAS contraction (schedule/cpu_blas.py): by numpy where `source` is ""
    tile: TileShape | None = None  # that contraction run by the tile kernel (codegen/cpu_tile.py), not the BLAS
    plans: tuple = ()  # the GemmPlans its source runs (`host_blas`: all of them only with a BLAS callable from C)

    @property
    def calls_blas(self) -> bool:
        """Whether the kernel runs numpy's BLAS (from C or through numpy): a tiled contraction does not,
        so its calls need not hold the BLAS's thread count (runtime/blas_threads.py, ~5-15 us a call)."""
        if self.source and self.plans:  # from C: a plan it runs for some thread count is the BLAS
            return any(p.kernel is GemmKernel.BLAS for p in self.plans)
        return self.host is not None and self.tile is None

    @property
    def by_numpy(self) -> BlasCall | None:
        """The BLAS call numpy runs between the C entries, or None (a C function: `source`)."""
        return self.host if not self.source else None

    def describe(self) -> str:
        g = self.decision.gemm
        if self.tile is not None and g is not None:
            pick = "register tiles: " if g.kernel is GemmKernel.TILE else ""
            return f"{pick}{g.describe()} (the mapper's pick over the {'BLAS' if pick else 'tile'})"
        return self.host.describe() if self.host is not None else self.decision.describe()


@dataclass(frozen=True)
class _Params:  # what ThreadLoop reads of a mapping for loads: the buffers
    buffers: tuple[BufferSpec, ...]


def _levels(g: KernelGroup) -> tuple[int, ...]:
    if not g.stitched:
        return tuple(0 for _ in g.statements)
    lv = levels(g.statements)
    return tuple(lv[s.name] for s in g.statements)


def reduction_name(s: Statement) -> str:
    """The OpenMP reduction identifier of statement s's combiner and accumulator type."""
    return f"pn_red_{s.combiner.name}_{c_ident(s.acc.compute)}"


def declare_reduction(s: Statement) -> str:
    """`#pragma omp declare reduction` from the functor of algebra's combiner (header.py)."""
    f, t = s.combiner.functor, s.acc.compute
    return (
        f"#pragma omp declare reduction({reduction_name(s)} : {t} : omp_out = {f}::apply(omp_out, omp_in)) "
        f"initializer(omp_priv = {identity_expr(s)})"
    )


# -- isl: one task's loop nest ------------------------------------------------------------------
def _scan(
    ctx: isl.Context, dims: list[tuple[str, str, str]], params: list[str], context: str, extra: str = ""
) -> isl.AstNode:
    """isl's AST scanning { S[dims] : lo <= d < hi (and `extra`) } in the order given, with
    `params` as isl parameters constrained by `context` (an isl constraint string over them)."""
    names = ", ".join(d for d, _, _ in dims)
    cons = " and ".join([f"{lo} <= {d} < {hi}" for d, lo, hi in dims] + ([extra] if extra else []))
    pars = ", ".join(params)
    dom = isl.Set(f"[{pars}] -> {{ S[{names}] : {cons} }}", context=ctx)
    ctx_set = isl.Set(f"[{pars}] -> {{ : {context} }}", context=ctx)
    sched = isl.Map.identity(dom.space.map_from_set()).intersect_domain(dom)
    return isl.AstBuild.from_context(ctx_set).node_from_schedule_map(isl.UnionMap.from_map(sched))


def _print(n: isl.AstNode, user: Callable[[list[str]], list[str]], pragmas: list[str]) -> list[str]:
    """islast.node with the CPU's loop pragmas (`pragmas[d]` before the loops at depth d);
    `user(args)` renders a statement instance from its argument expressions."""

    def call(e: isl.AstExpr) -> list[str]:
        return user([islast.expr(e.get_op_arg(k)) for k in range(1, e.get_op_n_arg())])

    return islast.node(n, call, "pn_idx", 0, pragmas=pragmas)


# -- the kernel ---------------------------------------------------------------------------------
class _Kernel(RowValues, SplitMerge):
    def __init__(self, name: str, g: KernelGroup, d: CpuDecision):
        self.name, self.g, self.d = name, g, d
        merges = tuple(MergeMode.STORE for _ in g.statements)
        self.params = kernel_buffers(g, name, merges, 1, (1, 1))
        self.loop = RunLoop(g, _Params(self.params), "long long")
        self.outputs = {b.statement for b in self.params if b.role == BufferRole.OUTPUT}
        self.level = _levels(g)
        self.epilogues = [k for k, s in enumerate(g.statements) if s.kind == StatementKind.MAP and s.form == Form.MAP]
        self.reductions = [k for k, s in enumerate(g.statements) if s.kind == StatementKind.REDUCE]
        self.bodies: dict[int, Expr] = {}  # statements whose body is rewritten (reciprocals)
        self.held: dict[int, dict[int, str]] = {}  # statement -> nodes whose values are held (reuse, reciprocals)
        self.rcp_flags: dict[int, dict[str, int]] = {}  # statement -> its reciprocals' flag nodes (cpu_rows.py)
        addrs = [a for s in g.statements for a in (s.write, *(r.addr for r in s.reads)) if a is not None]
        dom = g.statements[0].domain.reset_tuple_id()  # codegen/cpu_runs.py: j's runs without a division
        self.run = row_run(addrs, dom, d.N) if g.form in (Form.ROW, Form.ALL) else None
        self.map_run = row_run(addrs, dom, d.M, dim="i") if g.form == Form.MAP else None  # i's runs, likewise

    def check(self) -> None:
        g = self.g
        if g.stitched and g.form not in (Form.ROW, Form.ALL):  # ALL: one row, on one core
            raise CpuUnsupportedError(f"target='cpu': stitched {g.form} groups are not supported yet ({g.names})")
        if g.form != Form.MAP and not self.reductions:
            raise CpuUnsupportedError(f"target='cpu': a {g.form} group without a reduction ({g.names})")
        if any(s.scatter is not None for s in g.statements):
            raise CpuUnsupportedError(
                f"target='cpu': an indirect write (scatter-add with atomics, {g.names}) is not supported yet; "
                "use target='emulator'"
            )
        members = g.on_chip
        for k, s in enumerate(g.statements):
            if k in self.epilogues:
                continue
            for r in s.reads:  # a row-space value read in the pass that computes it has no register
                src = next((j for j, t in enumerate(g.statements) if t.result.uid == r.tensor.uid), None)
                if r.tensor.uid in members and src is not None and g.statements[src].kind == StatementKind.MAP:
                    if src not in self.epilogues:
                        raise CpuUnsupportedError(
                            f"target='cpu': statement {s.name} reads the row-space value {g.statements[src].name} "
                            "of its own group; not supported yet"
                        )

    # -- pieces -------------------------------------------------------------------------------
    def body(
        self,
        here: list[int],
        acc: Callable[[int], str],
        shifted: frozenset[int] = frozenset(),
        step: Callable[[int, str, str], list[str]] | None = None,
    ) -> list[str]:
        """The bodies of statements `here` at the current (i, j): accumulated or stored; a
        `shifted` Welford statement adds x - shift and its square to two plain sums. `step(k,
        acc, value)`, when given, renders a reduction's accumulation (its lines) instead of
        `acc = combiner::apply(acc, value)` (cpu_lanes' NaN-flagged max/min lanes)."""
        g, out = self.g, []
        for k in here:
            s = g.statements[k]
            if g.accumulator_of[k] != k:
                continue
            out += self.store_reused(k)
            body = self.bodies.get(k, s.body)
            # a 16-bit result is stored from the float register by pn_st, which rounds once: the
            # body's own final cast to that type (the same rounding) is left out, and so is convert's
            store16 = s.kind == StatementKind.MAP and k not in shifted and s.result.dtype.is_16bit_float
            if store16 and body.op == "cast" and body.dtype == s.result.dtype and body.args[0].dtype.compute == "float":
                body = body.args[0]
            expr = None if body is s.body else body
            lines, val = self.loop.body_lines(k, None, expr=expr, given=self.held.get(k))
            out += lines
            if k in shifted:
                t = s.acc.field.compute
                out.append(f"const {t} pn_d{k} = ({t})({convert(val, s.body.dtype, s.acc.field)}) - pn_sh{k};")
                out.append(f"pn_s1_{k} += pn_d{k}; pn_s2_{k} += pn_d{k} * pn_d{k};")
            elif s.kind == StatementKind.REDUCE:
                a, v = acc(k), accumuland(s, val)
                out += step(k, a, v) if step else [f"{a} = {s.combiner.functor}::apply({a}, {v});"]
            else:
                value = val if store16 and body.dtype.compute == "float" else convert(val, body.dtype, s.result.dtype)
                out.append(f"pn_st(&out{k}[{self.loop.address(s.write)}], {value});")
        return out

    def finish(self, here: list[int], acc: Callable[[int], str]) -> list[str]:
        """Statements `here` (reductions) finished at output i from their owners' accumulators:
        a register each (later passes and epilogues read it), stored where it has a buffer."""
        g, out = self.g, []
        for k in here:
            s = g.statements[k]
            reg = f"pn_r{k}"
            value = convert(post(s, acc(g.accumulator_of[k])), post_dtype(s), s.result.dtype)
            out.append(f"const {s.result.dtype.compute} {reg} = {value};")
            if k in self.outputs:
                out.append(f"pn_st(&out{k}[i], {reg});")
            self.loop.regs[s.result.uid] = reg
        return out

    def run_epilogues(self, after: int) -> list[str]:
        """The element-wise statements over the outputs that run after pass `after`."""
        here = [k for k in self.epilogues if max(self.level[k] - 1, 0) == after]
        if not here:
            return []
        out = ["{ const pn_idx j = 0; (void)j;"]
        for e in here:
            st = self.g.statements[e]
            lines, val = self.loop.body_lines(e, None)
            out += ["  " + ln for ln in lines]
            out.append(f"  const {st.result.dtype.compute} pn_r{e} = {convert(val, st.body.dtype, st.result.dtype)};")
            if e in self.outputs:
                out.append(f"  pn_st(&out{e}[{self.loop.address(st.write)}], pn_r{e});")
            self.loop.regs[st.result.uid] = f"pn_r{e}"
        return out + ["}"]

    def simd_clause(self, owners: list[int], var: Callable[[int], str] = lambda k: f"acc{k}") -> str:
        g = self.g
        return " ".join(f"reduction({reduction_name(g.statements[k])} : {var(k)})" for k in owners)

    def owners(self, here: list[int]) -> list[int]:
        return [k for k in here if k in self.reductions and self.g.accumulator_of[k] == k]

    # -- templates ----------------------------------------------------------------------------
    def row_pass(self, here: list[int], lo: str, hi: str, rows: int = 1, bind=None) -> list[str]:
        with self.loop.over(self.run):
            return self._row_pass(here, lo, hi, rows, bind)

    def _row_pass(self, here: list[int], lo: str, hi: str, rows: int = 1, bind=None) -> list[str]:
        """The scan of j in [lo, hi) for the statements `here`, accumulators declared before, in
        blocks of `decision.inner` iterations: each block reduces into fresh block accumulators
        (under `omp simd`, one partial per lane), merged into the running accumulator after the
        block. A lane's float sum then adds at most inner / lanes values in a row, and the
        running accumulator one value per block: the rounding of a long row stays that of a
        tree of short sums (a GPU's threads and blocks have it by construction).

        A Welford accumulator (pn_welford: a struct whose combine divides and branches, which no
        SIMD loop vectorizes) is lowered for each block to the shifted sums of x - shift and
        (x - shift)^2, shift = the block's first element (0 if not finite), two plain `+` reductions; after the
        block they become one pn_welford (mean = S1 / n, m2 = S2 - S1 * mean) merged into the
        accumulator by the combiner. The shift keeps the cancellation of m2 small: its error is
        that of (mean - shift)^2 against the variance, for rows of values near each other.

        `rows` > 1 (codegen/cpu_interleave.py): the pass of that many rows, `bind(r)` the lines
        naming row r's registers: one scan stepping every row's lanes in turn (cpu_lanes.py), or
        (other accumulators) the one-row pass once per row. A pass dividing by a row invariant is
        unswitched on its reciprocal's flag (cpu_rows.py's `unswitched`)."""
        g = self.g
        owners = self.owners(here)
        shifted = any(g.statements[k].combiner.name == WELFORD.name for k in owners)
        kinds = {lane_kind(g.statements[k]) for k in owners}
        lanes = bool(owners) and not shifted and LaneKind.NONE not in kinds
        if rows > 1 and not (lanes and LaneKind.ARG not in kinds):
            return [ln for r in range(rows) for ln in ["{", *bind(r), *self._row_pass(here, lo, hi), "}"]]
        return self.unswitched(here, rows, lambda: self._scan_pass(here, lo, hi, owners, lanes, rows, bind))

    def _scan_pass(
        self, here: list[int], lo: str, hi: str, owners: list[int], lanes: bool, rows: int, bind
    ) -> list[str]:
        """`_row_pass`'s scan once its rows and reciprocal flags are settled."""
        g = self.g
        ctx = g.statements[0].domain.get_ctx()
        ast = _scan(ctx, [("c0", "pn_lo", "pn_hi")], ["pn_lo", "pn_hi"], f"0 <= pn_lo < pn_hi <= {self.d.N}")
        shifted = frozenset(k for k in owners if g.statements[k].combiner.name == WELFORD.name)
        plain = [k for k in owners if k not in shifted]
        if lanes:
            return lanes_pass(self, here, lo, hi, owners, _scan, _print, rows, bind)  # codegen/cpu_lanes.py
        sums = [f"pn_s1_{k}, pn_s2_{k}" for k in sorted(shifted)]
        clause = self.simd_clause(plain, lambda k: f"pn_blk{k}")
        clause += f" reduction(+ : {', '.join(sums)})" if sums else ""
        pragma = f"#pragma omp simd {clause}".rstrip()

        def user(a: list[str]) -> list[str]:
            body = self.body(here, lambda k: f"pn_blk{k}", shifted)
            return ["{", f"  const pn_idx j = {a[0]};"] + ["  " + ln for ln in body] + ["}"]

        out = block_head(self.run, lo, hi, self.d.inner)
        out += ["  " + ln for ln in self.acc_decls(plain, name="pn_blk")]
        for k in sorted(shifted):
            s = g.statements[k]
            t = s.acc.field.compute
            lines, val = self.loop.body_lines(k, None)
            out += [f"  {t} pn_sh{k}, pn_s1_{k} = 0, pn_s2_{k} = 0;", "  { const pn_idx j = pn_lo;"]
            out += ["    " + ln for ln in lines]
            # a non-finite first element shifts by 0 (as pn_welford's constructor): inf - inf is no shift
            out += [f"    const {t} pn_v = ({t})({convert(val, s.body.dtype, s.acc.field)});"]
            out += [f"    pn_sh{k} = pn_v - pn_v == ({t})0 ? pn_v : ({t})0; }}"]
        out += ["  " + ln for ln in _print(ast, user, [pragma])]
        for k in plain:
            out.append(f"  acc{k} = {g.statements[k].combiner.functor}::apply(acc{k}, pn_blk{k});")
        for k in sorted(shifted):
            s = g.statements[k]
            t = s.acc.field.compute
            out += [
                f"  {{ {s.acc.compute} w; w.shift = pn_sh{k}; w.n = ({t})(pn_hi - pn_lo);",
                f"    w.mean = pn_s1_{k} / w.n; w.m2 = pn_s2_{k} - pn_s1_{k} * w.mean;",
                f"    acc{k} = {s.combiner.functor}::apply(acc{k}, w); }}",
            ]
        return out + ["}"]

    def acc_decls(self, owners: list[int], n: int | None = None, name: str = "acc") -> list[str]:
        """Accumulators `name`k set to the identity: one each, or arrays of `n` (a COLUMN block)."""
        g = self.g
        if n is None:
            return [f"{g.statements[k].acc.compute} {name}{k} = {identity_expr(g.statements[k])};" for k in owners]
        return [
            ln
            for k in owners
            for ln in (
                f"{g.statements[k].acc.compute} {name}{k}[{n}];",
                f"for (int q = 0; q < {n}; ++q) {name}{k}[q] = {identity_expr(g.statements[k])};",
            )
        ]

    def emit_row(self) -> list[str]:
        g, d = self.g, self.d
        if d.split == 1:
            start = (
                d.M - d.M % d.rows if d.rows > 1 else 0
            )  # rows > 1: the rows before it in groups (cpu_interleave.py)
            out = [f"for (pn_idx i = {start}; i < {d.M}; ++i) {{", *["  " + ln for ln in self.output_scratch()]]
            self.read_back()
            passes = max((v for k, v in enumerate(self.level) if k not in self.epilogues), default=0) + 1
            for lv in range(passes):
                here = [k for k in range(len(g.statements)) if self.level[k] == lv and k not in self.epilogues]
                out += ["  " + ln for ln in self.acc_decls(self.owners(here))]
                out += ["  " + ln for ln in self.reciprocals(here)] if lv else []
                out += ["  " + ln for ln in self.row_pass(here, "0", str(d.N))]
                out += ["  " + ln for ln in self.finish([k for k in here if k in self.reductions], lambda k: f"acc{k}")]
                out += ["  " + ln for ln in self.run_epilogues(lv)]
            out.append("}")
            if d.rows > 1:
                return rows_region(self, out, passes)
            rows = [  # one scratch row per reused value and thread, 64-byte aligned (not an output row's)
                (f"pn_cse{n}", x.ctype, f"(({d.N}LL * sizeof({x.ctype}) + 63) / 64 * 64)")
                for n, x in enumerate(d.reuse)
                if x.into is None
            ]
            if not rows:
                return ["#pragma omp parallel for schedule(static) num_threads(pn_nt)", *out]
            alloc = [f"{t}* __restrict__ {v} = ({t}*)aligned_alloc(64, {size});" for v, t, size in rows]
            loop = ["#pragma omp for schedule(static)", *out]
            free = [f"free({v});" for v, _, _ in rows]
            return ["#pragma omp parallel num_threads(pn_nt)", "{", *["  " + ln for ln in alloc + loop + free], "}"]
        alloc, free = self.partial_decls(d.M)
        owners = self.owners(self.reductions)
        out = alloc + ["#pragma omp parallel num_threads(pn_nt)", "{", *self.before_tasks()]
        out.append(self.tasks_pragma())
        out.append(f"for (pn_idx pn_t = 0; pn_t < {d.M * d.split}LL; ++pn_t) {{")
        out.append(f"  const pn_idx i = pn_t / {d.split}, pn_p = pn_t % {d.split};")
        out += ["  " + ln for ln in self.acc_decls(owners)]
        lo, hi = f"pn_p * {d.chunk}LL", f"pn_imin({d.N}LL, (pn_p + 1) * {d.chunk}LL)"
        out += ["  " + ln for ln in self.row_pass(self.reductions, lo, hi)]
        out += ["  " + ln for ln in self.deliver(lambda k: f"acc{k}")]
        if d.merge == CpuMerge.LAST:
            out += ["  " + self.last_of("pn_cnt[i]")] + ["    " + ln for ln in self.combine_partials()] + ["  }"]
        out.append("}")
        return out + self.after_tasks() + ["}"] + free

    def emit_column(self) -> list[str]:
        g, d = self.g, self.d
        B = d.block
        owners = self.owners(self.reductions)
        ctx = g.statements[0].domain.get_ctx()
        ast = _scan(
            ctx,
            [("c0", "pn_lo", "pn_hi"), ("c1", "pn_i0", f"pn_i0 + {B}")],
            ["pn_lo", "pn_hi", "pn_i0"],
            f"0 <= pn_lo < pn_hi <= {d.N} and 0 <= pn_i0 < {d.M}",
            extra=f"c1 < {d.M}",  # the last block clipped to M
        )

        def user(a: list[str]) -> list[str]:
            return (
                ["{", f"  const pn_idx j = {a[0]}; const pn_idx i = {a[1]};"]
                + ["  " + ln for ln in self.body(self.reductions, lambda k: f"pn_blk{k}[i - pn_i0]")]
                + ["}"]
            )

        nb = -(-d.M // B)
        alloc, free = self.partial_decls(nb) if d.split > 1 else ([], [])
        out = alloc + ["#pragma omp parallel num_threads(pn_nt)", "{", *self.before_tasks()]
        out.append(self.tasks_pragma())
        out.append(f"for (pn_idx pn_t = 0; pn_t < {nb * d.split}LL; ++pn_t) {{")
        out.append(f"  const pn_idx pn_i0 = pn_t / {d.split} * {B}, pn_p = pn_t % {d.split};")
        out.append(f"  const pn_idx pn_j0 = pn_p * {d.chunk}LL, pn_j1 = pn_imin({d.N}LL, (pn_p + 1) * {d.chunk}LL);")
        out += ["  " + ln for ln in self.acc_decls(owners, B)]
        # j in blocks of `inner` iterations, each into fresh block accumulators (row_pass says why)
        out.append(f"  for (pn_idx pn_b = pn_j0; pn_b < pn_j1; pn_b += {d.inner}LL) {{")
        out.append(f"    const pn_idx pn_lo = pn_b, pn_hi = pn_imin(pn_j1, pn_b + {d.inner}LL);")
        out += ["    " + ln for ln in self.acc_decls(owners, B, "pn_blk")]
        if d.column_rows > 1:  # rows in steps, a load and store of the block per step (codegen/cpu_column.py)
            out += ["    " + ln for ln in column_steps(self, owners, B)]
        else:
            out += ["    " + ln for ln in _print(ast, user, ["", "#pragma omp simd"])]
        for k in owners:
            f = g.statements[k].combiner.functor
            out.append(f"    for (int q = 0; q < {B}; ++q) acc{k}[q] = {f}::apply(acc{k}[q], pn_blk{k}[q]);")
        out.append("  }")
        block = f"for (pn_idx i = pn_i0; i < pn_imin({d.M}LL, pn_i0 + {B}); ++i) {{"
        out.append("  " + block)
        if d.split == 1:
            out += ["    " + ln for ln in self.finish(self.reductions, lambda k: f"acc{k}[i - pn_i0]")]
            out += ["    " + ln for ln in self.run_epilogues(0)]
        else:
            out += ["    " + ln for ln in self.deliver(lambda k: f"acc{k}[i - pn_i0]")]
        out.append("  }")
        if d.merge == CpuMerge.LAST:
            out += ["  " + self.last_of(f"pn_cnt[pn_t / {d.split}]"), "    " + block]
            out += ["      " + ln for ln in self.combine_partials()] + ["    }", "  }"]
        out.append("}")
        if d.split > 1:
            out += self.after_tasks()
        return out + ["}"] + free

    def emit_map(self) -> list[str]:
        g = self.g
        ctx = g.statements[0].domain.get_ctx()
        everything = list(range(len(g.statements)))
        if self.map_run is not None:  # runs of i with addresses affine in i (cpu_runs.py): plain SIMD loops
            with self.loop.over(self.map_run):
                hoisted, body = split_invariant(self.body(everything, lambda k: ""))
            return [*map_head(self.map_run, self.d.M, hoisted)] + ["    " + ln for ln in body] + ["  }", "}"]
        ast = _scan(ctx, [("c0", "0", str(self.d.M))], [], "true")

        def user(a: list[str]) -> list[str]:
            return (
                ["{", f"  const pn_idx i = {a[0]}; const pn_idx j = 0; (void)j;"]
                + ["  " + ln for ln in self.body(everything, lambda k: "")]
                + ["}"]
            )

        return _print(ast, user, ["#pragma omp parallel for simd schedule(static) num_threads(pn_nt)"])

    def render(self) -> CpuKernel:
        self.check()
        g = self.g
        lines = [f'extern "C" void {self.name}(void** pn_a, int pn_nt) {{', "  typedef long long pn_idx;"]
        lines.append(
            f"  if (pn_nt > {self.d.threads}) pn_nt = {self.d.threads};  // the mapper's threads (its model's choice)"
        )
        for n, p in enumerate(self.params):
            const = "const " if p.role == BufferRole.INPUT else ""
            lines.append(f"  {const}{p.ctype}* __restrict__ {p.param} = ({const}{p.ctype}*)pn_a[{n}];")
        body = {Form.MAP: self.emit_map, Form.COLUMN: self.emit_column}.get(g.form, self.emit_row)()
        lines += ["  " + ln for ln in (one_thread(body) if self.d.threads == 1 else body)]
        lines.append("}")
        decls = sorted({declare_reduction(g.statements[k]) for k in self.owners(self.reductions)})
        return CpuKernel(self.name, "\n".join(lines), self.params, self.d, tuple(decls))


def render_cpu(name: str, group: KernelGroup, d: CpuDecision) -> CpuKernel:
    """The C++ of one kernel group under its CPU decision; CpuUnsupportedError for a group kind
    the CPU target does not cover yet."""
    return _Kernel(name, marked(group, d.exp_le0), d).render()  # schedule/cpu_exp_range.py
