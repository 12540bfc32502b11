"""isl AST → CUDA C: a walker over islpy AST nodes and expressions."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import islpy as isl

_BIN = {
    isl.ast_expr_op_type.and_: "&&",
    isl.ast_expr_op_type.and_then: "&&",
    isl.ast_expr_op_type.or_: "||",
    isl.ast_expr_op_type.or_else: "||",
    isl.ast_expr_op_type.add: "+",
    isl.ast_expr_op_type.sub: "-",
    isl.ast_expr_op_type.mul: "*",
    isl.ast_expr_op_type.div: "/",
    isl.ast_expr_op_type.pdiv_q: "/",
    isl.ast_expr_op_type.pdiv_r: "%",
    isl.ast_expr_op_type.zdiv_r: "%",
    isl.ast_expr_op_type.eq: "==",
    isl.ast_expr_op_type.le: "<=",
    isl.ast_expr_op_type.lt: "<",
    isl.ast_expr_op_type.ge: ">=",
    isl.ast_expr_op_type.gt: ">",
}


def expr(e: isl.AstExpr) -> str:
    t = e.get_type()
    if t == isl.ast_expr_type.id:
        return e.get_id().get_name()
    if t == isl.ast_expr_type.int:
        v = e.get_val().to_python()
        return f"{v}" if abs(v) < 2**31 else f"{v}LL"
    op = e.get_op_type()
    args = [expr(e.get_op_arg(k)) for k in range(e.get_op_n_arg())]
    if op in _BIN:
        return f"({args[0]} {_BIN[op]} {args[1]})"
    if op == isl.ast_expr_op_type.minus:
        return f"(-{args[0]})"
    if op == isl.ast_expr_op_type.max:
        return _fold("pn_imax", args)
    if op == isl.ast_expr_op_type.min:
        return _fold("pn_imin", args)
    if op == isl.ast_expr_op_type.fdiv_q:  # floor division; the divisor is a positive constant
        return f"pn_floordiv({args[0]}, {args[1]})"
    if op in (isl.ast_expr_op_type.cond, isl.ast_expr_op_type.select):
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if op == isl.ast_expr_op_type.call:
        return f"{args[0]}({', '.join(args[1:])})"
    raise NotImplementedError(f"isl AST operation {op}")


def magnitude(e: isl.AstExpr, ranges: dict[str, tuple[int, int]]) -> int:
    """The largest absolute value any subexpression of `e` takes while each identifier stays in
    its closed range (interval arithmetic over the tree `expr` renders): what decides whether
    `int` indices suffice. isl's quasi-affine forms can hold terms far larger than the value,
    e.g. `(32767 * i + 32767) / 32768` for a pulled-back `i / 32768`.

    >>> i, c = isl.AstExpr.from_id(isl.Id("i")), lambda v: isl.AstExpr.from_val(isl.Val(v))
    >>> e = i.mul(c(32767)).add(c(32767)).pdiv_q(c(32768))
    >>> expr(e), magnitude(e, {"i": (0, 327679)})
    ('(((i * 32767) + 32767) / 32768)', 10737090560)
    >>> magnitude(i.pdiv_q(c(14336)).mul(c(4096)), {"i": (0, 1835008)})  # a quotient by a constant shrinks
    1835008
    """
    return _interval(e, ranges)[2]


_QUOTIENTS = (
    isl.ast_expr_op_type.div,
    isl.ast_expr_op_type.fdiv_q,
    isl.ast_expr_op_type.pdiv_q,
)


def _interval(e: isl.AstExpr, ranges) -> tuple[int, int, int]:
    """(low, high, the largest |value| of any subexpression) of `e` (see magnitude)."""
    t = e.get_type()
    if t == isl.ast_expr_type.id:
        lo, hi = ranges[e.get_id().get_name()]
        return lo, hi, max(abs(lo), abs(hi))
    if t == isl.ast_expr_type.int:
        v = e.get_val().to_python()
        return v, v, abs(v)
    op = e.get_op_type()
    args = [_interval(e.get_op_arg(k), ranges) for k in range(e.get_op_n_arg())]
    inner = max((a[2] for a in args), default=0)
    if op in (isl.ast_expr_op_type.add, isl.ast_expr_op_type.sub, isl.ast_expr_op_type.mul):
        (a0, a1, _), (b0, b1, _) = args
        if op == isl.ast_expr_op_type.add:
            lo, hi = a0 + b0, a1 + b1
        elif op == isl.ast_expr_op_type.sub:
            lo, hi = a0 - b1, a1 - b0
        else:
            ps = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
            lo, hi = min(ps), max(ps)
    elif op == isl.ast_expr_op_type.minus:
        lo, hi = -args[0][1], -args[0][0]
    elif op in (isl.ast_expr_op_type.pdiv_r, isl.ast_expr_op_type.zdiv_r):
        d = max(abs(args[1][0]), abs(args[1][1]))
        lo, hi = -d, d
    elif op in (isl.ast_expr_op_type.max, isl.ast_expr_op_type.min, isl.ast_expr_op_type.cond,
                isl.ast_expr_op_type.select):  # fmt: skip
        vals = args if op in (isl.ast_expr_op_type.max, isl.ast_expr_op_type.min) else args[1:]
        lo, hi = min(a[0] for a in vals), max(a[1] for a in vals)
    elif op in _QUOTIENTS and args[1][0] == args[1][1] and args[1][0] > 0:  # by a positive constant c:
        c = args[1][0]  # between floor(lo / c) and ceil(hi / c), however it rounds
        lo, hi = args[0][0] // c, -(-args[0][1] // c)
    else:  # other divisions (no larger than the dividend), comparisons, calls
        lo, hi = -inner, inner
    return lo, hi, max(inner, abs(lo), abs(hi))


def _fold(fn: str, args: list[str]) -> str:
    out = args[0]
    for a in args[1:]:
        out = f"{fn}({out}, {a})"
    return out


HELPERS = r"""
__device__ __forceinline__ long long pn_imax(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ long long pn_imin(long long a, long long b) { return a < b ? a : b; }
__device__ __forceinline__ long long pn_floordiv(long long a, long long b) { return (a >= 0 ? a : a - b + 1) / b; }
"""


def _has_loop(n: isl.AstNode) -> bool:
    t = n.get_type()
    if t == isl.ast_node_type.for_:
        return True
    if t == isl.ast_node_type.block:
        return any(_has_loop(c) for c in n.block_get_children())
    if t == isl.ast_node_type.if_:
        return _has_loop(n.if_get_then_node()) or (n.if_has_else_node() and _has_loop(n.if_get_else_node()))
    if t == isl.ast_node_type.mark:
        return _has_loop(n.mark_get_node())
    return False


def _unrolled(n: isl.AstNode, user, idx_t: str, indent: int, unroll: int) -> list[str] | None:
    """An innermost loop `for (it = a; it <= b; it += s) body` as `unroll` unguarded copies of the
    body per step, then the remainder. The copies have no branch between them, so the compiler
    issues their loads back to back: `unroll` loads in flight per thread (checked in the SASS of
    sm_90: four LDG.E.128 before the first add). None when the loop has another shape."""
    cond = n.for_get_cond()
    if cond.get_type() != isl.ast_expr_type.op or cond.get_op_type() not in (
        isl.ast_expr_op_type.le,
        isl.ast_expr_op_type.lt,
    ):
        return None
    it = expr(n.for_get_iterator())
    if expr(cond.get_op_arg(0)) != it:
        return None
    pad, cmp = "  " * indent, "<=" if cond.get_op_type() == isl.ast_expr_op_type.le else "<"
    inc, end, u = expr(n.for_get_inc()), f"pn_end_{it}", f"pn_u_{it}"
    body = node(n.for_get_body(), user, idx_t, indent + 2)
    out = [
        f"{pad}{{",
        f"{pad}  const {idx_t} {end} = {expr(cond.get_op_arg(1))};",
        f"{pad}  {idx_t} {u} = {expr(n.for_get_init())};",
    ]
    out.append(f"{pad}  for (; {u} + {unroll - 1} * ({inc}) {cmp} {end}; {u} += {unroll} * ({inc})) {{")
    for k in range(unroll):
        out += (
            [f"{pad}    {{ const {idx_t} {it} = {u} + {k} * ({inc});"] + ["  " + ln for ln in body] + [f"{pad}    }}"]
        )
    out.append(f"{pad}  }}")
    out.append(f"{pad}  for (; {u} {cmp} {end}; {u} += {inc}) {{ const {idx_t} {it} = {u};")
    out += body + [f"{pad}  }}", f"{pad}}}"]
    return out


def node(
    n: isl.AstNode,
    user: Callable[[isl.AstExpr], list[str]],
    idx_t: str,
    indent: int = 1,
    unroll: int = 1,
    pragmas: Sequence[str] = (),
    depth: int = 0,
) -> list[str]:
    """C lines for an AST node; `user` renders a statement instance (a call expression).
    Innermost loops are unrolled `unroll` times (see _unrolled). `pragmas[d]` (when not empty)
    is printed before each `for` at loop depth d (the CPU target's `#pragma omp ...`); `depth` is
    the loop depth of `n`.

    >>> ast = isl.AstBuild.alloc(isl.DEFAULT_CONTEXT).node_from_schedule_map(
    ...     isl.UnionMap("{ S[i] -> [i] : 0 <= i < 8 }"))
    >>> print("\\n".join(node(ast, lambda c: ["f();"], "int", 0, pragmas=["#pragma omp simd"])))
    #pragma omp simd
    for (int c0 = 0; (c0 <= 7); c0 += 1) {
      f();
    }
    """
    pad = "  " * indent
    t = n.get_type()
    if t == isl.ast_node_type.block:
        out = []
        for c in n.block_get_children():
            out += node(c, user, idx_t, indent, unroll, pragmas, depth)
        return out
    if t == isl.ast_node_type.for_:
        pre = [pad + pragmas[depth]] if depth < len(pragmas) and pragmas[depth] else []
        if unroll > 1 and not _has_loop(n.for_get_body()):
            lines = _unrolled(n, user, idx_t, indent, unroll)
            if lines is not None:
                return pre + lines
        it = expr(n.for_get_iterator())
        head = f"{pad}for ({idx_t} {it} = {expr(n.for_get_init())}; {expr(n.for_get_cond())}; {it} += {expr(n.for_get_inc())}) {{"
        body = node(n.for_get_body(), user, idx_t, indent + 1, unroll, pragmas, depth + 1)
        return pre + [head] + body + [f"{pad}}}"]
    if t == isl.ast_node_type.if_:
        then = node(n.if_get_then_node(), user, idx_t, indent + 1, unroll, pragmas, depth)
        out = [f"{pad}if ({expr(n.if_get_cond())}) {{"] + then
        if n.if_has_else_node():
            out += [f"{pad}}} else {{"] + node(n.if_get_else_node(), user, idx_t, indent + 1, unroll, pragmas, depth)
        return out + [f"{pad}}}"]
    if t == isl.ast_node_type.user:
        return [pad + line for line in user(n.user_get_expr())]
    if t == isl.ast_node_type.mark:
        return node(n.mark_get_node(), user, idx_t, indent, unroll, pragmas, depth)
    raise NotImplementedError(f"isl AST node {t}")
