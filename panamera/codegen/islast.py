"""isl AST → CUDA C: a walker over islpy AST nodes and expressions."""

from __future__ import annotations

from collections.abc import Callable

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


_COMPARE = frozenset(
    {isl.ast_expr_op_type.and_, isl.ast_expr_op_type.and_then, isl.ast_expr_op_type.or_,
     isl.ast_expr_op_type.or_else, isl.ast_expr_op_type.eq, isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt,
     isl.ast_expr_op_type.ge, isl.ast_expr_op_type.gt}
)  # fmt: skip
_QUOTIENT = frozenset({isl.ast_expr_op_type.div, isl.ast_expr_op_type.pdiv_q, isl.ast_expr_op_type.fdiv_q})
_REMAINDER = frozenset({isl.ast_expr_op_type.pdiv_r, isl.ast_expr_op_type.zdiv_r})


def widest(e: isl.AstExpr, ranges: dict[str, tuple[int, int]], hi: int) -> int:
    """The largest magnitude any subexpression of `e` (as `expr` prints it) can take when each
    identifier lies in its `ranges` entry, any other in [0, hi]: interval arithmetic over the tree. isl's quasi-affine expressions
    multiply by large coefficients before they divide (`(29507 * i + ...) / 96`), so an index
    within int can have intermediate values that overflow it (kernel.py's index_type). An
    operation it does not know counts as unbounded.

    >>> i = isl.AstExpr.from_id(isl.Id("i"))
    >>> widest(i.mul(isl.AstExpr.from_val(isl.Val(1000))).pdiv_q(isl.AstExpr.from_val(isl.Val(7))), {"i": (0, 9)}, 99)
    9000
    """
    return _interval(e, ranges, hi)[2]


def _interval(e: isl.AstExpr, ranges: dict[str, tuple[int, int]], hi: int) -> tuple[int, int, int]:
    """(low, high, widest magnitude within) of `e`."""
    t = e.get_type()
    if t == isl.ast_expr_type.id:
        lo, up = ranges.get(e.get_id().get_name(), (0, hi))
        return lo, up, max(abs(lo), abs(up))
    if t == isl.ast_expr_type.int:
        v = e.get_val().to_python()
        return v, v, abs(v)
    op = e.get_op_type()
    args = [_interval(e.get_op_arg(k), ranges, hi) for k in range(e.get_op_n_arg())]
    inner = max((a[2] for a in args), default=0)
    if op in _COMPARE:
        lo, up = 0, 1
    elif op == isl.ast_expr_op_type.add:
        lo, up = args[0][0] + args[1][0], args[0][1] + args[1][1]
    elif op == isl.ast_expr_op_type.sub:
        lo, up = args[0][0] - args[1][1], args[0][1] - args[1][0]
    elif op == isl.ast_expr_op_type.minus:
        lo, up = -args[0][1], -args[0][0]
    elif op == isl.ast_expr_op_type.mul:
        ends = [a * b for a in args[0][:2] for b in args[1][:2]]
        lo, up = min(ends), max(ends)
    elif op in _QUOTIENT and args[1][0] == args[1][1] > 0:  # by a positive constant
        d = args[1][0]
        lo, up = args[0][0] // d, -(-args[0][1] // d)
    elif op in _REMAINDER and args[1][0] == args[1][1] != 0:
        d = abs(args[1][0])
        lo, up = (0 if args[0][0] >= 0 else 1 - d), d - 1
    elif op in (isl.ast_expr_op_type.max, isl.ast_expr_op_type.min):
        pick = max if op == isl.ast_expr_op_type.max else min
        lo, up = pick(a[0] for a in args), pick(a[1] for a in args)
    elif op in (isl.ast_expr_op_type.cond, isl.ast_expr_op_type.select):
        lo, up = min(args[1][0], args[2][0]), max(args[1][1], args[2][1])
    else:  # a call, or a division by a non-constant: unbounded
        return -(2**63), 2**63, 2**63
    return lo, up, max(inner, abs(lo), abs(up))


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
    n: isl.AstNode, user: Callable[[isl.AstExpr], list[str]], idx_t: str, indent: int = 1, unroll: int = 1
) -> list[str]:
    """C lines for an AST node; `user` renders a statement instance (a call expression).
    Innermost loops are unrolled `unroll` times (see _unrolled)."""
    pad = "  " * indent
    t = n.get_type()
    if t == isl.ast_node_type.block:
        out = []
        for c in n.block_get_children():
            out += node(c, user, idx_t, indent, unroll)
        return out
    if t == isl.ast_node_type.for_:
        if unroll > 1 and not _has_loop(n.for_get_body()):
            lines = _unrolled(n, user, idx_t, indent, unroll)
            if lines is not None:
                return lines
        it = expr(n.for_get_iterator())
        head = f"{pad}for ({idx_t} {it} = {expr(n.for_get_init())}; {expr(n.for_get_cond())}; {it} += {expr(n.for_get_inc())}) {{"
        return [head] + node(n.for_get_body(), user, idx_t, indent + 1, unroll) + [f"{pad}}}"]
    if t == isl.ast_node_type.if_:
        out = [f"{pad}if ({expr(n.if_get_cond())}) {{"] + node(n.if_get_then_node(), user, idx_t, indent + 1, unroll)
        if n.if_has_else_node():
            out += [f"{pad}}} else {{"] + node(n.if_get_else_node(), user, idx_t, indent + 1, unroll)
        return out + [f"{pad}}}"]
    if t == isl.ast_node_type.user:
        return [pad + line for line in user(n.user_get_expr())]
    if t == isl.ast_node_type.mark:
        return node(n.mark_get_node(), user, idx_t, indent, unroll)
    raise NotImplementedError(f"isl AST node {t}")
