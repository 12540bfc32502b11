"""The partials of a reduction split over threads on the CPU target (decision.split > 1) and
their merge (codegen/cpu_kernel.py's `_Kernel` mixes these in): each task writes one partial per
(output, chunk), merged as the decision's `merge` says (model/cpu.py's CpuMerge, chosen by
schedule/cpu_mapper.py's `merge_mode`) — LAST: in chunk order by the last task of the output, found
by an acquire-release counter; ATOMIC: by compare-and-swap into a shared accumulator — then finished.
"""

from __future__ import annotations

from collections.abc import Callable

from ..schedule.cpu_mapper import CpuMerge
from .thread_loop import identity_expr

# The ATOMIC merge: a task's partial combined into a shared accumulator by compare-and-swap, with
# the combiner's functor (header.py), for any scalar accumulator (in every CPU source's preamble:
# cpu_target.py `cpu_source`).
ATOMIC_COMBINE = """#include <atomic>
template <class F, class T> static inline void pn_atomic_combine(T* p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load(std::memory_order_relaxed);
  while (!r.compare_exchange_weak(old, F::apply(old, v), std::memory_order_relaxed)) {}
}
"""


def tasks_pragma(merge: CpuMerge) -> str:
    """The work-sharing of a split's tasks' loop (static and symbolic kernels: this and the
    helpers below are the one source of the merge's OpenMP lines): LAST ends the parallel region
    with it, so it does not wait at its end (`nowait`: the region's join is the one barrier,
    where a barrier there and the join each cost a wake-up of a sleeping thread under a passive
    pool)."""
    return "#pragma omp for schedule(static)" + (" nowait" if merge == CpuMerge.LAST else "")


def last_of(counter: str, split: int) -> str:
    """LAST: the condition that this task is the last of the `split` of its output (or block) to
    finish; the acquire-release increment makes the other tasks' partials visible to it."""
    return f"if (std::atomic_ref<int>({counter}).fetch_add(1, std::memory_order_acq_rel) == {split - 1}) {{"


def before_tasks(merge: CpuMerge, outputs: int | str, sets: str) -> list[str]:
    """ATOMIC: the shared accumulators of the `outputs` outputs set (`sets`, C statements over i)
    before the tasks (the work-sharing loop's barrier follows); nothing for the other merges."""
    if merge != CpuMerge.ATOMIC:
        return []
    return ["#pragma omp for schedule(static)", f"for (pn_idx i = 0; i < {outputs}; ++i) {{ {sets} }}"]


def after_tasks(merge: CpuMerge, outputs: int | str, combine: list[str]) -> list[str]:
    """ATOMIC: after the tasks' barrier, each output i read back and finished (`combine`), the
    region's last loop; nothing for LAST (each output's last task finished it)."""
    if merge != CpuMerge.ATOMIC:
        return []
    head = ["#pragma omp for schedule(static) nowait", f"for (pn_idx i = 0; i < {outputs}; ++i) {{"]
    return head + ["  " + ln for ln in combine] + ["}"]


class SplitMerge:
    """Needs of its host: `g` (the group), `d` (the CpuDecision), `reductions` (statement
    indices), `owners(here)`, `finish(here, acc)` and `run_epilogues(after)`."""

    def partial_decls(self, counters: int) -> tuple[list[str], list[str]]:
        """The per-call arrays of a split plan: partials (LAST; chunk-major, chunk p's
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
        """Output i's partials combined in chunk order (LAST) or its shared accumulator
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
        """ATOMIC: the shared accumulators set to the identity (`before_tasks`)."""
        owners = self.owners(self.reductions)
        sets = " ".join(f"pn_acc{k}[i] = {identity_expr(self.g.statements[k])};" for k in owners)
        return before_tasks(self.d.merge, self.d.M, sets)

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
        return tasks_pragma(self.d.merge)

    def last_of(self, counter: str) -> str:
        return last_of(counter, self.d.split)

    def after_tasks(self) -> list[str]:
        """ATOMIC: after the tasks' barrier, each output read back and finished."""
        return after_tasks(self.d.merge, self.d.M, self.combine_partials() if self.d.merge == CpuMerge.ATOMIC else [])
