"""GPU figures (docs/GPU_MODEL.md, with their sources there) and the per-kernel time model.

    T = T_launch + max(T_dram, T_l2, T_sfu) + T_tail + T_atomic
    T_dram   = bytes / BW_eff,  BW_eff = min(eta * BW_peak, active SMs * bytes in flight per SM / latency)

`latency` in Little's law is the *loaded* latency [derived]: docs/GPU_MODEL.md says to aim for 32 KB in
flight per SM to saturate DRAM, i.e. latency = SMs * 32 KB / (eta * BW_peak) (about 1.4 us on
H100, four times the unloaded 350 ns: queueing under load). With the unloaded figure the model
would call a quarter of that occupancy enough, which measurements of streaming kernels do not
support.
    T_l2     = bytes re-read while resident in L2 / L2 bandwidth
    T_sfu    = transcendental ops (exp, log, sqrt, rsqrt) / (SMs * 16 per clock * clock)  [spec: CUDA
               Programming Guide throughput table, compute capability 8.x/9.0]
    T_atomic = same-address atomics / L2 clock + all atomics / distinct-address atomic throughput
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GPUSpec:
    name: str
    sms: int
    clock_hz: float
    dram_bw: float  # peak, bytes/s
    eta: float  # achievable fraction of peak for streaming reads
    dram_latency_s: float
    launch_s: float
    atomic_rate: float  # distinct-address atomics per second
    l2_clock_hz: float  # same-address atomics retire about one per L2 clock
    l2_bw: float = 10e12  # bytes/s for L2 hits
    sfu_per_clock_sm: int = 16
    l2_size: int = 50 * 2**20
    max_threads_sm: int = 2048
    max_blocks_sm: int = 32
    smem_per_block: int = 227 * 1024
    sources: tuple = ()  # (parameter, where the figure comes from), as in docs/GPU_MODEL.md

    @property
    def achievable_bw(self) -> float:
        return self.eta * self.dram_bw

    def resident_blocks(self, threads: int) -> int:
        """Blocks of `threads` threads that one SM holds at once (thread and block limits)."""
        return max(1, min(self.max_blocks_sm, self.max_threads_sm // max(threads, 1)))

    @property
    def loaded_latency_s(self) -> float:
        return max(self.dram_latency_s, self.sms * 32 * 1024 / self.achievable_bw)


_COMMON = (
    ("launch_s", "[measured] a two-kernel CUB reduce takes 4.9-5.4 us on tiny inputs (cccl PR #9722)"),
    ("l2_clock_hz", "[measured] same-address atomics retire about one per L2 clock (gpgpu-sim PR #33, V100)"),
    ("sfu_per_clock_sm", "[spec] CUDA Programming Guide throughput table"),
    ("max_threads_sm/max_blocks_sm", "[spec] 2048 threads, 32 blocks per SM (cc 7.0-9.0)"),
)
H100 = GPUSpec(
    "H100-SXM5", 132, 1.98e9, 3.35e12, 0.90, 350e-9, 2.5e-6, 60e9, 1.75e9,
    sources=(
        ("sms/clock_hz/dram_bw/l2_size/smem", "[spec] NVIDIA H100 datasheet"),
        ("eta", "[measured] CUB DeviceReduce reaches 90% of peak on H200 (cccl PR #9722)"),
        ("dram_latency_s", "[measured] gpu-benches, markdewing/AI_kernels"),
        ("atomic_rate", "[measured] int32 distinct-address atomics at 73 G/s on GH200 (triton PR #10059)"),
        ("l2_bw", "[measured] gpu-benches (H200)"),
        *_COMMON,
    ),
)  # fmt: skip
A100 = GPUSpec(
    "A100-SXM4-80GB",
    108,
    1.41e9,
    2.04e12,
    0.87,
    405e-9,
    2.5e-6,
    40e9,
    1.41e9,
    l2_bw=5e12,
    l2_size=40 * 2**20,
    smem_per_block=163 * 1024,
    sources=(
        ("sms/clock_hz/dram_bw/l2_size/smem", "[spec] NVIDIA A100 datasheet"),
        ("eta/l2_bw", "[measured] te42kyfo/gpu-benches (A100)"),
        ("dram_latency_s", "[measured] gpu-benches, markdewing/AI_kernels"),
        ("atomic_rate", "[assumed] two thirds of H100's, scaled by L2 clock (no published figure)"),
        *_COMMON,
    ),
)
# The paper's GPU (Tesla V100 SXM2). Figures not in docs/GPU_MODEL.md are tagged as their source says.
V100 = GPUSpec(
    "V100-SXM2",
    80,
    1.53e9,
    900e9,
    0.85,
    450e-9,
    3.0e-6,
    25e9,
    1.53e9,
    l2_bw=2.1e12,
    l2_size=6 * 2**20,
    sfu_per_clock_sm=16,
    max_blocks_sm=32,
    smem_per_block=96 * 1024,
    sources=(
        ("sms/clock_hz/dram_bw/l2_size/smem", "[spec] NVIDIA Tesla V100 datasheet (SXM2)"),
        ("eta", "[measured] about 790 GB/s streaming of 900 GB/s peak (Jia et al. 2018, 'Dissecting Volta')"),
        ("l2_bw", "[measured] about 2.1 TB/s L2 load throughput (Jia et al. 2018)"),
        ("dram_latency_s", "[derived] about 690 cycles at 1.53 GHz from Jia et al. 2018's pointer chase"),
        ("launch_s", "[assumed] 3 us back to back with CUDA 10 (no measurement in our sources)"),
        ("atomic_rate", "[assumed] scaled from H100's by L2 bandwidth (no published figure)"),
        ("l2_clock_hz", "[assumed] L2 at the core clock"),
    ),
)
GPUS = {"h100": H100, "a100": A100, "v100": V100}


@dataclass(frozen=True)
class KernelCost:
    launch_s: float
    dram_s: float
    tail_s: float
    atomic_s: float
    l2_s: float = 0.0
    sfu_s: float = 0.0
    features: tuple = field(default=(), compare=False)  # kernel_time's keyword arguments, to re-model

    @property
    def total_s(self) -> float:
        return self.launch_s + max(self.dram_s, self.l2_s, self.sfu_s) + self.tail_s + self.atomic_s


def kernel_time(
    gpu: GPUSpec,
    *,
    dram_bytes: float,
    blocks: int,
    threads: int,
    bytes_in_flight_per_thread: float,
    atomics: int = 0,
    same_address: int = 0,
    epilogue_cycles: int = 400,
    l2_bytes: float = 0.0,
    sfu_ops: float = 0.0,
) -> KernelCost:
    """Modeled time of one kernel launch."""
    features = (("dram_bytes", dram_bytes), ("blocks", blocks), ("threads", threads),
                ("bytes_in_flight_per_thread", bytes_in_flight_per_thread), ("atomics", atomics),
                ("same_address", same_address), ("epilogue_cycles", epilogue_cycles), ("l2_bytes", l2_bytes),
                ("sfu_ops", sfu_ops))  # fmt: skip
    if blocks <= 0:
        return KernelCost(gpu.launch_s, 0.0, 0.0, 0.0, features=features)
    resident = gpu.resident_blocks(threads)
    per_sm_blocks = min(resident, math.ceil(blocks / gpu.sms))
    active = min(gpu.sms, blocks)
    in_flight = active * per_sm_blocks * threads * bytes_in_flight_per_thread
    bw = min(gpu.achievable_bw, in_flight / gpu.loaded_latency_s)
    dram = dram_bytes / bw if dram_bytes else 0.0
    waves = math.ceil(blocks / (gpu.sms * resident))
    tail = waves * epilogue_cycles / gpu.clock_hz
    atomic = (same_address / gpu.l2_clock_hz + atomics / gpu.atomic_rate) if atomics else 0.0
    sfu = sfu_ops / (gpu.sms * gpu.sfu_per_clock_sm * gpu.clock_hz)
    return KernelCost(gpu.launch_s, dram, tail, atomic, l2_bytes / gpu.l2_bw, sfu, features)
