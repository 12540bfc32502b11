"""exp nodes of a stitched CPU row whose argument is never above 0: exp(x - m), m the row's max of
the same x (softmax, log_softmax, a log-sum-exp), printed with the cheaper exp of a non-positive
argument (runtime/cpu.py EXP_LE0) instead of the general one (EXP_FLUSH).

Before: `expf(x - m)`: the general float exp, whose overflow and underflow are one compare-and-
select at its end (|x| > 88.75: inf or 0; five vector operations: abs, compare, the sign's shift,
its mask, the blend).
After: `pn_exp_le0f(x - m)`: the argument clamped at -104 first (one max, a NaN passes it), where
every result flushes to 0 as the general exp's does, and no select: x - m <= 0 never overflows.
softmax [6144x128], 1 thread, the kernel alone, CPU time, min of 31 interleaved rounds (AMD EPYC
AVX2, 2026-11-25 13:34, load 10.6): 617 -> 575 us (onnxruntime ~600 idle).

Why it holds: m = max over j of x[i, j] (x any expression of the row: a masked softmax's
where(mask, s, -inf) too) is one of the row's values, so m >= x[i, j] for every j,
and a float subtraction is monotone: x - m <= 0, or NaN (a NaN in the row makes m NaN; an
infinite m gives inf - inf). Both exps give NaN for NaN, 0 for -inf and the same bits elsewhere in
[-104, 0] (the same polynomial and scaling).

Preconditions (each leaves the node to the general exp; tests/test_cpu_exp_range.py has one
negative test per item):
1. the group is a stitched ROW group (the row's max is an earlier pass's register);
2. the node is an exp computed in float (a double's exp is libm's);
3. its argument is a - b: `a` an expression with a structural key (schedule/cpu_reuse.py `keys`:
   no gathered load in it); `b` a read of the result of one of the group's statements, k0, at
   the address k0 writes row i's value to (row i's own m);
4. k0 is a reduction of the row with the max combiner whose body is `a` (the same key: the same
   operations on the same loads at the same addresses, so the same value for each j, and the
   same dtype), stored as it is (no finish, not a mean).

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> g = lower(pn.nn.softmax(pn.placeholder((4, 1000), "float32"), axis=1, method="multipass"),
...           stop_after="groups", target="emulator").groups[0]
>>> [(k, key[0]) for k, key in nonpositive_exps(g)]
[(1, 'exp'), (2, 'exp')]
"""

from __future__ import annotations

from dataclasses import replace

from ..enums import StrEnum
from ..poly.expr import Expr
from ..poly.program import KernelGroup
from ..poly.statement import Form, StatementKind
from .cpu_reuse import keys


class ExpRange(StrEnum):
    """Expr.value of an exp node whose argument's range is known (codegen/expr.py prints it)."""

    NONPOSITIVE = "le0"  # the argument is <= 0 or NaN: runtime/cpu.py EXP_LE0


def nonpositive_exps(g: KernelGroup) -> tuple[tuple[int, tuple], ...]:
    """(statement, structural key of the node: schedule/cpu_reuse.py `keys`) of each exp node of
    the group whose argument is never above 0 (preconditions 1 to 4)."""
    if not g.stitched or g.form != Form.ROW:  # 1
        return ()
    by_result = {s.result.uid: k for k, s in enumerate(g.statements)}
    out = []
    for k, s in enumerate(g.statements):
        key_of = keys(s)
        for e in s.body.walk():
            if e.op != "exp" or e.dtype.compute != "float" or key_of[id(e)] is None:  # 2
                continue
            if _row_max_of(g, s, e.args[0], by_result) and (k, key_of[id(e)]) not in out:
                out.append((k, key_of[id(e)]))
    return tuple(out)


def _row_max_of(g: KernelGroup, s, arg: Expr, by_result: dict[int, int]) -> bool:
    """Preconditions 3 and 4 for the argument `arg` of an exp of statement s."""
    if arg.op != "sub" or arg.args[1].op != "load":  # 3
        return False
    a, b = arg.args[0], s.reads[arg.args[1].read]
    key = keys(s)[id(a)]
    if key is None or b.indirect is not None or b.tensor.uid not in by_result:
        return False
    m = g.statements[by_result[b.tensor.uid]]
    if str(b.addr) != str(m.write):  # 3: row i's own max
        return False
    if m.kind != StatementKind.REDUCE or m.combiner is None or m.combiner.name != "max" or m.form != Form.ROW:  # 4
        return False
    return m.post is None and not m.mean_count and keys(m)[id(m.body)] == key and a.dtype == m.body.dtype


def marked(g: KernelGroup, exps: tuple[tuple[int, tuple], ...]) -> KernelGroup:
    """The group with the exp nodes `exps` (`nonpositive_exps`, the decision's `exp_le0`) marked
    (Expr.value ExpRange.NONPOSITIVE) for codegen/expr.py to print as the exp of a non-positive argument; every
    other node the same object (the codegen's values held by node id stay valid), and the nodes'
    structural keys unchanged (a mark is no part of a key)."""
    if not exps:
        return g
    statements = list(g.statements)
    for k in {k for k, _ in exps}:
        s = statements[k]
        wanted = {key for j, key in exps if j == k}
        key_of = keys(s)
        memo: dict[int, Expr] = {}
        for n in s.body.walk():
            args = tuple(memo[id(a)] for a in n.args)
            new = n if all(x is y for x, y in zip(args, n.args)) else replace(n, args=args)
            if n.op == "exp" and key_of[id(n)] in wanted:
                new = replace(new, value=ExpRange.NONPOSITIVE)
            memo[id(n)] = new
        statements[k] = replace(s, body=memo[id(s.body)])
    return replace(g, statements=tuple(statements))
