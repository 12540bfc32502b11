"""GPU figures (docs/GPU_MODEL.md, with their sources there): a GPU's spec (`GPUSpec`: SMs, clocks, the
memory system, occupancy rules) with the DRAM latency and bandwidth laws its figures give (Little's law,
latency rising with load: `latency_at`, `bandwidth`), and the GPUs modeled (`H100`, `H200`, `A100`,
`V100`, `GPUS`). The per-kernel time model built on them is model/kernel_cost.py (its names are
re-exported here, where callers have imported them).

`estimate.limit_us` is docs/GPU_MODEL.md's limit, from measurements only: the smallest kernel
time measured on the GPU + compulsory bytes at the best read and write bandwidths measured
(`GPUSpec.limit`).

>>> round(H100.latency_at(0.0) * 1e9), round(H100.loaded_latency_s * 1e9)
(350, 1019)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .kernel_cost import KernelCost, chain_s, kernel_time, sequence_s

MAX_REGISTERS = 255  # [spec] 32-bit registers one thread may use (cc 5.0-9.0)


def launch_bound_registers(max_threads: int, min_blocks: int = 0) -> int:
    """The registers per thread ptxas may use under `__launch_bounds__(max_threads, min_blocks)`
    [spec: CUDA C Programming Guide, "Launch Bounds"]: enough register file left for `min_blocks`
    blocks of `max_threads` threads (with no minimum, for one block), rounded down to the
    allocation unit of 8 per thread, at most 255.

    >>> launch_bound_registers(256, 4), launch_bound_registers(1024), launch_bound_registers(128)
    (64, 64, 255)
    """
    per_thread = 65536 // (max(max_threads, 1) * max(min_blocks, 1))
    return min(MAX_REGISTERS, per_thread // 8 * 8)


@dataclass(frozen=True)
class Limit:
    """What no kernel beats on a GPU, from measurements only (docs/GPU_MODEL.md, "The limit"): the
    smallest kernel time measured on it, and the best fractions of peak bandwidth any published
    kernel reached reading (`eta_read`) and writing (`eta_write`)."""

    floor_s: float
    eta_read: float
    eta_write: float
    source: str = ""


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
    fp32_per_clock_sm: int = 128  # also the issue width: 4 schedulers x 32 lanes
    fp64_per_clock_sm: int = 64
    l2_latency_cycles: int = 270  # an L2 hit's round trip, in core clocks: one CAS merge on a contended word
    vector_atomics: bool = False  # atomicAdd of float2/float4 as one 8/16-byte reduction (sm_90)
    l2_size: int = 50 * 2**20
    max_threads_sm: int = 2048
    max_blocks_sm: int = 32
    smem_per_block: int = 227 * 1024
    smem_per_sm: int = 228 * 1024  # [spec] shared memory per SM at the largest carveout: what resident blocks share
    smem_reserved_per_block: int = 1024  # [spec] shared memory the driver reserves per resident block (cc 8.0+)
    sources: tuple = ()  # (parameter, where the figure comes from), as in docs/GPU_MODEL.md
    eta_write: float = 0.0  # achievable fraction of peak for written bytes (0: as eta)
    queued_launch_s: float = -1.0  # a kernel queued behind another in the same call (< 0: launch_s)
    # distinct-address atomics per second by the merged word's type (others: atomic_rate)
    atomic_rates: tuple[tuple[str, float], ...] = ()
    saturating_kb_per_sm: int = 24  # bytes in flight per SM (KB) that saturate the stream: the loaded latency
    measured_limit: Limit | None = None  # None: no measurements on this GPU (`limit` falls back to the model)
    warpgroup_mma: bool = False  # wgmma.mma_async (sm_90a): tensor cores at their full rate (schedule/tc_tiling.py)
    max_cluster: int = 1  # blocks of one thread-block cluster (sm_90: 16, with the non-portable attribute past 8)
    l1_per_sm: int = 256 * 1024  # [spec] combined L1 / shared memory per SM: holds a spilled frame (model/spill.py)
    registers_per_sm: int = 65536  # [spec] 32-bit registers per SM (every GPU modeled here)

    @property
    def limit(self) -> Limit:
        """The measured limit, or on a GPU without measurements the model's own terms (the floor is
        then a launch and one unloaded round trip, the bandwidths the model's)."""
        if self.measured_limit is not None:
            return self.measured_limit
        floor = self.launch_s + self.dram_latency_s
        return Limit(floor, self.eta, self.eta_write or self.eta, "[model] no published measurement on this GPU")

    @property
    def write_bw(self) -> float:
        """Achievable DRAM bandwidth of written bytes (a store stream pays the read-to-write turnaround)."""
        return (self.eta_write or self.eta) * self.dram_bw

    @property
    def queued_s(self) -> float:
        """The cost of a launch queued behind another kernel of the same call: its setup overlaps the
        kernel before it, so only a small gap remains (model/estimate.py charges the first launch
        `launch_s`, every later one this)."""
        return self.launch_s if self.queued_launch_s < 0 else self.queued_launch_s

    def atomic_rate_of(self, dtype: str) -> float:
        """Distinct-address atomics per second on words of `dtype` (triton-lang/triton PR #10059: the
        rate falls with the word: int32 72.9, int64 39.2, float64 26.8 G/s on GH200)."""
        return dict(self.atomic_rates).get(dtype, self.atomic_rate)

    def stream_bw(self, read_bytes: float, write_bytes: float) -> float:
        """The achievable bandwidth of a stream that reads and writes these bytes: reads at eta x
        peak, writes at eta_write x peak, one after the other in the DRAM's time."""
        total = read_bytes + write_bytes
        if total <= 0:
            return self.achievable_bw
        return total / (read_bytes / self.achievable_bw + write_bytes / self.write_bw)

    def __repr__(self) -> str:
        """One short line (the whole spec is `dataclasses.asdict(spec)`): `help(pn.compile)` shows it.

        >>> H100
        <GPUSpec H100-SXM5: 132 SMs, 1.98 GHz, 3.35 TB/s DRAM, 50 MiB L2>
        """
        return (
            f"<GPUSpec {self.name}: {self.sms} SMs, {self.clock_hz / 1e9:.2f} GHz, {self.dram_bw / 1e12:.2f} TB/s DRAM, "
            f"{self.l2_size / 2**20:.0f} MiB L2>"
        )

    @property
    def l2_reach(self) -> int:
        """Bytes of the L2 a re-read finds still resident: half of it, the half an SM's requests
        reach (docs/GPU_MODEL.md: [fitted] to eager PyTorch's looped rows and the QuACK blog's
        profile of torch.compile re-reading long rows). The one figure of every re-read rule: a
        workspace read back (model/workspace.py), a stitched row's later passes and the column
        partials (schedule/cost.py), persistent row grids, attention's K/V and the peers' loops.

        >>> H100.l2_reach == 25 * 2**20
        True
        """
        return self.l2_size // 2

    @property
    def achievable_bw(self) -> float:
        return self.eta * self.dram_bw

    def resident_blocks(self, threads: int, shared_bytes: int = 0, registers: int = 0) -> int:
        """Blocks of `threads` threads that one SM holds at once: the least of the thread rule, the
        blocks-per-SM rule, the register rule (`registers` per thread, where known: 0 is not; each
        warp's allocated in units of 256, i.e. rounded up to 8 per thread) and
        the shared-memory rule (each block takes its `shared_bytes` plus the driver's reserved
        `smem_reserved_per_block`, out of `smem_per_sm`) — the CUDA occupancy calculator's rules
        without allocation granularity [spec: CUDA C Programming Guide, "Technical Specifications
        per Compute Capability" and the compute-capability 8.x/9.0 shared-memory notes]. A plan
        without shared memory is bound by threads and blocks alone.

        >>> A100.resident_blocks(256, shared_bytes=48 * 1024), H100.resident_blocks(256, shared_bytes=48 * 1024)
        (3, 4)
        >>> H100.resident_blocks(256), H100.resident_blocks(256, registers=128), H100.resident_blocks(256, registers=35)
        (8, 2, 6)
        """
        rules = [self.max_blocks_sm, self.max_threads_sm // max(threads, 1)]
        if registers:  # allocated per warp in units of 256 registers (8 per thread)
            per_warp = -(-min(registers, MAX_REGISTERS) * 32 // 256) * 256
            rules.append(self.registers_per_sm // per_warp // -(-max(threads, 1) // 32))
        if shared_bytes:
            rules.append(self.smem_per_sm // (shared_bytes + self.smem_reserved_per_block))
        return max(1, min(rules))

    @property
    def in_flight_per_sm(self) -> float:
        """Bytes each SM must keep in flight to saturate the achievable bandwidth at the loaded
        latency (Little's law, F = BW x L / SMs) [derived]: what a pipeline's stages must supply
        (schedule/pipeline.py)."""
        return self.achievable_bw * self.loaded_latency_s / self.sms

    @property
    def loaded_latency_s(self) -> float:
        """DRAM latency at saturation [fitted]: `saturating_kb_per_sm` in flight per SM saturate the
        achievable bandwidth, so by Little's law the latency under that load is SMs * that / BW."""
        return max(self.dram_latency_s, self.sms * self.saturating_kb_per_sm * 1024 / self.achievable_bw)

    def latency_at(self, bw: float) -> float:
        """The DRAM round trip under a load of `bw` bytes/s: unloaded at none, loaded at saturation,
        linear between (docs/GPU_MODEL.md, "Latency rises with load")."""
        frac = min(1.0, max(0.0, bw / self.achievable_bw))
        return self.dram_latency_s + (self.loaded_latency_s - self.dram_latency_s) * frac

    def bandwidth(self, in_flight: float, cap: float = 0.0) -> float:
        """The DRAM bandwidth `in_flight` bytes sustain: Little's law, BW = F / L(BW), with the
        latency rising linearly from unloaded to loaded as BW approaches eta * peak; solved
        for BW (the positive root of k BW^2 + L0 BW - F = 0) and capped at `cap` (the stream's
        achievable bandwidth, `stream_bw`; default eta * peak)."""
        if in_flight <= 0:
            return 0.0
        bmax, l0 = self.achievable_bw, self.dram_latency_s
        k = (self.loaded_latency_s - l0) / bmax
        bw = in_flight / l0 if k <= 0 else (-l0 + math.sqrt(l0 * l0 + 4 * k * in_flight)) / (2 * k)
        return min(cap or bmax, bw)


ATOMIC_RATES = (("int32", 72.9e9), ("float32", 72.9e9), ("int64", 39.2e9), ("float64", 26.8e9))
_COMMON = (
    (
        "launch_s",
        "[measured] the per-kernel floor: one cold kernel of CUB's single-tile path takes 4.86-5.29 us on "
        "H200 (NVBench, cccl PR #9722, 2^4-2^12 int32), less its own DRAM round trip and block epilogue",
    ),
    (
        "queued_launch_s",
        "[measured] a kernel queued behind another costs almost nothing: CUB's two-kernel 2^16 sum takes "
        "5.35 us, its one-kernel 2^12 sum 5.29 us (cccl PR #9722)",
    ),
    ("fp32/fp64_per_clock_sm", "[spec] NVIDIA H100/A100 whitepapers: 128 FP32 and 64 FP64 lanes per SM (SXM)"),
    (
        "l2_latency_cycles",
        "[measured] L2 hits take 222-339 cycles on an L40 (arXiv 2606.22588), about 270 on "
        "H100 (chipsandcheese, 'Nvidia's H100: Funny L2')",
    ),
    ("l2_clock_hz", "[measured] same-address atomics retire about one per L2 clock (gpgpu-sim PR #33, V100)"),
    ("sfu_per_clock_sm", "[spec] CUDA Programming Guide throughput table"),
    ("max_threads_sm/max_blocks_sm", "[spec] 2048 threads, 32 blocks per SM (cc 7.0-9.0)"),
    (
        "smem_per_sm/smem_reserved_per_block",
        "[spec] CUDA C Programming Guide, technical specifications per compute capability: shared memory per "
        "SM 228 KB (cc 9.0), 164 KB (cc 8.0), 96 KB (cc 7.0); 1 KB per block reserved for system use on cc 8.x "
        "and 9.0 (none on cc 7.x): a block's shared memory plus 1 KB bounds the blocks an SM holds",
    ),
    (
        "saturating_kb_per_sm",
        "[fitted] 24 KB in flight per SM saturate the stream: Liger's softmax 32Kx256 and "
        "32Kx512 bf16 (1228 and 2068 GB/s with 8 and 16 KB per SM in flight, CALIBRATION.md Q)",
    ),
    ("grid-wide wait", "[assumed] two L2 round trips per wait; no published measurement"),
    (
        "l1_per_sm",
        "[spec] combined L1 / shared memory per SM: 256 KB on H100 and H200, 192 KB on A100, 128 KB on V100 "
        "(NVIDIA tuning guides)",
    ),
    (
        "register spills",
        "[derived] model/spill.py: ptxas's spill bytes through L1 (the frame it holds), L2 (stores, missed "
        "loads) and DRAM (the chip's frame beyond L2); spill stores [assumed] write through L1 as global stores do",
    ),
)
H100 = GPUSpec(
    "H100-SXM5", 132, 1.98e9, 3.35e12, 0.95, 350e-9, 4.5e-6, 72.9e9, 1.75e9, vector_atomics=True, max_cluster=16,
    warpgroup_mma=True,
    eta_write=0.86, queued_launch_s=0.1e-6, atomic_rates=ATOMIC_RATES,
    measured_limit=Limit(4.85e-6, 0.96, 0.87, "CALIBRATION.md: CUB 2^8 on H200 (4.86 us measured, floor 4.85 us; the same GH100 chip); "
                         "QuACK cross-entropy 32Kx65K (reads), softmax 8Kx262K (read + write)"),
    sources=(
        ("sms/clock_hz/dram_bw/l2_size/smem", "[spec] NVIDIA H100 datasheet"),
        ("max_cluster", "[spec] CUDA Programming Guide: thread-block clusters of 8 blocks (portable), 16 on H100 "
         "with cudaFuncAttributeNonPortableClusterSizeAllowed"),
        ("eta", "[measured] read-mostly streams reach 0.95 of 3.35 TB/s: QuACK cross-entropy 32Kx65K bf16 at "
         "3182 GB/s (Dao-AILab/quack media/2025-07-10-membound-sol.md)"),
        ("eta_write", "[fitted] to QuACK's softmax and RMSNorm rows of 32K-262K elements (about 3.0 "
         "TB/s for equal reads and writes) given reads at eta: written bytes stream at 0.86 of peak"),
        ("dram_latency_s", "[measured] gpu-benches, markdewing/AI_kernels"),
        ("atomic_rates", "[measured] int32 72.9, int64 39.2, fp64 26.8 G/s distinct-address atomics on GH200 "
         "(triton-lang/triton PR #10059); float32 [assumed] as int32 (RED.ADD.F32 in the same L2 unit)"),
        ("l2_bw", "[measured] gpu-benches (H200)"),
        ("vector_atomics", "[spec] CUDA Programming Guide, atomicAdd(float2*/float4*) on compute capability 9.x; "
         "SASS ATOMG/REDG.E.ADD.F32x4 (tests/test_vector_atomics.py)"),
        *_COMMON,
    ),
)  # fmt: skip
# H200: the H100's GH100 chip (same SMs, clocks and L2) with 141 GB of HBM3e at 4.8 TB/s; CUB's
# measurements in CALIBRATION.md were taken on it.
H200 = dataclasses.replace(
    H100,
    name="H200-SXM",
    dram_bw=4.8e12,
    eta=0.92,
    eta_write=0.84,
    measured_limit=Limit(4.85e-6, 0.93, 0.85, "CALIBRATION.md: CUB 2^8 (4.86 us) and 2^28 (249.3 us) on H200"),
    sources=(
        ("sms/clock_hz/l2_size/smem", "[spec] NVIDIA H200 datasheet: the GH100 chip of H100 SXM"),
        ("dram_bw", "[spec] 4.8 TB/s HBM3e"),
        ("eta", "[measured] CUB DeviceReduce int32 2^28 in 249.3 us (cccl PR #9722): 0.92 of peak past the floor"),
        ("eta_write", "[assumed] H100's write/read ratio"),
        *[s for s in H100.sources if s[0] in ("dram_latency_s", "atomic_rates", "l2_bw", "vector_atomics")],
        *_COMMON,
    ),
)
A100 = GPUSpec(
    "A100-SXM4-80GB",
    108,
    1.41e9,
    2.04e12,
    0.87,
    405e-9,
    4.5e-6,
    48e9,
    1.41e9,
    l2_bw=5e12,
    l2_size=40 * 2**20,
    smem_per_block=163 * 1024,
    smem_per_sm=164 * 1024,
    l1_per_sm=192 * 1024,
    eta_write=0.79,
    queued_launch_s=0.1e-6,
    sources=(
        ("sms/clock_hz/dram_bw/l2_size/smem", "[spec] NVIDIA A100 datasheet"),
        ("eta/l2_bw", "[measured] te42kyfo/gpu-benches (A100)"),
        ("eta_write", "[assumed] H100's write/read ratio (0.86 / 0.95)"),
        ("dram_latency_s", "[measured] gpu-benches, markdewing/AI_kernels"),
        ("atomic_rate", "[assumed] two thirds of H100's int32 rate, scaled by L2 clock (no published figure)"),
        *_COMMON[2:],
        ("launch_s/queued_launch_s", "[assumed] H100's: the floor measured on H200 (no A100 measurement)"),
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
    5.0e-6,
    25e9,
    1.53e9,
    l2_bw=2.1e12,
    l2_size=6 * 2**20,
    sfu_per_clock_sm=16,
    fp32_per_clock_sm=64,
    fp64_per_clock_sm=32,
    max_blocks_sm=32,
    smem_per_block=96 * 1024,
    smem_per_sm=96 * 1024,
    smem_reserved_per_block=0,
    l1_per_sm=128 * 1024,
    eta_write=0.77,
    queued_launch_s=0.5e-6,
    sources=(
        ("sms/clock_hz/dram_bw/l2_size/smem", "[spec] NVIDIA Tesla V100 datasheet (SXM2)"),
        ("eta", "[measured] about 790 GB/s streaming of 900 GB/s peak (Jia et al. 2018, 'Dissecting Volta')"),
        ("eta_write", "[assumed] H100's write/read ratio"),
        ("l2_bw", "[measured] about 2.1 TB/s L2 load throughput (Jia et al. 2018)"),
        ("dram_latency_s", "[derived] about 690 cycles at 1.53 GHz from Jia et al. 2018's pointer chase"),
        ("launch_s/queued_launch_s", "[assumed] H100's floor and queued launch, a little more for CUDA 10"),
        ("fp64_per_clock_sm", "[spec] V100 whitepaper: 32 FP64 lanes per SM"),
        ("atomic_rate", "[assumed] scaled from H100's by L2 bandwidth (no published figure)"),
        ("l2_clock_hz", "[assumed] L2 at the core clock"),
    ),
)
GPUS = {"h100": H100, "h200": H200, "a100": A100, "v100": V100}

__all__ = [
    "A100",
    "ATOMIC_RATES",
    "GPUS",
    "GPUSpec",
    "H100",
    "H200",
    "KernelCost",
    "Limit",
    "MAX_REGISTERS",
    "V100",
    "chain_s",
    "kernel_time",
    "launch_bound_registers",
    "sequence_s",
]
