"""PyTorch eager as a peer (panamera/bench/peers.py explains peers): its launches planned from ATen's own rules,
read from its source code (every rule names its file and function; bench/README.md "Peers and their rules"):
- PyTorch eager: aten/src/ATen/native/cuda/Reduce.cuh (`setReduceConfig`, `ReduceConfig::
  set_block_dimension`, `get_output_vec_size`, `ReduceOp::input_vectorized_thread_reduce_impl`,
  `global_reduce`), Loops/CUDALoops.cuh + MemoryAccess.cuh (`vectorized_elementwise_kernel`,
  `elems_per_thread`, `can_vectorize_up_to`), SoftMax.cu (`host_softmax`,
  `SoftMaxForward_getBlockSize`, `potential_register_count`), PersistentSoftmax.cuh
  (`dispatch_softmax_forward`), layer_norm_kernel.cu (`launch_vectorized_layer_norm_kernel`, also
  the rms_norm template), Normalization.cuh (`batch_norm_collect_statistics_kernel`),
  group_norm_kernel.cu (`GroupNormKernelImplInternal`).

>>> from panamera.model import H100
>>> aten_reduce_config(1024, 4096, "ROW", 4, 4, H100)["grid"]
(64, 1)
"""

from __future__ import annotations

import dataclasses

from ..model.gpu import GPUSpec
from .peer_plan import (
    DRAM_ROUND_TRIP_CYCLES,
    PeerLaunch,
    PeerPlan,
    _plan,
    cdiv,
    from_workspace,
    kernel,
    last_pow2,
    next_pow2,
    reread,
)
from .peer_work import Reduction, Work, _acc


def aten_reduce_config(M: int, N: int, form: str, elem: int, acc: int, gpu: GPUSpec, coalesced: bool = True) -> dict:
    """ATen's launch configuration of one reduction (aten/src/ATen/native/cuda/Reduce.cuh:
    setReduceConfig, ReduceConfig::set_block_dimension/grid, get_output_vec_size), vt0 = 4 and
    input_vec_size = 4 (gpu_reduce_kernel defaults; sum_functor/MaxOps on CUDA keep them)."""
    fastest = form != "COLUMN"  # reduction_on_fastest_striding_dimension
    dim0, dim1 = (N, M) if fastest else (M, N)
    vec_in, out_vec = False, 1
    if fastest and dim0 >= 128 and coalesced:  # Case 1: "vectorize along input" (num_reduce_dims == 1)
        vec_in, dim0 = True, dim0 // 4
    elif not fastest:  # Case 2: "vectorize along output": 4, halved until it divides the output extent
        out_vec = 4
        while M % out_vec:
            out_vec //= 2
        dim0 //= out_vec
    max_threads = 512 // out_vec  # mnt_wrapper<T>::MAX_NUM_THREADS / output_vec_size
    d0 = last_pow2(dim0) if dim0 < max_threads else max_threads
    d1 = last_pow2(dim1) if dim1 < max_threads else max_threads
    bw = min(d0, 32)
    bh = min(d1, max_threads // bw)
    bw = min(d0, max_threads // bh)
    threads = bw * bh
    step_in = step_out = 1
    if fastest:
        step_in *= bw  # input_mult[0]: lanes split the reduced values
    else:
        step_out *= bw  # output_mult[0]: lanes own outputs
    vpt = cdiv(N, step_in)
    split_warps = vpt >= min(bh * 16, 256)
    if split_warps:
        step_in *= bh  # input_mult[1]: warps split the reduced values
    else:
        step_out *= bh
    target = gpu.sms * (gpu.max_threads_sm // threads)
    grid_x = cdiv(M // out_vec if out_vec > 1 else M, step_out)
    ctas, vpt = 1, cdiv(N, step_in)
    if split_warps and vpt >= 256 and grid_x <= target:
        ctas = max(min(cdiv(target, grid_x), cdiv(vpt, 16)), cdiv(vpt, 256))
    in_flight = 4 * elem if vec_in else 4 * out_vec * elem  # one input vector, or vt0 loads of out_vec
    return {"block": (bw, bh), "threads": threads, "grid": (grid_x, ctas), "ctas_per_output": ctas,
            "vectorize_input": vec_in, "output_vec_size": out_vec, "in_flight": in_flight, "acc": acc}  # fmt: skip


def _aten_reduce_launch(r: Reduction, gpu: GPUSpec, acc: int, what: str = "reduce_kernel") -> tuple[PeerLaunch, dict]:
    c = aten_reduce_config(r.M, r.N, r.form, r.in_bytes, acc, gpu, r.coalesced)
    gx, ctas = c["grid"]
    staging = acc * r.M * ctas * (1 if r.form != "COLUMN" else c["block"][0]) if ctas > 1 else 0
    ln = kernel(
        what, read=r.M * r.N * r.in_bytes + staging, written=r.M * r.out_bytes + staging, blocks=gx * ctas,
        threads=c["threads"], in_flight=c["in_flight"], atomics=gx * ctas if ctas > 1 else 0,
        same=ctas if ctas > 1 else 0,  # one semaphore per output group; the last block folds the staging buffer
        epilogue=400 + (DRAM_ROUND_TRIP_CYCLES if ctas > 1 else 0),
    )  # fmt: skip
    return from_workspace(ln, staging, gpu), c  # the last block folds the staging buffer


def aten_elementwise(name: str, numel: int, read: int, written: int, elem_in: int) -> PeerLaunch:
    """vectorized_elementwise_kernel (Loops/CUDALoops.cuh): 128 threads (num_threads()), elems_per_thread
    8 for io sizes > 1 byte (16 for 1-byte), loaded as aligned vectors (MemoryAccess.cuh
    can_vectorize_up_to) before use."""
    per = 16 if elem_in == 1 else 8
    return kernel(name, read=read, written=written, blocks=cdiv(numel, 128 * per), threads=128,
                  in_flight=per * max(read // max(numel, 1), 1))  # fmt: skip


# Registers of vectorized_layer_norm_kernel (ATen layer_norm_kernel.cu) as PyTorch ships it: the sm_90 SASS of
# libtorch_cuda.so in the PyPI wheels of 2.11.0 and 2.12.0 alike (cuobjdump --dump-resource-usage, no stack), by
# (pattern, element bytes): LayerNorm (rms_norm = false) fp32 39, bf16 32 (12 and 16 blocks of 128 threads per SM;
# a standalone re-typed compile gave the same); RMSNorm (the rms_norm = true instantiation) fp32 32, bf16 27 (16).
# PyTorch 2.7.1's wheel, the release of the LayerNorm rows in CALIBRATION.md L, ships LayerNorm fp32 at 45 (10).
EAGER_LN_REGISTERS = {("layer_norm", 4): 39, ("layer_norm", 2): 32, ("rms_norm", 4): 32, ("rms_norm", 2): 27}


def pytorch_eager(w: Work, gpu: GPUSpec) -> PeerPlan | None:
    M, N, e = w.M, w.N, w.in_bytes
    if w.pattern in ("softmax", "log_softmax", "cross_entropy"):
        ln, what = _torch_softmax(M, N, e, gpu, log=w.pattern != "softmax")
        launches = [ln]
        if w.pattern == "cross_entropy":  # log_softmax, then nll_loss_forward over M targets (tiny)
            launches.append(kernel("nll_loss_forward", read=M * 8 + M * 4, written=M * 4, blocks=1, threads=32,
                                   in_flight=8))  # fmt: skip
            what += " + nll_loss_forward"
        return _plan("pytorch-eager", launches, what)
    if w.pattern in ("layer_norm", "rms_norm"):
        if N % 4:
            return None  # the RowwiseMoments + LayerNormForward pair; no workload needs it
        params = (2 if w.pattern == "layer_norm" else 1) * N * e
        # fp32 statistics per row: mean and rstd (layer_norm_cuda), rstd alone (_fused_rms_norm_cuda)
        stats = (2 if w.pattern == "layer_norm" else 1) * M * 4
        regs = EAGER_LN_REGISTERS.get((w.pattern, e), 0)
        again = reread(M, N * e, 128, 2, gpu, registers=regs)  # pass 2 re-reads the row
        ln = kernel(
            "vectorized_layer_norm_kernel", read=M * N * e + params + again["read"],
            written=M * N * w.out_bytes + stats, blocks=M, threads=128, in_flight=4 * e, l2=again["l2"],
            registers=regs,
        )  # fmt: skip
        return _plan("pytorch-eager", [ln], f"layer_norm_kernel.cu vectorized ({w.pattern}), one block of 32x4 per row")
    if w.pattern == "batch_norm":
        C, NHW = M, N
        stats = kernel("batch_norm_collect_statistics", read=C * NHW * e, written=2 * C * 4, blocks=C,
                       threads=512, in_flight=e)  # fmt: skip
        tr = aten_elementwise("batch_norm_elemwise", C * NHW, C * NHW * e, C * NHW * e, e)
        return _plan(
            "pytorch-eager", [stats, tr], "Normalization.cuh: statistics one block per channel, then transform"
        )
    if w.pattern == "group_norm":
        rows, D = M, N
        mom = kernel("RowwiseMoments", read=rows * D * e, written=2 * rows * 4, blocks=rows, threads=512,
                     in_flight=e)  # fmt: skip
        fused = kernel(
            "ComputeFusedParams", read=2 * rows * 4, written=2 * rows * 4, blocks=1, threads=256, in_flight=4
        )
        tr = aten_elementwise("GroupNormForward", rows * D, rows * D * e, rows * D * e, e)
        return _plan("pytorch-eager", [mom, fused, tr], "group_norm_kernel.cu: moments, fused params, elementwise")
    if w.pattern == "l2_normalize":  # F.normalize: norm (reduce), clamp_min (M values), div (broadcast)
        r = w.reductions[0]
        red, c = _aten_reduce_launch(r, gpu, 4, "norm reduce_kernel")
        clamp = aten_elementwise("clamp_min", M, M * 4, M * 4, 4)
        div = aten_elementwise("div", M * N, M * N * e + M * 4, M * N * e, e)
        return _plan("pytorch-eager", [red, clamp, div], "F.normalize: norm, clamp_min, div", **c)
    # reduce / argmax: one kernel per op of the graph (the element-wise ones vectorized), reductions by ATen
    launches, facts = [], {}
    if not w.reductions:  # element-wise graph: one vectorized kernel per op
        launches = [aten_elementwise(op, numel, read, written, max(1, read // max(numel, 1)))
                    for op, numel, read, written in w.eager_ops]  # fmt: skip
        return _plan("pytorch-eager", launches, "one vectorized_elementwise_kernel per op") if launches else None
    for op, numel, read, written in w.eager_ops:
        launches.append(aten_elementwise(op, numel, read, written, max(1, read // max(numel, 1))))
    for r in w.reductions:  # the unfused reduction reads its direct operand
        ln, facts = _aten_reduce_launch(dataclasses.replace(r, in_bytes=r.operand_bytes), gpu,
                                        _acc(r, w.pattern == "argmax"))  # fmt: skip
        launches.append(ln)
    gx, ctas = facts["grid"]
    return _plan("pytorch-eager", launches, f"ATen reduce {gx}x{ctas} grid (ctas_per_output {ctas})", **facts)


TORCH_SMEM_PER_BLOCK = 48 * 1024  # cudaDeviceProp::sharedMemPerBlock, which SoftMax.cu's host_softmax tests


def _torch_softmax(M: int, N: int, e: int, gpu: GPUSpec, log: bool) -> tuple[PeerLaunch, str]:
    """SoftMax.cu host_softmax (inner_size == 1, no half_to_float)."""
    sfu_per = 1 if log else 2  # exp in the sum pass, and again in the write pass for softmax
    if N <= 2048 and N * e <= 8192:  # PersistentSoftmax.cuh dispatch_softmax_forward
        p2 = next_pow2(N)
        warp = min(p2, 32)
        batches = 2 if p2 <= 128 else 1
        wpb = 128 // warp
        blocks = cdiv(M, wpb * batches)
        per_thread = (p2 // warp) * batches  # WARP_ITERATIONS x WARP_BATCH loaded into registers
        return kernel("softmax_warp_forward", read=M * N * e, written=M * N * e, blocks=blocks, threads=128,
                      in_flight=per_thread * e, sfu=M * N), f"PersistentSoftmax: {warp}x{wpb} threads, {batches} rows per warp"  # fmt: skip
    ilp = 16 // e
    block = min(N, 1024)
    block = block if block % 32 == 0 else (block // 32 + 1) * 32  # SoftMaxForward_getBlockSize
    reg = cdiv(N, block)  # potential_register_count
    if reg < 10:  # cunn_SoftMaxForwardReg: the row stays in registers, one DRAM read
        return kernel("cunn_SoftMaxForwardReg", read=M * N * e, written=M * N * e, blocks=M, threads=block,
                      in_flight=reg * e, sfu=M * N), f"cunn_SoftMaxForwardReg ({reg} values per thread)"  # fmt: skip
    # cunn_SoftMaxForwardSmem: the row staged in dynamic shared memory, with one float per warp for the block
    # reduction, while that fits cudaDeviceProp::sharedMemPerBlock (48 KB on every GPU here, not the opt-in)
    reduction = block // 32 * (8 if e == 8 else 4)  # smem_reduction_sz: one accscalar_t per warp
    if N % ilp == 0 and N < (TORCH_SMEM_PER_BLOCK - reduction) // e:  # max_elements_per_smem
        shared = N * e + reduction
        return kernel("cunn_SoftMaxForwardSmem", read=M * N * e, written=M * N * e, blocks=M, threads=block,
                      in_flight=16, sfu=sfu_per * M * N, shared=shared), "cunn_SoftMaxForwardSmem"  # fmt: skip
    # cunn_SoftMaxForward: max pass, sum-exp pass, write pass over the row (two re-reads hit L2)
    why = (
        f"{N} % ILP {ilp} != 0" if N % ilp else f"a row of {N * e} bytes beyond {TORCH_SMEM_PER_BLOCK} of shared memory"
    )
    return kernel("cunn_SoftMaxForward", read=M * N * e, written=M * N * e, blocks=M, threads=block, in_flight=16,
                  l2=2 * M * N * e, sfu=sfu_per * M * N), f"cunn_SoftMaxForward ({why}: no smem), 3 passes"  # fmt: skip
