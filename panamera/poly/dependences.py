"""Dependences from isl flow analysis, and the isl schedule of a program.

Each statement writes one array (its result tensor, indexed by linear offset) and reads others.
A reduction statement also reads the element it writes (the update `out[i] = out[i] (+) v`), so
isl finds a self-dependence along j; it is *relaxable*: the combiner is associative and
commutative, so its instances may run in any order and be merged by atomics. The relaxed
dependences are removed from the validity constraints handed to isl's scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from .movement import indirect_access
from .statement import Statement, StatementKind


def array_name(t) -> str:
    return f"T{t.uid}"


def _access(st: Statement, addr: isl.PwAff, array: str, indirect=None) -> isl.Map:
    """The access relation of a read or write; a gather's (`indirect`) over-approximated by the
    whole gathered axis (poly/movement.py)."""
    m = isl.Map.from_pw_aff(addr) if indirect is None else indirect_access(addr, indirect)
    return (
        m.set_tuple_name(isl.dim_type.in_, st.name).set_tuple_name(isl.dim_type.out, array).intersect_domain(st.domain)
    )


@dataclass(frozen=True)
class Dependences:
    flow: isl.UnionMap  # every flow (read-after-write) dependence
    relaxed: isl.UnionMap  # the reduction self-dependences, relaxable by commutativity
    reads: isl.UnionMap
    writes: isl.UnionMap

    def between(self, a: Statement, b: Statement) -> isl.UnionMap:
        return self.flow.intersect_domain(isl.UnionSet.from_set(a.domain)).intersect_range(
            isl.UnionSet.from_set(b.domain)
        )

    @property
    def validity(self) -> isl.UnionMap:
        return self.flow.subtract(self.relaxed)


def compute_dependences(stmts: list[Statement]) -> Dependences:
    """Flow dependences of statements in their (coalesced) canonical domains, in program order."""
    ctx = stmts[0].domain.get_ctx()
    reads = writes = sched = isl.UnionMap.empty(isl.Space.params_alloc(ctx, 0))
    for k, st in enumerate(stmts):
        w = _access(st, st.write, array_name(st.result), st.scatter)  # a scatter may write any row
        writes = writes.union(isl.UnionMap.from_map(w))
        for r in (r for r in st.reads if r.memory):
            reads = reads.union(isl.UnionMap.from_map(_access(st, r.addr, array_name(r.tensor), r.indirect)))
        if st.kind == StatementKind.REDUCE:  # the update reads what it writes
            reads = reads.union(isl.UnionMap.from_map(w))
        v = isl.make_zero_and_vars(list(st.dims), [], ctx=ctx)
        order = isl.Map.from_pw_aff(v[0] + k)
        for d in st.dims:
            order = order.flat_range_product(isl.Map.from_pw_aff(v[d]))
        order = order.set_tuple_name(isl.dim_type.in_, st.name).intersect_domain(st.domain)
        sched = sched.union(isl.UnionMap.from_map(order))
    info = isl.UnionAccessInfo.from_sink(reads).set_must_source(writes).set_schedule_map(sched)
    flow = info.compute_flow().get_must_dependence()
    relaxed = isl.UnionMap.empty(flow.get_space())
    for st in stmts:
        if st.kind == StatementKind.REDUCE:
            dom = isl.UnionSet.from_set(st.domain)
            relaxed = relaxed.union(flow.intersect_domain(dom).intersect_range(dom))
    return Dependences(flow=flow, relaxed=relaxed, reads=reads, writes=writes)


def schedule(stmts: list[Statement], deps: Dependences) -> isl.Schedule:
    """isl's schedule for the statements: validity = non-relaxed flow, proximity = all flow."""
    dom = isl.UnionSet.from_set(stmts[0].domain)
    for st in stmts[1:]:
        dom = dom.union(isl.UnionSet.from_set(st.domain))
    sc = isl.ScheduleConstraints.on_domain(dom)
    sc = sc.set_validity(deps.validity).set_proximity(deps.flow).set_coincidence(deps.validity)
    return sc.compute_schedule()
