"""Bounded isl questions: a cap on the work isl may spend on a question that only enables an
optimization, so that compile time stays bounded whatever the subscripts look like.

isl's emptiness and equality tests are exponential in the worst case (integer feasibility over
existentially quantified divisions), and a subscript can carry many pieces: a 3-D pooling window
clamps each of its three axes (3 pieces each, 27 in all) and coalescing adds floor/mod divisions
of i and j, so "do rows i and i + 4 read one address?" compares 27 x 27 pieces and ran for
minutes. The mapper asks such questions only to enable an optimization (a contiguous or uniform
read, a register tile's shared operand, an aligned asynchronous copy); "no" is always a legal
answer there: it costs a scalar load or a tile, never a wrong kernel.

Rule: such a question runs under `MAX_OPERATIONS` isl operations (isl_ctx_set_max_operations:
isl's own count, deterministic, so every machine and every load gives the same answer, and a
saved schedule replays to the same decision); past the cap it takes its conservative answer.
The cap is ten times what the most demanding question of bench/'s 170 workloads needs (every one
of their 7454 questions is answered within 10^4 operations, measured; so their decisions and the
schedules/ entries replay unchanged) and costs a fraction of a second. Legality questions (dependences,
coalescing, stitching) are not bounded here: their answer must be exact.

>>> import islpy as isl
>>> s = isl.Set("{ [i] : 0 <= i < 4 and i > 5 }")
>>> proven_empty(s.get_ctx(), lambda: s), proven_empty(s.get_ctx(), lambda: s.universe(s.space))
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable

import islpy as isl

MAX_OPERATIONS = 100_000  # isl operations a bounded question may spend (about 0.2 s at worst here)
_QUOTA = "maximal number of operations exceeded"


def decide(ctx: isl.Context, question: Callable[[], bool], fallback: bool) -> bool:
    """`question()` under the operations cap on `ctx`; `fallback` (the conservative answer) when
    isl runs past it. The question calls isl on isl objects only (a Python number converted to an
    isl object inside it could fail past the cap as a TypeError of the binding, not isl.Error),
    and never asks another bounded question (not re-entrant)."""
    previous = ctx.get_max_operations()
    ctx.set_max_operations(MAX_OPERATIONS)
    ctx.reset_operations()
    try:
        return question()
    except isl.Error as e:
        if _QUOTA not in str(e):
            raise
        return fallback
    finally:
        ctx.set_max_operations(previous)
        ctx.reset_operations()


def proven_empty(ctx: isl.Context, build: Callable[[], isl.Set]) -> bool:
    """Whether isl proves the set that `build()` makes (in `ctx`) empty within the cap; building
    it counts too (the pieces of a difference of subscripts are made there). False when isl runs
    past the cap: emptiness not proven."""
    return decide(ctx, lambda: build().is_empty(), False)
