"""One kernel group + its mapping → CUDA C source and the buffers and launches it needs.

The loop nest of each thread comes from isl's AST generator: the statement domain is
intersected with the thread's share of the iterations (block and thread ids are isl parameters,
see schedule/mapping.py) and isl scans what remains; the reduction epilogue (warp shuffles,
shared memory, one atomic per block per output) follows from header.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import islpy as isl
import numpy as np

from ..dtypes import DType, bool_, float32
from ..poly.program import KernelGroup
from ..poly.statement import Statement
from ..schedule.mapping import Mapping, access_kind
from . import islast
from .expr import ExprRenderer, convert, literal


@dataclass(frozen=True)
class BufferSpec:
    key: str  # "in:<uid>", "out:<uid>", "ws:<stmt>", "cnt:<kernel>"
    ctype: str  # C storage type
    dtype: DType | None  # None for counters (uint32)
    size: int
    role: str  # input / output / workspace / counter


@dataclass(frozen=True)
class Fill:
    buffer: str
    ctype: str  # the buffer's C type
    value: object  # the value, as a Python scalar (recorded in the plan)
    c_value: str  # the value as a C expression


@dataclass(frozen=True)
class InitKernel:
    """A kernel that fills buffers with values in one launch: the identities of atomic outputs
    and workspaces, zeroed counters, or the result of an empty reduction."""

    name: str
    fills: tuple[Fill, ...]
    source: str

    @property
    def signature(self) -> list[str]:
        return [f"{f.ctype}*" for f in self.fills]


@dataclass(frozen=True)
class RenderedKernel:
    name: str
    source: str
    params: tuple[BufferSpec, ...]
    fills: tuple[Fill, ...]  # the resident workspaces and counters, initialised once
    modes: tuple[str, ...]  # per statement: store / atomic_ws / partials
    init: InitKernel | None = None  # the kernel that performs `fills` in one launch (first call only)

    @property
    def signature(self) -> list[str]:
        return [f"{'const ' if p.role == 'input' else ''}{p.ctype}*" for p in self.params]


def _mode(st: Statement, m: Mapping, deterministic: bool) -> str:
    """store: one block per output. atomic_ws: blocks merge atomically into a resident workspace
    that the last block turns into the output and resets to the identity. partials: blocks write
    their partials, the last block combines them in a fixed order (deterministic)."""
    if m.split == 1 or st.kind == "map":
        return "store"
    if deterministic or st.combiner.struct:  # no atomic merges a struct accumulator
        return "partials"
    return "atomic_ws"


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


def index_type(group: KernelGroup) -> str:
    sizes = [group.M * group.N] + [r.tensor.size for s in group.statements for r in s.reads if r.memory]
    sizes += [s.result.size for s in group.statements]
    return "int" if max(sizes) < 2**31 - 1 else "long long"


def render_kernel(name: str, group: KernelGroup, m: Mapping, deterministic: bool = False) -> RenderedKernel:
    stmts = group.statements
    modes = tuple(_mode(s, m, deterministic) for s in stmts)
    idx = index_type(group)
    # Parameters: every tensor read, then per statement its output and workspace, then counters.
    inputs, params = [], []
    members = {s.result.uid for s in stmts} if group.stitched else set()
    for s in stmts:
        for r in s.reads:
            if r.tensor.uid in members or not r.memory:  # registers (stitched) or an index (iota)
                continue
            if all(r.tensor is not t for t in inputs):  # identity: Tensor == builds a comparison
                inputs.append(r.tensor)
    for t in inputs:  # a result of an earlier kernel is read from that kernel's output buffer
        key = f"in:{t.uid}" if t.op == "placeholder" else f"out:{t.uid}"
        params.append(BufferSpec(key, t.dtype.c_type, t.dtype, t.size, "input"))
    in_name = {t.uid: f"in{k}" for k, t in enumerate(inputs)}
    fills: list[Fill] = []
    for k, (s, mode) in enumerate(zip(stmts, modes)):
        out = s.result
        if group.stitched and s.kind == "reduce" and out.uid not in group.external:
            continue  # stays on chip
        params.append(BufferSpec(f"out:{out.uid}", out.dtype.c_type, out.dtype, out.size, "output"))
        ident = s.combiner.identity(s.acc) if s.combiner else None
        if mode in ("atomic_ws", "partials"):
            size = s.M * (m.split if mode == "partials" else 1)
            params.append(BufferSpec(f"ws:{name}:{k}", s.acc.c_type, s.acc, size, "workspace"))
            if mode == "atomic_ws":
                fills.append(Fill(f"ws:{name}:{k}", s.acc.c_type, ident, identity_expr(s)))
    needs_last = any(md in ("atomic_ws", "partials") for md in modes)
    if needs_last:
        params.append(BufferSpec(f"cnt:{name}", "unsigned", None, m.grid[0], "counter"))
        fills.append(Fill(f"cnt:{name}", "unsigned", 0, "0u"))

    sig = []
    for p in params:
        pname = _param_name(p, in_name, stmts)
        const = "const " if p.role == "input" else ""
        sig.append(f"{const}{p.ctype}* __restrict__ {pname}")
    # At least 1024 resident threads per SM: ptxas may use 64 registers per thread (without a
    # minimum it sometimes caps at 32 and spills the unrolled loop's vectors).
    bounds = f"{m.threads}, {max(1, 1024 // m.threads)}"
    lines = [f'extern "C" __global__ void __launch_bounds__({bounds}) {name}({", ".join(sig)}) {{']
    lines.append(f"  typedef {idx} pn_idx;")
    lines.append("  const pn_idx bx = blockIdx.x, by = blockIdx.y, tx = threadIdx.x, ty = threadIdx.y;")
    body = _Body(group, m, in_name, idx)
    if group.form == "MAP":
        lines += body.map_kernel()
    elif group.stitched:
        lines += body.stitched_kernel()
    else:
        lines += body.reduce_kernel(modes)
    lines.append("}")
    init = render_init(f"{name}_init", fills, {p.key: p for p in params}) if fills else None
    return RenderedKernel(name, "\n".join(lines), tuple(params), tuple(fills), modes, init)


def render_empty(name: str, group: KernelGroup, specs: dict) -> InitKernel:
    """The results of reductions over nothing: the identity (sum 0, prod 1, all True), NaN for a
    mean or variance, as numpy."""
    fills = []
    for s in group.statements:
        res = s.result
        value = math.nan if res.attr("mean") or s.combiner.struct else s.combiner.identity(s.acc)
        value = np.array(value).astype(res.dtype.np).item()
        if res.dtype.is_16bit_float:  # a float value converted to 16 bits in the kernel
            fn = "__float2half_rn" if res.dtype.name == "float16" else "__float2bfloat16_rn"
            c_value = f"{fn}({literal(value, float32)})"
        else:
            c_value = literal(value, res.dtype)
        fills.append(Fill(f"out:{res.uid}", res.dtype.c_type, value, c_value))
    return render_init(name, fills, specs)


def render_init(name: str, fills: list[Fill], specs: dict) -> InitKernel:
    """One kernel that writes every fill's value over its whole buffer."""
    sig = ", ".join(f"{specs[f.buffer].ctype}* __restrict__ b{k}" for k, f in enumerate(fills))
    lines = [
        f'extern "C" __global__ void {name}({sig}) {{',
        "  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
        "  const long long stride = (long long)gridDim.x * blockDim.x;",
    ]
    for k, f in enumerate(fills):
        lines.append(f"  for (long long e = t; e < {specs[f.buffer].size}LL; e += stride) b{k}[e] = {f.c_value};")
    return InitKernel(name, tuple(fills), "\n".join(lines + ["}"]))


def _param_name(p: BufferSpec, in_name, stmts) -> str:
    kind, _, rest = p.key.partition(":")
    if p.role == "input":
        return in_name[int(rest)]
    if kind == "out":
        return f"out{[s.result.uid for s in stmts].index(int(rest))}"
    if kind == "ws":
        return f"ws{rest.rsplit(':', 1)[1]}"
    return "pn_counter"


class _Body:
    def __init__(self, group: KernelGroup, m: Mapping, in_name, idx: str):
        self.g, self.m, self.in_name, self.idx = group, m, in_name, idx
        self.ctx = group.statements[0].domain.get_ctx()
        self.regs: dict[int, str] = {}  # stitched results available in registers, by tensor uid

    # -- isl: the loop nest of one thread ---------------------------------------------------
    def loops(self, user) -> list[str]:
        """The thread's loop nest: the statement domain intersected with the iterations the task
        mappings give to (bx, by, tx, ty), with isl parameters for those indices."""
        m, g = self.m, self.g
        outer, inner = m.loops
        ext = {
            "ROW": (g.M, g.N // m.vec),
            "ALL": (g.M, g.N // m.vec),
            "COLUMN": (g.M // m.vec, g.N),
            "MAP": (g.M // m.vec, 1),
        }
        e0, e1 = ext[g.form]
        tasks = m.tasks
        serial_names = sorted({n for t in tasks.values() for n, _ in t.factors if n.startswith("k")})
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
        return islast.node(ast, user, self.idx, 1, self.m.unroll)

    def address(self, addr: isl.PwAff) -> str:
        dom = self.g.statements[0].domain.reset_tuple_id()
        return islast.expr(isl.AstBuild.from_context(dom).expr_from_pw_aff(addr.gist(dom)))

    # -- loads --------------------------------------------------------------------------------
    def _body_lines(
        self, stmt_idx: int, s: Statement, vec_slot: str | None, kinds, vregs: dict | None = None
    ) -> tuple[list[str], str]:
        lines: list[str] = []

        def load(read: int) -> str:
            r = s.reads[read]
            if r.tensor.uid in self.regs:
                return self.regs[r.tensor.uid]
            if not r.memory:  # iota: the index itself
                return f"((long long)({self.address(r.addr)}))"
            if kinds[read] == "contig" and vec_slot is not None:
                return f"{vregs[(stmt_idx, read)]}[{vec_slot}]"
            return f"pn_ld(&{self.in_name[r.tensor.uid]}[{self.address(r.addr)}])"

        value = ExprRenderer(lines, f"e{stmt_idx}_").render(s.body, load)
        return lines, value

    def _vector_loads(self, here: list[int], kinds) -> tuple[list[str], list[str], dict]:
        """One vector register per distinct contiguous read of the statements `here`: statements
        fused horizontally over one input share its load. Returns (declarations, loads, the
        register of each (statement, read))."""
        decl, loads, vregs, by_access = [], [], {}, {}
        for k in here:
            for ri, r in enumerate(self.g.statements[k].reads):
                if kinds[k][ri] != "contig":
                    continue
                key = (r.tensor.uid, self.address(r.addr))
                if key not in by_access:
                    by_access[key] = name = f"pn_v{k}_{ri}"
                    decl.append(f"{r.tensor.dtype.compute} {name}[{self.m.vec}];")
                    loads.append(f"pn_ldv(&{self.in_name[r.tensor.uid]}[{key[1]}], {name});")
                vregs[(k, ri)] = by_access[key]
        return decl, loads, vregs

    # -- kernels ------------------------------------------------------------------------------
    def map_kernel(self) -> list[str]:
        """Element-wise statements: each thread takes `vec` consecutive elements per step (one
        vector load per contiguous input), grid-stride over the rest."""
        g, V = self.g, self.m.vec
        kinds = [[access_kind(r, "i", V, s.domain) for r in s.reads] for s in g.statements]
        return self.loops(lambda call: self._iteration(call, list(range(len(g.statements))), kinds))

    def reduce_kernel(self, modes) -> list[str]:
        g, m = self.g, self.m
        col = g.form == "COLUMN"
        V = m.vec
        kinds = [[access_kind(r, "i" if col else "j", V, s.domain) for r in s.reads] for s in g.statements]
        lines = []
        for k, s in enumerate(g.statements):
            if col and V > 1:
                lines.append(f"  {s.acc.compute} acc{k}[{V}];")
                lines.append(f"  for (int v = 0; v < {V}; ++v) acc{k}[v] = {identity_expr(s)};")
            else:
                lines.append(f"  {s.acc.compute} acc{k} = {identity_expr(s)};")
        everything = list(range(len(g.statements)))
        lines += self.loops(lambda call: self._iteration(call, everything, kinds))
        lines += self._epilogue(modes)
        return lines

    def stitched_kernel(self) -> list[str]:
        """Reductions and their consumers over whole rows: one pass over the row per level."""
        from ..poly.stitch import is_epilogue, levels

        g, m = self.g, self.m
        V = m.vec
        level = levels(g.statements)
        epilogues = [k for k, s in enumerate(g.statements) if is_epilogue(s)]
        passes = max(level[s.name] for s in g.statements if not is_epilogue(s)) + 1
        kinds = [[access_kind(r, "j", V, s.domain) for r in s.reads] for s in g.statements]
        out = [f"  const pn_idx o = bx * {m.ty} + ty;  // the row this thread works on"]
        for ct in dict.fromkeys(s.acc.compute for s in g.statements if s.kind == "reduce"):
            safe = c_ident(ct)
            out.append(f"  __shared__ {ct} pn_smem_{safe}[{m.ty * max(1, m.tx // 32)}];")
            out.append(f"  __shared__ {ct} pn_bcast_{safe}[{m.ty}];")
        for lv in range(passes):
            here = [k for k, s in enumerate(g.statements) if level[s.name] == lv and k not in epilogues]
            out.append(f"  // pass {lv}: " + ", ".join(g.statements[k].name for k in here))
            for k in here:
                s = g.statements[k]
                if s.kind == "reduce":
                    out.append(f"  {s.acc.compute} acc{k} = {identity_expr(s)};")
            out += self.loops(lambda call, here=here: self._iteration(call, here, kinds))
            for k in here:
                s = g.statements[k]
                if s.kind != "reduce":
                    continue
                safe = c_ident(s.acc.compute)
                tmpl = f"<{s.combiner.functor}, {m.tx}, {m.ty}>"
                out.append(f"  acc{k} = pn_allreduce_x{tmpl}(acc{k}, pn_smem_{safe}, pn_bcast_{safe});")
                reg = f"r{k}"
                final = convert(self._post(s, f"acc{k}"), post_dtype(s), s.result.dtype)
                out.append(f"  const {s.result.dtype.compute} {reg} = {final};")
                self.regs[s.result.uid] = reg
                if s.result.uid in g.external:
                    out.append(f"  if (tx == 0 && o < {g.M}) pn_st(&out{k}[o], {reg});")
            for k in epilogues:  # the row's leader, once every value the epilogue reads is final
                s = g.statements[k]
                if level[s.name] != lv + 1:
                    continue
                body, val = self._body_lines(k, s, None, ["gather"] * len(s.reads))
                out.append(f"  if (tx == 0 && o < {g.M}) {{")
                out.append("    const pn_idx i = o; const pn_idx j = 0;")
                out += ["    " + ln for ln in body]
                out.append(
                    f"    pn_st(&out{k}[{self.address(s.write)}], {convert(val, s.body.dtype, s.result.dtype)});"
                )
                out.append("  }")
        return out

    def _iteration(self, call: isl.AstExpr, here: list[int], kinds) -> list[str]:
        """One instance of the isl loop nest for the statements `here`: the contiguous reads
        loaded as vectors, then per vector lane each body, accumulated (reductions) or stored."""
        g, V = self.g, self.m.vec
        col = g.form in ("COLUMN", "MAP")  # the vector runs along i instead of j
        a0, a1 = islast.expr(call.get_op_arg(1)), islast.expr(call.get_op_arg(2))
        first = "i" if col else "j"
        fixed = f"const pn_idx j = {a1};" if col else f"const pn_idx i = {a0};"
        out = ["{", f"  {fixed} const pn_idx pn_first = ({a0 if col else a1}) * {V};"]
        vregs = {}
        if V > 1:  # registers for the contiguous reads, loaded as one vector each
            decl, loads, vregs = self._vector_loads(here, kinds)
            out += ["  " + ln for ln in decl]
            if loads:
                out += [f"  {{ const pn_idx {first} = pn_first;"] + ["    " + ln for ln in loads] + ["  }"]
        out.append(f"  for (int v = 0; v < {V}; ++v) {{" if V > 1 else "  {")
        out.append(f"    const pn_idx {first} = pn_first{' + v' if V > 1 else ''};")
        for k in here:
            s = g.statements[k]
            body, val = self._body_lines(k, s, "v" if V > 1 else None, kinds[k], vregs)
            out += ["    " + ln for ln in body]
            if s.kind == "reduce":
                acc = f"acc{k}[v]" if col and V > 1 else f"acc{k}"
                out.append(f"    {acc} = {s.combiner.functor}::apply({acc}, {self._accumuland(s, val)});")
            else:
                value = convert(val, s.body.dtype, s.result.dtype)
                out.append(f"    pn_st(&out{k}[{self.address(s.write)}], {value});")
        return out + ["  }", "}"]

    def _accumuland(self, s: Statement, val: str) -> str:
        if s.combiner.name in ("all", "any"):  # truthiness, as numpy.all/any
            val = convert(val, s.body.dtype, bool_)
        elif s.body.dtype != s.acc:
            val = convert(val, s.body.dtype, s.acc)
        return f"({s.acc.compute})({val})"

    def _epilogue(self, modes) -> list[str]:
        g, m = self.g, self.m
        col = g.form == "COLUMN"
        V = m.vec if col else 1
        out = []
        size = m.tx * m.ty if col else m.ty * max(1, m.tx // 32)
        for ct in dict.fromkeys(s.acc.compute for s in g.statements):
            safe = c_ident(ct)
            out.append(f"  __shared__ {ct} pn_smem_{safe}[{size}];")
        for k, s in enumerate(g.statements):
            safe = c_ident(s.acc.compute)
            fn = "pn_reduce_y" if col else "pn_reduce_x"
            tmpl = f"<{s.combiner.functor}, {m.tx}, {m.ty}>"
            if col and V > 1:
                out.append(f"  for (int v = 0; v < {V}; ++v) acc{k}[v] = {fn}{tmpl}(acc{k}[v], pn_smem_{safe});")
            else:
                out.append(f"  acc{k} = {fn}{tmpl}(acc{k}, pn_smem_{safe});")
        out += self._per_output(lambda k, s, o, a: self._write(k, s, o, a, modes[k]))
        if any(md in ("atomic_ws", "partials") for md in modes):
            out += [
                "  __threadfence();",
                "  __syncthreads();",
                "  __shared__ int pn_is_last;",
                "  if (tx == 0 && ty == 0) pn_is_last = atomicAdd(&pn_counter[bx], 1u) == gridDim.y - 1;",
                "  __syncthreads();",
                "  if (pn_is_last) {",
                "    __threadfence();",
            ]
            out += ["  " + ln for ln in self._per_output(lambda k, s, o, a: self._final(k, s, o, modes[k]))]
            out.append("    if (tx == 0 && ty == 0) pn_counter[bx] = 0u;  // resident: ready for the next call")
            out.append("  }")
        return out

    def _per_output(self, emit) -> list[str]:
        g, m = self.g, self.m
        out = []
        if g.form == "COLUMN":
            V = m.vec
            out.append(f"  if (ty == 0) for (int v = 0; v < {V}; ++v) {{")
            out.append(f"    const pn_idx o = (bx * {m.tx} + tx) * {V} + v;")
            out.append(f"    if (o < {g.M}) {{")
            for k, s in enumerate(g.statements):
                out += ["      " + ln for ln in emit(k, s, "o", f"acc{k}[v]" if V > 1 else f"acc{k}")]
            out += ["    }", "  }"]
        else:
            out.append(f"  const pn_idx o = bx * {m.ty} + ty;")
            out.append(f"  if (tx == 0 && o < {g.M}) {{")
            for k, s in enumerate(g.statements):
                out += ["    " + ln for ln in emit(k, s, "o", f"acc{k}")]
            out.append("  }")
        return out

    def _post(self, s: Statement, a: str) -> str:
        """The reduction's value from its accumulator, in the dtype `post_dtype(s)`."""
        if s.post:
            if s.post[0] == "var":
                return f"pn_welford_var({a}, {int(s.post[1])})"
            if s.post[0] == "argindex":  # the index packed in an argmax/argmin key
                index = f"pn_argindex_{s.post[1]}({a})"
                return f"({int(s.post[2])}LL - {index})" if s.post[2] >= 0 else index
            return f"({a}).{s.post[0]}"  # a field: mean of Welford, m or s of online softmax
        if s.mean_count:
            return f"({a} / ({s.acc.compute}){literal(s.mean_count, s.acc)})"
        return a

    def _write(self, k: int, s: Statement, o: str, a: str, mode: str) -> list[str]:
        if mode == "store":
            return [f"pn_st(&out{k}[{o}], {self._post(s, a)});"]
        if mode == "atomic_ws":
            return [f"pn_atomic({s.combiner.functor}(), &ws{k}[{o}], {a});"]
        return [f"ws{k}[(pn_idx)by * {s.M} + {o}] = {a};"]

    def _final(self, k: int, s: Statement, o: str, mode: str) -> list[str]:
        if mode == "atomic_ws":  # the output, then the workspace back to the identity for the next call
            return [
                f"pn_st(&out{k}[{o}], {self._post(s, f'pn_ldcg(&ws{k}[{o}])')});",
                f"ws{k}[{o}] = {identity_expr(s)};",
            ]
        if mode == "partials":  # a fixed order of the partials: bit-identical results
            return [
                "{",
                f"  {s.acc.compute} a = {identity_expr(s)};",
                f"  for (pn_idx s = 0; s < (pn_idx)gridDim.y; ++s) a = {s.combiner.functor}::apply(a, pn_ldcg(&ws{k}[s * {s.M} + {o}]));",
                f"  pn_st(&out{k}[{o}], {self._post(s, 'a')});",
                "}",
            ]
        return []
