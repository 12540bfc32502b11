"""Real peers as baselines: each peer's launches planned from *that peer's own rules*, read from
its source code, and modeled by the same model as Panamera (`panamera.model.estimate`).

A peer is a function `peer(work, gpu) -> PeerPlan | None`; `work` is what the workload's graph says
(`describe(outs)`: the pattern, canonical form, M outputs x N reduced values, dtypes, the element-wise
ops). A peer that has no kernel for the pattern returns None; nothing is invented for it.
This module holds the reductions' generic peers (CUB, TorchInductor, the Triton tutorials, TVM) and
`plan_peers`; a plan's launches and shared rules are peer_plan.py, the workload as the peers see it
peer_work.py, PyTorch eager eager_peer.py; the row, contraction, decode and training peers have their own
modules (row_peers.py, contraction_peers.py, decode_peers.py, train_peers.py).

Sources (every rule below names its file and function; bench/README.md "Peers and their rules"):
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

import math
from collections.abc import Callable

from ..model.gpu import GPUSpec
from .eager_peer import EAGER_LN_REGISTERS, aten_reduce_config, pytorch_eager
from .inductor_peer import COMPILED_ROWS, Hint, is_persistent, reduction_config, row_loops, split_rows
from .inductor_peer import ROW_PATTERNS as INDUCTOR_ROWS
from .inductor_peer import registers as inductor_registers
from .peer_plan import PeerLaunch, PeerPlan, _plan, cdiv, from_workspace, kernel, next_pow2, reread
from .peer_work import Work, _acc, describe

# The peers of this module, and the names that moved to peer_plan.py, peer_work.py and eager_peer.py that
# callers import from here.
__all__ = [
    "CUB_REGISTERS",
    "EAGER_LN_REGISTERS",
    "PEERS",
    "PeerPlan",
    "Work",
    "aten_reduce_config",
    "cub",
    "cub_device_reduce",
    "cub_policy",
    "describe",
    "inductor",
    "inductor_num_splits",
    "kernel",
    "plan_peers",
    "pytorch_eager",
    "reread",
    "triton_layer_norm_config",
    "triton_softmax_config",
    "triton_tutorial",
    "tvm_default",
    "tvm_reduce_schedule",
]


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
    size_hint=None,
):
    """One Triton reduction kernel as Inductor configures it (inductor_peer.py rules 1-3: persistent up to 1024
    (INNER) or 64; else the looped config, XBLOCK 1 and RBLOCK up to 2048 with up to 16 warps for INNER, XBLOCK 64
    and RBLOCK 8 for OUTER). `passes` loops over the row re-read it (L2 when it is resident); `unroll`: the
    steps one round trip carries where the kernel was compiled (rule 5; 0: not compiled, no round trips charged);
    `compiled`: a row kernel whose registers were read (inductor_peer.py `registers`; else not known)."""
    c = reduction_config(xnumel, rnumel, Hint(hint), size_hint)  # size_hint: inductor_peer.py rule 6
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


def inductor(w: Work, gpu: GPUSpec, size_hint: int | None = None) -> PeerPlan | None:
    """`size_hint`: a row kernel compiled with its length symbolic at that length (inductor_peer.py rule 6)."""
    M, N, e = w.M, w.N, w.in_bytes
    split = inductor_num_splits(M, N, "INNER", gpu) if w.pattern in INDUCTOR_ROWS else 1
    if split > 1:  # inductor_peer.py rule 7: few long rows are split, online softmax falls back
        return _inductor_split_rows(w, gpu, split)
    if w.pattern in INDUCTOR_ROWS:  # inductor_peer.py rule 4: the loops over the row and their exponentials
        loops = row_loops(w.pattern)
        out_full = w.pattern != "cross_entropy"
        params = N * e * (2 if w.pattern in ("layer_norm",) else 1 if w.pattern == "rms_norm" else 0)
        sfu = M * N * loops.exps(is_persistent(N, Hint.INNER) and size_hint is None)
        ln, cfg = _inductor_kernel("triton_red_fused", M, N, "INNER", e, gpu, read=M * N * e + params,
                                   written=(M * N if out_full else M) * w.out_bytes, passes=loops.loops, sfu=sfu,
                                   unroll=loops.unroll, compiled=w.pattern in COMPILED_ROWS,
                                   size_hint=size_hint)  # fmt: skip
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


def _inductor_split_rows(w: Work, gpu: GPUSpec, split: int) -> PeerPlan:
    """inductor_peer.py rule 7: a row pattern's split reductions in turn (the partials of M x `split` chunks, then
    one program per row over them), then its pointwise output kernel over M x N where it does not fuse. The row is
    read by every split reduction and by the pointwise kernel: after the first, from L2 where it fits (the rule of
    a workspace read back, model/workspace.py). The split kernels were not compiled here: no dependent steps
    charged (as a plain split reduction's)."""
    M, N, e, acc = w.M, w.N, w.in_bytes, 4
    rule, rn, x = split_rows(w.pattern), cdiv(w.N, split), M * N * e
    params = N * e * (2 if w.pattern == "layer_norm" else 1 if w.pattern == "rms_norm" else 0)
    later = max(rule.reductions - 1 + int(rule.pointwise), 1)  # the kernels after the first pass: exp and log
    sfu = M * N * rule.sfu_per_element / later
    launches = []
    for i in range(rule.reductions):
        part = rule.outputs * M * split * acc
        k1, c1 = _inductor_kernel("triton_red_split", M * split, rn, "INNER", e, gpu, read=x + i * M * acc,
                                  written=part, sfu=sfu if i else 0.0)  # fmt: skip
        last = i == rule.reductions - 1 and not rule.pointwise  # cross-entropy's loss: the target, x[target]
        k2, c2 = _inductor_kernel("triton_red_final", M, split, "INNER", acc, gpu, read=part + last * M * (8 + e),
                                  written=M * (w.out_bytes if last else acc))  # fmt: skip
        launches += [k1 if i == 0 else from_workspace(k1, x, gpu), from_workspace(k2, part, gpu)]
    if rule.pointwise:
        ln = kernel("triton_poi_fused", read=x + params + 2 * M * acc, written=M * N * w.out_bytes,
                    blocks=cdiv(M * N, 1024), threads=128, in_flight=8 * e, sfu=sfu)  # fmt: skip
        launches.append(from_workspace(ln, x, gpu))
    what = f"split {split} x {rule.reductions} ({c1}; then {c2})" + ", pointwise XBLOCK 1024" * rule.pointwise
    off = " (online softmax off)" * (rule.reductions == 2)
    return _plan("inductor", launches, f"Inductor split rows{off}, {what}", split=split)


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
