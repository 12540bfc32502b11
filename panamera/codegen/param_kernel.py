"""Kernels whose extents are kernel arguments (issue 22): one source per size class.

A parametric statement (poly/params.py) under its class decision (schedule/param_mapping.py)
becomes one CUDA C kernel whose extents are `long long` arguments: the canonical extents
`pn_M`, `pn_N` and every symbol `pn_s_<name>` (addresses use the symbolic strides). The thread's
loop nest is isl's AST of the statement domain with those parameters, intersected with the
iterations the block and thread own, so tails are handled for any size; vectors are loaded only
where the class proves the contiguous extent a multiple of the width (precondition 3 of
poly/params.py), which also keeps every vector load aligned.

The reduction epilogue is the static kernels' (codegen/header.py): warp shuffles and shared
memory across the block, then per output a store (no split), one atomic per block into a
resident workspace (ATOMIC_WS), or the block's partial (PARTIALS); with a split, the last block
(counter + __threadfence) stores the final value and resets the workspace and counter.

>>> import panamera as pn
>>> from panamera.poly.params import build
>>> from panamera.schedule.param_mapping import ParamDecision
>>> from panamera.schedule.decision import MergeMode
>>> p = build((pn.sum(pn.placeholder(("B", 64), name="x"), axis=1),))
>>> k = render(p.statements[0], ParamDecision("S0", "ROW", 32, 4, 1, 4, MergeMode.STORE), p, "pn_d0", "int")
>>> "long long pn_M" in k.source, [a.key for a in k.args][-3:]
(True, ['pn_M', 'pn_N', 'pn_s_B'])
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from ..frontend.symbolic import Dim, prod
from ..poly.params import ParamProgram, PRead, PStatement
from ..poly.statement import Form, StatementKind
from ..schedule.decision import MergeMode
from ..schedule.derived import workspace_dtype
from ..schedule.param_mapping import ParamDecision
from . import islast
from .expr import ExprRenderer, convert
from .reduce_kernel import (
    fold_partials,
    last_block_close,
    last_block_open,
    merge_write,
    merged_value,
    workspace_identity,
)
from .thread_loop import accumuland, c_ident, identity_expr, post, post_dtype


@dataclass(frozen=True)
class KernelArg:
    """One parameter: a buffer ("in:NAME" of an input, "out:S" of a statement's result,
    "ws:S" workspace, "cnt:S" counter) or a scalar ("pn_M", "pn_N", "pn_s_B")."""

    key: str
    ctype: str  # the C parameter type
    buffer: bool


@dataclass(frozen=True)
class ParamKernel:
    name: str
    statement: str
    source: str
    args: tuple[KernelArg, ...]

    @property
    def signature(self) -> tuple[str, ...]:
        return tuple(a.ctype for a in self.args)


def c_extent(e) -> str:
    """An extent as a C expression of the symbol arguments: 4096*B*S -> (4096LL * pn_s_B * pn_s_S)."""
    if isinstance(e, Dim):
        return "(" + " * ".join(([f"{e.coef}LL"] if e.coef != 1 else []) + [f"pn_s_{n}" for n in e.syms]) + ")"
    return f"{int(e)}LL"


def c_strides(shape) -> list:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc = s * acc if isinstance(s, Dim) else acc * s
    return out[::-1]


def _is_one(e) -> bool:
    return isinstance(e, int) and e == 1


def part(s: PStatement, r: PRead, group: tuple[int, ...], idx: str) -> tuple[str, object | None]:
    """The part of read r's address owed to the canonical index `idx` (linear over `group`, C
    order), and its coefficient where the part is `idx * coefficient` (else None)."""
    strides = dict(zip(r.axes, c_strides_of(r)))
    eff = [a for a in group if not _is_one(s.shape[a])]
    varying = [a for a in eff if a in strides]
    if not varying:
        return "0", 0

    def inner(a):
        return prod(s.shape[b] for b in group if b > a)

    c = strides[varying[-1]]  # C order within the varying axes: stride(a) = c * their extents after a
    consistent = all(strides[a] == prod(s.shape[b] for b in varying if b > a) * c for a in varying)
    if consistent and varying == eff:
        return f"({idx}) * {c_extent(c)}", c
    if consistent and varying == eff[len(eff) - len(varying) :]:  # a suffix: idx modulo its extent
        return f"(({idx}) % {c_extent(prod(s.shape[a] for a in varying))}) * {c_extent(c)}", None
    if consistent and varying == eff[: len(varying)]:  # a prefix: idx divided by the rest
        return f"(({idx}) / {c_extent(inner(varying[-1]))}) * {c_extent(c)}", None
    terms = [f"((({idx}) / {c_extent(inner(a))}) % {c_extent(s.shape[a])}) * {c_extent(strides[a])}" for a in varying]
    return "(" + " + ".join(terms) + ")", None


def c_strides_of(r: PRead) -> list:
    """The strides of the read's varying axes in its view (C order, extent-1 axes dropped)."""
    full = c_strides(r.shape)
    return [st for st, e in zip(full, r.shape) if not _is_one(e)]


def address(s: PStatement, r: PRead) -> tuple[str, object | None, object | None]:
    """The C address of read r at the canonical (i, j), and the coefficients of i and j."""
    pi, ci = part(s, r, s.i_axes, "i")
    pj, cj = part(s, r, s.j_axes, "j")
    return f"({pi} + {pj})", ci, cj


def vector_read(s: PStatement, r: PRead, vec: int) -> bool:
    """Whether read r is one vector load per lane group: contiguous along the vector (the
    coefficient of the vector's index is 1) and the other index's coefficient a multiple of
    the width (the class proved the contiguous extent a multiple of `vec`; the statement's
    own full reads have exactly that coefficient)."""
    if vec == 1:
        return False
    _, ci, cj = address(s, r)
    along, other = (cj, ci) if s.form in (Form.ROW, Form.ALL) else (ci, cj)
    lead = s.N if s.form in (Form.ROW, Form.ALL) else s.M
    return along == 1 and (other == 0 or other == lead)


def render(
    s: PStatement,
    d: ParamDecision,
    program: ParamProgram,
    name: str,
    idx: str,
    epilogue: PStatement | None = None,
    siblings: tuple[PStatement, ...] = (),
) -> ParamKernel:
    """The CUDA C of statement `s` under decision `d`; `idx` is the C index type of the class.
    `epilogue`: a MAP over the reduction's result evaluated wherever an output becomes final
    (poly/param_stitch.py), its result stored too."""
    members = [s, *siblings] + ([epilogue] if epilogue is not None else [])
    own = {m.result.uid for m in members}
    inputs = list(dict.fromkeys(r.tensor.uid for m in members for r in m.reads if r.tensor.uid not in own))
    dtype_of = {r.tensor.uid: r.tensor.dtype for m in members for r in m.reads}
    bufs = [(KernelArg(f"t:{u}", f"const {dtype_of[u].c_type}*", True), f"in{k}") for k, u in enumerate(inputs)]
    bufs.append((KernelArg(f"t:{s.result.uid}", f"{s.result.dtype.c_type}*", True), "out"))
    for k, sib in enumerate(siblings):
        bufs.append((KernelArg(f"t:{sib.result.uid}", f"{sib.result.dtype.c_type}*", True), f"out_s{k}"))
    if epilogue is not None:
        bufs.append((KernelArg(f"t:{epilogue.result.uid}", f"{epilogue.result.dtype.c_type}*", True), "out_e"))
    if d.merge != MergeMode.STORE:
        bufs += [
            (KernelArg(f"ws:{s.name}", f"{workspace_dtype(s, d.merge).c_type}*", True), "ws"),
            (KernelArg(f"cnt:{s.name}", "unsigned*", True), "cnt"),
        ]
    scalars = [KernelArg("pn_M", "long long", False), KernelArg("pn_N", "long long", False)]
    scalars += [KernelArg(f"pn_s_{n}", "long long", False) for n in program.parameters]
    args = [a for a, _ in bufs] + scalars
    params = [f"{a.ctype} __restrict__ {alias}" for a, alias in bufs] + [f"{a.ctype} {a.key}" for a in scalars]
    names = {u: f"in{k}" for k, u in enumerate(inputs)}
    lines = [
        f'extern "C" __global__ void __launch_bounds__({d.threads}) {name}({", ".join(params)}) {{',
        f"  typedef {idx} pn_idx;",
        "  const pn_idx bx = blockIdx.x, by = blockIdx.y, tx = threadIdx.x, ty = threadIdx.y;",
        "  (void)bx; (void)by; (void)tx; (void)ty; (void)pn_M; (void)pn_N;",
    ]
    lines += [f"  (void)pn_s_{n};" for n in program.parameters]
    body = _Body(s, d, names)
    body.siblings = [(sib, f"out_s{k}") for k, sib in enumerate(siblings)]
    if epilogue is not None:
        one = ParamDecision(d.statement, d.form, d.tx, d.ty, d.split, 1, d.merge)
        body.epilogue = _Body(epilogue, one, names, {s.result.uid: "pn_fin"})
    if s.kind == StatementKind.MAP:
        lines += body.loops(body.map_iteration)
    else:
        lines += body.reduce()
    lines.append("}")
    name_of = "+".join(m.name for m in members)
    return ParamKernel(name, name_of, "\n".join(lines), tuple(args))


def finish(s: PStatement, a: str) -> str:
    """The stored value of accumulator `a`: the combiner's finish, a mean divided by the bound extent."""
    v = post(s, a)
    return f"({v} / ({s.acc.compute})pn_N)" if s.mean else v


class _Body:
    """One statement's loop nest and iterations; `regs` holds the values already in registers
    (a stitched group's finished reductions, by tensor uid)."""

    def __init__(self, s: PStatement, d: ParamDecision, names: dict[int, str], regs: dict[int, str] | None = None):
        self.s, self.d, self.names, self.regs = s, d, names, regs or {}
        self.epilogue: _Body | None = None  # an epilogue MAP at each final output (render's `epilogue`)
        self.siblings: list[tuple[PStatement, str]] = []  # reductions sharing the accumulator, their outputs

    def store(self, o: str, a: str) -> list[str]:
        """Output o of accumulator value `a`: its finish stored (and the siblings' finishes), and
        the epilogue evaluated at o with it in a register."""
        s = self.s
        final = finish(s, a)
        if self.siblings:
            shared = [f"const {s.acc.compute} pn_a = {a};"]
            out = [f"pn_st(&out[{o}], {finish(s, 'pn_a')});"]
            out += [f"pn_st(&{alias}[{o}], {finish(sib, 'pn_a')});" for sib, alias in self.siblings]
            return ["{", *shared, *out, "}"]
        if self.epilogue is None:
            return [f"pn_st(&out[{o}], {final});"]
        e = self.epilogue.s
        reg = f"const {s.result.dtype.compute} pn_fin = {convert(final, post_dtype(s), s.result.dtype)};"

        def put(val):
            return [f"pn_st(&out_e[i], {convert(val, e.body.dtype, e.result.dtype)});"]

        return (
            ["{", reg, f"pn_st(&out[{o}], pn_fin);"]
            + self.epilogue.lanes("const pn_idx j = 0; (void)j;", o, "i", put)
            + ["}"]
        )

    # -- isl: the thread's loop nest over the parametric domain ---------------------------------
    def loops(self, user) -> list[str]:
        s, d = self.s, self.d
        V, TX, TY, SPLIT = d.vec, d.tx, d.ty, d.split  # noqa: N806
        m = "pn_M" if isinstance(s.M, Dim) else str(s.M)
        n = "pn_N" if isinstance(s.N, Dim) else str(s.N)
        hw = "[pn_M, pn_N, bx, by, tx, ty]"
        if s.form == Form.MAP:
            text = f"{hw} -> {{ S[c] : c = {TX}*bx + tx and c >= 0 and {V}*c < {m} }}"
        elif s.form == Form.COLUMN:
            text = (f"{hw} -> {{ S[c, j] : c = {TX}*bx + tx and c >= 0 and {V}*c < {m} and 0 <= j < {n} and "
                    f"exists q : j = {SPLIT * TY}*q + {TY}*by + ty }}")  # fmt: skip
        else:
            text = (f"{hw} -> {{ S[i, c] : i = {TY}*bx + ty and 0 <= i < {m} and c >= 0 and {V}*c < {n} and "
                    f"exists q : c = {SPLIT * TX}*q + {TX}*by + tx }}")  # fmt: skip
        ctx = isl.DEFAULT_CONTEXT
        dom = isl.Set.read_from_str(ctx, text)
        context = isl.Set.read_from_str(
            ctx,
            f"{hw} -> {{ : 0 <= tx < {TX} and 0 <= ty < {TY} and 0 <= by < {SPLIT} and bx >= 0 and pn_M >= 0 and pn_N >= 0 }}",
        )
        sched = isl.Map.identity(dom.space.map_from_set()).intersect_domain(dom)
        ast = isl.AstBuild.from_context(context).node_from_schedule_map(isl.UnionMap.from_map(sched))
        return islast.node(ast, user, "pn_idx", 1, d.unroll)  # unguarded copies: loads in flight

    # -- one iteration: loads and the body per vector lane -------------------------------------
    def lanes(self, fixed: str, first: str, lane_index: str, emit) -> list[str]:
        """`fixed` declares the index the vector does not run along; lane v is `first * V + v`."""
        s, V = self.s, self.d.vec
        out = ["{", f"  {fixed} const pn_idx pn_first = ({first}) * {V};"]
        vregs = {}
        for k, r in enumerate(s.reads):
            if r.tensor.uid not in self.regs and vector_read(s, r, V):
                key = (r.tensor.uid, address(s, r)[0])  # one register per tensor and address
                if key not in vregs:
                    reg = f"pn_v{k}"
                    out.append(f"  {r.tensor.dtype.compute} {reg}[{V}];")
                    src = f"&{self.names[r.tensor.uid]}[{key[1]}]"
                    out.append(f"  {{ const pn_idx {lane_index} = pn_first; pn_ldv({src}, {reg}); }}")
                    vregs[key] = reg
        out.append(f"  for (int v = 0; v < {V}; ++v) {{" if V > 1 else "  {")
        out.append(f"    const pn_idx {lane_index} = pn_first{' + v' if V > 1 else ''};")
        lines: list[str] = []

        def load(read: int) -> str:
            r = s.reads[read]
            if r.tensor.uid in self.regs:
                return self.regs[r.tensor.uid]
            key = (r.tensor.uid, address(s, r)[0])
            if key in vregs:
                return f"{vregs[key]}[v]"
            return f"pn_ld(&{self.names[r.tensor.uid]}[{key[1]}])"

        val = ExprRenderer(lines, f"e{s.name}_").render(s.body, load)
        out += ["    " + ln for ln in lines] + ["    " + ln for ln in emit(val)]
        return out + ["  }", "}"]

    def map_iteration(self, call) -> list[str]:
        s = self.s
        c = islast.expr(call.get_op_arg(1))
        value = lambda val: [f"pn_st(&out[i], {convert(val, s.body.dtype, s.result.dtype)});"]  # noqa: E731
        return self.lanes("const pn_idx j = 0; (void)j;", c, "i", value)

    def reduce(self) -> list[str]:
        s, d = self.s, self.d
        col = s.form == Form.COLUMN
        V, TX, TY = d.vec, d.tx, d.ty  # noqa: N806
        acc_t = s.acc.compute
        out = []
        if col and V > 1:
            out += [f"  {acc_t} acc[{V}];", f"  for (int v = 0; v < {V}; ++v) acc[v] = {identity_expr(s)};"]
        else:
            out.append(f"  {acc_t} acc = {identity_expr(s)};")
        target = "acc[v]" if col and V > 1 else "acc"
        fold = lambda val: [f"{target} = {s.combiner.functor}::apply({target}, {accumuland(s, val)});"]  # noqa: E731

        def iteration(call):
            a0, a1 = islast.expr(call.get_op_arg(1)), islast.expr(call.get_op_arg(2))
            if col:
                return self.lanes(f"const pn_idx j = {a1};", a0, "i", fold)
            return self.lanes(f"const pn_idx i = {a0};", a1, "j", fold)

        out += self.loops(iteration)
        smem = f"pn_smem_{c_ident(acc_t)}"
        size = TX * TY if col else TY * max(1, TX // 32)
        out.append(f"  __shared__ {acc_t} {smem}[{size}];")
        fn, tmpl = ("pn_reduce_y" if col else "pn_reduce_x"), f"<{s.combiner.functor}, {TX}, {TY}>"
        if col and V > 1:
            out.append(f"  for (int v = 0; v < {V}; ++v) acc[v] = {fn}{tmpl}(acc[v], {smem});")
        else:
            out.append(f"  acc = {fn}{tmpl}(acc, {smem});")
        if d.atomic_vec > 1:  # the thread's adjacent outputs in one float2/float4 atomicAdd (M % vec == 0)
            out.append(f"  {{ const pn_idx o = (bx * {d.tx} + tx) * {V};")
            out.append("    if (ty == 0 && o < pn_M) pn_atomic_v(&ws[o], acc); }")
        else:
            out += self.outputs(lambda o, a: self.merge(o, a), inside_only=True)
        if d.merge != MergeMode.STORE:  # the static kernels' last block (codegen/reduce_kernel.py)
            out += last_block_open("cnt[bx]", "(pn_idx)gridDim.y")
            if d.merge == MergeMode.ATOMIC_WS:
                out += ["  " + ln for ln in self.outputs(self.final_from_workspace, inside_only=True)]
            else:
                out += ["  " + ln for ln in self.combine_partials(smem, fn, tmpl)]
            out += last_block_close("cnt[bx]")
        return out

    def outputs(self, emit, inside_only: bool) -> list[str]:
        """`emit(o, accumulator)` for every output this thread holds (the leader of its row or column)."""
        s, d = self.s, self.d
        if s.form == Form.COLUMN:
            V = d.vec  # noqa: N806
            lane = "[v]" if V > 1 else ""
            head = [f"  if (ty == 0) for (int v = 0; v < {V}; ++v) {{",
                    f"    const pn_idx o = (bx * {d.tx} + tx) * {V} + v;", "    if (o < pn_M) {"]  # fmt: skip
            return head + ["      " + ln for ln in emit("o", f"acc{lane}")] + ["    }", "  }"]
        head = [f"  {{ const pn_idx o = bx * {d.ty} + ty;", f"  if (tx == 0 && o < {c_m(s)}) {{"]
        return head + ["    " + ln for ln in emit("o", "acc")] + ["  } }"]

    def merge(self, o: str, a: str) -> list[str]:
        s, d = self.s, self.d
        if d.merge == MergeMode.STORE:
            return self.store(o, a)
        return merge_write(s, "ws", o, a, d.merge, "pn_M")

    def final_from_workspace(self, o: str, a: str) -> list[str]:
        s = self.s
        return self.store(o, merged_value(s, f"pn_ldcg(&ws[{o}])")) + [f"ws[{o}] = {workspace_identity(s)};"]

    def combine_partials(self, smem: str, fn: str, tmpl: str) -> list[str]:
        """The last block's combine of the partials: the static kernels' fold (codegen/reduce_kernel.py
        `fold_partials`), COLUMN partials split-major down the ty threads, the others along tx."""
        s, d = self.s, self.d
        n = "(pn_idx)gridDim.y"
        if s.form == Form.COLUMN:
            V = d.vec  # noqa: N806
            fold = fold_partials(s, "p", "o < pn_M", "ty", n, f"b += {d.ty}", "ws[b * pn_M + o]", fn + tmpl, smem)
            head = [f"for (int v = 0; v < {V}; ++v) {{", f"  const pn_idx o = (bx * {d.tx} + tx) * {V} + v;"]
            leader = "  if (ty == 0 && o < pn_M) {"
        else:
            m = c_m(s)
            fold = fold_partials(s, "p", f"o < {m}", "tx", n, f"b += {d.tx}", f"ws[o * {n} + b]", fn + tmpl, smem)
            head, leader = ["{", f"  const pn_idx o = bx * {d.ty} + ty;"], f"  if (tx == 0 && o < {m}) {{"
        return [*head, *fold, leader, *["    " + ln for ln in self.store("o", "p")], "  }", "}"]


def c_m(s: PStatement) -> str:
    return "pn_M" if isinstance(s.M, Dim) else str(s.M)
