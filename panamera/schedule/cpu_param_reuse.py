"""A symbolic stitched CPU row's kept values (issue 24): the static path's reuse
(schedule/cpu_reuse.py) for a parametric group (poly/param_stitch.py).

A symbolic softmax row makes the static one's passes: m = max(x), s = sum(exp(x - m)), then
y = exp(x - m) / s. As in the static kernels, a subexpression of the group's MAP (its last pass)
structurally equal to one a reduction's pass evaluates per element is kept: the reduction's pass
stores it to the MAP's output row (`Reuse.into`: onnxruntime's in-place scaling), the MAP reads it
back instead of evaluating it again. The price is cpu_reuse.saving's, the same rule as the static
path's; the decision is a `cpu_reuse.Reuse` carried on the class decision
(schedule/cpu_param_mapping.py `CpuParamDecision.reuse`) and printed by
codegen/cpu_param_kernel.py.

Before (softmax, last pass):  y[i, j] = exp(x[i, j] - m) / s
After:  sum pass:  e = exp(x[i, j] - m); y[i, j] = e; s += e.   last pass:  y[i, j] = y[i, j] / s

Preconditions (each returns no reuse; one negative test each in tests/test_dynamic_cpu_reuse.py):
1. the kernel is a stitched ROW group (a reduction's pass, then the MAP's pass over the row);
2. the subexpression varies along the row, has a key (no gathered load) and is evaluated by a
   reduction's pass (the first statement of its accumulator) and by the MAP;
3. the MAP's output holds it: its C type is the value's and it is no 16-bit float (cpu_reuse
   precondition 6; the MAP writes element (i, j) at N i + j, param_stitch precondition 1, and is
   read by no member: it is the last);
4. keeping it is cheaper than recomputing it (cpu_reuse.saving, at the level the output row lives
   in) at every sample size of the class (robust over the class, as its split is).

>>> import panamera as pn
>>> from panamera.poly.params import build
>>> from panamera.model.cpu import CpuModel
>>> from panamera.schedule.size_class import SizeClass
>>> p = build((pn.nn.softmax(pn.placeholder(("B", "N"), "float32"), axis=1, method="multipass"),))
>>> members = p.statements  # max, sum of exp, the MAP: one stitched group
>>> cls = SizeClass.of({"B": 64, "N": 30522}, frozenset())
>>> [(x.producer, x.consumers, x.ops, x.into) for x in choose(members, "stitched", cls, CpuModel.nominal(2, 32))]
[(1, (2,), 'exp(sub)', 2)]
"""

from __future__ import annotations

import math

from ..frontend import symbolic
from ..model.cpu import FREE, CpuModel
from ..poly.params import PRead, PStatement
from ..poly.statement import Form, StatementKind
from .cpu_reuse import Reuse, _describe, keys, saving
from .size_class import SizeClass


def address(r: PRead) -> tuple:
    """A symbolic read's key (cpu_reuse.keys' `address`): the view and the statement axes it varies
    along. The members of a stitched group iterate one box, so equal keys are equal addresses."""
    return (tuple(map(str, r.shape)), r.axes)


def varying(s: PStatement) -> set[int]:
    """The nodes of s's body that change along the row: a read varying along a j axis or through an
    index (a gather), and every node over one of them."""
    out: set[int] = set()
    for e in s.body.walk():
        if e.op == "load":
            r = s.reads[e.read]
            if r.indirect is not None or any(a in s.j_axes for a in r.axes):
                out.add(id(e))
        elif any(id(a) in out for a in e.args):
            out.add(id(e))
    return out


def choose(members: tuple[PStatement, ...], kind: str, cls: SizeClass, m: CpuModel) -> tuple[Reuse, ...]:
    """The values the MAP of a stitched group reads back from its output row (preconditions 1-4)."""
    last = len(members) - 1
    mp = members[last]
    if kind != "stitched" or members[0].form != Form.ROW or mp.kind != StatementKind.MAP:  # 1
        return ()
    row = mp.as_rows_of(members[0])
    wanted = {k for k in keys(row, address).values() if k is not None}
    seen: set[tuple] = set()
    producers = [k for k, s in enumerate(members) if s.kind == StatementKind.REDUCE]
    out = []
    for p in producers:
        s = members[p]
        if s.accumulator_key() in seen:  # the phase's first statement prints its pass
            continue
        seen.add(s.accumulator_key())
        key_of, var = keys(s, address), varying(s)
        common = [e for e in s.body.walk() if id(e) in var and e.op not in FREE and key_of[id(e)] in wanted]  # 2
        inside = {id(n) for e in common for n in e.walk() if n is not e}
        for e in common:
            if id(e) in inside or any(x.key == key_of[id(e)] for x in out):
                continue
            if mp.result.dtype.compute != e.dtype.compute or mp.result.dtype.is_16bit_float:  # 3
                continue
            size = 8 if e.dtype.compute == "double" else 4
            unread = _unread(e, s, row, key_of[id(e)], {t.result.uid for t in members})
            gains = []
            for z in cls.samples():
                n = symbolic.evaluate((members[0].N,), z)[0]
                gains.append(saving(m, e, 1, m.level(max(1, n) * size, 1), unread))
            if min(gains) > 0:  # 4
                gain = math.fsum(gains) / len(gains)
                out.append(Reuse(p, (last,), key_of[id(e)], e.dtype.compute, _describe(e), gain, last))
    return tuple(out)


def _unread(e, s: PStatement, row: PStatement, key: tuple, own: set[int]) -> int:
    """Bytes per element the MAP no longer loads once e is read back (x, in softmax's exp(x - m))."""
    mine = {s.reads[n.read].tensor for n in e.walk() if n.op == "load" and s.reads[n.read].tensor.uid not in own}
    k = keys(row, address)
    left, stack, seen = set(), [row.body], set()
    while stack:
        n = stack.pop()
        if id(n) in seen or k[id(n)] == key:
            continue
        seen.add(id(n))
        if n.op == "load":
            left.add(row.reads[n.read].tensor.uid)
        stack.extend(n.args)
    return sum(t.dtype.itemsize for t in {t.uid: t for t in mine}.values() if t.uid not in left)
