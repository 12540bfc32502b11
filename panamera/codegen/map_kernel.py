"""The MAP template: element-wise statements, `vec` consecutive elements per thread step (one
vector load per contiguous input), grid-stride over the rest."""

from __future__ import annotations

from .thread_loop import ThreadLoop


def emit_map(loop: ThreadLoop) -> list[str]:
    everything = list(range(len(loop.g.statements)))
    return loop.loops(lambda call: loop.iteration(call, everything))
