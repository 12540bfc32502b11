"""Real peers as baselines: each peer's launches planned from *that peer's own rules*, read from
its source code, and modeled by the same model as Panamera (`panamera.model.estimate`).

A peer is a function `peer(work, gpu) -> PeerPlan | None`; `work` is what the workload's graph says
(`describe(outs)`: the pattern, canonical form, M outputs x N reduced values, dtypes, the element-wise
ops). A peer that has no kernel for the pattern returns None; nothing is invented for it.

Sources (every rule below names its file and function; bench/README.md "Peers and their rules"):
- PyTorch eager: aten/src/ATen/native/cuda/Reduce.cuh (`setReduceConfig`, `ReduceConfig::
  set_block_dimension`, `get_output_vec_size`, `ReduceOp::input_vectorized_thread_reduce_impl`,
  `global_reduce`), Loops/CUDALoops.cuh + MemoryAccess.cuh (`vectorized_elementwise_kernel`,
  `elems_per_thread`, `can_vectorize_up_to`), SoftMax.cu (`host_softmax`,
  `SoftMaxForward_getBlockSize`, `potential_register_count`), PersistentSoftmax.cuh
  (`dispatch_softmax_forward`), layer_norm_kernel.cu (`launch_vectorized_layer_norm_kernel`, also
  the rms_norm template), Normalization.cuh (`batch_norm_collect_statistics_kernel`),
  group_norm_kernel.cu (`GroupNormKernelImplInternal`).
- CUB (NVIDIA/cccl): cub/device/dispatch/tuning/tuning_reduce.cuh (`policy_selector`: sm60+ policy
  256 threads x 16 items, vector loads of 4), cub/util_arch.cuh (`scale_mem_bound`,
  `CUB_SUBSCRIPTION_FACTOR` 5), cub/device/dispatch/dispatch_reduce.cuh (`InvokePasses`,
  `InvokeSingleTile`), cub/grid/grid_even_share.cuh (`DispatchInit`),
  cub/device/dispatch/dispatch_segmented_reduce.cuh (one block per segment).
- TorchInductor (PyTorch 2.7.1): torch/_inductor/ir.py (`Reduction.num_splits`, `inner_reduction_splits`,
  `outer_reduction_splits`, `create_multilayer`); the kernel configs, loops and dependent steps are
  inductor_peer.py's rules (choices.py, runtime/triton_heuristics.py, fx_passes/post_grad.py, with lines).
- Triton tutorials: python/tutorials/02-fused-softmax.py, 05-layer-norm.py; the reduction pattern is
  those kernels' structure (one program per row, `tl.sum` over BLOCK_SIZE) plus `tl.atomic_add` for
  outputs shared by programs.
- TVM: python/tvm/topi/cuda/reduction.py (`_schedule_reduce`), injective.py
  (`schedule_injective_from_existing`), softmax.py (`_schedule_softmax`).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..frontend.tensor import Tensor, topological
from ..model.estimate import Estimate, estimate
from ..model.gpu import GPUSpec
from ..model.kernel_cost import kernel_time
from ..model.spill import Spill
from ..model.workspace import workspace_fits
from .inductor_peer import COMPILED_ROWS, Hint, is_persistent, reduction_config, row_loops
from .inductor_peer import ROW_PATTERNS as INDUCTOR_ROWS
from .inductor_peer import registers as inductor_registers

_KT_ARGS = set(inspect.signature(kernel_time).parameters) - {"gpu"}
INLINE = ("const", "iota", "argkey_max", "argkey_min", "placeholder", "reshape")
DRAM_ROUND_TRIP_CYCLES = 700  # one more dependent global-memory round trip in a last-block epilogue


# --- plans -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PeerLaunch:
    """One kernel of a peer's plan: kernel_time's keyword arguments, as Panamera's launches carry them."""

    name: str
    features: dict
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def cost_features(self) -> tuple:
        return tuple((k, v) for k, v in self.features.items() if k in _KT_ARGS)


@dataclass(frozen=True)
class PeerPlan:
    peer: str
    launches: tuple[PeerLaunch, ...]
    description: str
    facts: dict = field(default_factory=dict)  # the rule's decisions (ctas_per_output, split, BLOCK_SIZE, ...)

    @property
    def kernels(self) -> int:
        return len(self.launches)

    @property
    def blocks(self) -> int:
        return sum(ln.features["blocks"] for ln in self.launches)

    @property
    def atomics(self) -> int:
        return sum(int(ln.features.get("atomics", 0)) for ln in self.launches)

    def estimate(self, gpu: GPUSpec, compulsory: int | tuple[int, int]) -> Estimate:
        return estimate(list(self.launches), gpu, compulsory)


def kernel(name, *, read, written, blocks, threads, in_flight, l2=0.0, atomics=0, same=0, cas=0, sfu=0.0,
           epilogue=400, round_trips=0, spill: Spill | None = None, shared=0, registers=0) -> PeerLaunch:  # fmt: skip
    """A launch from its streamed bytes and shape; `in_flight` = streamed input bytes per thread per
    loop step (vector width x loads issued before the first use); `spill`: the compiler's register
    spills per thread as ptxas -v reports them (model/spill.py); `shared`: the block's shared memory
    where the peer's source states it, and `registers` per thread where its compiler's output was
    read (both bound the resident blocks, `GPUSpec.resident_blocks`; 0: not known)."""
    f = {"dram_bytes": float(read + written), "blocks": int(max(blocks, 1)), "threads": int(threads),
         "bytes_in_flight_per_thread": float(in_flight), "atomics": int(atomics), "same_address": int(same),
         "cas_atomics": int(cas), "epilogue_cycles": int(epilogue), "l2_bytes": float(l2), "sfu_ops": float(sfu)}  # fmt: skip
    if written:  # written bytes stream at the write bandwidth (model/gpu.py stream_bw)
        f["write_bytes"] = float(written)
    if round_trips:
        f["round_trips"] = int(round_trips)
    if shared:
        f["shared_bytes"] = int(shared)
    if registers:
        f["registers"] = int(registers)
    if spill:
        n = int(max(blocks, 1)) * int(threads)
        f.update(spill_stores=float(spill.stores * n), spill_loads=float(spill.loads * n), spill_frame=int(spill.frame))
    return PeerLaunch(name, f, int(read), int(written))


def from_workspace(ln: PeerLaunch, nbytes: float, gpu: GPUSpec) -> PeerLaunch:
    """`ln` with `nbytes` of its DRAM reads taken from L2 where they fit: the read-back of a
    workspace a kernel (this one or the one before) wrote, its partials or staging buffer
    (model/workspace.py: the rule of Panamera's own splits; the write stays a DRAM write).

    >>> from panamera.model import H100
    >>> k = kernel("splitKreduce_kernel", read=4 * 2**20, written=2**17, blocks=8, threads=512, in_flight=16)
    >>> f = from_workspace(k, 4 * 2**20, H100).features
    >>> f["dram_bytes"], f["l2_bytes"]
    (131072.0, 4194304.0)
    >>> from_workspace(k, 4 * 2**20, dataclasses.replace(H100, l2_size=6 * 2**20)).features["dram_bytes"]
    4325376.0
    """
    if not nbytes or not workspace_fits(gpu, nbytes):
        return ln
    f = {**ln.features, "dram_bytes": ln.features["dram_bytes"] - nbytes}
    f["l2_bytes"] = f.get("l2_bytes", 0.0) + nbytes
    return dataclasses.replace(ln, features=f, bytes_read=int(ln.bytes_read - nbytes))


def _plan(peer: str, launches, what: str, **facts) -> PeerPlan:
    launches = tuple(launches)
    shapes = ", ".join(f"{ln.features['blocks']}x{ln.features['threads']}" for ln in launches)
    n = len(launches)
    return PeerPlan(peer, launches, f"{what}: {n} kernel{'s' * (n != 1)} ({shapes} blocks x threads)", facts)


def reread(
    rows: int, row_bytes: int, threads: int, passes: int, gpu: GPUSpec, rows_per_block: int = 1, registers: int = 0
) -> dict:
    """Where a looped row kernel's later passes re-read its rows: from L2 while the rows in flight
    (the resident blocks' rows) fit in half of it (the half an SM's requests reach); beyond, the
    part that no longer fits comes from DRAM again (the QuACK blog's profile of torch.compile's
    looped softmax; fitted to eager PyTorch's RMSNorm and LayerNorm rows in CALIBRATION.md L).
    The resident blocks are counted as the kernel's are (`GPUSpec.resident_blocks`), with the
    peer's `registers` per thread where its compiler's output was read (0: not known).
    Returns the extra `read` (DRAM) and `l2` bytes for `kernel`."""
    extra = (passes - 1) * rows * row_bytes
    blocks = cdiv(rows, rows_per_block)
    in_flight = min(blocks, gpu.sms * gpu.resident_blocks(threads, registers=registers)) * rows_per_block * row_bytes
    hit = min(1.0, gpu.l2_reach / max(in_flight, 1))
    return {"l2": extra * hit, "read": extra * (1 - hit)}


def cdiv(a, b) -> int:
    return -(-int(a) // int(b))


def next_pow2(n) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def last_pow2(n) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(n, 1)))))


# --- what the workload is --------------------------------------------------------------------------
@dataclass(frozen=True)
class Reduction:
    """One reduction of the graph in canonical form: M outputs, each over N values."""

    form: str  # ROW (reduced values contiguous), COLUMN (outputs contiguous), ALL
    M: int
    N: int
    combiner: str
    in_bytes: int  # element size of the reduced operand as stored in DRAM
    out_bytes: int
    coalesced: bool = True  # the reduced axes are one contiguous run (else e.g. NCHW over N,H,W)
    operand_bytes: int = 4  # element size of the reduction's direct operand (what an unfused kernel reads)
    source: int = 0  # uid of the graph input it streams (two reductions of one input share it)


@dataclass(frozen=True)
class Work:
    pattern: str  # reduce | softmax | log_softmax | cross_entropy | layer_norm | rms_norm | l2_normalize | batch_norm | group_norm | argmax
    reductions: tuple[Reduction, ...]
    eager_ops: tuple  # (op, out elements, bytes read, bytes written) per element-wise kernel, graph order
    M: int
    N: int
    in_bytes: int
    out_bytes: int
    pointwise: int  # element-wise ops fused before the reductions
    input_bytes: int = 0  # every graph input's bytes (what a fully fused kernel reads)
    output_bytes: int = 0  # every graph output's bytes


def _root(t: Tensor) -> Tensor:
    """The graph input an element-wise chain streams (through casts, views, scalars)."""
    while t.op not in ("placeholder",) and t.inputs:
        big = [i for i in t.inputs if i.size == t.size and i.op not in ("const", "iota")]
        if not big:
            break
        t = big[0]
    return t


def canonical(shape, axes) -> tuple[str, int, int, bool]:
    """(form, M, N, coalesced) of reducing `axes` of a row-major `shape`, size-1 axes dropped."""
    dims = [(s, i in axes) for i, s in enumerate(shape) if s != 1]
    runs: list[list] = []
    for s, red in dims:
        if runs and runs[-1][1] == red:
            runs[-1][0] *= s
        else:
            runs.append([s, red])
    N = math.prod(s for s, r in runs if r)
    M = math.prod(s for s, r in runs if not r)
    if not any(not r for _, r in runs):
        return "ALL", 1, N, True
    if not any(r for _, r in runs):
        return "ALL", M, 1, True
    if runs[-1][1]:
        return "ROW", M, N, len([r for _, r in runs if r]) == 1
    return "COLUMN", M, N, len([r for _, r in runs if r]) == 1


def describe(outs) -> Work:
    """The workload as the peers see it, from Panamera's front-end graph."""
    order = topological(outs)
    ops = {t.op for t in order}
    reduces = [t for t in order if t.op == "reduce"]
    choose = next((t for t in order if t.op == "choose"), None)
    names = {t.attr("combiner").name for t in reduces}
    if choose is not None:
        pattern = choose.attr("formulation")
    elif not reduces:  # an element-wise graph (a backward without a reduction, e.g. threshold_backward)
        pattern = "elementwise"
    elif {"argkey_max", "argkey_min"} & ops:
        pattern = "argmax"
    elif {"iota", "eq", "where"} <= ops:
        pattern = "cross_entropy"
    elif "welford" in names:
        src = _root(reduces[0].inputs[0])
        axes = reduces[0].attr("axes")
        pattern = "group_norm" if "reshape" in ops and src.ndim == 4 and len(axes) == 2 else (
            "batch_norm" if src.ndim == 4 else "layer_norm")  # fmt: skip
    elif "rsqrt" in ops and "maximum" in ops:
        pattern = "l2_normalize"
    elif "rsqrt" in ops:
        pattern = "rms_norm"
    else:
        pattern = "reduce"
    reds = []
    for r in reduces:
        x = r.inputs[0]
        src = _root(x)
        form, M, N, co = canonical(x.shape, set(r.attr("axes")))
        reds.append(Reduction(form, M, N, r.attr("combiner").name, src.dtype.itemsize, r.dtype.itemsize, co,
                              x.dtype.itemsize, src.uid))  # fmt: skip
    eager = []
    for t in order:
        if t.op in INLINE or t.op in ("reduce", "choose"):
            continue
        read = sum(i.size * i.dtype.itemsize for i in t.inputs if i.op not in ("const", "iota"))
        eager.append((t.op, t.size, read, t.size * t.dtype.itemsize))
    big = [t for t in order if t.op == "placeholder"]
    in_bytes = max(big, key=lambda t: t.size).dtype.itemsize if big else outs[0].dtype.itemsize
    out = outs[0]
    M, N = (reds[0].M, reds[0].N) if reds else (out.size, 1)
    pointwise = sum(1 for t in order if t.op not in INLINE and t.op != "reduce" and t.op != "choose")
    inputs = sum(t.size * t.dtype.itemsize for t in big)
    written = sum(t.size * t.dtype.itemsize for t in outs)
    return Work(pattern, tuple(reds), tuple(eager), M, N, in_bytes, out.dtype.itemsize, pointwise, inputs, written)


# --- PyTorch eager ----------------------------------------------------------------------------------
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


def _acc(r: Reduction, argmax: bool = False) -> int:
    if argmax:  # (value, int64 index) pair
        return 16
    if r.combiner in ("and", "or", "all", "any"):
        return 1
    return max(4, r.in_bytes, r.out_bytes)


# ptxas -v of vectorized_layer_norm_kernel (ATen layer_norm_kernel.cu) re-typed standalone (nvcc 13.0, sm_90,
# -O3, 0 spills), by element bytes: fp32 39, bf16 32 registers (12 and 16 blocks of 128 threads per SM).
EAGER_LN_REGISTERS = {4: 39, 2: 32}


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
        regs = EAGER_LN_REGISTERS.get(e, 0)
        again = reread(M, N * e, 128, 2, gpu, registers=regs)  # pass 2 re-reads the row
        ln = kernel(
            "vectorized_layer_norm_kernel", read=M * N * e + params + again["read"],
            written=M * N * w.out_bytes + 2 * M * 4, blocks=M, threads=128, in_flight=4 * e, l2=again["l2"],
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


# --- CUB ---------------------------------------------------------------------------------------------
def cub_policy(acc: int) -> tuple[int, int, int]:
    """(threads, items per thread, vector load length) of tuning_reduce.cuh's sm60+ policy (used on
    sm90; the sm100 tunings do not apply), scaled by util_arch.cuh scale_mem_bound for the accumulator."""
    items = min(max(16 * 4 // acc, 1), 32)
    threads = min(256, cdiv(48 * 1024 // (acc * items), 32) * 32)
    return threads, items, 4


# ptxas -v of DeviceReduce's kernels (CCCL 3.0 as nvcc 13.0 ships it, sm_90, -O3; cub::DeviceReduce::Sum of int32
# and float32): DeviceReduceKernel and DeviceReduceSingleTileKernel use 32 registers, by accumulator bytes. Other
# accumulators were not compiled (0: not known).
CUB_REGISTERS = {4: 32}


def cub_device_reduce(n: int, elem: int, acc: int, gpu: GPUSpec, out_bytes: int) -> tuple[list[PeerLaunch], dict]:
    """DeviceReduce (dispatch_reduce.cuh): one DeviceReduceSingleTileKernel when n fits one tile, else
    DeviceReduceKernel over GridEvenShare (grid = min(tiles, sm_occupancy x SMs x 5), sm_occupancy from
    the CUDA occupancy calculator, registers included: `CUB_REGISTERS`) and a single-tile pass over the
    partials."""
    threads, items, vec = cub_policy(acc)
    regs = CUB_REGISTERS.get(acc, 0)
    tile = threads * items
    if n <= tile:
        return [kernel("DeviceReduceSingleTileKernel", read=n * elem, written=out_bytes, blocks=1, threads=threads,
                       in_flight=items * elem, registers=regs)], {"grid": 1, "kernels": 1, "threads": threads}  # fmt: skip
    grid = min(cdiv(n, tile), gpu.resident_blocks(threads, registers=regs) * gpu.sms * 5)
    k1 = kernel("DeviceReduceKernel", read=n * elem, written=grid * acc, blocks=grid, threads=threads,
                in_flight=items * elem, registers=regs)  # fmt: skip
    k2 = kernel("DeviceReduceSingleTileKernel", read=grid * acc, written=out_bytes, blocks=1, threads=threads,
                in_flight=items * acc, registers=regs)  # fmt: skip
    k2 = from_workspace(k2, grid * acc, gpu)  # the partials were just written by k1
    return [k1, k2], {"grid": grid, "kernels": 2, "threads": threads, "items": items, "vec": vec}


def cub(w: Work, gpu: GPUSpec) -> PeerPlan | None:
    if w.pattern not in ("reduce", "argmax"):
        return None
    launches, facts, what = [], {}, []
    for r in w.reductions:
        acc = 8 if w.pattern == "argmax" else _acc(r)  # ArgMax accumulates a KeyValuePair<int, T>
        threads, items, vec = cub_policy(acc)
        if r.form == "ALL":
            ls, facts = cub_device_reduce(r.N, r.in_bytes, acc, gpu, r.out_bytes)
            what.append(f"DeviceReduce {facts['grid']} blocks x {threads}, {items} items, VEC {vec}")
            launches += ls
            continue
        if r.form == "COLUMN":  # segments must be contiguous: the user transposes first (the paper's extra pass)
            launches.append(kernel("transpose", read=r.M * r.N * r.in_bytes, written=r.M * r.N * r.in_bytes,
                                   blocks=cdiv(r.M * r.N, 32 * 32), threads=256, in_flight=4 * r.in_bytes))  # fmt: skip
            what.append("transpose + ")
        launches.append(kernel("DeviceSegmentedReduceKernel", read=r.M * r.N * r.in_bytes, written=r.M * r.out_bytes,
                               blocks=r.M, threads=threads, in_flight=items * r.in_bytes))  # fmt: skip
        what.append(f"DeviceSegmentedReduce {r.M} segments x {threads} threads")
        facts = {"grid": r.M, "threads": threads}
    return _plan("cub", launches, "CUB " + "; ".join(what).replace("+ ;", "+"), **facts)


# --- TorchInductor -----------------------------------------------------------------------------------
def inductor_num_splits(numel: int, rnumel: int, hint: str, gpu: GPUSpec, reduction_type: str = "sum") -> int:
    """torch/_inductor/ir.py Reduction.num_splits (inner_reduction_splits / outer_reduction_splits)."""
    if reduction_type in ("argmax", "argmin"):
        return 1
    sms, tps = gpu.sms, 2048
    lo, hi = 32 * sms * tps, 512 * sms * tps

    def closest_divisor(target):
        divs = [d for d in range(1, int(math.isqrt(rnumel)) + 1) if rnumel % d == 0]
        divs += [rnumel // d for d in divs]
        return min(divs, key=lambda d: abs(d - target))

    if hint == "INNER":
        nt = 256
        if numel >= 2 * sms or rnumel <= 8192:
            return 1
        if rnumel * numel <= lo:
            split = 32
        elif rnumel * numel < hi:
            target = sms * tps // (2 * nt)
            bpo = cdiv(target, numel)
            tmp = cdiv(rnumel, nt * bpo)
            c = closest_divisor(tmp)
            split = max(c, 32) if abs(c - tmp) < 30 else tmp
        else:
            c = closest_divisor(512)
            split = c if abs(c - 512) < 50 else 512
        return cdiv(rnumel, split * nt)
    if rnumel <= 32 or numel >= sms * 2 * 32:
        return 1
    nt, rv = 256, 4
    xblocks = cdiv(numel, 128)
    if rnumel * numel < lo:
        split = 32
    elif rnumel * numel < hi:
        target = cdiv(sms * tps // nt, xblocks)
        tmp = cdiv(rnumel, rv * target)
        c = closest_divisor(tmp)
        split = max(c, 32) if abs(tmp - c) < 20 else tmp
    else:
        c = closest_divisor(512)
        split = c if abs(c - 512) < 50 else 512
    return cdiv(rnumel, rv * split)


def _inductor_kernel(
    name,
    xnumel,
    rnumel,
    hint,
    elem,
    gpu,
    *,
    read,
    written,
    passes=1,
    sfu=0.0,
    outs=1,
    unroll=0,
    gathers=0,
    compiled=False,
):
    """One Triton reduction kernel as Inductor configures it (inductor_peer.py rules 1-3: persistent up to 1024
    (INNER) or 64; else the looped config, XBLOCK 1 and RBLOCK up to 2048 with up to 16 warps for INNER, XBLOCK 64
    and RBLOCK 8 for OUTER). `passes` loops over the row re-read it (L2 when it is resident); `unroll`: the
    steps one round trip carries where the kernel was compiled (rule 5; 0: not compiled, no round trips charged);
    `compiled`: a row kernel whose registers were read (inductor_peer.py `registers`; else not known)."""
    c = reduction_config(xnumel, rnumel, Hint(hint))
    regs = inductor_registers(c) if compiled else 0
    if c.persistent:
        return kernel(name, read=read, written=written, blocks=cdiv(xnumel, c.xblock), threads=c.threads,
                      in_flight=c.per_thread() * elem, sfu=sfu, registers=regs), \
            f"persistent XBLOCK {c.xblock} RBLOCK {c.rblock} {c.warps} warps"  # fmt: skip
    trips = c.round_trips(rnumel, passes, unroll) if unroll else 0
    ahead = c.steps_together(rnumel, unroll) if unroll else 1  # steps whose loads are in flight together
    if c.xblock == 1:
        again = reread(xnumel, rnumel * elem, c.threads, passes, gpu, registers=regs)
        where = f", re-read from {again['l2'] / max(again['l2'] + again['read'], 1):.0%} L2" if passes > 1 else ""
        return kernel(name, read=read + again["read"], written=written, blocks=xnumel, threads=c.threads,
                      in_flight=ahead * c.per_thread() * elem, l2=again["l2"], sfu=sfu, round_trips=trips,
                      registers=regs), \
            f"XBLOCK 1 RBLOCK {c.rblock} {c.warps} warps, {passes} loop(s){where}" + \
            (f", {trips} dependent steps" if trips else "")  # fmt: skip
    again = reread(xnumel, rnumel * elem, c.threads, passes, gpu, rows_per_block=c.xblock, registers=regs)
    return kernel(name, read=read + again["read"], written=written, blocks=cdiv(xnumel, c.xblock), threads=c.threads,
                  in_flight=ahead * c.per_thread() * elem, l2=again["l2"], sfu=sfu, round_trips=trips,
                  registers=regs), \
        f"XBLOCK {c.xblock} RBLOCK {c.rblock} {c.warps} warps"  # fmt: skip


def inductor(w: Work, gpu: GPUSpec) -> PeerPlan | None:
    M, N, e = w.M, w.N, w.in_bytes
    if w.pattern in INDUCTOR_ROWS:  # inductor_peer.py rule 4: the loops over the row and their exponentials
        loops = row_loops(w.pattern)
        out_full = w.pattern != "cross_entropy"
        params = N * e * (2 if w.pattern in ("layer_norm",) else 1 if w.pattern == "rms_norm" else 0)
        sfu = M * N * loops.exps(is_persistent(N, Hint.INNER))
        ln, cfg = _inductor_kernel("triton_red_fused", M, N, "INNER", e, gpu, read=M * N * e + params,
                                   written=(M * N if out_full else M) * w.out_bytes, passes=loops.loops, sfu=sfu,
                                   unroll=loops.unroll, compiled=w.pattern in COMPILED_ROWS)  # fmt: skip
        return _plan("inductor", [ln], f"one fused kernel per row, {cfg}")
    launches, what, facts = [], [], {}
    seen: dict = {}
    for r in w.reductions:  # reductions of one input over the same ranges fuse into one kernel
        key = (r.source, r.form, r.M, r.N)
        if key in seen:
            seen[key].append(r)
            continue
        seen[key] = [r]
    for (_, form, Mr, Nr), rs in seen.items():
        kind = "argmax" if w.pattern == "argmax" else "sum"
        hint = "OUTER" if form == "COLUMN" else "INNER"  # the innermost read index moves with a reduced var
        split = inductor_num_splits(Mr, Nr, hint, gpu, kind)
        facts = {"split": split, "hint": hint}
        outs = len(rs)
        acc = max(4, rs[0].in_bytes)
        if split > 1:
            rn = cdiv(Nr, split)
            k1, c1 = _inductor_kernel("triton_red_split", Mr * split, rn, hint, rs[0].in_bytes, gpu,
                                      read=Mr * Nr * rs[0].in_bytes, written=outs * Mr * split * acc)  # fmt: skip
            k2, c2 = _inductor_kernel("triton_red_final", Mr, split, hint, acc, gpu, read=outs * Mr * split * acc,
                                      written=outs * Mr * rs[0].out_bytes)  # fmt: skip
            k2 = from_workspace(k2, outs * Mr * split * acc, gpu)  # k1's partials
            launches += [k1, k2]
            what.append(f"split {split} ({hint}): {c1}; then {c2}")
        else:
            k, c = _inductor_kernel("triton_red_fused", Mr, Nr, hint, rs[0].in_bytes, gpu,
                                    read=Mr * Nr * rs[0].in_bytes, written=outs * Mr * rs[0].out_bytes)  # fmt: skip
            launches.append(k)
            what.append(f"{hint}: {c}")
    if w.pattern == "elementwise":  # the scheduler fuses every pointwise op into one kernel
        n = w.M
        launches.append(kernel("triton_poi_fused", read=w.input_bytes, written=w.output_bytes, blocks=cdiv(n, 1024),
                               threads=128, in_flight=8 * w.in_bytes))  # fmt: skip
        what.append("pointwise XBLOCK 1024")
    if w.pattern == "batch_norm":  # the normalize pass is a pointwise kernel after the statistics
        launches.append(kernel("triton_poi_fused", read=M * N * e, written=M * N * w.out_bytes, blocks=cdiv(M * N, 1024),
                               threads=128, in_flight=8 * e))  # fmt: skip
        what.append("pointwise XBLOCK 1024")
    return _plan("inductor", launches, "Inductor " + "; ".join(what), **facts)


# --- Triton tutorials ----------------------------------------------------------------------------------
def triton_softmax_config(n_cols: int) -> tuple[int, int]:
    """02-fused-softmax.py: BLOCK_SIZE = next_power_of_2(n_cols); num_warps 4, 8 from 2048, 16 from 4096."""
    block = next_pow2(n_cols)
    warps = 16 if block >= 4096 else 8 if block >= 2048 else 4
    return block, warps


def triton_layer_norm_config(n: int, elem: int) -> tuple[int, int]:
    """05-layer-norm.py: BLOCK_SIZE = min(65536 // element_size, next_power_of_2(N)) (less than 64 KB per
    feature), num_warps = min(max(BLOCK_SIZE // 256, 1), 8)."""
    block = min(65536 // elem, next_pow2(n))
    return block, min(max(block // 256, 1), 8)


def triton_tutorial(w: Work, gpu: GPUSpec) -> PeerPlan | None:
    M, N, e = w.M, w.N, w.in_bytes
    if w.pattern == "softmax":
        block, warps = triton_softmax_config(N)
        if block * e > 2**17:  # the row must fit the program's registers
            return None
        ln = kernel("softmax_kernel", read=M * N * e, written=M * N * w.out_bytes, blocks=M, threads=32 * warps,
                    in_flight=block // (32 * warps) * e, sfu=M * N)  # fmt: skip
        return _plan("triton-tutorial", [ln], f"02-fused-softmax: BLOCK_SIZE {block}, {warps} warps, one program per row",
                     block_size=block, num_warps=warps)  # fmt: skip
    if w.pattern == "layer_norm":
        block, warps = triton_layer_norm_config(N, e)
        loops = 3  # mean, variance, normalize: each loop re-loads the row
        ln = kernel("_layer_norm_fwd_fused", read=M * N * e + 2 * N * e, written=M * N * w.out_bytes + 2 * M * 4,
                    blocks=M, threads=32 * warps, in_flight=max(block // (32 * warps), 1) * e,
                    l2=(loops - 1) * M * N * e)  # fmt: skip
        return _plan("triton-tutorial", [ln], f"05-layer-norm: BLOCK_SIZE {block}, {warps} warps, {loops} loops per row",
                     block_size=block, num_warps=warps)  # fmt: skip
    if w.pattern not in ("reduce",):
        return None
    launches, what = [], []
    for r in w.reductions:
        if r.combiner not in ("sum", "max", "min"):
            return None  # tl.atomic_* has no and/or on bool tensors
        cas = r.combiner != "sum" and r.in_bytes < 4
        if r.form == "ROW":  # one program per row, BLOCK_SIZE loop (the 05-layer-norm structure)
            block, warps = triton_layer_norm_config(r.N, r.in_bytes)
            launches.append(kernel("row_reduce", read=r.M * r.N * r.in_bytes, written=r.M * r.out_bytes, blocks=r.M,
                                   threads=32 * warps, in_flight=max(block // (32 * warps), 1) * r.in_bytes))  # fmt: skip
            what.append(f"one program per row, BLOCK_SIZE {block}, {warps} warps")
        elif r.form == "ALL":  # tl.sum over BLOCK_SIZE 1024 per program, tl.atomic_add into the scalar
            progs = cdiv(r.N, 1024)
            launches.append(kernel("block_sum_atomic", read=r.N * r.in_bytes, written=4, blocks=progs, threads=128,
                                   in_flight=8 * r.in_bytes, atomics=progs, same=progs, cas=progs if cas else 0))  # fmt: skip
            what.append(f"{progs} programs of BLOCK_SIZE 1024, tl.atomic_add")
        else:  # COLUMN: (BLOCK_M 64 x BLOCK_N 64) tiles, tl.sum(axis=0), tl.atomic_add per column
            tm, tn = cdiv(r.N, 64), cdiv(r.M, 64)
            launches.append(kernel("col_sum_atomic", read=r.M * r.N * r.in_bytes, written=r.M * 4, blocks=tm * tn,
                                   threads=128, in_flight=32 * r.in_bytes, atomics=tm * r.M, same=tm,
                                   cas=tm * r.M if cas else 0))  # fmt: skip
            what.append(f"{tm}x{tn} programs of 64x64, tl.atomic_add")
    return _plan("triton-tutorial", launches, "Triton " + "; ".join(what))


# --- TVM -----------------------------------------------------------------------------------------------
def tvm_reduce_schedule(M: int, form: str, max_threads: int = 1024) -> tuple[int, tuple[int, int]]:
    """topi/cuda/reduction.py _schedule_reduce: an all-reduce is one block of max_num_threads threads
    (rfactor + cross-thread reduction); otherwise blocks of 32 x 32 threads, threadIdx.x over the
    reduced values (split factor 32), threadIdx.y over 32 fused outputs."""
    if form == "ALL":
        return 1, (max_threads, 1)
    return cdiv(M, 32), (32, 32)


def tvm_default(w: Work, gpu: GPUSpec) -> PeerPlan | None:
    M, N, e = w.M, w.N, w.in_bytes
    if w.pattern in ("softmax", "log_softmax"):  # softmax.py: warp softmax, one row per block of 32 threads
        ln = kernel("softmax_warp", read=M * N * e, written=M * N * w.out_bytes, blocks=M, threads=32, in_flight=e,
                    l2=M * N * e, sfu=M * N)  # fmt: skip
        return _plan(
            "tvm-default", [ln], "topi softmax.py warp schedule: one 32-thread block per row, max then exp-sum"
        )
    if w.pattern not in ("reduce", "argmax"):
        return None
    launches, facts = [], {}
    for r in w.reductions:  # injective producers inlined into each reduction (schedule_reduce traverse_before_reduce)
        blocks, (tx, ty) = tvm_reduce_schedule(r.M, r.form)
        # a thread steps through its reduced values 32 (or max_threads) apart, one scalar load per step
        launches.append(kernel("default_reduce", read=r.M * r.N * r.in_bytes, written=r.M * r.out_bytes, blocks=blocks,
                               threads=tx * ty, in_flight=r.in_bytes))  # fmt: skip
        facts = {"blocks": blocks, "threads": (tx, ty)}
    b, (tx, ty) = facts["blocks"], facts["threads"]
    return _plan("tvm-default", launches, f"TVM schedule_reduce: {b} blocks of {tx}x{ty}", **facts)


PEERS: dict[str, Callable[[Work, GPUSpec], PeerPlan | None]] = {
    "pytorch-eager": pytorch_eager,
    "cub": cub,
    "inductor": inductor,
    "triton-tutorial": triton_tutorial,
    "tvm-default": tvm_default,
}


def plan_peers(outs, gpu: GPUSpec) -> dict[str, PeerPlan | None]:
    """Every peer's plan of one workload (None where the peer has no kernel for it): a contraction
    goes to the contraction peers (contraction_peers.py), anything else to the reductions' peers."""
    from .contraction_peers import describe_contraction, plan_contraction_peers
    from .row_peers import ROW_PEERS

    c = describe_contraction(outs)
    if c is not None:
        return plan_contraction_peers(c, gpu)
    w = describe(outs)
    return {name: f(w, gpu) for name, f in {**PEERS, **ROW_PEERS}.items()}
