"""The partials of a reduction split over threads on the CPU target (decision.split > 1) and
their merge (codegen/cpu_kernel.py's `_Kernel` mixes these in): each task writes one partial per
(output, chunk), merged as the decision's `merge` says (schedule/cpu_mapper.py's CpuMerge) —
ORDERED: in chunk order after the tasks' barrier; LAST: by the last task of the output, found by
an acquire-release counter; ATOMIC: by compare-and-swap into a shared accumulator — then finished.
"""

from __future__ import annotations

from collections.abc import Callable

from ..schedule.cpu_mapper import CpuMerge
from .thread_loop import identity_expr


class SplitMerge:
    """Needs of its host: `g` (the group), `d` (the CpuDecision), `reductions` (statement
    indices), `owners(here)`, `finish(here, acc)` and `run_epilogues(after)`."""

    def partial_decls(self, counters: int) -> tuple[list[str], list[str]]:
        """The per-call arrays of a split plan: partials (ORDERED, LAST; chunk-major, chunk p's
        outputs at p * M: a COLUMN task's block of partials shares no cache line with another
        chunk's), a counter per output or block (LAST), one shared accumulator per output
        (ATOMIC); and the lines that free them."""
        g, d = self.g, self.d
        alloc, free = [], []
        for k in self.owners(self.reductions):
            t = g.statements[k].acc.compute
            name, n = (f"pn_acc{k}", d.M) if d.merge == CpuMerge.ATOMIC else (f"pn_part{k}", d.M * d.split)
            alloc.append(f"{t}* __restrict__ {name} = ({t}*)malloc(sizeof({t}) * {n}LL);")
            free.append(f"free({name});")
        if d.merge == CpuMerge.LAST:
            alloc.append(f"int* pn_cnt = (int*)calloc({counters}, sizeof(int));")
            free.append("free(pn_cnt);")
        return alloc, free

    def combine_partials(self) -> list[str]:
        """Output i's partials combined in chunk order (ORDERED, LAST) or its shared accumulator
        read (ATOMIC), then finished, and its epilogues."""
        g, d = self.g, self.d
        out = []
        for k in self.owners(self.reductions):
            s = g.statements[k]
            if d.merge == CpuMerge.ATOMIC:
                out.append(f"{s.acc.compute} acc{k} = pn_acc{k}[i];")
                continue
            out.append(f"{s.acc.compute} acc{k} = pn_part{k}[i];")
            out.append(
                f"for (int p = 1; p < {d.split}; ++p) acc{k} = {s.combiner.functor}::apply(acc{k}, pn_part{k}[p * {d.M}LL + i]);"
            )
        out += self.finish(self.reductions, lambda k: f"acc{k}")
        return out + self.run_epilogues(0)

    def before_tasks(self) -> list[str]:
        """ATOMIC: the shared accumulators set to the identity (the loop's barrier follows)."""
        g, d = self.g, self.d
        if d.merge != CpuMerge.ATOMIC:
            return []
        owners = self.owners(self.reductions)
        sets = " ".join(f"pn_acc{k}[i] = {identity_expr(g.statements[k])};" for k in owners)
        return ["#pragma omp for schedule(static)", f"for (pn_idx i = 0; i < {d.M}; ++i) {{ {sets} }}"]

    def deliver(self, value: Callable[[int], str]) -> list[str]:
        """A task's partial of output i (`value(k)` for owner k): stored in its chunk's slot,
        or combined into the shared accumulator by compare-and-swap (ATOMIC)."""
        g, d = self.g, self.d
        out = []
        for k in self.owners(self.reductions):
            if d.merge == CpuMerge.ATOMIC:
                out.append(f"pn_atomic_combine<{g.statements[k].combiner.functor}>(&pn_acc{k}[i], {value(k)});")
            else:
                out.append(f"pn_part{k}[pn_p * {d.M}LL + i] = {value(k)};")
        return out

    def tasks_pragma(self) -> str:
        """The work-sharing of the tasks' loop: LAST ends the parallel region with it, so it does
        not wait at its end (`nowait`: the region's join is the one barrier, where a barrier
        there and the join each cost a wake-up of a sleeping thread under a passive pool)."""
        return "#pragma omp for schedule(static)" + (" nowait" if self.d.merge == CpuMerge.LAST else "")

    def last_of(self, counter: str) -> str:
        """LAST: the condition that this task is the last of its output (or block) to finish; the
        acquire-release increment makes the other tasks' partials visible to it."""
        return f"if (std::atomic_ref<int>({counter}).fetch_add(1, std::memory_order_acq_rel) == {self.d.split - 1}) {{"

    def after_tasks(self) -> list[str]:
        """ORDERED and ATOMIC: after the tasks' barrier, each output merged and finished."""
        if self.d.merge == CpuMerge.LAST:
            return []
        out = [
            "#pragma omp for schedule(static) nowait",
            f"for (pn_idx i = 0; i < {self.d.M}; ++i) {{",
        ]  # the region's end
        return out + ["  " + ln for ln in self.combine_partials()] + ["}"]
