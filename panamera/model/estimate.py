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

from dataclasses import dataclass

from ..runtime.plan import LaunchPlan
from .gpu import GPUSpec, kernel_time


@dataclass(frozen=True)
class Estimate:
    gpu: str
    total_us: float
    launch_us: float
    dram_us: float
    l2_us: float
    sfu_us: float
    tail_us: float
    atomic_us: float
    launches: int
    dram_bytes: int
    compulsory_bytes: int
    limit_us: float  # compulsory bytes at the achievable bandwidth, plus one launch

    @property
    def ratio_to_limit(self) -> float:
        return self.total_us / self.limit_us if self.limit_us else float("nan")


def limit_us(compulsory_bytes: int, gpu: GPUSpec) -> float:
    """The floor for any implementation: every input read once and every output written once at
    the achievable DRAM bandwidth, plus one kernel launch."""
    return (compulsory_bytes / gpu.achievable_bw + gpu.launch_s) * 1e6


def compulsory_bytes(plan: LaunchPlan) -> int:
    """Bytes of the plan's inputs and outputs (workspaces and counters excluded)."""
    total = 0
    for key, spec in plan.buffers.items():
        if key.startswith(("in:", "out:")) and spec.dtype is not None:
            total += spec.size * spec.dtype.itemsize
    return total


def estimate(plan: LaunchPlan, gpu: GPUSpec, compulsory: int | None = None) -> Estimate:
    """Model every launch of `plan` on `gpu` and add them up (see model/gpu.py for the terms)."""
    parts = dict(launch=0.0, dram=0.0, l2=0.0, sfu=0.0, tail=0.0, atomic=0.0)
    total = 0.0
    for ln in plan.per_call:
        c = kernel_time(gpu, **dict(ln.cost_features))
        total += c.total_s
        parts["launch"] += c.launch_s
        parts["dram"] += c.dram_s
        parts["l2"] += c.l2_s
        parts["sfu"] += c.sfu_s
        parts["tail"] += c.tail_s
        parts["atomic"] += c.atomic_s
    need = compulsory_bytes(plan) if compulsory is None else compulsory
    us = {k: v * 1e6 for k, v in parts.items()}
    return Estimate(
        gpu.name, total * 1e6, us["launch"], us["dram"], us["l2"], us["sfu"], us["tail"], us["atomic"],
        len(plan.per_call), sum(ln.bytes_read + ln.bytes_written for ln in plan.per_call), need, limit_us(need, gpu),
    )  # fmt: skip
