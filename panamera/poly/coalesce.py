"""Loop coalescing (Panamera §3): every reduction becomes ROW, COLUMN or ALL.

Before (NCHW, reduce N, H, W; the reduced loops are not adjacent)::

    for d0 < 256 (N, reduced), d1 < 256 (C), d2 < 56 (H, reduced), d3 < 56 (W, reduced):
        out[d1] += x[d0, d1, d2, d3]

After (`coalesce` interchanges the parallel loop outwards, which is legal because the combiner
is associative and commutative, and flattens each role into one loop)::

    for i < 256:            # i = d1
        for j < 802816:     # j = d0*3136 + d2*56 + d3
            out[i] += x[(j / 3136) * 802816 + i * 3136 + j % 3136]      # ROW form

The form is named by where the innermost (contiguous) loop goes: reduced → ROW, parallel →
COLUMN (the reduced loops stride over rows of the contiguous parallel extent), no parallel
loop → ALL (M = 1). Loops of extent 1 are ignored. Element-wise statements coalesce to MAP.
The subscripts after coalescing are isl quasi-affine expressions (floor division and modulo of
i and j), obtained by pulling each access back through the inverse of the coalescing map.

Preconditions, each checked (`LegalityError` otherwise; one negative test each in
tests/test_poly.py):
  1. the combiner is associative and commutative (one of algebra.COMBINERS), so that parallel
     and reduced loops may be interchanged and reduced loops reordered;
  2. the iteration domain is exactly the box of its extents (no guards, no symbolic bounds).
Given both, the coalescing map is a bijection from the domain onto [0, M) x [0, N): every
iteration runs exactly once in the canonical nest. isl verifies that as an invariant (an
internal error if it ever fails, not a user-facing precondition).
"""

from __future__ import annotations

import math
from dataclasses import replace

import islpy as isl

from ..algebra import COMBINERS
from ..errors import LegalityError
from .statement import Form, Statement, StatementKind, box, delinearize, linear


def classify(st: Statement, roles: frozenset[str] | None = None) -> Form:
    if st.kind == StatementKind.MAP and roles is None:
        return Form.MAP
    reduced = st.reduced if roles is None else roles
    live = [d for d, e in zip(st.dims, st.extents) if e != 1]
    par = [d for d in live if d not in reduced]
    if not par:
        return Form.ALL
    if not any(d in reduced for d in live):
        return Form.ROW  # nothing to reduce: one element per row
    return Form.ROW if live[-1] in reduced else Form.COLUMN


def coalesce(st: Statement, roles: frozenset[str] | None = None) -> Statement:
    """The statement in canonical form over the domain { [i, j] : 0 <= i < M and 0 <= j < N }.

    `roles` places an element-wise statement in the iteration space of a reduction over the same
    domain (the dimensions it names become j): that is how a consumer of a reduction joins the
    reduction's kernel (poly/stitch.py)."""
    if st.kind == StatementKind.REDUCE and COMBINERS.get(st.combiner.name) is not st.combiner:
        raise LegalityError(
            f"coalesce {st.name}: combiner {st.combiner.name!r} is not a known associative and commutative one"
        )
    ctx = st.domain.get_ctx()
    expected, _ = box(ctx, st.dims, st.extents)
    if not st.domain.reset_tuple_id().is_equal(expected):
        raise LegalityError(f"coalesce {st.name}: the iteration domain is not the box of extents {st.extents}")
    reduced = st.reduced if roles is None else roles
    par = [(d, e) for d, e in zip(st.dims, st.extents) if d not in reduced]
    red = [(d, e) for d, e in zip(st.dims, st.extents) if d in reduced]
    M = math.prod(e for _, e in par)
    N = math.prod(e for _, e in red)
    canon, cv = box(ctx, ("i", "j"), (M, N))

    # The coalescing map D -> C, and its inverse C -> D built by delinearization; isl checks that
    # they are mutually inverse on the domain, i.e. that coalescing is a bijection.
    dv = isl.make_zero_and_vars(list(st.dims), [], ctx=ctx)
    i_of_d = linear([dv[d] for d, _ in par], [e for _, e in par], dv[0])
    j_of_d = linear([dv[d] for d, _ in red], [e for _, e in red], dv[0])
    fwd = isl.Map.from_pw_aff(i_of_d).flat_range_product(isl.Map.from_pw_aff(j_of_d))
    fwd = fwd.intersect_domain(expected)
    sub = dict(zip([d for d, _ in par], delinearize(cv["i"], [e for _, e in par], ctx)))
    sub.update(zip([d for d, _ in red], delinearize(cv["j"], [e for _, e in red], ctx)))
    inv_affs = [sub[d] for d in st.dims]
    inv = _map_from_affs(inv_affs, canon) if inv_affs else None
    if M * N > 0 and inv is not None:
        img = fwd.range()
        ok = img.is_equal(canon.reset_tuple_id()) and fwd.is_injective()
        ok = ok and inv.apply_range(fwd).is_equal(isl.Map.identity(canon.space.map_from_set()).intersect_domain(canon))
        if not ok:
            raise AssertionError(f"coalesce {st.name}: the coalescing map is not a bijection onto [0,{M})x[0,{N})")

    inv_pma = isl.PwMultiAff.from_map(inv) if inv is not None else None

    def pull(pa: isl.PwAff) -> isl.PwAff:
        # Substitute every domain dimension by its quasi-affine expression in (i, j).
        if inv_pma is None:  # rank 0: a single iteration
            return (cv[0] + pa.get_pieces()[0][1].get_constant_val().to_python()) if pa.get_pieces() else cv[0]
        return pa.pullback_pw_multi_aff(inv_pma).gist(canon.reset_tuple_id()).coalesce()

    reads = tuple(replace(r, addr=pull(r.addr)) for r in st.reads)
    return replace(
        st,
        dims=("i", "j"),
        extents=(M, N),
        reduced=frozenset({"j"}),
        domain=canon.set_tuple_name(st.name),
        reads=reads,
        write=pull(st.write),
        form=classify(st, roles),
        M=M,
        N=N,
        origin=st,
    )


def _map_from_affs(affs, dom):
    m = isl.Map.from_pw_aff(affs[0])
    for a in affs[1:]:
        m = m.flat_range_product(isl.Map.from_pw_aff(a))
    return m.intersect_domain(dom.reset_tuple_id())
