"""How a CPU row scan spreads each reduction's accumulator over its W lanes (`LaneKind`, decided
once here from the statement; codegen/cpu_lanes.py emits it, schedule/cpu_cost.py costs it).
"""

from __future__ import annotations

import islpy as isl

from ..enums import StrEnum
from ..poly.statement import Statement

LANE_TYPES = ("float", "double", "int", "long long")  # value types pn_lim knows
FLAGGED_COMBINERS = ("max", "min")


class LaneKind(StrEnum):
    """How a reduction's accumulator spreads over W lanes in `lanes_pass`."""

    NONE = "none"  # a struct accumulator (Welford, log-sum-exp): one per scan, as before
    PLAIN = "plain"  # a scalar accumulator: W of them, folded by the combiner
    FLAGGED = "flagged"  # a float max/min: W plain compares and W sums watching for a NaN (codegen/cpu_lanes.py)
    ARG = "arg"  # an argmax/argmin key of an index rising with j: (value, offset in the block) per lane


def lane_kind(s: Statement) -> LaneKind:
    """The lanes of reduction statement s (LaneKind).

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> x = pn.placeholder((4, 50), "float32")
    >>> [lane_kind(lower(y, target="cpu", stop_after="groups").groups[0].statements[0]).value
    ...  for y in (pn.sum(x, axis=1), pn.argmax(x, axis=1), pn.argmax(x, axis=1, last=True), pn.var(x, axis=1),
    ...            pn.max(x, axis=1), pn.max(x.astype("int32"), axis=1))]
    ['plain', 'arg', 'plain', 'none', 'flagged', 'plain']
    """
    if s.acc.is_struct:
        return LaneKind.NONE
    if s.combiner.name in FLAGGED_COMBINERS and s.acc.compute in ("float", "double"):
        return LaneKind.FLAGGED
    b = s.body
    if not b.op.startswith("argkey_") or b.args[0].dtype.compute not in LANE_TYPES:
        return LaneKind.PLAIN
    x = b.args[1]
    if x.op == "load" and not s.reads[x.read].memory and _rises_with_j(s.reads[x.read].addr):
        return LaneKind.ARG
    return LaneKind.PLAIN  # a key per element, as before (the last index, an index from elsewhere)


def _rises_with_j(addr: isl.PwAff) -> bool:
    """Whether an index (an iota's address over the canonical domain) grows with j, one per step."""
    pos = addr.get_space().find_dim_by_name(isl.dim_type.in_, "j")
    if pos < 0:
        return False
    return all(aff.get_coefficient_val(isl.dim_type.in_, pos).is_one() for _, aff in addr.get_pieces())
