"""Fusion of element-wise producers into a reduction, decided and verified with isl.

Before (what an eager framework runs: one loop nest per op, each through memory)::

    for i, j: P0[i, j] = exp(x[..])            # producer statements, over the reduction's
    for i, j: P1[i, j] = P0[i, j] * w[..]      # canonical domain (the paper's reduction
    for i, j: R[i] (+)= P1[i, j]               # propagation gives them the same loops)

After (`fuse_producers`: isl's scheduler, with proximity on the flow dependences, puts all of them
in one band; every producer instance runs at the same band point as its consumer)::

    for i, j: { t0 = exp(x[..]); t1 = t0 * w[..]; R[i] (+)= t1 }    # producers in registers

Preconditions, each checked (`LegalityError` otherwise; negative tests in tests/test_poly.py):
  1. every producer is an element-wise op (frontend/tensor.py), so its value at (i, j) depends
     only on loads at (i, j) and its statement takes the reduction's domain with an identity write;
  2. in isl's schedule (validity: flow dependences minus the relaxable reduction self-dependence,
     proximity: all flow dependences), every producer → consumer dependence has distance zero in
     the outer band: the value is produced in the iteration that consumes it, so it never needs
     to leave registers. (Past MAX_SCHEDULED_PRODUCERS producers, isl checks this on the fused
     band rather than searching for a schedule: its search grows with the cube of the count.)
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from ..errors import LegalityError
from ..frontend.tensor import ARG_OPS, BINARY_ARITH, BITWISE, COMPARE, LOGICAL, UNARY
from .statement import Statement


@dataclass(frozen=True)
class Fusion:
    statement: str
    producers: int
    schedule: isl.Schedule
    band_depth: int

    def describe(self) -> str:
        return f"{self.statement}: {self.producers} producer(s) fused in one isl band of depth {self.band_depth}"


def _identity(dom: isl.Set, src: str, dst: str) -> isl.Map:
    return (
        isl.Map.identity(dom.space.map_from_set())
        .intersect_domain(dom)
        .set_tuple_name(isl.dim_type.in_, src)
        .set_tuple_name(isl.dim_type.out, dst)
    )


ELEMENTWISE = frozenset(UNARY + BINARY_ARITH + COMPARE + LOGICAL + BITWISE + ARG_OPS + ("where", "cast"))


def _isl_scheduler(sc: isl.ScheduleConstraints) -> isl.Schedule:
    return sc.compute_schedule()


# isl's scheduler solves one integer program over every producer and dependence: 200 producers
# took 1.3 s, 800 (a chain of 400 element-wise ops) 90 s. Past this many producers it is not
# asked; the band it would propose (every producer at its consumer's point, precondition 1) is
# built and isl checks precondition 2 on it, exactly as on a proposed schedule.
MAX_SCHEDULED_PRODUCERS = 64


def _fused_band(domains: isl.UnionSet, names: list[str], dom: isl.Set) -> isl.Schedule:
    """The schedule with one band over the domain's dimensions for every statement in `names`."""
    ident = isl.Map.identity(dom.space.map_from_set()).intersect_domain(dom)
    band = _union([ident.set_tuple_name(isl.dim_type.in_, n) for n in names], isl.UnionMap.from_map)
    return isl.Schedule.from_domain(domains).insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(band))


def _union(parts: list, lift, empty=None):
    """The union of `parts` (lifted to union sets or maps), pairwise in a balanced tree: adding
    them one by one copies the growing union each time, quadratic in a long chain."""
    if not parts:
        return empty
    level = [lift(p) for p in parts]
    while len(level) > 1:
        level = [a.union(b) for a, b in zip(level[::2], level[1::2])] + ([level[-1]] if len(level) % 2 else [])
    return level[0]


def fuse_producers(st: Statement, scheduler=_isl_scheduler) -> Fusion:
    """isl's schedule for the producers of `st` and `st` itself, checked to fuse them."""
    dom = st.domain.reset_tuple_id()
    nodes = [e for e in st.body.walk() if e.op not in ("load", "const")]
    name = {id(e): f"{st.name}_P{k}" for k, e in enumerate(nodes)}
    order: list[str] = []
    domain_parts, write_parts, read_parts = [st.domain], [], []

    def value_array(e) -> str:
        return f"V_{name[id(e)]}"

    for e in nodes:
        if e.op not in ELEMENTWISE:
            raise LegalityError(f"fuse {st.name}: producer {e.op!r} is not element-wise")
        domain_parts.append(dom.set_tuple_name(name[id(e)]))
        write_parts.append(_identity(dom, name[id(e)], value_array(e)))
        read_parts += [_identity(dom, name[id(e)], value_array(a)) for a in _operands(e, name)]
        order.append(name[id(e)])
    root = st.body
    read_parts += [
        _identity(dom, st.name, value_array(a)) for a in ([root] if id(root) in name else _operands(root, name))
    ]
    order.append(st.name)
    domains = _union(domain_parts, isl.UnionSet.from_set)
    space = isl.Space.params_alloc(st.domain.get_ctx(), 0)
    writes = _union(write_parts, isl.UnionMap.from_map, isl.UnionMap.empty(space))
    reads = _union(read_parts, isl.UnionMap.from_map, isl.UnionMap.empty(space))
    if len(nodes) <= MAX_SCHEDULED_PRODUCERS:
        # The unfused program order: one loop nest per statement, in producer order.
        sched = isl.UnionMap.empty(reads.get_space())
        for k, sname in enumerate(order):
            v = isl.make_zero_and_vars(list(st.dims), [], ctx=st.domain.get_ctx())
            m = isl.Map.from_pw_aff(v[0] + k)
            for d in st.dims:
                m = m.flat_range_product(isl.Map.from_pw_aff(v[d]))
            sched = sched.union(isl.UnionMap.from_map(m.intersect_domain(dom).set_tuple_name(isl.dim_type.in_, sname)))
        info = isl.UnionAccessInfo.from_sink(reads).set_must_source(writes).set_schedule_map(sched)
        flow = info.compute_flow().get_must_dependence()
        sc = isl.ScheduleConstraints.on_domain(domains).set_validity(flow).set_proximity(flow).set_coincidence(flow)
        schedule = scheduler(sc)
    else:  # isl checks the fused band below instead of searching for it
        flow = writes.apply_range(reads.reverse())  # each value array has one writer: exact flow
        schedule = _fused_band(domains, order, dom)
    depth = _outer_band_depth(schedule)
    if nodes and depth:
        smap = schedule.get_map()  # every statement to the same schedule space
        deltas = flow.apply_domain(smap).apply_range(smap).deltas()
        sets: list[isl.Set] = []
        deltas.foreach_set(sets.append)
        zero = all(d.dim_max_val(k).is_zero() and d.dim_min_val(k).is_zero() for d in sets for k in range(depth))
        if not zero:
            raise LegalityError(f"fuse {st.name}: isl's schedule does not place producers with their consumer")
    elif nodes and st.M * st.N > 1:  # a single iteration needs no loop: nothing to fuse across
        raise LegalityError(f"fuse {st.name}: isl's schedule has no common band for producers and reduction")
    return Fusion(st.name, len(nodes), schedule, depth)


def _operands(e, name: dict) -> list:
    """The producer values `e` reads; through a gather's load (a load with an argument), the
    index it loaded at the same point (poly/movement.py)."""
    out, todo = [], list(reversed(e.args))  # iterative: chains of gathers of any depth
    while todo:
        a = todo.pop()
        if id(a) in name:
            out.append(a)
        elif a.op == "load" and a.args:
            todo += reversed(a.args)
    return out


def _outer_band_depth(schedule: isl.Schedule) -> int:
    node = schedule.get_root()
    while node.get_type() == isl.schedule_node_type.domain or node.get_type() == isl.schedule_node_type.filter:
        if not node.has_children():
            return 0
        node = node.child(0)
    if node.get_type() == isl.schedule_node_type.band:
        return node.band_n_member()
    return 0
