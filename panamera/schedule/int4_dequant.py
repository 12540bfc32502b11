"""Packed int4 weights staged for tensor cores by the exponent trick, not element by element.

A tensor-core operand that is an int4 weight (two nibbles per uint8, the low one at even or odd
k, minus an integer zero point, times a 16-bit scale per group) costs ~20 CUDA-core instructions
per weight when its expression is evaluated lane by lane (the nibble select, casts, float math
and a rounding). Marlin (IST-DASLab/marlin, vLLM's `marlin/dequant.h`) and FasterTransformer's
int4 converter (arXiv 2211.10017) instead mask two nibbles into the mantissas of a 16-bit pair
whose exponent is fixed and subtract the bias with one paired instruction; `pn_i4x8`
(codegen/header.py) does that for 8 weights per 32-bit word, then one `__hmul2` applies the scale.
The result equals the element-wise expression rounded to the MMA's type bit for bit: n - z is
exact, and (n - z) * s is rounded once in both.

`nibbles` recognizes the operand and says which reads play which part; codegen/tc_staging.py (`stage_int4`)
stages it with `pn_i4x8`, and schedule/tc_tiling.py's cost counts `OPS_PER_WEIGHT`.

Preconditions (`nibbles` returns the first that fails, by number; one negative test each in
tests/test_int4_dequant.py):
  1. the MMA type is fp16 or bf16 and a staging step's `vec` k lanes are whole 32-bit words of
     packed bytes (vec a multiple of 8);
  2. the operand is `where(k % 2 == c, lo, hi) * scale` (either order of the product), lo =
     `(p & 15) - z` and hi = `((p >> 4) & 15) - z` (or `p >> 4`) of one uint8 read p, cast to
     float, z the same integer in [0, 15] on both sides, and the scale a cast of one read;
  3. the scale's type is the MMA's and it is one value across each step's vec lanes (UNIFORM);
  4. isl proves the select's iota is k mod 2 and the packed read's address is floor(k / 2) plus
     a function of the row within each step's vec lanes, aligned to vec / 2 bytes at its first.

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> from panamera.schedule.tensor_core import analyse
>>> p, s = pn.placeholder((16, 64), "uint8"), pn.placeholder((16, 1), "float16")
>>> lo, hi = (p & 0xF).astype("float32") - 8.0, (p >> 4).astype("float32") - 8.0
>>> nib = pn.where(pn.arange(2).reshape(1, 1, 2) == 0, lo.reshape(16, 64, 1), hi.reshape(16, 64, 1))
>>> a = lower(pn.placeholder((4, 128), "float16") @ (nib.reshape(16, 128) * s.astype("float32")).T,
...           stop_after="mappings", target="emulator")
>>> ops, d = analyse(a.groups[0]), a.mappings[0].decision
>>> nibbles(ops.b, a.groups[0].statements[0], "f16", d.vec, d.access[0]).zero
8
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from ..poly.access import AccessKind
from ..poly.bounded import proven_empty
from ..poly.expr import Expr

# CUDA-core instructions per staged weight on the exponent-trick path: per 8 weights, 3 shifts,
# 4 LOP3 (mask | exponent), 4 __hsub2, 4 __hmul2, 4 PRMT to pair neighbours for the shared store,
# the word's load, the scale's load and broadcast, one 16-byte shared store: 22 / 8.
OPS_PER_WEIGHT = 2.75
_BIAS = {"f16": (0x6400, 15), "bf16": (0x4300, 127)}  # 1024.0 / 128.0 and the largest exact zero point


@dataclass(frozen=True)
class Nibbles:
    """A packed int4 operand: `packed` and `scale` are read indices of the statement, `zero` the
    zero point, `flip` 0 when the low nibble is the even k (1: the odd k)."""

    packed: int
    scale: int
    zero: int
    flip: int

    def bias_bits(self, kind: str) -> int:
        """The 16-bit pattern of 1024 + z (fp16) or 128 + z (bf16), in both halves of a word."""
        h = _BIAS[kind][0] + self.zero
        return h << 16 | h


def _load(e: Expr, st, memory: bool = True) -> int | None:
    if e.op == "load" and st.reads[e.read].memory == memory:
        return e.read
    return None


def _nibble(e: Expr, st) -> tuple[int, int, float] | None:
    """(read, shift, zero) of `cast((p >> shift) & 15) - z` with p a uint8 read."""
    if e.op != "sub" or e.args[1].op != "const" or e.args[0].op != "cast" or not e.args[0].dtype.is_float:
        return None
    x = e.args[0].args[0]
    if x.op == "bitand" and x.args[1].op == "const" and x.args[1].value == 15:
        x = x.args[0]
        shift = 0
        if x.op == "shr" and x.args[1].op == "const" and x.args[1].value == 4:
            x, shift = x.args[0], 4
    elif x.op == "shr" and x.args[1].op == "const" and x.args[1].value == 4:
        x, shift = x.args[0], 4
    else:
        return None
    r = _load(x, st)
    if r is None or st.reads[r].tensor.dtype.name != "uint8":
        return None
    return r, shift, e.args[1].value


def nibbles(e: Expr, st, kind: str, vec: int, access: tuple) -> Nibbles | str:
    """The packed int4 operand `e` of statement `st` staged as MMA type `kind` ("f16" / "bf16")
    `vec` k lanes per step (`access` the mapping's kinds of st's reads), or the precondition it
    fails as "N: why"."""
    if kind not in _BIAS or vec % 8:
        return f"1: MMA type {kind} with {vec} lanes per step is not fp16 / bf16 with whole 32-bit words"
    if e.op != "mul":
        return "2: not a product of a nibble select and a scale"
    sel, sc = e.args if e.args[0].op == "where" else e.args[::-1]
    if sel.op != "where" or sc.op != "cast" or _load(sc.args[0], st) is None:
        return "2: not a product of a nibble select and a scaled read"
    cond, a, b = sel.args
    iota = _load(cond.args[0], st, memory=False) if cond.op == "eq" and cond.args[1].op == "const" else None
    na, nb = _nibble(a, st), _nibble(b, st)
    if iota is None or cond.args[1].value not in (0, 1) or na is None or nb is None:
        return "2: the select is not (k % 2 == c ? nibble : nibble) of a uint8 read"
    (ra, sa, za), (rb, sb, zb) = na, nb
    z = int(za) if za == int(za) else -1
    if ra != rb or {sa, sb} != {0, 4} or za != zb or not 0 <= z <= _BIAS[kind][1]:
        return "2: the nibbles are not the two halves of one byte minus one integer zero point in [0, 15]"
    scale = sc.args[0].read
    mma_dtype = {"f16": "float16", "bf16": "bfloat16"}[kind]
    if st.reads[scale].tensor.dtype.name != mma_dtype or access[scale] != AccessKind.UNIFORM:
        return f"3: the scale is not {mma_dtype} and one value across {vec} lanes"
    if not _proven(st, iota, ra, vec):
        return "4: isl does not prove the select reads k mod 2 and the bytes are k / 2 within a step"
    lo_parity = int(cond.args[1].value) if sa == 0 else 1 - int(cond.args[1].value)
    return Nibbles(packed=ra, scale=scale, zero=z, flip=lo_parity)


_PROVEN: dict[tuple[int, int, int, int], tuple[object, bool]] = {}  # id(st), iota, packed, vec -> (st, proven)


def _proven(st, iota: int, packed: int, vec: int) -> bool:
    """`_prove`, once per statement and vector width (the mapper asks for every tensor-core candidate)."""
    key = (id(st), iota, packed, vec)
    hit = _PROVEN.get(key)
    if hit is None or hit[0] is not st:  # the statement itself is kept: an id is never reused while cached
        if len(_PROVEN) > 512:
            _PROVEN.clear()
        hit = _PROVEN[key] = (st, _prove(st, iota, packed, vec))
    return hit[1]


def _prove(st, iota: int, packed: int, vec: int) -> bool:
    """isl: iota(i, j) = j mod 2 on the domain, and for the packed read's address a(i, j) -
    floor(j / 2) is constant across each aligned group of vec lanes, a(i, j) = 0 mod vec / 2 at
    its first lane."""
    dom = st.domain.reset_tuple_id()
    ctx = dom.get_ctx()
    v = isl.make_zero_and_vars(["i", "j"], [], ctx=ctx)
    two, width, half = (isl.Val.int_from_si(ctx, n) for n in (2, vec, vec // 2))
    sp = isl.Space.create_from_names(ctx, in_=["i", "j"], out=["i", "j"])
    step = isl.MultiAff.identity(sp)
    step = step.set_aff(1, step.get_aff(1).add_constant_val(isl.Val.one(ctx)))
    inner = v["j"].mod_val(width).ne_set(v[0] + (vec - 1)) & dom
    first = v["j"].mod_val(width).eq_set(v[0]) & dom
    a = st.reads[packed].addr
    f = a - (v["j"] - v["j"].mod_val(two)).scale_down_val(two)  # a - floor(j / 2)
    return (
        proven_empty(ctx, lambda: st.reads[iota].addr.ne_set(v["j"].mod_val(two)) & dom)
        and proven_empty(ctx, lambda: (f.pullback_multi_aff(step) - f).ne_set(v[0]) & inner)
        and proven_empty(ctx, lambda: a.mod_val(half).ne_set(v[0]) & first)
    )
