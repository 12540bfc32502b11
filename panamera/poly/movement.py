"""Data movement in the polyhedral model: remaps as piecewise quasi-affine subscripts, gathers as
non-affine reads.

A remap (frontend/movement.py) is never a statement: the statement that reads it reads its input
through the composed access, built here with isl from the output subscripts (PwAffs over the
reader's named domain dims)::

    slice x[1:9:2]        ->  x[2*o + 1]
    pad reflect (lo = 2)  ->  x[(n-1) - |(n-1) - ((o - 2) mod 2(n-1))|]      (piecewise)
    tile                  ->  x[o mod n]
    resize nearest (x2)   ->  x[min(max(floor((2*o + 0) / 4), 0), n-1)]    (quasi-affine)

A gather's subscript along its axis is a loaded value. `gather_read` keeps the affine part of
the address and the axis' stride; the codegen adds `index * stride` to it at run time, and
dependences (poly/dependences.py) over-approximate the read as the whole axis
(`indirect_access`): isl then never proves such a read row-local, so nothing is stitched across
it, and the gathered tensor is materialized before the gathering statement (`must_materialize`).

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


def axis_subscript(m: AxisMap, idx: list[isl.PwAff], zero: isl.PwAff, n: int) -> isl.PwAff:
    """The input subscript of one axis map at the output subscripts `idx`, kept in [0, n)."""
    ctx = zero.get_ctx()
    v = zero + m.offset
    for k, c in m.terms:
        v = v + idx[k] * c if c != 1 else v + idx[k]
    if m.den != 1:
        v = v.scale_down_val(_val(ctx, m.den)).floor()
    if n <= 0 or m.boundary == Boundary.NONE:
        return v
    if m.boundary == Boundary.WRAP:
        return v.mod_val(_val(ctx, n))
    if m.boundary == Boundary.REFLECT and n > 1:  # period 2(n-1), mirrored about n-1
        q = v.mod_val(_val(ctx, 2 * (n - 1)))
        return (zero + (n - 1)) - _abs((zero + (n - 1)) - q)
    return v.max(zero).min(zero + (n - 1))  # CLAMP (and a reflection of one element)


def remap_index(t: Tensor, idx: list[isl.PwAff], zero: isl.PwAff) -> list[isl.PwAff]:
    """The subscripts of `t.inputs[0]` that the remap `t` reads at `idx`."""
    src = t.inputs[0]
    return [axis_subscript(m, idx, zero, n) for m, n in zip(t.attr("index"), src.shape)]


def gather_subscripts(t: Tensor, idx: list[isl.PwAff], zero: isl.PwAff) -> tuple[list, list, int]:
    """(subscripts of the index tensor, subscripts of the data with 0 on the gathered axis, axis)."""
    data, ind = t.inputs
    a = t.attr("axis")
    if t.attr("elements"):
        at = list(idx)
        return at, idx[:a] + [zero] + idx[a + 1 :], a
    r = ind.ndim
    return idx[a : a + r], idx[:a] + [zero] + idx[a + r :], a


def must_materialize(order) -> set[Tensor]:
    """Tensors gathered from that are computed (not placeholders): they become statements, so a
    gather never inlines a producer at a data-dependent point."""
    return {t.inputs[0] for t in order if t.op == "gather" and t.inputs[0].op != "placeholder"}


def indirect_access(addr: isl.PwAff, ind: Indirect) -> isl.Map:
    """The elements a gather may read: { d -> addr(d) + stride * t : 0 <= t < extent }."""
    v = isl.make_zero_and_vars(["a", "t"], [], ctx=addr.get_ctx())
    spread = v["a"] + v["t"] * ind.stride if ind.stride != 1 else v["a"] + v["t"]
    box = v["t"].ge_set(v[0]) & v["t"].lt_set(v[0] + ind.extent)
    m = isl.Map.from_pw_aff(spread.intersect_domain(box))  # [a, t] -> [b]
    m = m.project_out(isl.dim_type.in_, 1, 1)  # [a] -> [b], t existential
    return isl.Map.from_pw_aff(addr).apply_range(m)
