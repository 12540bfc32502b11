"""Performance model of a launch plan on a GPU (shared/GPU_MODEL.md). Every figure is *modeled*."""

from .gpu import A100, GPUS, H100, GPUSpec, KernelCost, kernel_time

__all__ = ["A100", "GPUS", "H100", "GPUSpec", "KernelCost", "kernel_time"]
