"""Peers of the `training` suite's backward graphs, each planned from its own source's launch rules
and modeled by the same model as Panamera (peers.py explains peers). A backward graph reads two
full tensors (x or y, and dy) and writes dx beside its reductions, which the generic reduction peers
of peers.py do not see; so a training workload says what it is (`Backward`) and these rules plan it.

Sources (bench/README.md "Peers and their rules"):
- **PyTorch eager**: aten/src/ATen/native/cuda/layer_norm_kernel.cu `LayerNormBackwardKernelImplInternal`
  (dX: `layer_norm_grad_input_kernel_vectorized`, one block of `num_threads()` = 128 per row, a
  pass for the two row sums, then a pass that re-reads the row and writes dX) and
  `LaunchGammaBetaBackwardCUDAKernel` (M <= 64K: `GammaBetaBackwardCUDAKernelTemplate` with
  block_dim_x 32, block_dim_y 32, rows_per_block_y 256: N / 32 blocks, each over every row; M > 64K
  with N / 32 < SMs / 2: blocks.y = ceil(M / 32) partial rows then `.sum(0)`); `RMSNormBackwardKernelImpl`
  is the same template with one column output. SoftMax.cu `host_softmax_backward` (rows <= 1024 values and
  <= 4 KB: `dispatch_softmax_backward`, a warp per row; else `cunn_SoftMaxBackwardSmem` when the row fits
  `sharedMemPerBlock` (48 KB) and N % ILP == 0, staging one operand; else `cunn_SoftMaxBackward`).
  Cross-entropy: `nll_loss_backward` (zero the M x N gradient, then one kernel scatters -dloss / M),
  then `host_softmax_backward` with the log-softmax epilogue. Normalization.cuh
  `batch_norm_backward_reduce_kernel` / `..._channels_last_kernel` (per-channel sums of dy and dy * xhat)
  then `batch_norm_backward_elemt_kernel` (dx).
- **Liger-Kernel** (linkedin/Liger-Kernel): `ops/layer_norm.py` `layer_norm_backward` and
  `ops/rms_norm.py` `rms_norm_backward`: grid = SM count, each program loops over
  ceil(M / SMs) rows keeping dW (and dB) row partials in registers, stores them to an
  (SMs x N) fp32 buffer, then `_DW.sum(dim=0)` (an ATen column reduction). `ops/softmax.py`
  `_softmax_backward`: one program per row, the single-block kernel when BLOCK_SIZE >= n_cols.
  Cross-entropy has no backward kernel: its forward writes the gradient in place
  (`ops/cross_entropy.py`), so Liger has no plan for this graph (None).
- **TorchInductor**: a row reduction kernel for dx (persistent up to 1024 values, else looped: the
  write loop re-reads the row, peer_plan.py `reread`), and the column sums as an OUTER reduction split
  by `Reduction.num_splits` (ir.py) into partials and a final kernel; BatchNorm: the channel sums,
  then a pointwise kernel for dx; embedding: torch/_decomp's `embedding_dense_backward` (`new_zeros`,
  then `index_put(accumulate=True)`), lowered to a zeroing kernel and atomic_add stores.
- **PyTorch eager, embedding**: Embedding.cu `embedding_dense_backward_cuda` and
  EmbeddingBackwardKernel.cu (sort the ids with cub, segment offsets, partial sums of 10 rows,
  then the partials summed per segment): deterministic, the peer of Panamera's sorted segments.

Every plan reads at least the workload's inputs and writes its outputs, so no peer is modeled
below the limit (tests/test_train_bench.py checks it at every shape).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..enums import StrEnum
from ..model.gpu import GPUSpec
from .eager_peer import _aten_reduce_launch, aten_elementwise
from .peer_plan import PeerPlan, _plan, cdiv, from_workspace, kernel, next_pow2, reread
from .peer_work import Reduction
from .peers import _inductor_kernel, inductor_num_splits
from .row_peers import liger_settings


class Pattern(StrEnum):
    LAYER_NORM = "layer_norm"
    RMS_NORM = "rms_norm"
    SOFTMAX = "softmax"
    CROSS_ENTROPY = "cross_entropy"
    BATCH_NORM = "batch_norm"
    EMBEDDING = "embedding"


@dataclass(frozen=True)
class Backward:
    """What a backward workload computes, as its peers see it: `M` rows of `N` values (BatchNorm: M =
    N·H·W positions of N channels; embedding: M ids of N values into `rows` table rows), stored in
    `elem` bytes; the saved statistics are fp32.

    >>> Backward(Pattern.LAYER_NORM, 4096, 1024, 2).columns
    2
    """

    pattern: Pattern
    M: int
    N: int
    elem: int
    channels_last: bool = True
    rows: int = 0

    @property
    def columns(self) -> int:
        """Column sums (dgamma, dbeta) the backward produces."""
        return {Pattern.LAYER_NORM: 2, Pattern.RMS_NORM: 1, Pattern.BATCH_NORM: 2}.get(self.pattern, 0)

    @property
    def stats(self) -> int:
        """Bytes of the saved per-row statistics (fp32 mean and rstd, or rstd)."""
        return {Pattern.LAYER_NORM: 8, Pattern.RMS_NORM: 4}.get(self.pattern, 0) * self.M


SMEM_PER_BLOCK_DEFAULT = 48 * 1024  # cudaDeviceProp.sharedMemPerBlock, what host_softmax_backward checks


# --- PyTorch eager -------------------------------------------------------------------------------------
def _eager_gamma_beta(b: Backward, gpu: GPUSpec) -> list:
    """LaunchGammaBetaBackwardCUDAKernel: dgamma (and dbeta) from x, dy, mean, rstd."""
    M, N, e, k = b.M, b.N, b.elem, b.columns
    read = 2 * M * b.N * e + b.stats
    if M > 64 * 1024 and N // 32 < gpu.sms // 2:
        rows_y = min(32 * 1024 // cdiv(N, 32), cdiv(M, 32))
        part = kernel("GammaBetaBackwardCUDAKernelTemplate", read=read, written=k * rows_y * N * e,
                      blocks=cdiv(N, 32) * rows_y, threads=32, in_flight=2 * e)  # fmt: skip
        r = Reduction("COLUMN", N, rows_y, "sum", e, e)
        fin, _ = _aten_reduce_launch(r, gpu, 4, "sum(0)")
        return [part, *[fin] * k]
    # block (32, 32), rows_per_block_y 256: each thread holds 256 / 32 rows of x and dy in flight
    return [kernel("GammaBetaBackwardCUDAKernelTemplate", read=read, written=k * N * e, blocks=cdiv(N, 32),
                   threads=1024, in_flight=8 * 2 * e)]  # fmt: skip


def _eager_norm(b: Backward, gpu: GPUSpec) -> PeerPlan:
    M, N, e = b.M, b.N, b.elem
    again = reread(M, 2 * N * e, 128, 2, gpu)  # the write pass re-reads x and dy
    dx = kernel("layer_norm_grad_input_kernel_vectorized", read=2 * M * N * e + N * e + b.stats + again["read"],
                written=M * N * e, blocks=M, threads=128, in_flight=2 * 4 * e, l2=again["l2"])  # fmt: skip
    launches = [dx, *_eager_gamma_beta(b, gpu)]
    return _plan("pytorch-eager", launches, f"layer_norm_kernel.cu backward ({b.pattern}): dX one 128-thread block "
                 "per row, two passes; gamma/beta template over columns")  # fmt: skip


def _eager_softmax_bwd(M: int, N: int, e: int, gpu: GPUSpec, name: str) -> tuple:
    """host_softmax_backward: reads the output (y, or logp) and the incoming gradient, writes dx."""
    if N <= 1024 and N * e <= 4096:
        p2 = next_pow2(N)
        warp = min(p2, 32)
        batches = 2 if p2 <= 128 else 1
        return kernel(f"{name}_warp_backward", read=2 * M * N * e, written=M * N * e,
                      blocks=cdiv(M, (128 // warp) * batches), threads=128, in_flight=2 * (p2 // warp) * batches * e,
                      sfu=M * N), "persistent warp per row"  # fmt: skip
    block = min(N, 1024)
    block = block if block % 32 == 0 else (block // 32 + 1) * 32
    ilp = 16 // e
    smem = N * e < SMEM_PER_BLOCK_DEFAULT and N % ilp == 0
    again = reread(M, (1 if smem else 2) * N * e, block, 2, gpu)  # the unstaged operand(s) re-read
    return kernel(f"cunn_{name}Backward{'Smem' if smem else ''}", read=2 * M * N * e + again["read"],
                  written=M * N * e, blocks=M, threads=block, in_flight=2 * ilp * e if not smem else 16,
                  l2=again["l2"], sfu=M * N), ("one operand staged in shared memory" if smem else "two passes")  # fmt: skip


def pytorch_eager(b: Backward, gpu: GPUSpec) -> PeerPlan | None:
    M, N, e = b.M, b.N, b.elem
    if b.pattern in (Pattern.LAYER_NORM, Pattern.RMS_NORM):
        return _eager_norm(b, gpu)
    if b.pattern is Pattern.SOFTMAX:
        ln, what = _eager_softmax_bwd(M, N, e, gpu, "SoftMax")
        return _plan("pytorch-eager", [ln], f"SoftMax.cu host_softmax_backward: {what}")
    if b.pattern is Pattern.CROSS_ENTROPY:
        zero = kernel("fill (grad_input.zero_)", read=0, written=M * N * e, blocks=cdiv(M * N, 128 * 8), threads=128,
                      in_flight=0)  # fmt: skip
        nll = kernel("nll_loss_backward", read=M * 8 + 4, written=M * e, blocks=1, threads=32, in_flight=8)
        ln, what = _eager_softmax_bwd(M, N, e, gpu, "LogSoftMax")
        return _plan("pytorch-eager", [zero, nll, ln], f"zero_, nll_loss_backward, host_softmax_backward: {what}")
    if b.pattern is Pattern.BATCH_NORM:
        C, R = N, M
        red = kernel("batch_norm_backward_reduce" + ("_channels_last" if b.channels_last else ""),
                     read=2 * R * C * e + 2 * C * 4, written=2 * C * 4, blocks=C if not b.channels_last else cdiv(C, 32),
                     threads=512, in_flight=2 * e)  # fmt: skip
        if b.channels_last:  # flexible_launch_configs: the N·H·W extent split over a 2-D grid, staged, last block folds
            ys = min(cdiv(R, 512 // 32 * 4), max(1, gpu.sms * 4 // cdiv(C, 32)))
            red = kernel("batch_norm_backward_reduce_channels_last", read=2 * R * C * e + 2 * C * 4 + 2 * ys * C * 4,
                         written=2 * C * 4 + 2 * ys * C * 4, blocks=cdiv(C, 32) * ys, threads=512, in_flight=2 * 4 * e,
                         atomics=cdiv(C, 32) * ys)  # fmt: skip
        elt = aten_elementwise("batch_norm_backward_elemt", R * C, 2 * R * C * e + 4 * C * 4, R * C * e, e)
        return _plan("pytorch-eager", [red, elt], "Normalization.cuh: backward_reduce per channel, then backward_elemt")
    if b.pattern is Pattern.EMBEDDING:
        return _eager_embedding(b, gpu)
    return None


EMBEDDING_FEATURE_IDS = 3072  # Embedding.cu: at most this many ids (no scale_grad_by_freq) take the feature kernel
NROWS_PER_THREAD = 10  # EmbeddingBackwardKernel.cu: rows per partial segment


def _eager_embedding(b: Backward, gpu: GPUSpec) -> PeerPlan:
    """Embedding.cu `embedding_dense_backward_cuda`, deterministic by construction. Up to 3072 ids:
    `embedding_backward_feature_kernel` (zeros, then one kernel: blocks of 32 x 32 threads over
    feature chunks of 32 walk the ids, each warp owning its rows). Beyond: `arange`, cub's
    `radix_sort_pairs` of the int64 ids with their positions over all 64 key bits (the nbits
    bound is commented out): one histogram kernel, one exclusive sum, eight onesweep passes of
    8 bits moving keys and values; then EmbeddingBackwardKernel.cu `embedding_backward_cuda_kernel`:
    `at::zeros` of the table, `cub::unique_by_key` (segment offsets: two kernels),
    `krn_partials_per_segment`, `cub::exclusive_sum` (two kernels), `compute_num_of_partial_segments`,
    `krn_partial_segment_offset`, `compute_grad_weight` (one thread per feature of a partial
    segment of up to NROWS_PER_THREAD rows, fp32 partials; grid sized by the ids) and
    `sum_and_scatter` (one thread per feature of a segment). The ids are taken uniform, as
    Panamera's plans take them (schedule/segments.py `expected_segments`)."""
    from ..schedule.segments import expected_segments

    T, D, V, e = b.M, b.N, b.rows, b.elem
    zeros = kernel("fill (at::zeros)", read=0, written=V * D * e, blocks=cdiv(V * D, 128 * 8), threads=128, in_flight=0)
    if T <= EMBEDDING_FEATURE_IDS:
        feat = kernel("embedding_backward_feature_kernel", read=T * 8 + T * D * e + T * D * e, written=T * D * e,
                      blocks=cdiv(D, 32), threads=1024, in_flight=e)  # fmt: skip
        return _plan("pytorch-eager", [zeros, feat], "Embedding.cu embedding_backward_feature_kernel (<= 3072 ids)")
    segs = expected_segments(T, V)
    partials = segs + max(0.0, T - segs) / NROWS_PER_THREAD  # segments longer than 10 rows split
    warped = cdiv(D, 32) * 32
    block = min(warped, 1024)
    onesweep_tile = 256 * 16  # threads x items of a onesweep tile (16 keys and values loaded before use)
    small = cdiv(T, 32)
    launches = [
        kernel("arange", read=0, written=T * 8, blocks=cdiv(T, 128 * 8), threads=128, in_flight=0),
        kernel(
            "DeviceRadixSortHistogramKernel",
            read=T * 8,
            written=8 * 256 * 8,
            blocks=gpu.sms,
            threads=128,
            in_flight=8 * 4,
        ),  # fmt: skip
        kernel(
            "DeviceRadixSortExclusiveSumKernel",
            read=8 * 256 * 8,
            written=8 * 256 * 8,
            blocks=1,
            threads=256,
            in_flight=8,
        ),  # fmt: skip
        *[
            kernel(
                "DeviceRadixSortOnesweepKernel",
                read=T * 16,
                written=T * 16,
                blocks=cdiv(T, onesweep_tile),
                threads=256,
                in_flight=16 * 16,
            )
            for _ in range(8)
        ],  # fmt: skip
        zeros,
        kernel("DeviceSelectSweepKernel init", read=0, written=16, blocks=1, threads=128, in_flight=0),
        kernel(
            "DeviceSelectSweepKernel (unique_by_key)",
            read=T * 8,
            written=segs * 8,
            blocks=cdiv(T, 128 * 15),
            threads=128,
            in_flight=15 * 8,
        ),  # fmt: skip
        kernel("krn_partials_per_segment", read=segs * 8, written=segs * 8, blocks=small, threads=32, in_flight=8),
        kernel("DeviceScanInitKernel", read=0, written=16, blocks=1, threads=128, in_flight=0),
        kernel(
            "DeviceScanKernel (exclusive_sum)",
            read=T * 8,
            written=T * 8,
            blocks=cdiv(T, 128 * 15),
            threads=128,
            in_flight=15 * 8,
        ),  # fmt: skip
        kernel("compute_num_of_partial_segments", read=16, written=8, blocks=1, threads=1, in_flight=8),
        kernel(
            "krn_partial_segment_offset", read=3 * segs * 8, written=partials * 8, blocks=small, threads=32, in_flight=8
        ),  # fmt: skip
        kernel(
            "compute_grad_weight",
            read=partials * 8 + T * 8 + T * D * e,
            written=partials * D * 4,
            blocks=cdiv(T * warped, block),
            threads=block,
            in_flight=e,
            round_trips=2,
        ),  # fmt: skip
        kernel(
            "sum_and_scatter",
            read=segs * 16 + partials * D * 4,
            written=segs * D * e,
            blocks=cdiv(T * warped, block),
            threads=block,
            in_flight=4,
            round_trips=2,
        ),  # fmt: skip
    ]
    return _plan("pytorch-eager", launches, f"Embedding.cu: cub radix_sort_pairs (64 key bits: 8 onesweep passes), "
                 f"then embedding_backward_cuda_kernel (zeros, unique_by_key, partial segments of {NROWS_PER_THREAD} "
                 "rows, compute_grad_weight, sum_and_scatter)")  # fmt: skip


# --- Liger-Kernel --------------------------------------------------------------------------------------
def liger(b: Backward, gpu: GPUSpec) -> PeerPlan | None:
    M, N, e = b.M, b.N, b.elem
    s = liger_settings(N)
    if s is None:
        return None
    block, warps = s
    if b.pattern in (Pattern.LAYER_NORM, Pattern.RMS_NORM):
        k, progs = b.columns, gpu.sms
        rows = cdiv(M, progs)
        main = kernel(f"_{b.pattern}_backward_kernel", read=2 * M * N * e + N * e + b.stats,
                      written=M * N * e + k * progs * N * 4, blocks=progs, threads=32 * warps,
                      in_flight=2 * max(1, block // (32 * warps)) * e)  # fmt: skip
        r = Reduction("COLUMN", N, progs, "sum", 4, e)
        fin, _ = _aten_reduce_launch(r, gpu, 4, "_DW.sum(dim=0)")
        fin = from_workspace(fin, progs * N * 4, gpu)  # the dW partials the main kernel wrote
        return _plan("liger", [main, *[fin] * k], f"Liger {b.pattern} backward: {progs} programs x {rows} rows, "
                     f"dW partials ({progs} x {N} fp32) then .sum(dim=0)", rows_per_program=rows)  # fmt: skip
    if b.pattern is Pattern.SOFTMAX and block >= N:
        ln = kernel("_softmax_single_block_backward_kernel", read=2 * M * N * e, written=M * N * e, blocks=M,
                    threads=32 * warps, in_flight=2 * max(1, block // (32 * warps)) * e)  # fmt: skip
        return _plan("liger", [ln], f"Liger softmax backward: one program per row, BLOCK_SIZE {block}, {warps} warps")
    return None  # cross-entropy: the gradient is written by the forward kernel; BatchNorm, embedding: no kernel


# --- TorchInductor -------------------------------------------------------------------------------------
def inductor(b: Backward, gpu: GPUSpec) -> PeerPlan | None:
    M, N, e = b.M, b.N, b.elem
    launches, what = [], []
    if b.pattern in (Pattern.LAYER_NORM, Pattern.RMS_NORM, Pattern.SOFTMAX, Pattern.CROSS_ENTROPY):
        tensors = 1 if b.pattern is Pattern.CROSS_ENTROPY else 2  # logp alone; else (x or y) and dy
        extra = N * e + b.stats if b.columns else M * 8 if b.pattern is Pattern.CROSS_ENTROPY else 0
        dx, c = _inductor_kernel("triton_red_fused_dx", M, N, "INNER", tensors * e, gpu,
                                 read=tensors * M * N * e + extra, written=M * N * e, passes=2,
                                 sfu=M * N if b.pattern is Pattern.CROSS_ENTROPY else 0.0)  # fmt: skip
        launches.append(dx)
        what.append(f"dx: {c}")
    if b.columns:
        rows, cols = (M, N)
        split = inductor_num_splits(cols, rows, "OUTER", gpu)
        read = 2 * rows * cols * e + (b.stats if b.pattern is not Pattern.BATCH_NORM else 2 * cols * 4)
        k = b.columns
        if split > 1:
            rn = cdiv(rows, split)
            k1, c1 = _inductor_kernel("triton_red_split_dw", cols * split, rn, "OUTER", 2 * e, gpu, read=read,
                                      written=k * cols * split * 4)  # fmt: skip
            k2, c2 = _inductor_kernel("triton_red_final_dw", cols, split, "OUTER", 4, gpu, read=k * cols * split * 4,
                                      written=k * cols * e)  # fmt: skip
            k2 = from_workspace(k2, k * cols * split * 4, gpu)  # k1's partials
            launches += [k1, k2]
            what.append(f"column sums split {split}: {c1}; then {c2}")
        else:
            k1, c1 = _inductor_kernel("triton_red_fused_dw", cols, rows, "OUTER", 2 * e, gpu, read=read,
                                      written=k * cols * e)  # fmt: skip
            launches.append(k1)
            what.append(f"column sums: {c1}")
    if b.pattern is Pattern.EMBEDDING:  # torch/_decomp embedding_dense_backward: new_zeros, then
        # index_put(accumulate=True), which Inductor lowers to a store with mode "atomic_add"
        T, D, V = M, N, b.rows
        launches.append(kernel("triton_poi_fused_zeros", read=0, written=V * D * 4, blocks=cdiv(V * D, 1024),
                               threads=128, in_flight=0))  # fmt: skip
        # the rows the ids touch are read back into L2 and written again by the atomics
        touched = min(T, V) * D * 4
        launches.append(kernel("triton_poi_fused_index_put", read=T * 8 + T * D * e + touched, written=touched,
                               blocks=cdiv(T * D, 1024), threads=128, in_flight=8 * e, atomics=T * D))  # fmt: skip
        what.append("zeros, then index_put(accumulate=True) as atomic_add stores")
    if b.pattern is Pattern.BATCH_NORM:
        launches.append(kernel("triton_poi_fused_dx", read=2 * M * N * e + 4 * N * 4, written=M * N * e,
                               blocks=cdiv(M * N, 1024), threads=128, in_flight=2 * 8 * e))  # fmt: skip
        what.append("dx pointwise XBLOCK 1024")
    if not launches:
        return None
    return _plan("inductor", launches, "Inductor " + "; ".join(what))


TRAIN_PEERS = {"pytorch-eager": pytorch_eager, "inductor": inductor, "liger": liger}


def plan_train_peers(b: Backward, gpu: GPUSpec) -> dict[str, PeerPlan | None]:
    """Every training peer's plan of one backward workload (None where the peer has no kernel)."""
    return {name: f(b, gpu) for name, f in TRAIN_PEERS.items()}
