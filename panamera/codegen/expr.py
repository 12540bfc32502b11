"""Scalar expressions (poly/expr.py) rendered as C, in the register types of dtypes.py."""

from __future__ import annotations

import math

import numpy as np

from ..dtypes import DType, promote
from ..frontend.walk import postorder
from ..poly.expr import Expr
from ..schedule.cpu_exp_range import ExpRange

_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_MATH = {op: op for op in ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "floor", "ceil")}
_LOGICAL = {"and": "&", "or": "|", "xor": "^"}
_BITWISE = {"bitand": "&", "bitor": "|", "bitxor": "^", "shr": ">>", "shl": "<<"}
_WRAP8 = {"int8": "signed char", "uint8": "unsigned char"}  # 8-bit values wrap as numpy's


def literal(value, d: DType) -> str:
    if d.name == "bool":
        return "1" if bool(value) else "0"
    if not d.is_float:
        v = int(value)
        return f"{v}LL" if d.name == "int64" else str(v)
    v = float(np.asarray(value).astype(d.np)) if d.is_16bit_float else float(value)
    f = "F" if d.compute == "float" else "D"
    if math.isnan(v):
        return f"PN_NAN_{f}"
    if math.isinf(v):
        return f"PN_INF_{f}" if v > 0 else f"(-PN_INF_{f})"
    text = repr(float(np.float32(v))) if d.compute == "float" else repr(v)
    return f"{text}f" if d.compute == "float" else text


def convert(x: str, src: DType, dst: DType) -> str:
    """C expression converting a register value of dtype `src` to dtype `dst` (numpy astype)."""
    if src == dst:
        return x
    if dst.name == "bool":
        return f"(({x}) != 0)"
    if dst.name == "float16":
        return f"pn_round_half((float)({x}))"
    if dst.name == "bfloat16":
        return f"pn_round_bf16((float)({x}))"
    if dst.name in _WRAP8:
        return f"((int)({_WRAP8[dst.name]})({x}))"
    return f"(({dst.compute})({x}))"


def _round(x: str, d: DType) -> str:
    if d.name == "float16":
        return f"pn_round_half({x})"
    if d.name == "bfloat16":
        return f"pn_round_bf16({x})"
    if d.name in _WRAP8:
        return f"((int)({_WRAP8[d.name]})({x}))"
    return x


# sin and cos (ONNX Sin/Cos); fmod (C's, the sign of the dividend) and mod (numpy's, the sign of the divisor).
_MATH.update(sin="sin", cos="cos")


def _mod(x: list[str], d: DType, c_fmod: bool) -> str:
    """numpy.fmod (C's) or numpy.mod (Python's: the result takes the divisor's sign); an integer
    divisor 0 gives 0, as numpy, and so does -1 (every remainder by -1 is 0, and C's
    INT_MIN % -1 overflows: SIGFPE on x86)."""
    if d.is_float:
        f = f"fmod{'f' if d.compute == 'float' else ''}"
        r = f"{f}({x[0]}, {x[1]})"
        if c_fmod:
            return _round(r, d)
        return _round(f"pn_mod_fix({r}, {x[1]})", d)
    if d.name == "bool":
        return f"({x[0]} & 0)"
    r = f"(({x[1]} == 0 || {x[1]} == -1) ? ({d.compute})0 : {x[0]} % {x[1]})"
    return r if c_fmod else f"pn_mod_fix({r}, {x[1]})"


class ExprRenderer:
    """Emits one `const` register per expression node (SSA), each node once; `given` maps nodes
    (by id) to C expressions that already hold their values (their subtrees are not rendered)."""

    def __init__(self, lines: list[str], prefix: str, given: dict[int, str] | None = None):
        self.lines, self.prefix, self.names = lines, prefix, dict(given or {})

    def render(self, e: Expr, load) -> str:
        for n in postorder([e], lambda x: () if id(x) in self.names else x.args):
            if id(n) not in self.names:
                name = f"{self.prefix}{len(self.names)}"
                self.lines.append(f"const {n.dtype.compute} {name} = {self._value(n, load)};")
                self.names[id(n)] = name
        return self.names[id(e)]

    def _value(self, n: Expr, load) -> str:
        a = [self.names[id(x)] for x in n.args]
        d = n.dtype
        if n.op == "const":
            return literal(n.value, d)
        if n.op == "load":  # a gather's load has one argument: the index it loaded
            return load(n.read, *a)
        if n.op == "cast":
            return convert(a[0], n.args[0].dtype, d)
        if n.op in _CMP:
            p = promote(n.args[0].dtype, n.args[1].dtype)
            x, y = (convert(v, s.dtype, p) for v, s in zip(a, n.args))
            return f"(({x} {_CMP[n.op]} {y}) ? 1 : 0)"
        x = [convert(v, s.dtype, d) for v, s in zip(a, n.args)] if n.op != "where" else a
        if n.op in _ARITH:
            if d.name == "bool":
                return f"({x[0]} | {x[1]})" if n.op == "add" else f"({x[0]} & {x[1]})"
            return _round(f"({x[0]} {_ARITH[n.op]} {x[1]})", d)
        if n.op in _BITWISE:
            return _round(f"({x[0]} {_BITWISE[n.op]} {x[1]})", d)
        if n.op in _LOGICAL:
            return f"({x[0]} {_LOGICAL[n.op]} {x[1]})"
        if n.op == "trunc_div":  # x / 0 is 0; x / -1 negates with wrap-around (INT_MIN / -1 traps in C)
            neg = f"({d.compute})(0ULL - (unsigned long long){x[0]})"
            return f"({x[1]} == 0 ? ({d.compute})0 : {x[1]} == -1 ? {neg} : {x[0]} / {x[1]})"
        if n.op == "pow":
            return _round(f"pn_pow({x[0]}, {x[1]})", d)
        if n.op in ("fmod", "mod"):
            return _mod(x, d, n.op == "fmod")
        if n.op in ("maximum", "minimum"):
            return f"pn_{n.op}({x[0]}, {x[1]})"
        if n.op == "where":
            return f"({a[0]} ? {convert(a[1], n.args[1].dtype, d)} : {convert(a[2], n.args[2].dtype, d)})"
        if n.op == "neg":
            return _round(f"(-{x[0]})", d)
        if n.op == "abs":
            return f"pn_abs({x[0]})"
        if n.op == "not":
            return f"({x[0]} ? 0 : 1)"
        if n.op.startswith("argkey_"):  # (value, index) packed into one ordered int64 key
            return f"pn_{n.op}({a[0]}, (long long)({a[1]}))"
        if n.op == "exp" and n.value == ExpRange.NONPOSITIVE and d.compute == "float":  # x - max(x)
            return _round(f"pn_exp_le0f({x[0]})", d)
        if n.op in _MATH:
            fn = _MATH[n.op] + ("f" if d.compute == "float" else "")
            return _round(f"{fn}({x[0]})", d)
        raise NotImplementedError(f"codegen of elementwise op {n.op!r}")
