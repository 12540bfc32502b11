"""How a CPU row scan spreads each reduction's accumulator over its W lanes (`LaneKind`, decided
once here from the statement; codegen/cpu_lanes.py emits it, schedule/cpu_cost.py costs it), and
how many vector registers of lanes a pass steps (`pass_vectors`: W = that x the decision's lanes;
each pass's, `group_vectors`, carried on the decision as `CpuDecision.vectors`).
"""

from __future__ import annotations

from ..enums import StrEnum
from ..model.cpu import LANE_VECTORS, TRANSCENDENTAL
from ..poly.params import PStatement
from ..poly.program import KernelGroup
from ..poly.statement import Form, Statement, StatementKind
from ..poly.stitch import levels

LANE_TYPES = ("float", "double", "int", "long long")  # value types pn_lim knows
FLAGGED_COMBINERS = ("max", "min")


class LaneKind(StrEnum):
    """How a reduction's accumulator spreads over W lanes in `lanes_pass`."""

    NONE = "none"  # a struct accumulator (Welford, log-sum-exp): one per scan, as before
    PLAIN = "plain"  # a scalar accumulator: W of them, folded by the combiner
    FLAGGED = "flagged"  # a float max/min: W plain compares and W sums watching for a NaN (codegen/cpu_lanes.py)
    ARG = "arg"  # an argmax/argmin key of an index rising with j: (value, offset in the block) per lane


def lane_kind(s: Statement | PStatement) -> LaneKind:
    """The lanes of reduction statement s (LaneKind), static (poly/statement.py) or symbolic
    (poly/params.py: schedule/cpu_param_mapping.py `arg_lanes` asks this too): an argmax/argmin
    scans in ARG lanes where its index read rises with j (`rises_with_j`, each read type's own
    answer from its address or its axes).

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
    if x.op == "load" and s.reads[x.read].rises_with_j(s):
        return LaneKind.ARG
    return LaneKind.PLAIN  # a key per element, as before (the last index, an index from elsewhere)


def pass_vectors(statements: list[Statement]) -> int:
    """The vector registers of lanes each reduction of one row pass over `statements` steps:
    LANE_VECTORS, so that a cheap body (a sum, a max) runs at the speed of its loads rather than of
    one register's add latency; 1 where a body of the pass evaluates a transcendental (softmax's
    exp pass): each vector's own work (~25 instructions for exp) outlasts the add latency more
    registers would hide, and on a 16-register ISA (AVX2) LANE_VECTORS accumulators beside exp's
    constants and temporaries spill, and fold in more steps. AMD EPYC AVX2, 1 thread, kernel level
    (CPU time, 41 interleaved rounds, 2026-11-25, load 11-12; with the register-wide lane folds),
    median / min: softmax [8x128256] 870 / 767 -> 798-836 / 667-738 us, softmax [64x30522]
    2532-2545 / 2098-2132 -> 2381-2430 / 1973-1985 us, log_softmax [64x30522] 2205-2257 /
    1909-1946 -> 2102-2241 / 1814-1851 us (a different sum tree: last-bit changes, 3.6e-7 relative at
    most); softmax [6144x128] unchanged.

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> x = pn.placeholder((4, 50), "float32")
    >>> [pass_vectors(list(lower(y, target="cpu", stop_after="groups").groups[0].statements))
    ...  for y in (pn.sum(x, axis=1), pn.sum(pn.exp(x), axis=1))] == [LANE_VECTORS, 1]
    True
    """
    heavy = any(e.op in TRANSCENDENTAL for s in statements for e in s.body.walk())
    return 1 if heavy else LANE_VECTORS


def group_vectors(g: KernelGroup) -> tuple[int, ...]:
    """`pass_vectors` of each row pass of group g, by its pass (poly/stitch.py `levels`; one pass
    unless stitched) over the statements it scans (an epilogue, a MAP-form statement, runs once
    a row and scans nothing): decided once, for the mapper's decision (`CpuDecision.vectors`,
    which codegen/cpu_lanes.py reads), the cost (schedule/cpu_cost.py) and the rows
    (schedule/cpu_rows.py).

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> x = pn.placeholder((4, 50), "float32")
    >>> e = pn.exp(x - pn.max(x, axis=1, keepdims=True))
    >>> group_vectors(lower(e / pn.sum(e, axis=1, keepdims=True), target="cpu", stop_after="groups").groups[0])
    (4, 1, 1)
    """
    lv = levels(g.statements) if g.stitched else {}
    passes: list[list[Statement]] = [[] for _ in range(max(lv.values(), default=0) + 1)]
    for s in g.statements:
        if not (s.kind == StatementKind.MAP and s.form == Form.MAP):
            passes[lv.get(s.name, 0)].append(s)
    return tuple(pass_vectors(ss) for ss in passes)
