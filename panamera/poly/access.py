"""Access analysis: how a read moves along a canonical loop, decided by isl.

The mapper chooses the vector width from it and records the kind of every read in the mapping
(schedule/mapping.py); the codegen loads each read as the mapping says and never asks again.

>>> import islpy as isl
>>> from panamera.poly.statement import box
>>> dom, v = box(isl.Context(), ["i", "j"], [4, 8])
>>> from panamera.frontend.tensor import placeholder
>>> row = Read(placeholder((4, 8), "float32"), v["i"] * 8 + v["j"])
>>> access_kind(row, "j", 4, dom), access_kind(row, "i", 4, dom)
(<AccessKind.CONTIG: 'contig'>, <AccessKind.GATHER: 'gather'>)
"""

from __future__ import annotations

import islpy as isl

from ..enums import StrEnum
from .bounded import proven_empty
from .statement import Read, Statement


class AccessKind(StrEnum):
    CONTIG = "contig"  # `vec` consecutive iterations read `vec` consecutive, aligned elements: one vector load
    UNIFORM = "uniform"  # they all read one element (a broadcast)
    GATHER = "gather"  # anything else: one scalar load per iteration


def access_kind(read: Read, along: str, vec: int, domain: isl.Set) -> AccessKind:
    """CONTIG when groups of `vec` consecutive values of `along` read consecutive, aligned
    elements; UNIFORM when they all read one element; GATHER otherwise, or when isl cannot tell
    within its bounded work (poly/bounded.py)."""
    if vec == 1 or not read.memory or read.indirect is not None:  # a gather's address is loaded
        return AccessKind.GATHER
    ctx = domain.get_ctx()
    v = isl.make_zero_and_vars(["i", "j"], [], ctx=ctx)
    dom = domain.reset_tuple_id()
    a, shift, zero, one = read.addr, _shift(ctx, along), v[0], v[0] + 1
    width = isl.Val.int_from_si(ctx, vec)
    inner = v[along].mod_val(width).ne_set(v[0] + (vec - 1)) & dom
    first = v[along].mod_val(width).eq_set(zero) & dom
    diff: list[isl.PwAff] = []  # the address step to the next iteration, made once

    def steps_other_than(by: isl.PwAff) -> isl.Set:  # isl calls only: they run under the cap
        if not diff:
            diff.append(a.pullback_multi_aff(shift) - a)
        return diff[0].ne_set(by) & inner

    # isl's work is capped (poly/bounded.py): GATHER when it cannot tell
    if proven_empty(ctx, lambda: steps_other_than(zero)):
        return AccessKind.UNIFORM
    aligned = proven_empty(ctx, lambda: a.mod_val(width).ne_set(zero) & first)
    if aligned and proven_empty(ctx, lambda: steps_other_than(one)):
        return AccessKind.CONTIG
    return AccessKind.GATHER


def _shift(ctx, along: str) -> isl.MultiAff:
    """(i, j) -> (i + 1, j) or (i, j + 1)."""
    sp = isl.Space.create_from_names(ctx, in_=["i", "j"], out=["i", "j"])
    ma = isl.MultiAff.identity(sp)
    pos = 0 if along == "i" else 1
    return ma.set_aff(pos, ma.get_aff(pos).add_constant_val(isl.Val.one(ctx)))


def access_kinds(statements, along: str, vec: int) -> tuple[tuple[AccessKind, ...], ...]:
    """The kind of every read of every statement, along one canonical loop."""
    return tuple(tuple(access_kind(r, along, vec, s.domain) for r in s.reads) for s in statements)


def vector_widths(itemsizes) -> tuple[int, ...]:
    """The vector widths a load may take, widest first: at most 16 bytes of the widest element (4
    floats, 8 halves, 16 bools). The static mapper (`choose_vec`) and the class plans
    (schedule/param_mapping.py `widest_vec`) try these.

    >>> vector_widths([4, 2]), vector_widths([1]), vector_widths([8])
    ((4, 2), (16, 8, 4, 2), (2,))
    """
    widest = max(itemsizes, default=4)
    return tuple(v for v in (16, 8, 4, 2) if v * widest <= 16)


def choose_vec(statements: tuple[Statement, ...], along: str, extent: int) -> int:
    """The widest vector that divides the extent, keeps every contiguous read aligned and every
    read loaded per lane within 16 bytes (`loads_fit`): tried from `vector_widths` of the
    narrowest input, since a read UNIFORM along `along` (a row's fp32 mean beside its bf16
    values) is one scalar, not a vector."""
    widths = [r.tensor.dtype.itemsize for s in statements for r in s.reads if r.memory]
    for vec in vector_widths([min(widths, default=4)]):
        if vec_fits(statements, along, extent, vec):
            return vec
    return 1


def loads_fit(statements, along: str, vec: int) -> bool:
    """Whether every read keeps within 16 bytes per load at vector width `vec`: `vec` lanes of
    its type, unless isl finds it UNIFORM along `along` (one scalar every lane shares). The one
    rule the mapper (`vec_fits`) and replay (schedule/replay.py rule 3) apply.

    >>> import islpy as isl
    >>> from types import SimpleNamespace
    >>> from panamera.poly.statement import box
    >>> from panamera.frontend.tensor import placeholder
    >>> dom, v = box(isl.Context(), ["i", "j"], [4, 8])
    >>> row = Read(placeholder((4, 8), "bfloat16", name="x"), v["i"] * 8 + v["j"])
    >>> mean = Read(placeholder((4, 1), name="mean"), v["i"])
    >>> st = SimpleNamespace(domain=dom, reads=(row, mean))  # the parts of a Statement it reads
    >>> loads_fit([st], "j", 8), [r.tensor.name for r in too_wide([st], "i", 8)]
    (True, ['mean'])
    """
    return not too_wide(statements, along, vec)


def too_wide(statements, along: str, vec: int) -> tuple[Read, ...]:
    """The reads `vec` lanes of which exceed 16 bytes and that are not UNIFORM along `along`."""
    return tuple(
        r
        for s in statements
        for r in s.reads
        if r.memory
        and vec * r.tensor.dtype.itemsize > 16
        and access_kind(r, along, vec, s.domain) != AccessKind.UNIFORM
    )


def vec_fits(statements, along: str, extent: int, vec: int) -> bool:
    """`vec` divides the extent, every input keeps within 16 bytes per load (`loads_fit`), and at
    least one read is contiguous at that width (else a vector gains nothing)."""
    if extent % vec or not loads_fit(statements, along, vec):
        return False
    return any(k == AccessKind.CONTIG for kinds in access_kinds(statements, along, vec) for k in kinds)
