"""Formulation choice is planning: where the frontend offers several formulations of one value
(softmax's online statistics or separate max and sum passes), the planner picks one.

The frontend only builds graphs: `frontend.tensor.alternatives` makes a "choose" node whose
inputs are the formulations. This stage replaces every choose node, innermost first, by the
formulation whose plan the performance model prefers (`cost`: the modeled µs of a formulation
compiled alone), or by the one a replayed schedule names, and records what it chose.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ScheduleError, Unsupported
from ..frontend.tensor import Tensor, _ids, topological
from ..frontend.walk import evaluate


@dataclass(frozen=True)
class Formulation:
    op: str  # what the choice is for ("softmax")
    names: tuple[str, ...]  # the formulations offered
    chosen: str
    costs_us: tuple[float, ...] = ()  # modeled µs of each formulation; empty when replayed
    # each formulation barred by a deterministic compile (its cost infinite); another infinite
    # cost is a form that cannot take this graph (the compiler's cost says so)
    barred: tuple[bool, ...] = ()

    @property
    def record(self) -> str:
        """How a schedule saves the choice."""
        return f"{self.op}={self.chosen}"

    def describe(self) -> str:
        if not self.costs_us:
            return f"{self.op}: {self.chosen} (from the schedule)"
        barred = self.barred or (False,) * len(self.names)
        vs = " vs ".join(
            f"{n} {c:.1f} us" if c != math.inf else f"{n} (not deterministic)" if b else f"{n} (cannot take this graph)"
            for n, c, b in zip(self.names, self.costs_us, barred)
        )
        return f"{self.op}: {vs} (modeled) -> {self.chosen}"


def _choice_points(outputs) -> list[Tensor]:
    """The choose nodes reachable from the outputs, innermost (inputs) first."""
    return [t for t in topological(outputs) if t.op == "choose"]


def substitute(outputs: tuple[Tensor, ...], by: dict[int, Tensor]) -> tuple[Tensor, ...]:
    """The graph with every tensor whose uid is in `by` replaced; tensors downstream of a
    replacement are rebuilt (new uids), everything else is shared."""
    memo: dict[int, Tensor] = {}

    def sources(t: Tensor) -> tuple[Tensor, ...]:  # a replaced tensor stands for its replacement
        return (by[t.uid],) if t.uid in by else t.inputs

    def rebuild(t: Tensor, new: list[Tensor]) -> Tensor:
        if t.uid in by:
            return new[0]
        same = all(a is b for a, b in zip(new, t.inputs))
        return t if same else dataclasses.replace(t, inputs=tuple(new), uid=next(_ids))

    return tuple(evaluate(o, lambda t: t.uid, sources, rebuild, memo) for o in outputs)  # iterative


# Ops whose result depends on the order of their atomic adds (frontend/scatter.py's indirect write).
NONDETERMINISTIC = frozenset({"scatter_add"})


def nondeterministic(outputs) -> Tensor | None:
    """The first tensor of the graph whose value depends on the order of atomic adds, or None."""
    return next((t for t in topological(outputs) if t.op in NONDETERMINISTIC), None)


def choose_formulations(
    outputs: tuple[Tensor, ...],
    cost: Callable[[tuple[Tensor, ...]], float],
    saved: tuple[str, ...] | None = None,
    deterministic: bool = False,
) -> tuple[tuple[Tensor, ...], tuple[Formulation, ...]]:
    """The outputs with every choose node replaced, and the choices made (in graph order).
    `saved`: the choices of a replayed schedule ("op=name" each), checked against the graph.
    `deterministic`: a formulation with atomic adds in any order (`NONDETERMINISTIC`) is never
    chosen, and a graph left with one is refused (`Unsupported`)."""
    points = _choice_points(outputs)
    if saved is not None and len(saved) != len(points):
        raise ScheduleError(f"schedule chooses {len(saved)} formulation(s), the program has {len(points)}")
    chosen, by = [], {}
    for k, t in enumerate(points):
        op, names = t.attr("formulation"), t.attr("names")
        # Formulations are graphs too: inner choices are made before the outer ones are costed.
        alternatives = substitute(t.inputs, by)
        if saved is not None:
            want_op, _, name = saved[k].partition("=")
            if want_op != op or name not in names:
                raise ScheduleError(
                    f"schedule formulation {k} is {saved[k]!r}, but the program chooses {op} among {list(names)}"
                )
            f = Formulation(op, names, name)
        else:
            barred = tuple(deterministic and nondeterministic((alt,)) is not None for alt in alternatives)
            costs = tuple(math.inf if b else cost((alt,)) for alt, b in zip(alternatives, barred))
            f = Formulation(op, names, names[costs.index(min(costs))], costs, barred)
        chosen.append(f)
        by[t.uid] = alternatives[names.index(f.chosen)]
    graph = substitute(outputs, by) if by else outputs
    bad = nondeterministic(graph) if deterministic else None
    if bad is not None:
        raise Unsupported(
            f"{bad.op} {bad.label!r}: atomic adds in any order are not deterministic, and no deterministic "
            "formulation of it is offered (frontend/scatter.py: the owner-computes form is bounded by MAX_TERMS; "
            "sorted segments take a scatter compiled alone, its index and source inputs: segments.py); "
            "compile without deterministic=True, or compile the scatter alone"
        )
    return graph, tuple(chosen)
