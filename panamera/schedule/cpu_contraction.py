"""What runs a contraction group on the CPU: the decision, made once by the CPU mapper
(schedule/cpu_mapper.py `map_cpu`) and carried on its `CpuDecision` as a `GemmPlan`.

A group schedule/cpu_blas.py's rule (`blas_call`) accepts runs as one of:

- `GemmKernel.BLAS`: numpy's BLAS, called from C (runtime/cpu_gemm.py) where the product is a `Gemm`,
  else by numpy between the program's C entries;
- `GemmKernel.TILE`: the register-tiled kernel (codegen/cpu_tile.py) with its `TileShape` (K split
  included), where the CPU model (model/cpu_tile.py `gemm_choice`) finds it faster than the BLAS on
  the machine's cores.

Any other group (a small or fused contraction included) is a generated kernel: the decision's form
(ROW dot products, ...) and no `GemmPlan`. The formulation stage's cost (schedule/cpu_cost.py
`time_of`) and the renderer (codegen/cpu_host_kernels.py `host_blas`) read the plan; neither chooses.

>>> import dataclasses, panamera as pn
>>> from panamera.compiler import lower
>>> from panamera.model.cpu import CpuModel
>>> from panamera.model.cpu_gemm import GemmRates
>>> m = CpuModel.nominal(cores=1, simd_bytes=64)
>>> m = dataclasses.replace(m, gemm=GemmRates((165.0, 72.0), 0.9))  # an AVX-512 machine's BLAS probe
>>> x, w = pn.placeholder((128, 1024), "float32"), pn.placeholder((32, 1024), "float32")
>>> g = lower(x @ w.T, stop_after="groups", target="emulator").groups[0]
>>> plan_gemm(g, m, 1).describe()
'TILE 8x32 ksplit=1 threads=1 (128x32x1024, 1 gemm call)'
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..model.cpu_gemm import gemm_time
from ..model.cpu_tile import GemmKernel, gemm_tile, tile_plan, tile_threads, tile_time
from ..poly.program import KernelGroup
from .cpu_blas import BlasCall, blas_call, split_for_blas
from .cpu_epilogue import TileEpilogue, tile_epilogue

if TYPE_CHECKING:
    from ..model.cpu import CpuModel, KernelTime
    from ..model.cpu_tile import TileShape
    from .cpu_mapper import CpuDecision, CpuMachine


@dataclass(frozen=True)
class GemmPlan:
    """A contraction group's kernel: `kernel` (BLAS or TILE), the product as `call` (its einsum, and
    its `Gemm` where it is gemm calls from C), `tile` (the TILE kernel's shape, else None), and
    `threads`: the most the tile runs on (`tile_threads`; a call asking for more runs on this many),
    for the BLAS the cores the choice was made for; `epilogue`: the element-wise consumer the tile
    applies at its store (schedule/cpu_epilogue.py), TILE only."""

    kernel: GemmKernel
    call: BlasCall
    itemsize: int
    tile: TileShape | None = None
    threads: int = 1
    epilogue: TileEpilogue | None = None
    decided: int = 0  # the threads of the call this plan was decided for (0: any)
    fewer: tuple[GemmPlan, ...] = ()  # the plans of calls on fewer threads, where another kernel or tile wins

    def at(self, threads: int) -> GemmPlan:
        """The plan a call on `threads` threads runs: of those in `fewer` decided for `threads` or
        more, the one decided for the fewest; else this one.

        >>> from panamera.schedule.cpu_blas import BlasCall
        >>> call = BlasCall("ab,bc->ac", (), "out:1", (8, 8), 1024)
        >>> one = GemmPlan(GemmKernel.TILE, call, 4, None, 1, decided=1)
        >>> p = GemmPlan(GemmKernel.BLAS, call, 4, None, 2, decided=2, fewer=(one,))
        >>> p.at(1).kernel, p.at(2).kernel, p.at(8).kernel
        (<GemmKernel.TILE: 'tile'>, <GemmKernel.BLAS: 'blas'>, <GemmKernel.BLAS: 'blas'>)
        """
        fits = [p for p in self.fewer if p.decided >= threads]
        return min(fits, key=lambda p: p.decided) if fits else self

    def describe(self) -> str:
        """One line: the kernel, its tile and the product; then each of `fewer`, on its threads.

        >>> from panamera.schedule.cpu_blas import BlasCall
        >>> GemmPlan(GemmKernel.BLAS, BlasCall("ab,bc->ac", (), "out:1", (8, 8), 1024), 4).describe()
        "BLAS (numpy einsum 'ab,bc->ac', 0.0 MFLOP)"
        """
        below = "".join(f"; on {p.decided} thread(s): {p.describe()}" for p in self.fewer)
        gm = self.call.gemm
        if self.tile is None or gm is None:
            return self.call.describe() + below
        t = self.tile
        calls = f"{len(gm.calls)} gemm call" + ("s" if len(gm.calls) > 1 else "")
        fused = f", {self.epilogue.describe()}" if self.epilogue is not None else ""
        head = f"TILE {t.mr}x{t.nr} ksplit={t.ksplit} threads={self.threads}"
        return f"{head} ({gm.m}x{gm.n}x{gm.k}, {calls}{fused})" + below

    def time(self, m: CpuModel, threads: int | None = None) -> KernelTime:
        """The modeled time of this plan on `threads` threads (default: the model's cores): the
        kernel chosen for a call on that many (`at`), never re-chosen (the tile keeps its K split)."""
        t = max(1, threads or m.cores)
        if self.fewer and (p := self.at(t)) is not self:
            return p.time(m, t)
        gm = self.call.gemm
        if self.kernel is GemmKernel.TILE and gm is not None and self.tile is not None:  # on at most its threads
            used = min(t, self.threads)
            kt = tile_time(gm, self.itemsize, m, used, self.tile.ksplit)
            if self.epilogue is None:
                return kt
            extra = self.epilogue.compute_us(m, used, self.itemsize)  # its arithmetic; no pass over C
            return dataclasses.replace(kt, total_us=kt.total_us + extra, compute_us=kt.compute_us + extra)
        if gm is not None:
            mnk = gm.m * gm.n * gm.k
            packed = (gm.m * gm.k + gm.k * gm.n) * self.itemsize
            return gemm_time(2 * mnk * len(gm.calls), packed, self.itemsize, m, t, mnk)
        packed = sum(math.prod(op.shape) for op in self.call.operands) * self.itemsize
        return gemm_time(self.call.flops, packed, self.itemsize, m, t, _mnk(self.call))


def plan_gemm(group: KernelGroup, m: CpuModel, threads: int, deterministic: bool = False) -> GemmPlan | None:
    """The kernel of contraction `group` for a call on `threads` threads, or None where `blas_call`'s
    rule refuses it (a generated kernel runs it): TILE where the model finds the tile faster
    (model/cpu_tile.py `gemm_tile`), else BLAS. A group of a contraction and an element-wise
    consumer the tile can apply (schedule/cpu_epilogue.py) is planned as its contraction, the
    consumer carried as the plan's `epilogue`; under the BLAS such a group has no plan (the
    grouping, `cpu_groups`, splits it). A call on fewer threads (halving down to 1) is decided too,
    once, here: where another kernel or tile wins there, that plan is in the result's `fewer`
    (a call with `threads=1` on a machine planned for 2 runs the kernel chosen for one thread); a
    fused consumer keeps the tile on every count (the grouping is one for all). `deterministic`: no
    `fewer` — the kernel and tile (its K split) decided for `threads` run on any count, so a call's
    bits do not depend on its threads (a K split's chunks are fixed, merged in chunk order)."""
    ep = tile_epilogue(group)
    core = KernelGroup((group.statements[0],)) if ep is not None else group
    call = blas_call(core) if group.M * group.N else None
    if call is None:
        return None
    itemsize = group.statements[0].result.dtype.itemsize
    plan = _plan_at(call, ep, group, itemsize, m, threads)
    if plan is None or deterministic:
        return plan
    fewer, last, t = [], plan, threads // 2
    while t >= 1:
        p = _plan_at(call, ep, group, itemsize, m, t)
        if p is None:  # the consumer fused: the tile on `t` threads, as the grouping for all counts needs
            tile = tile_plan(call.gemm, itemsize, m, (used := tile_threads(call.gemm, itemsize, m, t)))[0]
            p = GemmPlan(GemmKernel.TILE, call, itemsize, tile, used, ep, t)
        if (p.kernel, p.tile) != (last.kernel, last.tile):
            fewer.append(p)
            last = p
        t //= 2
    return dataclasses.replace(plan, fewer=tuple(fewer))


def _plan_at(
    call: BlasCall, ep: TileEpilogue | None, group: KernelGroup, itemsize: int, m: CpuModel, threads: int
) -> GemmPlan | None:
    """`plan_gemm`'s choice for a call on `threads` threads, with no `fewer`."""
    tile = gemm_tile(call.gemm, itemsize, m, threads)
    if tile is None and ep is not None and call.gemm is not None:  # the tile saves the consumer's pass
        tile = _fused_tile(call, ep, group, itemsize, m, threads)
    if tile is None or call.gemm is None:
        return GemmPlan(GemmKernel.BLAS, call, itemsize, None, threads, None, threads) if ep is None else None
    used = tile_threads(call.gemm, itemsize, m, threads)
    if used != threads:  # the tile (its K split) for the threads it runs on
        tile = tile_plan(call.gemm, itemsize, m, used)[0]
    return GemmPlan(GemmKernel.TILE, call, itemsize, tile, used, ep, threads)


def _fused_tile(
    call: BlasCall, ep: TileEpilogue, group: KernelGroup, itemsize: int, m: CpuModel, threads: int
) -> TileShape | None:
    """The tile where the BLAS is faster alone but not with the consumer's own pass over its product:
    the tile with `ep` at its store (its arithmetic added) against the BLAS and the consumer's MAP
    kernel as the mapper would run it, both modeled on `threads` threads; else None."""
    from .cpu_cost import time_of
    from .cpu_mapper import CpuMachine, map_cpu

    tile, kt = tile_plan(call.gemm, itemsize, m, threads)
    fused = kt.total_us + ep.compute_us(m, threads, itemsize)
    alone = KernelGroup((group.statements[1],))
    d = map_cpu(alone, CpuMachine(threads, m.simd_bytes, m.name), model=m)
    split = GemmPlan(GemmKernel.BLAS, call, itemsize, None, threads).time(m, threads).total_us
    return tile if fused < split + time_of(alone, d, m, threads).total_us else None


def cpu_groups(group: KernelGroup, m: CpuModel, threads: int) -> tuple[KernelGroup, ...]:
    """The CPU kernels of a planner group (`cpu_plans` without the decisions).

    >>> import panamera as pn
    >>> from panamera.compiler import lower
    >>> from panamera.model.cpu import CpuModel
    >>> x, w, b = pn.placeholder((128, 1024)), pn.placeholder((32, 1024)), pn.placeholder((32,))
    >>> g = lower(pn.maximum(x @ w.T + b, 0.0), stop_after="groups", target="emulator").groups[0]
    >>> m = CpuModel.nominal(cores=1, simd_bytes=64)
    >>> len(cpu_groups(g, m, 1)) == (1 if plan_gemm(g, m, 1) is not None else 2)
    True
    """
    return tuple(g for g, _ in _pieces(group, m, threads))


def _pieces(
    group: KernelGroup, m: CpuModel, threads: int, deterministic: bool = False
) -> tuple[tuple[KernelGroup, GemmPlan | None], ...]:
    """A planner group's CPU kernels, each with its gemm plan where it was made deciding the grouping: a
    contraction with an element-wise consumer the tile applies at its store (schedule/cpu_epilogue.py)
    stays one group where the model runs the contraction on the tile (`plan_gemm`); else as
    schedule/cpu_blas.py's `split_for_blas` says (no plan made yet)."""
    plan = plan_gemm(group, m, threads, deterministic) if tile_epilogue(group) is not None else None
    if plan is not None:
        return ((group, plan),)
    return tuple((g, None) for g in split_for_blas(group))


def cpu_plans(
    group: KernelGroup, machine: CpuMachine, m: CpuModel, split: int | None = None, deterministic: bool = False
) -> tuple[tuple[KernelGroup, CpuDecision | None], ...]:
    """The CPU kernels of a planner group and their decisions, each made once: the grouping's gemm plan
    carried into the mapper (`map_cpu`'s `gemm`), never planned again; None for a kernel with nothing
    to map (an empty extent: its fill)."""
    from .cpu_mapper import map_cpu

    out = []
    for g, plan in _pieces(group, m, machine.cores, deterministic):
        d = map_cpu(g, machine, split, model=m, deterministic=deterministic, gemm=plan) if g.M * g.N else None
        out.append((g, d))
    return tuple(out)


def _mnk(call: BlasCall) -> int:
    """M N K of each product of a call numpy runs: its flops over the matmul's batch."""
    batch = call.form.a_shape[0] if call.form is not None else 1
    return call.flops // 2 // max(1, batch)
