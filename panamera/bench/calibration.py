"""Published GPU measurements the performance model is calibrated against (the project's
CALIBRATION.md, with each source), and the model's figure for each: the modeled time of that
kernel's own plan (CUB's single-tile or two-kernel DeviceReduce, QuACK's and Liger's row kernels,
torch.compile's and eager PyTorch's) on the GPU it was measured on. tests/test_calibration.py
holds every row to +-10 % and checks that no row beats the limit (model/estimate.py `limit_us`).

Methods matter: NVBench (CUB) times the kernels alone with a cold L2; `triton.testing.do_bench`
(Liger, QuACK) records CUDA events around a Python call, so each time also holds the gap between
the start event and the kernel's start that the host's launch path leaves (`HOST_GAP_S`, fitted to
every do_bench row the model reproduces: the gap that least-squares their log ratios, 1.1 us; their
time less the model's range 0.74-1.16 us by series at 17-52 us). The model's own fixed terms are
held by the NVBench rows alone (no host gap): a do_bench row cannot tell the gap from a kernel's
fixed time, so moving one against the other leaves those rows where they were.

>>> rows = [r for r in ROWS if r.source == "C"]
>>> [round(modeled_us(r) / r.measured_us, 2) for r in rows[:2]]
[1.01, 1.04]
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ..model.estimate import estimate, limit_us
from ..model.gpu import H100, H200, GPUSpec
from .eager_peer import pytorch_eager
from .inductor_peer import QUACK_SWEEP_HINT
from .peer_work import Work
from .peers import cub_device_reduce, inductor
from .row_peers import liger, quack

HOST_GAP_S = 1.1e-6  # [fitted] do_bench's event-to-kernel gap of a Python launch (every fitting do_bench row)

Q_SHAPES = ((32768, 256), (32768, 512), (32768, 1024), (32768, 2048), (32768, 4096), (32768, 8192), (32768, 16384),
            (32768, 32768), (32768, 65536), (16384, 131072), (8192, 262144))  # fmt: skip
# GB/s read from the QuACK README figure (bf16), by kernel and implementation; None: not measured
Q_GBPS = {
    ("rms_norm", "quack"): (1913, 2298, 2581, 2761, 2900, 2987, 2960, 2987, 3020, 2986, 2811),
    ("rms_norm", "liger"): (1945, 2128, 2587, 2815, 2904, 2836, 2645, 2860, 653, None, None),
    ("rms_norm", "cudnn"): (1862, 2259, 2575, 2738, 2742, 2840, 2753, 1601, 273, 740, 637),
    ("rms_norm", "inductor"): (1278, 1576, 1948, 2185, 2303, 1947, 1814, 1776, 1534, 1503, 1498),
    ("softmax", "quack"): (1900, 2344, 2630, 2813, 2889, 2938, 2974, 2985, 3004, 3009, 3012),
    ("softmax", "liger"): (1228, 2068, 2660, 2780, 2870, 2928, 2988, 2823, 1963, None, None),
    ("softmax", "inductor"): (281, 558, 1107, 1405, 1623, 1759, 1789, 1684, 2032, 1440, 1409),
    ("cross_entropy", "quack"): (1113, 1600, 1902, 2320, 2692, 2942, 3061, 3021, 3182, 3163, 3034),
    ("cross_entropy", "inductor"): (340, 585, 875, 1163, 1396, 1553, 1648, 1700, 1479, 1226, 1226),
}
L_N = (1024, 2048, 4096, 8192, 16384)
L_US = {  # Liger-Kernel benchmark/data/all_benchmark_data.csv, forward, 4096 x N, do_bench median
    ("layer_norm", "float32", "liger"): (18.8, 29.2, 51.0, 94.8, 184.8),
    ("layer_norm", "float32", "pytorch-eager"): (23.6, 37.3, 66.2, 152.7, 306.8),
    ("rms_norm", "bfloat16", "liger"): (12.2, 17.6, 29.2, 50.9, 95.0),
    ("rms_norm", "bfloat16", "pytorch-eager"): (12.8, 19.0, 32.5, 74.5, 149.2),
}
C_US = {4: 5.01, 8: 4.86, 12: 5.29, 16: 5.35, 20: 7.13, 24: 25.7, 28: 249.3}  # cccl PR #9722 "Ref", H200, int32

# QuACK's torch.compile rows: every shape of its sweep runs the kernel recompiled at the sweep's first, 32768 x 256,
# with the row length symbolic (inductor_peer.py rule 6); the bench's Inductor peer is the static compile
PEER_PLANS = {
    "quack": quack,
    "liger": liger,
    "inductor": partial(inductor, size_hint=QUACK_SWEEP_HINT),
    "pytorch-eager": pytorch_eager,
}
ITEMSIZE = {"bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class Row:
    """One published measurement: `source` (Q, L or C of CALIBRATION.md), the kernel's pattern,
    who implemented it, its shape (M, N) and dtype, the GPU, the measured time and the method."""

    source: str
    pattern: str
    impl: str
    M: int
    N: int
    dtype: str
    gpu: GPUSpec
    measured_us: float
    method: str  # "do_bench" or "nvbench"

    @property
    def name(self) -> str:
        return f"{self.source} {self.pattern} {self.impl} {self.M}x{self.N} {self.dtype}"

    @property
    def traffic(self) -> tuple[int, int]:
        """(read, written) compulsory bytes: the inputs once, the outputs once."""
        e = ITEMSIZE.get(self.dtype, 4)
        if self.pattern == "reduce":
            return self.N * e, e
        params = {"rms_norm": self.N * e, "layer_norm": 2 * self.N * e}.get(self.pattern, 0)
        if self.pattern == "cross_entropy":
            return self.M * self.N * e + 8 * self.M, 4 * self.M
        return self.M * self.N * e + params, self.M * self.N * e


def _q_bytes(pattern: str, M: int, N: int) -> int:
    """QuACK's byte counts (benchmarks/benchmark_{rmsnorm,softmax,cross_entropy}.py), bf16."""
    if pattern == "rms_norm":
        return 2 * M * N * 2 + 4 * N
    if pattern == "softmax":
        return 2 * M * N * 2
    return (M * N + 2 * M) * 2


def _rows() -> tuple[Row, ...]:
    out = []
    for (pattern, impl), gbps in Q_GBPS.items():
        for (M, N), g in zip(Q_SHAPES, gbps):
            if g is not None:
                us = _q_bytes(pattern, M, N) / (g * 1e9) * 1e6
                out.append(Row("Q", pattern, impl, M, N, "bfloat16", H100, us, "do_bench"))
    for (pattern, dtype, impl), times in L_US.items():
        for N, us in zip(L_N, times):
            out.append(Row("L", pattern, impl, 4096, N, dtype, H100, us, "do_bench"))
    for log2, us in C_US.items():
        out.append(Row("C", "reduce", "cub", 1, 2**log2, "int32", H200, us, "nvbench"))
    return tuple(out)


ROWS = _rows()
# Rows the model does not reproduce, with the reason: (impl, pattern, N values or None for all) ->
# why. tests/test_calibration.py keeps them listed and fails when one comes within +-10 % (then it
# belongs with the others); docs/GPU_MODEL.md "Calibration" states them.
GAPS: dict[tuple[str, str, str, tuple[int, ...] | None], str] = {
    (
        "Q",
        "cudnn",
        "rms_norm",
        None,
    ): "cuDNN is closed source: no plan to model (its 32K-262K rows fall to 273-1601 GB/s)",
    (
        "Q",
        "inductor",
        "rms_norm",
        (256, 512, 1024),
    ): "torch.compile (PyTorch 2.7.1) of QuACK's rmsnorm_ref, every row of the sweep run by the kernel recompiled "
    "at 32768 x 256 with the row length symbolic (inductor_peer.py rule 6: looped, R0_BLOCK 256 x 2 warps, the loop "
    "not unrolled), which fits 2048-262144 (0.90-1.07). 256-1024 measure 7-9 us over it (0.75-0.89), unexplained. "
    "Its harness runs 32768 x 32768 first (benchmark_rmsnorm.py's defaults), so only N turns symbolic at 256",
    (
        "Q",
        "inductor",
        "softmax",
        (256, 512, 1024, 2048, 65536, 131072, 262144),
    ): "as for RMSNorm (rule 6, the kernel compiled at 256 with the row length symbolic), with 2.7.1's online softmax "
    "(one loop for max and sum, two exp per element, then the write loop), each step of a loop waiting for its "
    "load (the chain's latency plus its issue in series, model/gpu.py): 4096-32768 fit (0.98-1.07). 256-1024 take "
    "119-121 us whatever the row (0.22-0.71; the same kernel's RMSNorm takes 26-69), 2048 is at 0.87. 65536 is "
    "faster than its neighbours (2032 GB/s between 1684 and 1440: 1.21x); 131072 and 262144 are slower (0.85-0.87). "
    "They are one kernel, not a split reduction (ir.py Reduction.num_splits / choices.py reduction_split_factor: no "
    "split from 2 rows per SM; test_inductor_peer), and the static kernel (R0_BLOCK 2048, 16 warps) models them the "
    "same (0.84-0.86). Read against 2.7.1 for 256-1024 and not it: online softmax stays on with a symbolic row "
    "(lowering.py prepare_softmax_online l. 6986-6988 compares size_hint(rnumel), 256, with 8); the harness's "
    "first shape, 8192 x 16384 (benchmark_softmax.py's defaults), makes M symbolic too at the recompile, but no rule "
    "that picks the kernel reads a symbolic M (choices.py, triton_heuristics.py take the size hints); "
    "Dynamo's local PGO (_dynamo/config.py automatic_dynamic_local_pgo, on), which would compile the first shape "
    "already symbolic at its hint 16384, keys its state by a job id (_dynamo/pgo.py get_cache_key: None in a plain "
    "run). Flat 119-121 us is what a 512-thread program (R0_BLOCK 2048 x 16 warps, one step per loop, 63 waves) "
    "would take (1.02/1.06/1.15 modeled), not the 2-warp kernel of a 256 hint; do_bench's 256 MB L2 clear "
    "(about 90 us on the GPU) before each timed call hides up to that much host time, so a host-bound call would "
    "need about 210 us of Python per call",
    (
        "Q",
        "inductor",
        "cross_entropy",
        (256, 512, 1024, 2048, 32768, 131072, 262144),
    ): "F.cross_entropy(reduction='none') under torch.compile: log-softmax matches Inductor's online-softmax pattern "
    "(fx_passes/post_grad.py prepare_softmax_pattern), so one loop reads the logits once and the epilogue loads the "
    "target, then x[target] (L2 hits mostly); run by the kernel recompiled at 32768 x 256 (rule 6), it fits 4096, "
    "8192, 16384 and 65536 (0.94-1.09). Below, a floor of about 42 us (256-2048 at 0.34-0.81): the static kernel "
    "(persistent to 1024) is further off, the one compiled at 2048 (R0_BLOCK 2048 x 16 warps, 63 waves of one round "
    "trip each) would fit 1024 but not 256/512 (1.30/1.19). 32768 is at 1.12x; 131072 and 262144 (one kernel, no "
    "split) take 1.7 us per dependent step (0.80). Its harness, as softmax's, runs 8192 x 16384 first, so M and N "
    "turn symbolic together at 32768 x 256 (no rule that picks the kernel reads M); the measured rows 256-2048 lie "
    "on one line, 39 us + 0.0375 us per element of a row, whose intercept no kernel term of the model has",
    ("Q", "liger", "rms_norm", (16384,)): "12 % slower than modeled and slower per byte than the 32768 row of the "
    "same series (811.9 vs 751 us per 2 GB); Triton 3.3.1 compiles its kernel (16 warps) to 124 registers without "
    "spills, one block per SM, as its softmax at 16384 (80 registers), which fits; both are modeled so "
    "(row_peers.LIGER_REGISTERS) and neither moves: a block's 32 KB in flight still saturate the stream. An "
    "outlier no term follows. Its SASS (the same compile, cuobjdump) issues the weight's loads only after the "
    "warp-level sum of squares, at every size: with one block per SM one L2 round trip plus the block's 32 KB of W "
    "at an SM's share of the L2 (75.8 GB/s) are exposed per block, +141 us: 1.06x. Not adopted: the same rule puts "
    "Liger's 32768 row (64 KB of W, one block per SM) at 1.21x and Liger-Kernel's own 4096x16384 bf16 row (L, "
    "fits) at 1.20x. That L row is another compile (Liger-Kernel's CSV: megatron_rms_norm, Liger 0.8.0, 2026-06-10, "
    "the same _rms_norm_forward_kernel in llama casting through liger_kernel/megatron/rms_norm.py, under that date's "
    "Triton), so the SASS order read from Triton 3.3.1 need not hold for it; the 32768 row still stands against it",
    ("Q", "quack", "cross_entropy", (512, 1024, 2048)): "QuACK's cross-entropy reads these rows at 2.0-2.3 TB/s, "
    "below its softmax's rate (the same exp per element, twice the bytes, fits); quack/cross_entropy.py adds only the "
    "target logit read after the row's cp.async wait (an L2 hit, already charged as a second round trip per wave): "
    "the 2-8 us it pays beyond that are not explained (-15 to -20 %; 256 fits since the chain's issue is in series with "
    "its two round trips per wave, model/gpu.py). Nor by occupancy: its staged rows' shared "
    "memory (sX, now in the plan) binds only from 2048 and moves nothing; a register count that fixed 1024 "
    "(96-128 per thread) would put 256 and 512 at 1.47-1.85x. A count that follows the source (the row's "
    "N / threads_per_row fp32 values live per thread, plus 24-48) moves 256 first (1.13-1.25x at +32-48) and leaves "
    "1024/2048 unmoved: their 64-128 B per thread in flight saturate at any occupancy. The excess over QuACK's own "
    "softmax at half the bytes is 6-10 us at 256-4096 and none from 8192 (one row per block); the serial per-block "
    "chain (target index, row, target logit from L2) added to the stream instead of overlapped fits 1024/2048 "
    "(1.04-1.05x) but not 256 (1.45x) or 4096 (1.13x). Read again at the blog's commit (00ff856, 2025-07-10: online "
    "softmax, 32 threads per row and 4 rows per block to 3072): the target index is loaded before the row's cp.async, "
    "in parallel with it, so the dependent step after the row is the logit gather alone, an L2 hit that the plan "
    "charges at the loaded DRAM latency; without that second round trip the model leaves 3.0 / 3.6 / 7.4 / 8.8 / 8.5 "
    "/ 6.9 / 6.5 us at 256-16384, flat in N from 1024 (per 32768 rows, not per byte), and any constant of 3.9-4.5 us "
    "would fit all eleven rows. benchmark_cross_entropy.py times _cross_entropy(x, target) itself (three from_dlpack "
    "conversions per call, as benchmark_rmsnorm.py's _rmsnorm_fwd, whose rows fit with the common 1.1 us gap): no "
    "source sets such a constant for this harness alone",
    ("L", "pytorch-eager", "layer_norm", None): "nn.LayerNorm fp32 measures 1.2-1.3x the model of "
    "vectorized_layer_norm_kernel (32x4 threads per row, launch_vectorized_layer_norm_kernel) with its second pass "
    "from L2 or DRAM. Its Welford update (a reciprocal per element) hides under the stream by Little's law. Its "
    "register count does not explain it: the kernel compiles to 39 registers (the sm_90 SASS of PyTorch 2.11's and "
    "2.12's wheels, as a standalone re-typed compile; 32 for bf16, no stack), 12 blocks of 128 per SM, now counted "
    "(eager_peer.EAGER_LN_REGISTERS), which moves the model 0-9 % the wrong way (fewer rows in flight: more of the "
    "second pass hits L2; 0.76-0.81x). PyTorch 2.7.1's wheel, the release current when these rows were taken, ships "
    "it at 45 (10 blocks): 0.76 / 0.79 / 0.80 / 0.78 / 0.85, still out. "
    "Nor the block's serial phases: charging its in-flight bytes only while pass 1's N / 512 DRAM round trips run "
    "(not during the Welford block reduction or pass 2's L2 round trips) moves the rows <= 1 % (the model's latency "
    "falls with the load); about half the bytes in flight (12 KB per SM) would fit 1024 but not 16384, whose second "
    "pass is mostly DRAM. The ratio is flat over N (0.78-0.86), the mark of a per-element cost: the Welford update "
    "(an IEEE reciprocal per element, ~20 instructions) added to the stream rather than overlapped lands the five "
    "rows at 0.88-1.01, but queueing 12 warps per scheduler at ~80 issue cycles per loop step against a 1.07 us "
    "round trip explains only 4-8 %. The rows are Liger 0.6.0's run of 2025-07-17; eager RMSNorm's (which fit) are "
    "Liger 0.8.0's of 2026-06-10, through the same kernel template (_fused_rms_norm_cuda, `bool rms_norm`). Their "
    "excess is per element (0.8-1.3 ns per element fits all five; measured less modeled: 5.7 / 8.3 / 15.0 / 36.2 / "
    "59.4 us), but the issue in series with the stream (the lock-step rule of model/gpu.py) at ~20 instructions per "
    "element for Welford's two passes is ~0.6 ns (2.7.1's SASS: pass 1 keeps one 16-byte load per thread per step, "
    "runtime-unrolled by 4 but each load issued after the last step's four updates, every reciprocal behind a "
    "slow-path branch: 88 instructions per 4-element step, ~17 executed per element), and at RMSNorm's ~8 (4 per byte "
    "against LayerNorm's 5) it would put "
    "eager RMSNorm 4096 at 1.14x. Every re-read charged to DRAM (as if pass 2 always missed L2) lands them at 0.98 / "
    "1.06 / 1.09 / 0.90 / 0.88, with no source for a miss; RMSNorm's rows fit with the L2 hits",
    ("L", "pytorch-eager", "rms_norm", (8192,)): "10.8 % under the measurement (0.892), at the edge of the L2 re-read "
    "rule (peer_plan.reread): 2112 resident rows of 16 KB (34.6 MB) against half the L2 (26.2 MB) re-read 75.8 % from "
    "L2, and 73.6 % or less would fit (a reach 3 % smaller), within the rule's precision but set by no measurement; "
    "the rule is shared with Inductor's looped rows. The measurement is confirmed by the CSV's second provider "
    "(megatron: WrappedTorchNorm returns the same nn.RMSNorm, 74.496 us to the ns)",
    ("C", "cub", "reduce", (2**24,)): "2^20 to 2^24 runs at 3.25 TB/s and 2^24 to 2^28 at 4.5 (-19 %). The plan is "
    "CCCL's as the PR ran it (tuning_reduce.cuh policy_selector: the sm60+ policy, 256 threads x 16 items, vector 4, "
    "on sm90, whose only tunings are sm100's for float32 and 8-byte accumulators; dispatch_reduce.cuh: grid = "
    "min(tiles, sm_occupancy x SMs x CUB_SUBSCRIPTION_FACTOR 5)), 4096 one-tile blocks (5280 allowed at 8 per SM) with "
    "128 KB per SM in flight, so neither latency, occupancy nor the grid explains it. Nor the two-kernel plan: cccl PR "
    "#8884 times the one-kernel atomic reduce (reduce.nondeterministic, H200 NVL, NVBench) at 7.61 / 27.28 / 259.45 us "
    "for 2^20 / 2^24 / 2^28, 2^24 again 0.105 of 2^28 (0.103 here). 2^24 and 2^28 both fit a "
    "read at 4.50 TB/s plus 5.3 us, the write-back of 21 MB of dirty lines such as NVBench's l2flush (a "
    "cudaMemsetAsync of the L2's size before each sample, nvbench/detail/l2flush.cuh) leaves; but do_bench's cache "
    "clear (a 256 MB zero_ just before the start event) leaves them too, and NVBench even waits for the memset "
    "(measure_cold.cuh: flush, stream sync, then the timer), while Liger's series rises at one slope (2.9 TB/s) from "
    "16 MB up, with no such term",
}


def gap(r: Row) -> str | None:
    """Why the model does not reproduce row `r` (GAPS), or None."""
    for (source, impl, pattern, ns), why in GAPS.items():
        if (r.source, r.impl, r.pattern) == (source, impl, pattern) and (ns is None or r.N in ns):
            return why
    return None


def _work(r: Row) -> Work:
    e = ITEMSIZE[r.dtype]
    out = 4 if r.pattern == "cross_entropy" else e
    return Work(r.pattern, (), (), r.M, r.N, e, out, 0)


def plan_of(r: Row):
    """The launches of the measured kernel's plan, or None where Panamera has no plan for it."""
    if r.impl == "cub":
        return cub_device_reduce(r.N, 4, 4, r.gpu, 4)[0]
    f = PEER_PLANS.get(r.impl)
    p = f(_work(r), r.gpu) if f is not None else None
    return None if p is None else list(p.launches)


def modeled_us(r: Row) -> float | None:
    """The model's time of the row's plan on its GPU, plus the method's host gap (do_bench)."""
    launches = plan_of(r)
    if launches is None:
        return None
    e = estimate(launches, r.gpu, r.traffic)
    return e.total_us + (HOST_GAP_S * 1e6 if r.method == "do_bench" else 0.0)


def limit_of(r: Row) -> float:
    """The limit (model/estimate.py `limit_us`) of the row's compulsory traffic on its GPU."""
    read, written = r.traffic
    return limit_us(read + written, r.gpu, written)
