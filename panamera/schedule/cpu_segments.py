"""The CPU plan of a deterministic scatter-add of rows (frontend/scatter.py `scatter_add_sorted`,
`out[ids[t]] += src[t]`): two strategies, both bit-stable across runs and thread counts, and the
CPU model (model/cpu.py) keeps the cheaper.

**Privatized** (`CpuScatterForm.PRIVATIZED`): the ids are cut into `chunks` fixed ranges (the
machine's cores, decided here at compile time, never the call's thread count); each chunk adds its
source rows, in position order, into a private table of its own (zeroed first); then each row of
the output is the sum of the chunks' tables in chunk order. Work `chunks × table` on top of the
source: it suits small tables and many ids.

**Sorted segments** (`CpuScatterForm.SORTED`): a stable counting sort of the positions by id (a
histogram of the rows, its prefix sum, the positions placed in order: one thread, `n + rows`
steps), then the rows are split across the threads, each row summing its segment's source rows
in position order (rows no id names are zero). Every row's sum depends on the ids alone. Work:
the table once and the source once, plus the sort: it suits large tables.

Both accumulate 16-bit floats in float32 and round once at the write, as the GPU's kernels do.
The plan's `threads` is the model's choice with the form (every core unless one thread is
modeled faster, as `cpu_cost.best_threads`): a one-thread plan's kernel opens no parallel region
(codegen/cpu_region.py), and a call asking for more threads runs on the plan's.

>>> from panamera.dtypes import as_dtype
>>> from panamera.model.cpu import CpuModel
>>> m = CpuModel.nominal(cores=2, simd_bytes=32)
>>> i64, f32 = as_dtype("int64"), as_dtype("float32")
>>> plan_cpu_scatter(ScatterProblem(8192, 50257, 768, i64, f32), m).form.value
'sorted_segments'
>>> plan_cpu_scatter(ScatterProblem(1 << 20, 16, 64, i64, f32), m).form.value
'privatized'
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..dtypes import DType
from ..errors import OptionError
from ..model.cpu import CpuModel, CpuWork, kernel_time
from .scatter_problem import OfProblem, ScatterProblem

PRIVATE_MAX = 64 << 20  # bytes of private tables (chunks x table) the privatized form may take


class CpuScatterForm(Enum):
    """The two CPU strategies of a deterministic scatter-add."""

    PRIVATIZED = "privatized"
    SORTED = "sorted_segments"


@dataclass(frozen=True)
class CpuScatterPlan(OfProblem):
    """The decision for `problem` (its fields read on the plan: `p.n`, `p.rows`, ...): `form`,
    `chunks` (the privatized form's fixed ranges of ids; 1 for sorted segments), each offered
    form's modeled time on the plan's threads (`costs`, µs, *modeled*) and `threads`, the most the
    kernel runs on (1: no parallel region)."""

    form: CpuScatterForm
    problem: ScatterProblem
    chunks: int
    costs: tuple[tuple[CpuScatterForm, float], ...]
    threads: int = 1

    @property
    def modeled_us(self) -> float:
        return dict(self.costs)[self.form]

    def describe(self) -> str:
        """One line: the form, its geometry and the modeled times of the forms offered."""
        what = (
            f"{self.chunks} private tables merged in chunk order"
            if self.form == CpuScatterForm.PRIVATIZED
            else ("a stable counting sort of the ids, then whole segments per thread")
        )
        costs = ", ".join(f"{f.value} {us:.1f} us" for f, us in self.costs)
        return (
            f"{self.form.value}: {self.n} ids into {self.rows}x{self.width}, {what} on {self.threads} thread(s) "
            f"(modeled: {costs})"
        )


def _acc_bytes(src: DType) -> int:
    return 4 if src.is_16bit_float else src.itemsize


def privatized_us(
    n: int, rows: int, width: int, ids: DType, src: DType, chunks: int, m: CpuModel, threads: int | None = None
) -> float:
    """Modeled µs of the privatized form on `threads` (default: every core): the chunks' pass (each
    zeroes its table, reads its ids and source rows and adds them into the table), a barrier, the
    merge over rows (every table read, the output written)."""
    t = max(1, threads or m.cores)
    a, table = _acc_bytes(src), rows * width
    add = CpuWork(
        M=chunks,
        N=n * width // max(chunks, 1),
        elements=n * width + chunks * table,
        read_bytes=n * (ids.itemsize + width * src.itemsize) + chunks * table * a,
        write_bytes=chunks * table * a,
        cheap=2.0,
    )
    merge = CpuWork(M=rows, N=chunks * width, elements=chunks * table, read_bytes=chunks * table * a,
                    write_bytes=table * src.itemsize)  # fmt: skip
    one = kernel_time(add, m, tasks=chunks, split=1, threads=t)
    two = kernel_time(merge, m, tasks=rows, split=1, threads=t)
    return one.total_us + two.total_us - two.fork_us + m.rates.fork(t) / 2  # one region, a barrier


def sorted_us(n: int, rows: int, width: int, ids: DType, src: DType, m: CpuModel, threads: int | None = None) -> float:
    """Modeled µs of sorted segments on `threads` (default: every core): the counting sort on one thread (the ids read twice, the
    counts zeroed, scanned and bumped, the positions written: scalar steps with a dependent
    load each), a barrier, then the rows across the threads (each segment's source rows read
    once, every row of the output written once)."""
    sort = CpuWork(
        M=1,
        N=n,
        elements=2 * n + 2 * rows,
        read_bytes=2 * n * ids.itemsize + (rows + n) * 8,
        write_bytes=(rows + 1) * 8 + n * 8,
        cheap=4.0,
        width=8,
    )
    table = rows * width
    own = CpuWork(M=rows, N=width, elements=n * width + table, read_bytes=n * (8 + width * src.itemsize) + rows * 8,
                  write_bytes=table * src.itemsize)  # fmt: skip
    t = max(1, threads or m.cores)
    one = kernel_time(sort, m, tasks=1, split=1, threads=1)
    two = kernel_time(own, m, tasks=rows, split=1, threads=t)
    return one.total_us + two.total_us - two.fork_us + m.rates.fork(t) / 2


def plan_cpu_scatter(
    problem: ScatterProblem, m: CpuModel, form: CpuScatterForm | None = None, chunks: int | None = None
) -> CpuScatterPlan:
    """The CPU plan of `problem` (n ids into a `rows x width` table): the form the model prefers
    (or `form`, pinned: the tests check both give the same bits), the privatized form's `chunks`
    (default: the machine's cores; offered only while `chunks x table` takes at most PRIVATE_MAX
    bytes)."""
    n, rows, width, ids, src = problem.n, problem.rows, problem.width, problem.ids, problem.src
    c = max(1, chunks if chunks is not None else m.cores)

    def costs_on(t: int) -> list[tuple[CpuScatterForm, float]]:
        out = [(CpuScatterForm.SORTED, sorted_us(n, rows, width, ids, src, m, t))]
        if c * rows * width * _acc_bytes(src) <= PRIVATE_MAX:
            out.insert(0, (CpuScatterForm.PRIVATIZED, privatized_us(n, rows, width, ids, src, c, m, t)))
        return out

    offered = dict(costs_on(max(1, m.cores)))
    if form is not None and form not in offered:
        raise OptionError(
            f"scatter-add on the CPU: form {form.value!r} is not offered for {n} ids into {rows}x{width} "
            f"({c} private tables would take over {PRIVATE_MAX} bytes)"
        )
    chosen = form or min(offered, key=lambda f: (offered[f], f.value))
    threads = max(1, m.cores)
    if threads > 1 and dict(costs_on(1))[chosen] < offered[chosen] * 0.98:  # one thread wins by 2 % (best_threads)
        threads = 1
    used = c if chosen == CpuScatterForm.PRIVATIZED else 1
    return CpuScatterPlan(chosen, problem, used, tuple(costs_on(threads)), threads)


def scratch(p: CpuScatterPlan) -> dict[str, int]:
    """The scratch buffers' element counts: the private tables (privatized, accumulator elements)
    or the row offsets and the sorted positions (sorted segments, long long elements)."""
    if p.form == CpuScatterForm.PRIVATIZED:
        return {"tables": p.chunks * p.rows * p.width}
    return {"off": p.rows + 2, "ord": max(p.n, 1)}
