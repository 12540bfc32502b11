"""The library's matmul (cuBLAS) as the model sees it: a roofline of FLOPs at tensor-core peak and
bytes, on the SMs its output tiles occupy.

    T_lib = T_launch + max(FLOPs / (TC peak x occupied SMs / SMs), T_dram) + T_tail

The tile grid is cuBLAS's usual one: 128 x 128 output tiles, 64 x 64 when the 128-tiles would
not give every SM one; no split-K (the path the paper compares against in Table 1: AKG's
tensor-core schedule). T_dram is model/kernel_cost.py's Little's-law stream of A, B and C once, with a
three-stage pipeline of 32-deep K slabs of both operands in flight per block. Tensor-core peaks
are the dense figures of the vendor datasheets [spec]; V100 has no TF32: fp32 runs on its CUDA
cores.

>>> from panamera.model import H100
>>> lib = library_matmul(H100, 4096, 4096, 4096, 1, "float16")
>>> lib.tiles, lib.compute_bound, round(lib.total_s * 1e6)
(1024, True, 144)
>>> library_matmul(H100, 1, 4096, 4096, 1, "float16").compute_bound  # a GEMV streams its 32 MB
False
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .gpu import A100, H100, V100, GPUSpec
from .kernel_cost import kernel_time

# Dense tensor-core FLOP/s by operand dtype [spec]: NVIDIA H100 SXM5, A100 SXM4 and V100 SXM2
# datasheets (FP16/BF16, TF32 for float32, FP64; int8 in OP/s).
TENSOR_CORE_PEAK = {
    H100.name: {"float16": 989e12, "bfloat16": 989e12, "float32": 495e12, "float64": 67e12, "int8": 1979e12},
    A100.name: {"float16": 312e12, "bfloat16": 312e12, "float32": 156e12, "float64": 19.5e12, "int8": 624e12},
    V100.name: {"float16": 125e12, "bfloat16": 15.7e12, "float32": 15.7e12, "float64": 7.8e12, "int8": 62e12},
}


def tensor_core_peak(gpu: GPUSpec, dtype: str) -> float:
    """The dense tensor-core FLOP/s for operands of `dtype` (CUDA-core FP32 where there is none)."""
    table = TENSOR_CORE_PEAK.get(gpu.name, {})
    key = "int8" if dtype in ("int8", "uint8") else dtype
    return table.get(key, gpu.sms * gpu.fp32_per_clock_sm * 2 * gpu.clock_hz)


# mma.sync / wmma (what Panamera's tensor-core kernels issue) against the datasheet's dense peak:
# on Hopper the full rate needs the asynchronous warpgroup wgmma, and the synchronous mma reaches
# about half of it [measured: Luo et al., "Dissecting the NVIDIA Hopper Architecture through
# Microbenchmarking and Multiple Level Analysis", arXiv 2501.12084 (mma vs wgmma on H800), and
# WMMA at <= 50 % of H100's FP16 peak in waynehacking8/blackwell-tensorcore-kernels' and
# r/CUDA's measurements]; on Ampere mma.sync is the native path (the datasheet peak) [spec].
MMA_SYNC_FRACTION = {H100.name: 0.5}


def mma_sync_peak(gpu: GPUSpec, dtype: str) -> float:
    """The FLOP/s of mma.sync-class MMAs with operands of `dtype` (`tensor_core_peak` scaled by
    `MMA_SYNC_FRACTION`: half on Hopper, whole on Ampere).

    >>> round(mma_sync_peak(H100, "bfloat16") / 1e12), round(mma_sync_peak(A100, "float16") / 1e12)
    (494, 312)
    """
    frac = MMA_SYNC_FRACTION.get(gpu.name, 1.0)
    return tensor_core_peak(gpu, dtype) * frac


@dataclass(frozen=True)
class LibraryCost:
    """The library's modeled matmul: its parts, in seconds."""

    total_s: float
    flops_s: float
    dram_s: float
    tiles: int
    flops: float
    peak: float
    roofline_dram_s: float = 0.0  # the compulsory bytes at the achievable bandwidth

    @property
    def compute_bound(self) -> bool:
        """The problem's verdict on the roofline: its FLOPs at tensor-core peak outlast its
        compulsory bytes at the achievable bandwidth (arithmetic intensity above the ridge)."""
        return self.flops / self.peak >= self.roofline_dram_s

    def describe(self) -> str:
        bound = "compute-bound" if self.compute_bound else "memory-bound"
        return (
            f"library (cuBLAS roofline: {self.peak / 1e12:.0f} TFLOP/s tensor cores on {self.tiles} tile(s), "
            f"{self.flops / 1e6:.1f} MFLOP) {self.total_s * 1e6:.2f} us, {bound}"
        )


def library_matmul(gpu: GPUSpec, M: int, N: int, K: int, batch: int, dtype: str, out_itemsize: int = 0) -> LibraryCost:
    """The modeled time of the library's (batch x) M x N x K matmul with operands of `dtype`."""
    item = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1}.get(dtype, 4)
    out_item = out_itemsize or max(item, 2)
    tile = 128 if math.ceil(M / 128) * math.ceil(N / 128) * batch >= gpu.sms else 64
    tiles = max(1, math.ceil(M / tile) * math.ceil(N / tile) * batch)
    flops = 2.0 * M * N * K * batch
    dram_bytes = batch * (M * K + K * N) * item + batch * M * N * out_item
    stage = 2 * tile * 32 * item  # one K slab of both operands
    c = kernel_time(gpu, dram_bytes=dram_bytes, write_bytes=batch * M * N * out_item, blocks=tiles, threads=256,
                    bytes_in_flight_per_thread=3 * stage / 256)  # fmt: skip
    peak = tensor_core_peak(gpu, dtype)
    occupied = min(tiles, gpu.sms) / gpu.sms
    flops_s = flops / (peak * occupied)
    total = c.launch_s + max(flops_s, c.dram_s) + c.tail_s
    return LibraryCost(total, flops_s, c.dram_s, tiles, flops, peak, dram_bytes / gpu.achievable_bw)
