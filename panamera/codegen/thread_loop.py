"""The thread loop every kernel template shares: one thread's iterations, their loads and bodies.

The loop nest of each thread comes from isl's AST generator: the statement domain intersected
with the thread's share of the iterations (block and thread ids are isl parameters; the task
mappings of schedule/mapping.py say which) and isl scans what remains. Every read is loaded as
the mapping's access kind says; the templates (map_kernel.py, reduce_kernel.py,
stitched_kernel.py) put accumulators and epilogues around the loop.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import islpy as isl

from ..algebra import FinishKind
from ..dtypes import DType, bool_
from ..poly.access import AccessKind
from ..poly.program import KernelGroup
from ..poly.statement import Form, Statement, StatementKind
from ..runtime.plan import BufferRole
from ..schedule.mapping import Mapping
from . import islast
from .expr import ExprRenderer, convert, literal


def c_ident(ctype: str) -> str:
    """A C type as a piece of an identifier ("pn_welford<float>" -> "pn_welford_float_")."""
    return re.sub(r"\W", "_", ctype)


def identity_expr(s: Statement) -> str:
    """The combiner's identity in the accumulator's C type."""
    return f"{s.combiner.functor}::template identity<{s.acc.compute}>()"


def post_dtype(s: Statement) -> DType:
    """The dtype of a reduction's value before it is stored: the accumulator's, or for a struct
    accumulator the dtype of its fields."""
    return s.acc.field if s.acc.is_struct else s.acc


def post(s: Statement, a: str) -> str:
    """The reduction's value from its accumulator `a`, in the dtype `post_dtype(s)`."""
    f = s.post
    if f is not None:
        if f.kind in (FinishKind.ARGMAX_INDEX, FinishKind.ARGMIN_INDEX):  # the index packed in the key
            index = f"pn_argindex_{'max' if f.kind == FinishKind.ARGMAX_INDEX else 'min'}({a})"
            return f"({int(f.last_index)}LL - {index})" if f.last_index >= 0 else index
        return {
            FinishKind.WELFORD_MEAN: f"pn_welford_mean({a})",  # kept relative to its shift
            FinishKind.WELFORD_VAR: f"pn_welford_var({a}, {int(f.ddof)})",
            FinishKind.LSE_MAX: f"({a}).m",
            FinishKind.LSE_SUM: f"({a}).s",
        }[f.kind]
    if s.mean_count:
        return f"({a} / ({s.acc.compute}){literal(s.mean_count, s.acc)})"
    return a


def address_ast(group: KernelGroup, addr: isl.PwAff) -> isl.AstExpr:
    """The isl AST expression of an address (a read's or a write's) over the group's canonical
    domain: what `ThreadLoop.address` renders and `kernel.index_bound` bounds."""
    dom = group.statements[0].domain.reset_tuple_id()
    return isl.AstBuild.from_context(dom).expr_from_pw_aff(addr.gist(dom))


class ThreadLoop:
    """One kernel group under its mapping: the thread's loop nest and the code of one iteration."""

    def __init__(self, group: KernelGroup, m: Mapping, idx: str):
        self.g, self.m, self.idx = group, m, idx
        self.in_name = {b.uid: b.param for b in m.buffers if b.role == BufferRole.INPUT}
        self.ctx = group.statements[0].domain.get_ctx()
        self.regs: dict[int, str] = {}  # stitched results available in registers, by tensor uid
        self.accs: dict[int, str] = {}  # accumulators other than acc{k}, by statement (column partials)
        self.staged: dict[
            tuple[int, int], str
        ] = {}  # (statement, read) -> its shared-memory stage (codegen/pipeline.py)
        # Rows kept on chip (schedule/onchip.py): (statement, read) -> the vector it is kept in,
        # and the pairs whose iteration loads it there (pass 0's); the others read it back.
        self.kept: dict[tuple[int, int], str] = {}
        self.kept_loads: set[tuple[int, int]] = set()
        # Row tiles held in shared memory (schedule/hold.py, codegen/column_stitch.py): tensor uid -> its
        # array, the thread's vector there, the condition to use it, and whether this pass stores or reads it
        self.held: dict[int, str] = {}
        self.held_at, self.held_if, self.held_store = "", "", False

    # -- isl: the loop nest of one thread ---------------------------------------------------
    def loops(self, user: Callable[[isl.AstExpr], list[str]]) -> list[str]:
        """The thread's loop nest: the canonical domain intersected with the iterations the task
        mappings give to (bx, by, tx, ty), with isl parameters for those indices."""
        m = self.m
        outer, inner = m.loops
        e0, e1 = m.extents
        tasks = m.tasks
        serial_names = sorted({n for t in tasks.values() for n in t.serial_indices()})
        hw = ["bx", "by", "tx", "ty"]
        v = isl.make_zero_and_vars([outer, inner, *serial_names], hw, ctx=self.ctx)
        z = v[0]
        s = v[outer].ge_set(z) & v[outer].lt_set(z + e0) & v[inner].ge_set(z) & v[inner].lt_set(z + e1)
        for loop, t in tasks.items():
            s = s & v[loop].eq_set(t.affine(v)) & t.bounds(v)
        bounds = {"bx": m.grid[0], "by": m.grid[1], "tx": m.tx, "ty": m.ty}
        context = s.params().universe(s.params().space)
        for name in hw:
            context = context & (v[name].ge_set(z) & v[name].lt_set(z + bounds[name])).params()
        for name in serial_names:  # serial steps become isl's loops over the owned tasks
            s = s.project_out(isl.dim_type.set, s.find_dim_by_name(isl.dim_type.set, name), 1)
        s = s.set_tuple_name("S")
        sched = isl.Map.identity(s.space.map_from_set()).intersect_domain(s)
        ast = isl.AstBuild.from_context(context).node_from_schedule_map(isl.UnionMap.from_map(sched))
        return islast.node(ast, user, self.idx, 1, m.unroll)

    def address(self, addr: isl.PwAff) -> str:
        return islast.expr(address_ast(self.g, addr))

    # -- register tiles (schedule/rtile.py) ----------------------------------------------------
    def tile_row(self, t: str, r: str, c: str = "0") -> tuple[str, str]:
        """Row (r, c) of the register tile scanned as row t of the i loop, and whether it exists:
        i = (q * rtile + r) * rstride + p * ctile + c for t = q * (rstride / ctile) + p."""
        m = self.m
        S, R, C = m.rstride, m.rtile, m.ctile
        P = S // C
        first = f"(({t}) / {P} * {R} + {r})"
        return f"({first} * {S} + ({t}) % {P} * {C} + {c})", f"({t} < {m.tile_rows} && {first} < {m.M // S})"

    def sharing(self, k: int, read: int) -> tuple[bool, bool]:
        """Whether read `read` of statement k is shared along the tile's r rows and its c rows."""
        m, r = self.m, self.g.statements[k].reads[read]
        if not r.memory:
            return False, False
        return bool(m.rshared) and m.rshared[k][read], bool(m.cshared) and m.cshared[k][read]

    # -- loads and bodies ---------------------------------------------------------------------
    def body_lines(
        self, k: int, vec_slot: str | None, vregs: dict | None = None, expr=None, given: dict[int, str] | None = None
    ) -> tuple[list[str], str]:
        """The C lines of statement k's body (or of `expr`, another expression over its reads: a
        scatter's index) at the current (i, j) and the name of its value; `given`: nodes whose
        values are already held (ExprRenderer)."""
        s = self.g.statements[k]
        lines: list[str] = []

        def load(read: int, index: str | None = None) -> str:
            r = s.reads[read]
            if r.indirect is not None:  # a gather: the loaded index, wrapped if negative, clamped
                n = r.indirect.extent
                if n == 0:  # nothing to clamp to: no load (frontend/gather.py refuses a non-empty index)
                    return f"(({r.tensor.dtype.compute})0)"
                q = f"((long long)({index}) + ((long long)({index}) < 0 ? {n}LL : 0LL))"
                q = f"({q} < 0LL ? 0LL : ({q} >= {n}LL ? {n - 1}LL : {q}))"
                return f"pn_ld(&{self.in_name[r.tensor.uid]}[({self.address(r.addr)}) + {q} * {r.indirect.stride}LL])"
            if r.tensor.uid in self.regs:
                return self.regs[r.tensor.uid]
            if not r.memory:  # iota: the index itself
                return f"((long long)({self.address(r.addr)}))"
            if vregs is not None and (k, read) in vregs and vec_slot is not None:  # loaded before
                return f"{vregs[(k, read)]}[{vec_slot}]"
            return f"pn_ld(&{self.in_name[r.tensor.uid]}[{self.address(r.addr)}])"

        value = ExprRenderer(lines, f"e{k}_" if expr is None else f"x{k}_", given).render(
            s.body if expr is None else expr, load
        )
        return lines, value

    def scatter_store(self, k: int, value: str, vec_slot: str | None, vregs: dict) -> list[str]:
        """An indirect write (poly/statement.py `scatter`): the row id computed, then one atomic
        add at `write + id * stride` when the id is in [0, extent) (nothing otherwise)."""
        s = self.g.statements[k]
        lines, q = self.body_lines(k, vec_slot, vregs, expr=s.scatter_index)
        n, stride = s.scatter.extent, s.scatter.stride
        target = f"&out{k}[({self.address(s.write)}) + pn_q{k} * {stride}LL]"
        add = (
            f"atomicAdd(reinterpret_cast<unsigned long long*>({target}), (unsigned long long)({value}))"
            if s.result.dtype.name == "int64"
            else f"atomicAdd({target}, {value})"
        )
        return lines + [
            f"{{ const long long pn_q{k} = (long long)({q}); if (pn_q{k} >= 0LL && pn_q{k} < {n}LL) {add}; }}"
        ]

    def vector_loads(
        self, here: list[int], sharing: tuple[bool, bool] | None = None
    ) -> tuple[list[str], list[str], dict]:
        """One vector register per distinct contiguous read of the statements `here`: statements
        fused horizontally over one input share its load. Returns (declarations, loads, the
        register of each (statement, read)). `sharing`: only the reads a register tile shares
        so (`ThreadLoop.sharing`)."""
        decl, loads, vregs, by_access = [], [], {}, {}
        for k in here:
            for ri, r in enumerate(self.g.statements[k].reads):
                if self.m.access[k][ri] != AccessKind.CONTIG or r.tensor.uid in self.regs:
                    continue  # not contiguous, or a stitched value already in registers
                if sharing is not None and self.sharing(k, ri) != sharing:
                    continue
                key = (r.tensor.uid, self.address(r.addr))
                if (k, ri) in self.kept:  # on chip: pass 0 loads the vector there, later passes read it
                    vregs[(k, ri)] = self.kept[(k, ri)]
                    if (k, ri) in self.kept_loads and key not in by_access:
                        by_access[key] = self.kept[(k, ri)]
                        loads.append(f"pn_ldv(&{self.in_name[r.tensor.uid]}[{key[1]}], {self.kept[(k, ri)]});")
                    continue
                if key not in by_access:
                    by_access[key] = name = f"pn_v{k}_{ri}"
                    decl.append(f"{r.tensor.dtype.compute} {name}[{self.m.vec}];")
                    src = self.staged.get((k, ri), f"&{self.in_name[r.tensor.uid]}[{key[1]}]")
                    loads.append(self._held(r.tensor.uid, name, f"pn_ldv({src}, {name});"))
                vregs[(k, ri)] = by_access[key]
        return decl, loads, vregs

    def _held(self, uid: int, name: str, load: str) -> str:
        """Vector `name`'s `load`, with a held tensor's copy in shared memory (`held`): stored
        after the load (the columns' pass) or read instead of it (the consumers')."""
        if uid not in self.held:
            return load
        at, V = f"{self.held[uid]}[{self.held_at} + pn_h]", self.m.vec
        if self.held_store:
            return f"{load} if ({self.held_if}) for (int pn_h = 0; pn_h < {V}; ++pn_h) {at} = {name}[pn_h];"
        return f"if ({self.held_if}) {{ for (int pn_h = 0; pn_h < {V}; ++pn_h) {name}[pn_h] = {at}; }} else {load}"

    def iteration(self, call: isl.AstExpr, here: list[int]) -> list[str]:
        """One instance of the isl loop nest for the statements `here`: the contiguous reads
        loaded as vectors, then per vector lane each body, accumulated (reductions) or stored."""
        if self.m.rtile * self.m.ctile > 1:
            return self.tile_iteration(call, here)
        return self.iteration_at(islast.expr(call.get_op_arg(1)), islast.expr(call.get_op_arg(2)), here)

    def iteration_at(self, a0: str, a1: str, here: list[int]) -> list[str]:
        """`iteration` at the canonical loop indices a0, a1 (C expressions)."""
        g, V = self.g, self.m.vec
        col = g.form in (Form.COLUMN, Form.MAP)  # the vector runs along i instead of j
        first = "i" if col else "j"
        fixed = f"const pn_idx j = {a1};" if col else f"const pn_idx i = {a0};"
        out = ["{", f"  {fixed} const pn_idx pn_first = ({a0 if col else a1}) * {V};"]
        vregs = {}
        if V > 1:  # registers for the contiguous reads, loaded as one vector each
            decl, loads, vregs = self.vector_loads(here)
            out += ["  " + ln for ln in decl]
            if loads:
                out += [f"  {{ const pn_idx {first} = pn_first;"] + ["    " + ln for ln in loads] + ["  }"]
        out.append(f"  for (int v = 0; v < {V}; ++v) {{" if V > 1 else "  {")
        out.append(f"    const pn_idx {first} = pn_first{' + v' if V > 1 else ''};")
        for k in here:
            s = g.statements[k]
            if g.accumulator_of[k] != k:
                continue  # its owner accumulates the same values
            body, val = self.body_lines(k, "v" if V > 1 else None, vregs)
            out += ["    " + ln for ln in body]
            if s.kind == StatementKind.REDUCE:
                acc = f"acc{k}[v]" if g.form == Form.COLUMN and V > 1 else f"acc{k}"
                acc = self.accs.get(k, acc)
                out.append(f"    {acc} = {s.combiner.functor}::apply({acc}, {accumuland(s, val)});")
            elif s.scatter is not None:
                value = convert(val, s.body.dtype, s.result.dtype)
                out += ["    " + ln for ln in self.scatter_store(k, value, "v" if V > 1 else None, vregs)]
            else:
                value = convert(val, s.body.dtype, s.result.dtype)
                out.append(f"    pn_st(&out{k}[{self.address(s.write)}], {value});")
        return out + ["  }", "}"]

    def tile_iteration(self, call: isl.AstExpr, here: list[int]) -> list[str]:
        """One step of a register tile (ROW/ALL, schedule/rtile.py): each read is loaded once per
        row it is not shared along, at the first row it serves (the same address at the others:
        isl's `shared_along_rows`): shared both ways once, along r once per c, along c once per
        r, else per row; vectors for the contiguous reads, per lane for the others. Then per row
        (unrolled, its accumulators in registers) the bodies."""
        g, m, V = self.g, self.m, self.m.vec
        R, C = m.rtile, m.ctile
        t, a1 = islast.expr(call.get_op_arg(1)), islast.expr(call.get_op_arg(2))
        out = ["{", f"  const pn_idx pn_t = {t}; const pn_idx pn_first = ({a1}) * {V};"]
        regs: dict = {}

        def stage(sharing: tuple[bool, bool], copies: str | None, row: str | None, pad: str) -> list[str]:
            """Loads of the reads shared as `sharing`, at row `row`, into registers indexed
            by `copies` (None: one copy)."""
            decl, loads, vregs = self.vector_loads(here, sharing) if V > 1 else ([], [], {})
            scalar = [
                (k, ri)
                for k in here
                for ri in range(len(g.statements[k].reads))
                if g.accumulator_of[k] == k
                and m.access[k][ri] != AccessKind.CONTIG
                and g.statements[k].reads[ri].memory
                and g.statements[k].reads[ri].tensor.uid not in self.regs  # a stitched value: registers
                and g.statements[k].reads[ri].indirect is None
                and self.sharing(k, ri) == sharing
                and (k, ri) not in vregs
            ]
            n = {None: "", "pn_c": f"[{C}]", "pn_r": ""}[copies]
            lines = [ln.replace("[", f"{n}[", 1) for ln in decl]
            for k, ri in scalar:
                lines.append(f"{g.statements[k].reads[ri].tensor.dtype.compute} pn_s{k}_{ri}{n}[{V}];")
                vregs[(k, ri)] = f"pn_s{k}_{ri}"
            index = "[pn_c]" if copies == "pn_c" else ""
            for key, name in vregs.items():
                regs[key] = name + index
            body = []
            if loads:
                body += ["  { const pn_idx j = pn_first;"]
                body += ["    " + ln for ln in loads]
                body += ["  }"]
                if index:  # the vector lands in this copy's registers
                    body = [ln.rstrip() for ln in body]
                    body = [_index_target(ln, index) for ln in body]
            if scalar:
                body.append(f"  for (int v = 0; v < {V}; ++v) {{ const pn_idx j = pn_first + v;")
                for k, ri in scalar:
                    r = g.statements[k].reads[ri]
                    addr = f"&{self.in_name[r.tensor.uid]}[{self.address(r.addr)}]"
                    body.append(f"    pn_s{k}_{ri}{index}[v] = pn_ld({addr});")
                body.append("  }")
            if not body:
                return [pad + ln for ln in lines]
            if copies == "pn_c":
                head = ["#pragma unroll", f"for (int pn_c = 0; pn_c < {C}; ++pn_c) {{ const pn_idx i = {row};"]
            else:  # row None: the row's own i, already in scope
                head = ["{" if row is None else f"{{ const pn_idx i = {row};"]
            return [pad + ln for ln in lines + head + body + ["}"]]

        row00, _ = self.tile_row("pn_t", "0", "0")
        out += stage((True, True), None, row00, "  ")
        out += stage((True, False), "pn_c", self.tile_row("pn_t", "0", "pn_c")[0], "  ")
        row_r0, valid = self.tile_row("pn_t", "pn_r", "0")
        out += ["#pragma unroll", f"  for (int pn_r = 0; pn_r < {R}; ++pn_r) if ({valid}) {{"]
        out += stage((False, True), "pn_r", row_r0, "    ")
        row, _ = self.tile_row("pn_t", "pn_r", "pn_c")
        out += ["#pragma unroll", f"    for (int pn_c = 0; pn_c < {C}; ++pn_c) {{", f"      const pn_idx i = {row};"]
        out.append(f"      const int pn_v = pn_r * {C} + pn_c;  // the row's registers (stitched values)")
        out += stage((False, False), "pn_r", None, "      ")
        out.append(f"      for (int v = 0; v < {V}; ++v) {{" if V > 1 else "      {")
        out.append(f"        const pn_idx j = pn_first{' + v' if V > 1 else ''};")
        for k in here:
            s = g.statements[k]
            if g.accumulator_of[k] != k:
                continue
            body, val = self.body_lines(k, "v" if V > 1 else "0", regs)
            out += ["        " + ln for ln in body]
            if s.kind == StatementKind.REDUCE:
                acc = f"acc{k}[pn_v]"
                out.append(f"        {acc} = {s.combiner.functor}::apply({acc}, {accumuland(s, val)});")
            else:
                value = convert(val, s.body.dtype, s.result.dtype)
                out.append(f"        pn_st(&out{k}[{self.address(s.write)}], {value});")
        return out + ["      }", "    }", "  }", "}"]


def _index_target(line: str, index: str) -> str:
    """`pn_ldv(&a[...], pn_vK_R);` -> `pn_ldv(&a[...], pn_vK_R[pn_c]);`"""
    if "pn_ldv(" not in line:
        return line
    head, _, reg = line.rpartition(", ")
    return f"{head}, {reg[:-2]}{index});"


def accumuland(s: Statement, val: str) -> str:
    """The value one iteration contributes to the accumulator, in the accumulator's type."""
    if s.combiner.truthiness:  # numpy.all/any fold bool(x)
        val = convert(val, s.body.dtype, bool_)
    elif s.body.dtype != s.acc:
        val = convert(val, s.body.dtype, s.acc)
    return f"({s.acc.compute})({val})"
