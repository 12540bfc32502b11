"""Values a stitched row computes in one pass and needs again in a later one: kept in a row of
scratch (stored once, read back) or recomputed, as the CPU model finds cheaper.

A softmax row makes three passes (schedule/mapping.py `levels`): m = max(x), s = sum(exp(x - m)),
then y = exp(x - m) / s. Printed as they are, the last pass computes exp(x - m) a second time.
onnxruntime's MlasComputeSoftmax (onnxruntime/core/mlas/lib/compute.cpp) instead stores exp(x - m)
to the output in its sum pass (MlasComputeSumExpF32Kernel) and scales that row in place while it
is still in cache (MlasComputeSoftmaxOutputF32Kernel). Here the same idea is found, not written
per operator: a subexpression of a later pass's statement that is structurally equal to one an
earlier pass evaluates per element (same operations, same loads at the same addresses, same
constants) is a *reuse* candidate; the earlier pass stores it to a per-thread row `pn_cseK[j]`
(codegen/cpu_kernel.py), the later ones read it instead of evaluating it.

Whether that pays is the model's call (model/cpu.py's probed rates, per element): recomputing
costs the subexpression's operations in every later pass that uses it; keeping it costs one
store and one load per such pass at the L2 bandwidth (the scratch row must fit L2), less the
loads of the later passes that the reuse makes unnecessary. exp(x - m) (0.22 ns on the
project's machine) is kept when the row fits L2 (8 bytes at ~48 GB/s, 0.17 ns, less the reread
of x); x - m (one subtraction) never is; log_softmax's last pass (x - m - log(s)) shares only
x - m and stays as it is, as in onnxruntime.

Preconditions (each returns no reuse; tests/test_cpu_softmax.py has one negative test per item):
1. the group is a stitched ROW group (other groups make one pass);
2. the subexpression varies along the row (a row invariant costs nothing to recompute) and has
   a key: no gathered load (its address is not affine);
3. the later statement makes its own pass over the row (an epilogue at j = 0 has no elements);
4. the model finds keeping it cheaper than recomputing it, its scratch row in L2 (a longer row
   would be stored to and read back from memory: no scratch row of that size is allocated),
   unless the scratch row is the output row (`Reuse.into`, below): no row is allocated then, and a
   row beyond L2 is priced at the rates of the level it lives in (the store, the read back, less
   the reread of x, and a second write-back of the output row: it leaves L2 after the producer's
   pass and again after the last pass). exp(x - m) is kept so; log_softmax's x - m is not.
   softmax [8x128256] (513 KB rows, L2 512 KiB, AMD EPYC AVX2, 1 thread, CPU time, kernel level,
   min of 41 interleaved, 2026-11-25 10:05, load 10): 1170 -> 728 us (onnxruntime 883 idle),
   bit-identical.

The scratch row of a kept value is the output row itself (`Reuse.into`, as onnxruntime's: the sum
pass writes exp(x - m) to the output, the last pass scales it in place) when (`output_row`; one
negative test each in tests/test_cpu_inplace.py):
5. the value has one consumer, a statement of the group's last pass whose result is stored (an output);
6. that output's C type is the scratch row's (a float16 output cannot hold the float value);
7. the output is written row after row, element (i, j) at N i + j, so scratch index j is its element j;
8. nothing else of the group reads that output (the consumer reads element j, then writes it).
The output's stream to memory then moves into the pass that stores the value, where it hides under
that pass's work (exp), instead of making the last pass a pure stream. softmax [64x30522], 1 thread,
CPU time, kernel level (2026-11-25, load 7): 1424 -> 1110 us (onnxruntime 1385), bit-identical.

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> g = lower(pn.nn.softmax(pn.placeholder((4, 1000), "float32"), axis=1, method="multipass"),
...           stop_after="groups", target="emulator").groups[0]
>>> r = choose(g, CpuModel.nominal(cores=2, simd_bytes=64))
>>> [(x.producer, x.consumers, x.ops, x.into) for x in r]
[(1, (2,), 'exp(sub)', 2)]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import islpy as isl

from ..model.cpu import DIVISION, FREE, TRANSCENDENTAL, CpuModel
from ..poly.expr import Expr
from ..poly.program import KernelGroup
from ..poly.statement import Form, Statement, StatementKind
from ..poly.stitch import levels


@dataclass(frozen=True)
class Reuse:
    """A value statement `producer` evaluates per element and statements `consumers` (of later
    passes) read back from a row of scratch: `key` is its structure (`keys`), `ctype` the C type
    of the scratch row, `ops` a readable form, `saved_ns` the model's saving per element; `into`:
    the consumer whose output row is the scratch row (`output_row`), None: a row of its own."""

    producer: int
    consumers: tuple[int, ...]
    key: tuple
    ctype: str
    ops: str
    saved_ns: float = 0.0
    into: int | None = None


def keys(s, address=lambda r: str(r.addr)) -> dict[int, tuple | None]:
    """Each node of statement s's body (by id) to its structural key: loads by tensor and
    `address` (a static read's isl address; a symbolic statement's read names its view and axes,
    schedule/cpu_param_reuse.py), constants by value and dtype, operations by name, dtype and their
    arguments' keys; None for a node that has no key (precondition 2: a gathered load, or anything
    above one)."""
    out: dict[int, tuple | None] = {}
    for e in s.body.walk():
        if e.op == "load":
            r = s.reads[e.read]
            out[id(e)] = None if r.indirect is not None else ("load", r.tensor.uid, address(r))
        elif e.op == "const":
            out[id(e)] = ("const", repr(e.value), e.dtype.name)
        else:
            args = tuple(out[id(a)] for a in e.args)
            out[id(e)] = None if any(a is None for a in args) else (e.op, e.dtype.name, *args)
    return out


def nodes_with(s, key: tuple, address=lambda r: str(r.addr)) -> list[Expr]:
    """The nodes of statement s's body whose key is `key`."""
    k = keys(s, address)
    return [e for e in s.body.walk() if k[id(e)] == key]


def varying(s: Statement, on_chip: frozenset[int]) -> set[int]:
    """The nodes of s's body whose value changes along the row (j): a value loaded from memory per
    element, a read whose address depends on j (an iota's index, an on-chip value per element) or
    goes through an index (a gather), and every node over one of them. The rest is a row invariant,
    hoisted out of the row loop (codegen/cpu_rows.py) or costed once per row."""
    out: set[int] = set()
    for e in s.body.walk():
        if e.op == "load" and _varies(s.reads[e.read], on_chip):
            out.add(id(e))
        elif any(id(a) in out for a in e.args):
            out.add(id(e))
    return out


def _varies(r, on_chip: frozenset[int]) -> bool:
    if r.indirect is not None or (r.memory and r.tensor.uid not in on_chip):
        return True
    pos = r.addr.get_space().find_dim_by_name(isl.dim_type.in_, "j")
    return pos >= 0 and any(
        not aff.get_coefficient_val(isl.dim_type.in_, pos).is_zero() for _, aff in r.addr.get_pieces()
    )


def op_counts(e: Expr, varying: set[int] | None = None) -> tuple[float, float, float]:
    """(cheap, transcendental, division) operations of the subtree of e (only `varying` nodes
    when given: the others are hoisted out of the row loop)."""
    cheap = trans = div = 0.0
    for n in e.walk():
        if n.op in FREE or (varying is not None and id(n) not in varying):
            continue
        if n.op in TRANSCENDENTAL:
            trans += 1
        elif n.op in DIVISION:
            div += 1
        else:
            cheap += 1
    return cheap, trans, div


def _describe(e: Expr) -> str:
    inner = [_describe(a) for a in e.args if a.op not in FREE]
    return e.op + (f"({', '.join(inner)})" if inner else "")


def _loads(e: Expr, s: Statement, on_chip: frozenset[int]) -> set[tuple]:
    """The tensors the subtree of e loads from memory (the group's own results are registers)."""
    return {
        ("load", s.reads[n.read].tensor.uid)
        for n in e.walk()
        if n.op == "load" and s.reads[n.read].memory and s.reads[n.read].tensor.uid not in on_chip
    }


def _pass_of(g: KernelGroup) -> dict[int, int]:
    """The row pass of each statement that scans the row (precondition 3: epilogues excluded)."""
    lv = levels(g.statements)
    return {
        k: lv[s.name]
        for k, s in enumerate(g.statements)
        if not (s.kind == StatementKind.MAP and s.form == Form.MAP) and g.accumulator_of[k] == k
    }


def candidates(g: KernelGroup) -> list[tuple[int, tuple[int, ...], Expr]]:
    """(producer, consumers, the producer's node) for each largest subexpression of an earlier
    pass that later passes evaluate again (preconditions 1 to 3), one per key."""
    if not g.stitched or g.form != Form.ROW:
        return []
    passes = _pass_of(g)
    stmts = g.statements
    on_chip = g.on_chip
    key_of = {k: keys(stmts[k]) for k in passes}
    out, taken = [], set()
    for p in sorted(passes, key=lambda k: passes[k]):
        var = varying(stmts[p], on_chip)
        later = [c for c in passes if passes[c] > passes[p]]
        common = {}
        for e in stmts[p].body.walk():
            key = key_of[p][id(e)]
            if key is None or id(e) not in var or e.op in FREE or key in taken:
                continue
            users = tuple(c for c in later if key in key_of[c].values())
            if users:
                common[id(e)] = (e, users)
        inside = {id(n) for e, _ in common.values() for n in e.walk() if n is not e}
        for i, (e, users) in common.items():
            if i not in inside and key_of[p][i] not in taken:
                taken.add(key_of[p][i])
                out.append((p, users, e))
    return out


def choose(g: KernelGroup, m: CpuModel) -> tuple[Reuse, ...]:
    """The candidates the model keeps (precondition 4): per element, the operations a consumer
    would recompute (priced as model/cpu.py `element_ns` prices a body: a cheap one at the lanes'
    throughput, `Rates.lane_op_ns`, an exp or a division at the probe's rate) against a store and a load per consumer of the scratch row at the rate of
    its level (L2 for a row of its own: a row of N values per thread must fit it; the output
    row's, `into`, any), less the loads a consumer no longer makes."""
    out = []
    for p, users, e in candidates(g):
        s = g.statements[p]
        key = keys(s)[id(e)]
        size = 8 if e.dtype.compute == "double" else 4
        x = Reuse(p, users, key, e.dtype.compute, _describe(e))
        into = output_row(g, x)
        level = m.level(g.N * size, 1)
        if level != "L2" and into is None:  # a scratch row of its own beyond L2: not allocated
            continue
        unread = 0  # bytes per element of the loads of the consumers that only the reused value needed
        for c in users:
            saved = _loads(e, s, g.on_chip) - _remaining_loads(g.statements[c], key)
            unread += sum(_tensor(g, uid).dtype.itemsize for _, uid in saved)
        gain = saving(m, e, len(users), level, unread)
        if gain > 0:
            out.append(replace(x, saved_ns=gain, into=into))
    return tuple(out)


def saving(m: CpuModel, e: Expr, consumers: int, level: str, unread: int) -> float:
    """Precondition 4's price (ns per element, > 0: keep): `consumers` passes recomputing e, less
    a store and a read back per consumer of its row at `level`'s rates (beyond L2 only the output
    row, which then leaves L2 twice: after the producer's pass and after the last), less the
    `unread` bytes the consumers no longer load. The static (`choose`) and the symbolic CPU path
    (schedule/cpu_param_reuse.py) price a kept value with it."""
    r = m.rates
    cheap, trans, div = op_counts(e)
    op = r.lane_op_ns  # as model/cpu.py `element_ns` prices a body: a cheap operation at its throughput
    recompute = op * cheap + max(r.exp_ns - op, 0.0) * trans + max(r.div_ns - op, 0.0) * div
    recompute *= max(1.0, e.dtype.itemsize / 4) * consumers
    size = 8 if e.dtype.compute == "double" else 4
    keep = size / r.bandwidth(level, 1, write=True) + consumers * size / r.bandwidth(level, 1)
    if level != "L2":
        keep += size / r.bandwidth(level, 1, write=True)
    return recompute - (keep - unread / r.bandwidth(level, 1))


def output_row(g: KernelGroup, x: Reuse) -> int | None:
    """The consumer of `x` whose output row can be `x`'s scratch row (module docstring:
    preconditions 5 to 8), else None."""
    if len(x.consumers) != 1:  # 5
        return None
    c = x.consumers[0]
    s, lv = g.statements[c], levels(g.statements)
    read = {r.tensor.uid for t in g.statements for r in t.reads}
    stored = s.result.uid in g.external or s.result.uid not in read
    if s.kind != StatementKind.MAP or lv[s.name] != max(lv.values()) or not stored or s.scatter is not None:
        return None
    if s.result.dtype.compute != x.ctype or s.result.dtype.is_16bit_float:  # 6
        return None
    row = isl.PwAff(f"{{ [i, j] -> [({g.N}i + j)] }}", context=s.write.get_ctx())
    dom = s.domain.reset_tuple_id()
    if not s.write.gist(dom).is_equal(row.intersect_domain(dom).gist(dom)):  # 7
        return None
    if s.result.uid in read:  # 8
        return None
    return c


def _remaining_loads(c: Statement, key: tuple) -> set[tuple]:
    """The tensors consumer c still loads once its nodes of `key` are read back."""
    k = keys(c)
    skip = {id(n) for n in c.body.walk() if k[id(n)] == key}
    seen, out = set(), set()
    stack = [c.body]
    while stack:
        n = stack.pop()
        if id(n) in seen or id(n) in skip:
            continue
        seen.add(id(n))
        if n.op == "load" and c.reads[n.read].memory:
            out.add(("load", c.reads[n.read].tensor.uid))
        stack.extend(n.args)
    return out


def _tensor(g: KernelGroup, uid: int):
    """The tensor a read of group g names by `uid`."""
    return next(r.tensor for s in g.statements for r in s.reads if r.tensor.uid == uid)


def saved_work(g: KernelGroup, reuse: tuple[Reuse, ...]) -> tuple[float, float, float, int]:
    """What `reuse` changes in group g's work (schedule/cpu_cost.py): the (cheap, transcendental,
    division) operations per element the consumers no longer evaluate, and the bytes re-read
    from cache it adds: the scratch rows (a store and a load per consumer, every element) less
    the tensors a consumer no longer loads."""
    parts = saved_by_statement(g, reuse).values()
    return (
        sum(p[0] for p in parts),
        sum(p[1] for p in parts),
        sum(p[2] for p in parts),
        sum(p[3] for p in parts),
    )


def saved_by_statement(g: KernelGroup, reuse: tuple[Reuse, ...]) -> dict[int, tuple[float, float, float, int]]:
    """`saved_work` per statement of g (by index): a consumer's saved operations and the bytes it
    loads from the scratch row less those it no longer loads; the producer's store of the row."""
    out: dict[int, tuple[float, float, float, int]] = {}

    def add(k: int, c: float, t: float, d: float, moved: int) -> None:
        a = out.get(k, (0.0, 0.0, 0.0, 0))
        out[k] = (a[0] + c, a[1] + t, a[2] + d, a[3] + moved)

    for x in reuse:
        producer = g.statements[x.producer]
        node = nodes_with(producer, x.key)[0]
        row = g.M * g.N * (8 if x.ctype == "double" else 4)
        add(x.producer, 0.0, 0.0, 0.0, 0 if x.into is not None else row)  # into: the output's own write
        for c in x.consumers:
            s = g.statements[c]
            var = varying(s, g.on_chip)
            ops = [op_counts(n, var) for n in nodes_with(s, x.key)[:1]]
            saved = _loads(node, producer, g.on_chip) - _remaining_loads(s, x.key)
            kept = row - sum(_tensor(g, uid).size * _tensor(g, uid).dtype.itemsize for _, uid in saved)
            add(c, sum(o[0] for o in ops), sum(o[1] for o in ops), sum(o[2] for o in ops), kept)
    return out
