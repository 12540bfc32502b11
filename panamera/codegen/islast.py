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


def node(n: isl.AstNode, user: Callable[[isl.AstExpr], list[str]], idx_t: str, indent: int = 1) -> list[str]:
    """C lines for an AST node; `user` renders a statement instance (a call expression)."""
    pad = "  " * indent
    t = n.get_type()
    if t == isl.ast_node_type.block:
        out = []
        for c in n.block_get_children():
            out += node(c, user, idx_t, indent)
        return out
    if t == isl.ast_node_type.for_:
        it = expr(n.for_get_iterator())
        head = f"{pad}for ({idx_t} {it} = {expr(n.for_get_init())}; {expr(n.for_get_cond())}; {it} += {expr(n.for_get_inc())}) {{"
        return [head] + node(n.for_get_body(), user, idx_t, indent + 1) + [f"{pad}}}"]
    if t == isl.ast_node_type.if_:
        out = [f"{pad}if ({expr(n.if_get_cond())}) {{"] + node(n.if_get_then_node(), user, idx_t, indent + 1)
        if n.if_has_else_node():
            out += [f"{pad}}} else {{"] + node(n.if_get_else_node(), user, idx_t, indent + 1)
        return out + [f"{pad}}}"]
    if t == isl.ast_node_type.user:
        return [pad + line for line in user(n.user_get_expr())]
    if t == isl.ast_node_type.mark:
        return node(n.mark_get_node(), user, idx_t, indent)
    raise NotImplementedError(f"isl AST node {t}")
