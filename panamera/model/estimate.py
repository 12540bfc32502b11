"""`estimate(plan, gpu)`: the modeled time of a launch plan on a GPU, with its parts and the limit.

Each launch records what the model was told about it (bytes, blocks, threads, atomics, ...), so
a plan made for one GPU can be re-modeled on another: the figures are then those of *that plan*
on the other GPU, not of the plan Panamera would make for it.

>>> import panamera as pn
>>> from panamera.model import H100, estimate
>>> x = pn.placeholder((4096, 4096), "float32", name="x")
>>> e = estimate(pn.compile(pn.sum(x, axis=1), target="emulator").plan, H100)
>>> round(e.dram_us), e.launches
(22, 1)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..runtime.plan import LaunchPlan
from .gpu import GPUSpec
from .kernel_cost import kernel_time


@dataclass(frozen=True)
class Estimate:
    gpu: str
    total_us: float
    launch_us: float
    dram_us: float
    l2_us: float
    sfu_us: float  # the special-function part of issue_us
    tail_us: float
    atomic_us: float
    launches: int
    dram_bytes: int
    compulsory_bytes: int
    limit_us: float  # the smallest measured kernel + compulsory bytes at the best measured bandwidths
    issue_us: float = 0.0  # arithmetic issue time (FP32, FP64, SFU)
    sync_us: float = 0.0  # grid-wide waits of split stitched rows
    spill_us: float = 0.0  # register spills' local-memory traffic (model/spill.py; peers' compiled kernels)

    @property
    def ratio_to_limit(self) -> float:
        return self.total_us / self.limit_us if self.limit_us else float("nan")


def limit_us(compulsory_bytes: int, gpu: GPUSpec, written: int = 0) -> float:
    """The floor for any implementation (docs/GPU_MODEL.md, "The limit"), from measured terms
    only: the smallest kernel time measured on the GPU (`gpu.limit.floor_s`), plus every input
    read once at the best read bandwidth any published kernel reached and every output written
    once (`written` of the `compulsory_bytes`) at the best measured write bandwidth. No published
    measurement beats it (tests/test_calibration.py)."""
    lim = gpu.limit
    read = max(0, compulsory_bytes - written)
    return (lim.floor_s + read / (lim.eta_read * gpu.dram_bw) + written / (lim.eta_write * gpu.dram_bw)) * 1e6


def compulsory_bytes(plan: LaunchPlan) -> int:
    """Bytes of the plan's inputs and outputs (workspaces and counters excluded)."""
    return sum(compulsory_split(plan))


def compulsory_split(plan: LaunchPlan) -> tuple[int, int]:
    """(read, written): bytes of the plan's inputs, and of its outputs."""
    read = written = 0
    for key, spec in plan.buffers.items():
        if key.startswith(("in:", "out:")) and spec.dtype is not None:
            n = spec.size * spec.dtype.itemsize
            read, written = (read + n, written) if key.startswith("in:") else (read, written + n)
    return read, written


def estimate(plan, gpu: GPUSpec, compulsory: int | tuple[int, int] | None = None, extra_launches: int = 0) -> Estimate:
    """Model every launch of one call of `plan` (a LaunchPlan, or launches gathered from several
    plans) on `gpu` and add them up; `extra_launches` empty launches are added (a library's second
    pass). The first launch pays the per-kernel floor `gpu.launch_s`, every later one only the
    gap of a queued launch (`gpu.queued_s`). `compulsory`: the limit's bytes, or (read, written).
    See model/kernel_cost.py for the terms."""
    launches = plan.per_call if isinstance(plan, LaunchPlan) else list(plan)
    costs = [kernel_time(gpu, **dict(ln.cost_features)) for ln in launches]
    queued = gpu.launch_s - gpu.queued_s
    costs = [c if k == 0 else dataclasses.replace(c, launch_s=c.launch_s - queued) for k, c in enumerate(costs)]
    part = {
        k: sum(getattr(c, f"{k}_s") for c in costs) * 1e6
        for k in ("launch", "dram", "l2", "sfu", "issue", "tail", "atomic", "sync", "spill")
    }
    extra = extra_launches * (gpu.queued_s if costs else gpu.launch_s) * 1e6
    part["launch"] += extra
    if compulsory is None:
        need, written = compulsory_split(plan) if isinstance(plan, LaunchPlan) else (0, 0)
        need += written
    else:
        need, written = (sum(compulsory), compulsory[1]) if isinstance(compulsory, tuple) else (compulsory, 0)
    return Estimate(
        gpu.name, sum(c.total_s for c in costs) * 1e6 + extra, part["launch"], part["dram"], part["l2"], part["sfu"],
        part["tail"], part["atomic"], len(launches) + extra_launches,
        sum(ln.bytes_read + ln.bytes_written for ln in launches), need, limit_us(need, gpu, written), part["issue"],
        part["sync"], part["spill"],
    )  # fmt: skip
