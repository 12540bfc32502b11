"""The per-kernel time model (docs/GPU_MODEL.md): one launch's modeled time on a GPU (`kernel_time`), and
kernels launched back to back by one call (`sequence_s`, `chain_s`). The GPU's figures and the DRAM
latency and bandwidth laws they give are model/gpu.py's `GPUSpec`.

    T = T_launch + max(T_dram, T_l2, T_issue) + T_tail + T_atomic
    T = T_launch + max(T_dram + T_l2, T_issue) + T_tail + T_atomic + T_sync    (grid-wide waits)

    T_launch = the per-kernel floor of the first kernel of a call [measured: CUB's single-tile
               kernel, 4.86-5.29 us cold on H200, less its own round trip and epilogue: 4.5 us];
               a kernel queued behind another pays only `queued_launch_s` [measured: CUB's two
               kernels at 2^16 take 5.35 us, its one at 2^12 5.29 us] (model/estimate.py).
    T_dram   = max(bytes / BW, L(BW) + bytes / BW_stream): the first round trip (at the latency
               of the load the stream puts on DRAM; none for a kernel that only stores), then the stream;
               BW_stream = bytes / (read / (eta * peak) + written / (eta_write * peak)), the
               access pattern's achievable bandwidth [measured: QuACK's read-mostly and
               read-write rows]; BW from Little's law with a latency that rises with load:
               BW = min(BW_stream, F / L(BW)),  L(BW) = L0 + (L1 - L0) * BW / (eta * BW_peak)
               F: bytes in flight chip-wide (streamed input bytes only, never more than the kernel
               moves); L0 the unloaded latency [measured]; L1 the loaded latency at saturation
               [fitted: SMs * 24 KB / (eta * BW_peak), about 1.0 us on H100, to Liger's softmax rows
               of 256 and 512 elements, whose programs keep 8 and 16 KB per SM in flight]. A
               512-byte sum pays one unloaded round trip, a saturating stream L1.
               A kernel whose blocks wait for `round_trips` dependent round trips in turn (a loop
               that issues its next load only after using the last, a gather whose address is
               loaded) lasts at least waves x round_trips x L(BW) + T_issue: each step's work
               issues only once its load has arrived, so the SM's issue runs in series with the
               chain, not under it [assumed: lock-step, every resident warp waits, then issues;
               no new figure. It reproduces torch.compile's looped softmax and cross-entropy rows
               of 16384-65536 elements, 1.2-1.4 us per dependent step against L1's 0.87].
    T_l2     = bytes re-read while resident in L2 / L2 bandwidth
    T_issue  = max(all FP and SFU instructions / 128, FP64 / 64, SFU / 16) per SM per clock, over
               the SMs the kernel occupies [spec: 4 schedulers x 32 lanes; H100 SXM FP64 64 and
               SFU 16 lanes per SM per clock]: arithmetic that outlasts the DRAM time binds; a
               tensor-core kernel's MMA FLOPs / the mma.sync rate of the occupied SMs, the larger
               of the two (model/library.py `mma_sync_peak`).
    T_tail   = the last wave's block epilogue (earlier waves' epilogues hide under streaming)
    T_atomic = the merges left exposed: those of the last wave, plus what earlier waves issue
               beyond the streaming time they overlap. Native atomics cost 1 / the merged type's
               atomic rate each [measured per dtype: triton-lang/triton PR #10059]
               and serialize on one address at one per L2 clock; compare-and-swap merges
               serialize on one address at one L2 round trip each (a CAS needs the previous
               value back) [derived].
    T_sync   = a kernel whose blocks wait for each other `grid_syncs` times (a split stitched
               row, all blocks resident): each wait costs two L2 round trips (the arrival's
               atomic, then the poll that sees the last one) plus the kernel's own `sync_cycles`
               (what it does around the waits) [derived]. Its passes no longer overlap across
               blocks, so the L2 re-reads add to the DRAM stream instead of hiding under it.
    T_spill  = a kernel whose compiler spilled registers: its spill stores and loads through L1,
               L2 and, for the frame beyond the L2, DRAM (model/spill.py), added to T [derived].

>>> from panamera.model.gpu import H100
>>> round(kernel_time(H100, dram_bytes=512, blocks=1, threads=32, bytes_in_flight_per_thread=16).dram_s * 1e6, 2)
0.35
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # model/gpu.py re-exports this module's names: imported for the annotations only
    from .gpu import GPUSpec


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
    spill_s: float = 0.0  # register spills' local-memory traffic (model/spill.py), added

    @property
    def total_s(self) -> float:
        stream = (
            max(self.dram_s + self.l2_s, self.issue_s) if self.phased else max(self.dram_s, self.l2_s, self.issue_s)
        )
        return self.launch_s + stream + self.tail_s + self.atomic_s + self.sync_s + self.spill_s


def sequence_s(costs, gpu: GPUSpec) -> float:
    """Seconds of kernels launched back to back by one call: the first pays the per-kernel floor
    (`gpu.launch_s`), every later one only the gap of a queued launch (`gpu.queued_s`) — the rule
    model/estimate.py applies to a whole plan, so that the planner weighs alternatives (one
    stitched kernel against the unfused kernels, one launch against two) as the plan is modeled.

    >>> from panamera.model.gpu import H100
    >>> c = KernelCost(H100.launch_s, 1e-6, 0.0, 0.0)
    >>> round((sequence_s([c, c], H100) - c.total_s) * 1e6, 3) == round(1.0 + H100.queued_s * 1e6, 3)
    True
    """
    return chain_s([c.total_s for c in costs], gpu)


def chain_s(totals_s, gpu: GPUSpec) -> float:
    """`sequence_s` of kernels known only by their single-launch totals (seconds), as a plan kept
    as data holds them (schedule/param_schedule.py `ClassPlan`): the one rule, on figures.

    >>> from panamera.model.gpu import H100
    >>> round(chain_s([5e-6, 5e-6], H100) * 1e6, 3) == round(10.0 - (H100.launch_s - H100.queued_s) * 1e6, 3)
    True
    """
    totals = list(totals_s)
    return sum(totals) - max(0, len(totals) - 1) * (gpu.launch_s - gpu.queued_s)


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
    write_bytes: float = 0.0,
    atomic_dtype: str = "",
    round_trips: int = 0,
    mma_flops: float = 0.0,
    mma_dtype: str = "",
    mma_async: bool = False,
    spill_stores: float = 0.0,
    spill_loads: float = 0.0,
    spill_frame: int = 0,
    shared_bytes: int = 0,
    registers: int = 0,
) -> KernelCost:
    """Modeled time of one kernel launch (the terms are in the module docstring).

    `bytes_in_flight_per_thread`: streamed input bytes each thread has requested and not yet
    received (vector width x loads in flight); `atomics`: every atomic the kernel issues (merges
    and counter arrivals), of which `cas_atomics` are compare-and-swap merges; `same_address`:
    merges into one word (the blocks that share an output); `*_ops`: thread instructions;
    `grid_syncs`: grid-wide waits every block passes, `sync_cycles` the cycles of the work
    around them (T_sync); `write_bytes`: the part of `dram_bytes` written (streamed at
    `eta_write`); `atomic_dtype`: the merged words' type (its atomic rate, `atomic_rate_of`);
    `round_trips`: dependent DRAM round trips every block waits for in turn (a gather whose
    address is itself loaded: 2), so each wave lasts at least that many latencies at the load in
    use, and the kernel at least all of them plus its issue (T_issue: a step's work waits for its
    load; 0: not modeled); `mma_flops`: the FLOPs of the kernel's MMAs on tensor cores with
    operands of `mma_dtype`, at model/library.py's `mma_sync_peak` over the SMs the kernel occupies
    (`mma_async`: warpgroup MMAs, wgmma, at the datasheet's dense peak, `tensor_core_peak`),
    an issue term beside the CUDA cores' (T_issue: the larger binds); `spill_stores` /
    `spill_loads`: the kernel's register-spill bytes (ptxas -v per thread x threads launched),
    `spill_frame` the stack frame per thread (the frames of the blocks resident on an SM share it);
    `shared_bytes` a block's shared memory, as
    the stage that planned the kernel decided it: it bounds the resident blocks per SM
    (`GPUSpec.resident_blocks`: waves, bytes in flight, the tail) and the L1 a spilled frame
    finds (model/spill.py: T_spill, added); `registers` the registers per thread, as ptxas reports them,
    as the kernel's launch bounds cap them (`launch_bound_registers`) or as the planning stage
    estimates them: they bound the resident blocks as shared memory does (0: unknown, bound by
    threads and shared memory alone)."""
    features = (("dram_bytes", dram_bytes), ("blocks", blocks), ("threads", threads),
                ("bytes_in_flight_per_thread", bytes_in_flight_per_thread), ("atomics", atomics),
                ("same_address", same_address), ("cas_atomics", cas_atomics), ("epilogue_cycles", epilogue_cycles),
                ("l2_bytes", l2_bytes), ("sfu_ops", sfu_ops), ("fp32_ops", fp32_ops), ("fp64_ops", fp64_ops))  # fmt: skip
    if grid_syncs or sync_cycles:  # recorded only where used: every other plan's features stay as they were
        features += (("grid_syncs", grid_syncs), ("sync_cycles", sync_cycles))
    if write_bytes:
        features += (("write_bytes", write_bytes),)
    if atomic_dtype:
        features += (("atomic_dtype", atomic_dtype),)
    if round_trips:
        features += (("round_trips", round_trips),)
    if mma_flops:
        features += (("mma_flops", mma_flops), ("mma_dtype", mma_dtype))
        if mma_async:
            features += (("mma_async", True),)
    if spill_stores or spill_loads:
        features += (("spill_stores", spill_stores), ("spill_loads", spill_loads), ("spill_frame", spill_frame))
    if shared_bytes:
        features += (("shared_bytes", shared_bytes),)
    if registers:
        features += (("registers", registers),)
    if blocks <= 0:
        return KernelCost(gpu.launch_s, 0.0, 0.0, 0.0, features=features)
    resident = gpu.resident_blocks(threads, shared_bytes, registers)
    per_sm_blocks = min(resident, math.ceil(blocks / gpu.sms))
    active = min(gpu.sms, blocks)
    in_flight = min(active * per_sm_blocks * threads * bytes_in_flight_per_thread, dram_bytes)
    # Little's law, but never faster than the first round trip plus the stream at full bandwidth.
    cap = gpu.stream_bw(dram_bytes - min(write_bytes, dram_bytes), min(write_bytes, dram_bytes))
    reads = dram_bytes - min(write_bytes, dram_bytes)  # a kernel that only stores waits for no round trip
    dram = dram_bytes / cap
    if reads:  # the first round trip, at the latency of the load the stream puts on DRAM, then the stream
        bw = gpu.bandwidth(in_flight, cap)
        dram = max(dram_bytes / bw, gpu.latency_at(bw) + dram_bytes / cap)
    waves = math.ceil(blocks / (gpu.sms * resident))
    tail = epilogue_cycles / gpu.clock_hz
    rate = active * gpu.clock_hz  # per-SM-clock throughputs, on the SMs the kernel occupies
    sfu = sfu_ops / (gpu.sfu_per_clock_sm * rate)
    issue = max(
        (fp32_ops + fp64_ops + sfu_ops) / (gpu.fp32_per_clock_sm * rate), fp64_ops / (gpu.fp64_per_clock_sm * rate), sfu
    )
    if round_trips and dram_bytes:  # every wave waits for its blocks' dependent round trips in turn, and each
        # step's work issues once its load has arrived: the chain's issue is in series with its latency
        dram = max(dram, waves * round_trips * gpu.latency_at(dram_bytes / max(dram, 1e-12)) + issue)
    if mma_flops:  # the tensor cores' issue (model/library.py imports this module: imported here)
        from .library import mma_sync_peak, tensor_core_peak

        peak = tensor_core_peak(gpu, mma_dtype) if mma_async else mma_sync_peak(gpu, mma_dtype)
        issue = max(issue, mma_flops / (peak / gpu.sms * active))
    atomic = _exposed_atomics(gpu, atomics, same_address, cas_atomics, waves, dram, gpu.atomic_rate_of(atomic_dtype))
    sync = (grid_syncs * 2 * gpu.l2_latency_cycles + sync_cycles) / gpu.clock_hz
    spill = 0.0
    if spill_stores or spill_loads:  # model/spill.py imports this module: imported here
        from .spill import spill_s

        frame = spill_frame * threads * per_sm_blocks  # the frames of the blocks the registers let in
        spill = spill_s(gpu, stores=spill_stores, loads=spill_loads, frame_per_sm=frame, shared=shared_bytes)
    return KernelCost(
        gpu.launch_s, dram, tail, atomic, l2_bytes / gpu.l2_bw, sfu, issue, features, sync, grid_syncs > 0, spill
    )


def _exposed_atomics(
    gpu: GPUSpec, atomics: int, same_address: int, cas: int, waves: int, streaming_s: float, rate: float
) -> float:
    """The atomics' time not hidden under streaming: merges issued by earlier waves overlap the
    later waves' loads; the last wave's, and any excess beyond the streaming time, are exposed."""
    if not atomics:
        return 0.0
    serial_native = same_address / gpu.l2_clock_hz
    serial_cas = same_address * gpu.l2_latency_cycles / gpu.clock_hz
    serial = serial_cas if cas else serial_native
    total = atomics / rate + serial
    last = total / waves
    return last + max(0.0, total - last - streaming_s)
