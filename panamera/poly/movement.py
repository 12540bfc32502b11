"""Data movement in the polyhedral model: remaps inlined as piecewise quasi-affine subscripts,
gathers as non-affine reads.

Before (what a framework runs: the layout change is a kernel and a tensor of its own)::

    for b, h, s, d: T[b, h, s, d] = x[b, s, h, d]                       # Transpose: copy
    for b, h, s, d: P[b, h, s, d] = T[b, h, s, d] * cos[s, d]
                                  + cat(-T[.., D/2:], T[.., :D/2])[b, h, s, d] * sin[s, d]

After (`remap_index`: a remap is never a statement; its reader reads the remap's input through
the composed access, built with isl from the reader's named domain dims)::

    for b, h, s, d: P[b, h, s, d] = x[b, s, h, d] * cos[s, d]
                                  + (d < D/2 ? -x[b, s, h, min(d + D/2, D-1)]
                                             :  x[b, s, h, max(d - D/2, 0)]) * sin[s, d]

The subscripts per input axis (frontend AxisMap: floor((sum c*o + offset) / den), then a
boundary)::

    slice x[1:9:2]        ->  x[2*o + 1]
    pad constant (lo = 2) ->  x[(o - 2) mod n]       (masked: a select discards the padding's reads)
    pad reflect (lo = 2)  ->  x[(n-1) - |(n-1) - ((o - 2) mod 2(n-1))|]      (piecewise)
    tile                  ->  x[o mod n]
    resize nearest (x2)   ->  x[min(max(floor((2*o + 0) / 4), 0), n-1)]    (quasi-affine)

Preconditions, each checked (negative tests in tests/test_movement.py):
  1. every composed subscript stays inside its input on the reader's domain (isl: the set of
     iterations where it leaves [0, n) is empty; `LegalityError` otherwise), so inlining never
     reads outside a buffer, whatever select later discards the value;
  2. a gather is never inlined: its subscript along the axis is a loaded value, so the tensor it
     gathers from is materialized by an earlier statement (`must_materialize`) and read through
     a non-affine access (`Indirect`: the codegen adds `index * stride` at run time);
  3. isl cannot prove which element a gather reads, so dependences over-approximate it by the
     whole axis (`indirect_access`) and stitching never treats it as row-local
     (poly/stitch.py, precondition 3): no kernel is fused across a gather's dependence.

>>> import islpy as isl
>>> from panamera.frontend.movement import AxisMap, Boundary
>>> v = isl.make_zero_and_vars(["o"], [])
>>> str(axis_subscript(AxisMap(((0, 1),), offset=-2, boundary=Boundary.REFLECT), [v["o"]], v[0], 4).eval(
...     isl.Point.zero(v[0].domain().space).set_coordinate_val(isl.dim_type.set, 0, 0)))
'2'
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from ..errors import LegalityError
from ..frontend.movement import AxisMap, Boundary
from ..frontend.tensor import Tensor


@dataclass(frozen=True)
class Indirect:
    """The data-dependent part of a gather's address: `index * stride`, index in [0, extent)."""

    stride: int
    extent: int


def _val(ctx: isl.Context, v: int) -> isl.Val:
    return isl.Val.int_from_si(ctx, v)


def _abs(a: isl.PwAff) -> isl.PwAff:
    return a.max(a.neg())


def axis_subscript(
    m: AxisMap, idx: list[isl.PwAff], zero: isl.PwAff, n: int, domain: isl.Set | None = None
) -> isl.PwAff:
    """The input subscript of one axis map at the output subscripts `idx`, kept in [0, n). On a
    `domain` where the map stays inside by itself, the boundary is left out (isl decides): a
    clamp is three pieces, and the pieces of the axes multiply in the address. A MASKED read
    (a select discards it) takes the subscript modulo n: inside, in one piece."""
    ctx = zero.get_ctx()
    v = zero + m.offset
    for k, c in m.terms:
        v = v + idx[k] * c if c != 1 else v + idx[k]
    if m.den != 1:
        v = v.scale_down_val(_val(ctx, m.den)).floor()
    if n <= 0 or m.boundary == Boundary.NONE:
        return v
    if domain is not None and ((v.lt_set(zero) | v.ge_set(zero + n)) & domain).is_empty():
        return v
    if m.boundary in (Boundary.WRAP, Boundary.MASKED):
        return v.mod_val(_val(ctx, n))
    if m.boundary == Boundary.REFLECT and n > 1:  # period 2(n-1), mirrored about n-1
        q = v.mod_val(_val(ctx, 2 * (n - 1)))
        return (zero + (n - 1)) - _abs((zero + (n - 1)) - q)
    return v.max(zero).min(zero + (n - 1))  # CLAMP (and a reflection of one element)


def remap_index(t: Tensor, idx: list[isl.PwAff], zero: isl.PwAff, domain: isl.Set | None = None) -> list[isl.PwAff]:
    """The subscripts of `t.inputs[0]` that the remap `t` reads at `idx`, checked by isl to stay
    inside the input on `domain` (precondition 1 of the module docstring)."""
    src = t.inputs[0]
    subs = [axis_subscript(m, idx, zero, n, domain) for m, n in zip(t.attr("index"), src.shape)]
    if domain is not None:
        for a, (sub, n) in enumerate(zip(subs, src.shape)):
            outside = (sub.lt_set(zero) | sub.ge_set(zero + n)) & domain
            if not outside.is_empty():
                raise LegalityError(
                    f"remap {t.label!r}: subscript {a} of {src.label!r} leaves [0, {n}) "
                    f"(at {outside.sample_point()}); give its AxisMap a boundary"
                )
    return subs


def gather_subscripts(t: Tensor, idx: list[isl.PwAff], zero: isl.PwAff) -> tuple[list, list, int]:
    """(subscripts of the index tensor, subscripts of the data with 0 on the gathered axis, axis)."""
    data, ind = t.inputs
    a = t.attr("axis")
    if t.attr("elements"):
        at = list(idx)
        return at, idx[:a] + [zero] + idx[a + 1 :], a
    r = ind.ndim
    return idx[a : a + r], idx[:a] + [zero] + idx[a + r :], a


def gather_source(t: Tensor) -> Tensor:
    """The tensor whose memory gather `t` reads: its data input with reshapes looked through (a
    reshape keeps every element's C-order linear offset, so a gather from a reshaped placeholder
    reads the placeholder itself, not a copy; GatherND gathers from such a view)."""
    data = t.inputs[0]
    while data.op == "reshape":
        data = data.inputs[0]
    return data


def must_materialize(order) -> set[Tensor]:
    """Tensors gathered from that are computed (not placeholders): they become statements, so a
    gather never inlines a producer at a data-dependent point."""
    return {gather_source(t) for t in order if t.op == "gather" and gather_source(t).op != "placeholder"}


def indirect_access(addr: isl.PwAff, ind: Indirect) -> isl.Map:
    """The elements a gather may read: { d -> addr(d) + stride * t : 0 <= t < extent }."""
    v = isl.make_zero_and_vars(["a", "t"], [], ctx=addr.get_ctx())
    spread = v["a"] + v["t"] * ind.stride if ind.stride != 1 else v["a"] + v["t"]
    box = v["t"].ge_set(v[0]) & v["t"].lt_set(v[0] + ind.extent)
    m = isl.Map.from_pw_aff(spread.intersect_domain(box))  # [a, t] -> [b]
    m = m.project_out(isl.dim_type.in_, 1, 1)  # [a] -> [b], t existential
    return isl.Map.from_pw_aff(addr).apply_range(m)
