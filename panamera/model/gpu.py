"""GPU figures (docs/GPU_MODEL.md, with their sources there) and the per-kernel time model.

    T = T_launch + max(T_dram, T_l2, T_issue) + T_tail + T_atomic
    T = T_launch + max(T_dram + T_l2, T_issue) + T_tail + T_atomic + T_sync    (grid-wide waits)

    T_launch = the launch alone [derived]: the measured 2.5 us per kernel of a two-kernel CUB
               reduce of a tiny input holds each kernel's own DRAM round trip and epilogue, so the
               launch is about 2.1 us (docs/GPU_MODEL.md, "The launch figure contains work").
    T_dram   = max(bytes / BW, L0 + bytes / (eta * BW_peak)): the first round trip, then the stream;
               BW from Little's law with a latency that rises with load:
               BW = min(eta * BW_peak, F / L(BW)),  L(BW) = L0 + (L1 - L0) * BW / (eta * BW_peak)
               F: bytes in flight chip-wide (streamed input bytes only, never more than the kernel
               moves); L0 the unloaded latency [measured]; L1 the loaded latency at saturation
               [derived: SMs * 32 KB / (eta * BW_peak), the "aim for 32 KB per SM" rule, ~1.4 us on
               H100]. A 512-byte sum pays one unloaded round trip, a saturating stream L1.
    T_l2     = bytes re-read while resident in L2 / L2 bandwidth
    T_issue  = max(all FP and SFU instructions / 128, FP64 / 64, SFU / 16) per SM per clock, over
               the SMs the kernel occupies [spec: 4 schedulers x 32 lanes; H100 SXM FP64 64 and
               SFU 16 lanes per SM per clock]: arithmetic that outlasts the DRAM time binds.
    T_tail   = the last wave's block epilogue (earlier waves' epilogues hide under streaming)
    T_atomic = the merges left exposed: those of the last wave, plus what earlier waves issue
               beyond the streaming time they overlap. Native atomics cost 1 / atomic rate each
               and serialize on one address at one per L2 clock; compare-and-swap merges
               serialize on one address at one L2 round trip each (a CAS needs the previous
               value back) [derived].
    T_sync   = a kernel whose blocks wait for each other `grid_syncs` times (a split stitched
               row, all blocks resident): each wait costs two L2 round trips (the arrival's
               atomic, then the poll that sees the last one) plus the kernel's own `sync_cycles`
               (what it does around the waits) [derived]. Its passes no longer overlap across
               blocks, so the L2 re-reads add to the DRAM stream instead of hiding under it.

`estimate.limit_us` is docs/GPU_MODEL.md's limit: one launch + one unloaded DRAM round trip +
compulsory bytes at eta * BW_peak.

>>> round(kernel_time(H100, dram_bytes=512, blocks=1, threads=32, bytes_in_flight_per_thread=16).dram_s * 1e6, 2)
0.35
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
    fp32_per_clock_sm: int = 128  # also the issue width: 4 schedulers x 32 lanes
    fp64_per_clock_sm: int = 64
    l2_latency_cycles: int = 270  # an L2 hit's round trip, in core clocks: one CAS merge on a contended word
    vector_atomics: bool = False  # atomicAdd of float2/float4 as one 8/16-byte reduction (sm_90)
    l2_size: int = 50 * 2**20
    max_threads_sm: int = 2048
    max_blocks_sm: int = 32
    smem_per_block: int = 227 * 1024
    sources: tuple = ()  # (parameter, where the figure comes from), as in docs/GPU_MODEL.md

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
    def achievable_bw(self) -> float:
        return self.eta * self.dram_bw

    def resident_blocks(self, threads: int) -> int:
        """Blocks of `threads` threads that one SM holds at once (thread and block limits)."""
        return max(1, min(self.max_blocks_sm, self.max_threads_sm // max(threads, 1)))

    @property
    def in_flight_per_sm(self) -> float:
        """Bytes each SM must keep in flight to saturate the achievable bandwidth at the loaded
        latency (Little's law, F = BW x L / SMs) [derived]: what a pipeline's stages must supply
        (schedule/pipeline.py)."""
        return self.achievable_bw * self.loaded_latency_s / self.sms

    @property
    def loaded_latency_s(self) -> float:
        """DRAM latency at saturation [derived]: 32 KB in flight per SM saturate the achievable
        bandwidth, so by Little's law the latency under that load is SMs * 32 KB / BW."""
        return max(self.dram_latency_s, self.sms * 32 * 1024 / self.achievable_bw)

    def bandwidth(self, in_flight: float) -> float:
        """The DRAM bandwidth `in_flight` bytes sustain: Little's law, BW = F / L(BW), with the
        latency rising linearly from unloaded to loaded as BW approaches eta * peak; solved
        for BW (the positive root of k BW^2 + L0 BW - F = 0) and capped at eta * peak."""
        if in_flight <= 0:
            return 0.0
        bmax, l0 = self.achievable_bw, self.dram_latency_s
        k = (self.loaded_latency_s - l0) / bmax
        bw = in_flight / l0 if k <= 0 else (-l0 + math.sqrt(l0 * l0 + 4 * k * in_flight)) / (2 * k)
        return min(bmax, bw)


_COMMON = (
    (
        "launch_s",
        "[derived] 2.5 us per kernel of a two-kernel CUB reduce of a tiny input (4.9-5.4 us, cccl PR "
        "#9722) less the kernel's own DRAM round trip and epilogue it contains: about 2.1 us (docs/GPU_MODEL.md)",
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
)
H100 = GPUSpec(
    "H100-SXM5", 132, 1.98e9, 3.35e12, 0.90, 350e-9, 2.1e-6, 60e9, 1.75e9, vector_atomics=True,
    sources=(
        ("sms/clock_hz/dram_bw/l2_size/smem", "[spec] NVIDIA H100 datasheet"),
        ("eta", "[measured] CUB DeviceReduce reaches 90% of peak on H200 (cccl PR #9722)"),
        ("dram_latency_s", "[measured] gpu-benches, markdewing/AI_kernels"),
        ("atomic_rate", "[measured] int32 distinct-address atomics at 73 G/s on GH200 (triton PR #10059)"),
        ("l2_bw", "[measured] gpu-benches (H200)"),
        ("vector_atomics", "[spec] CUDA Programming Guide, atomicAdd(float2*/float4*) on compute capability 9.x; "
         "SASS ATOMG/REDG.E.ADD.F32x4 (tests/test_vector_atomics.py)"),
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
    2.1e-6,
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
    2.5e-6,
    25e9,
    1.53e9,
    l2_bw=2.1e12,
    l2_size=6 * 2**20,
    sfu_per_clock_sm=16,
    fp32_per_clock_sm=64,
    fp64_per_clock_sm=32,
    max_blocks_sm=32,
    smem_per_block=96 * 1024,
    sources=(
        ("sms/clock_hz/dram_bw/l2_size/smem", "[spec] NVIDIA Tesla V100 datasheet (SXM2)"),
        ("eta", "[measured] about 790 GB/s streaming of 900 GB/s peak (Jia et al. 2018, 'Dissecting Volta')"),
        ("l2_bw", "[measured] about 2.1 TB/s L2 load throughput (Jia et al. 2018)"),
        ("dram_latency_s", "[derived] about 690 cycles at 1.53 GHz from Jia et al. 2018's pointer chase"),
        (
            "launch_s",
            "[assumed] 3 us back to back with CUDA 10 (no measurement in our sources), less a round "
            "trip and an epilogue as for H100: 2.5 us",
        ),
        ("fp64_per_clock_sm", "[spec] V100 whitepaper: 32 FP64 lanes per SM"),
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
    sfu_s: float = 0.0  # the special-function part of issue_s (shown apart, not added again)
    issue_s: float = 0.0
    features: tuple = field(default=(), compare=False)  # kernel_time's keyword arguments, to re-model
    sync_s: float = 0.0  # grid-wide waits (T_sync)
    phased: bool = False  # passes separated by grid-wide waits: DRAM and L2 times add up

    @property
    def total_s(self) -> float:
        stream = (
            max(self.dram_s + self.l2_s, self.issue_s) if self.phased else max(self.dram_s, self.l2_s, self.issue_s)
        )
        return self.launch_s + stream + self.tail_s + self.atomic_s + self.sync_s


def kernel_time(
    gpu: GPUSpec,
    *,
    dram_bytes: float,
    blocks: int,
    threads: int,
    bytes_in_flight_per_thread: float,
    atomics: int = 0,
    same_address: int = 0,
    cas_atomics: int = 0,
    epilogue_cycles: int = 400,
    l2_bytes: float = 0.0,
    sfu_ops: float = 0.0,
    fp32_ops: float = 0.0,
    fp64_ops: float = 0.0,
    grid_syncs: int = 0,
    sync_cycles: int = 0,
) -> KernelCost:
    """Modeled time of one kernel launch (the terms are in the module docstring).

    `bytes_in_flight_per_thread`: streamed input bytes each thread has requested and not yet
    received (vector width x loads in flight); `atomics`: every atomic the kernel issues (merges
    and counter arrivals), of which `cas_atomics` are compare-and-swap merges; `same_address`:
    merges into one word (the blocks that share an output); `*_ops`: thread instructions;
    `grid_syncs`: grid-wide waits every block passes, `sync_cycles` the cycles of the work
    around them (T_sync)."""
    features = (("dram_bytes", dram_bytes), ("blocks", blocks), ("threads", threads),
                ("bytes_in_flight_per_thread", bytes_in_flight_per_thread), ("atomics", atomics),
                ("same_address", same_address), ("cas_atomics", cas_atomics), ("epilogue_cycles", epilogue_cycles),
                ("l2_bytes", l2_bytes), ("sfu_ops", sfu_ops), ("fp32_ops", fp32_ops), ("fp64_ops", fp64_ops))  # fmt: skip
    if grid_syncs or sync_cycles:  # recorded only where used: every other plan's features stay as they were
        features += (("grid_syncs", grid_syncs), ("sync_cycles", sync_cycles))
    if blocks <= 0:
        return KernelCost(gpu.launch_s, 0.0, 0.0, 0.0, features=features)
    resident = gpu.resident_blocks(threads)
    per_sm_blocks = min(resident, math.ceil(blocks / gpu.sms))
    active = min(gpu.sms, blocks)
    in_flight = min(active * per_sm_blocks * threads * bytes_in_flight_per_thread, dram_bytes)
    # Little's law, but never faster than the first round trip plus the stream at full bandwidth.
    dram = (
        max(dram_bytes / gpu.bandwidth(in_flight), gpu.dram_latency_s + dram_bytes / gpu.achievable_bw)
        if dram_bytes
        else 0.0
    )
    waves = math.ceil(blocks / (gpu.sms * resident))
    tail = epilogue_cycles / gpu.clock_hz
    rate = active * gpu.clock_hz  # per-SM-clock throughputs, on the SMs the kernel occupies
    sfu = sfu_ops / (gpu.sfu_per_clock_sm * rate)
    issue = max(
        (fp32_ops + fp64_ops + sfu_ops) / (gpu.fp32_per_clock_sm * rate), fp64_ops / (gpu.fp64_per_clock_sm * rate), sfu
    )
    atomic = _exposed_atomics(gpu, atomics, same_address, cas_atomics, waves, dram)
    sync = (grid_syncs * 2 * gpu.l2_latency_cycles + sync_cycles) / gpu.clock_hz
    return KernelCost(
        gpu.launch_s, dram, tail, atomic, l2_bytes / gpu.l2_bw, sfu, issue, features, sync, grid_syncs > 0
    )


def _exposed_atomics(gpu: GPUSpec, atomics: int, same_address: int, cas: int, waves: int, streaming_s: float) -> float:
    """The atomics' time not hidden under streaming: merges issued by earlier waves overlap the
    later waves' loads; the last wave's, and any excess beyond the streaming time, are exposed."""
    if not atomics:
        return 0.0
    serial_native = same_address / gpu.l2_clock_hz
    serial_cas = same_address * gpu.l2_latency_cycles / gpu.clock_hz
    serial = serial_cas if cas else serial_native
    total = atomics / gpu.atomic_rate + serial
    last = total / waves
    return last + max(0.0, total - last - streaming_s)
