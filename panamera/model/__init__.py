"""Performance model of a launch plan on a GPU (docs/GPU_MODEL.md). Every figure is *modeled*."""

from .estimate import Estimate, estimate, limit_us
from .gpu import A100, GPUS, H100, H200, V100, GPUSpec, Limit
from .kernel_cost import KernelCost, kernel_time

__all__ = [
    "A100",
    "GPUS",
    "H100",
    "H200",
    "Limit",
    "V100",
    "Estimate",
    "GPUSpec",
    "KernelCost",
    "estimate",
    "kernel_time",
    "limit_us",
]
