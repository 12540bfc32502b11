"""Peers for contractions (docs/WORKLOADS.md C): each planned from *that peer's own rules* and
modeled by the same model as Panamera (`panamera.model.estimate`), plus a tensor-core term.

Kernels of a contraction also do matrix arithmetic: a launch records its tensor-core FLOPs
(`tc_flops`, `tc_dtype` in its features) and `ContractionPlan.estimate` adds what that work
outlasts the launch's streaming, the roofline `max(FLOPs / (peak x occupied SMs / SMs), stream)`
of model/library.py.

Sources (bench/README.md, "Contraction peers"):
- cuBLAS: model/library.py's tile grid and roofline (128 x 128 tiles, 64 x 64 when they cannot give
  every SM one; 256 threads; three 32-deep K stages in flight) where the tiles fill the GPU. For
  outputs too small to fill it [observed, closed source]: public H100 profiles of torch.mm / F.linear
  show cuBLASLt's `nvjet_tst_64x8_64x16_..._splitK_TNT` (64 x 8 output tiles, 64-deep K slabs, 16
  stages) followed by `cublasLt::splitKreduce_kernel<32, 16, int, float, ...>`; the split factor is
  [assumed] the one that gives every SM one block (at least 4 K slabs per split, as for Triton).
- Triton split-K: triton-lang/triton `python/triton/ops/matmul.py` (2.x): the autotuned `_kernel`'s
  configs (the compute-bound list and `get_configs_io_bound`: BLOCK_M 16/32, BLOCK_K 32/64,
  BLOCK_N 32-256, num_stages 2-6, num_warps 2 if BLOCK_N <= 64 else 4, SPLIT_K 1/2/4/8/16), pruned
  by `matmul_perf_model.early_config_prune` (shared memory); SPLIT_K > 1 zeroes C first
  (`init_to_zero('C')`) and merges with `tl.atomic_add`. The autotuner times its candidates and
  keeps the fastest: here the model times them.
- Flash-Decoding: Dao-AILab/flash-attention `csrc/flash_attn/flash_api.cpp` (`mha_fwd`:
  `seqlenq_ngroups_swapped` folds the Hq / Hkv query heads of one KV head into seqlen_q when
  seqlen_q == 1; `set_params_splitkv`: block_n = 256 / 128 / 64 for head dim <= 64 / <= 128 / more,
  kBlockM 64, `num_splits_heuristic(batch * heads * m_blocks, 2 x SMs, n_blocks, 128)`),
  `flash_fwd_launch_template.h` (`run_flash_splitkv_fwd`: grid (m_blocks, splits, batch x heads) of
  4 warps, then `flash_fwd_splitkv_combine_kernel` with kBlockM 4 for head dim 128).
- Marlin (int4 weights): IST-DASLab/marlin `marlin/marlin_cuda_kernel.cu`, panamera/bench/marlin_peer.py.
- PyTorch eager: `aten/src/ATen/native/transformers/attention.cpp`
  `_scaled_dot_product_attention_math` (q and k each scaled by sqrt(scale), matmul, softmax,
  matmul; `pre_process_group_query_attention_input` repeat_interleaves K and V for grouped heads);
  F.linear is cuBLAS; int8 weights as torchao's `_linear_fp_act_int8_weight_impl` (the weights cast
  to the activation dtype, torch.mm, then `* scale`); int4 as torchao's fallback (`dequantize()`,
  then F.linear), counted as one dequantization kernel (generous: eager runs several).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from ..frontend.tensor import topological
from ..model.estimate import Estimate, estimate
from ..model.gpu import GPUSpec
from ..model.kernel_cost import kernel_time
from ..model.library import tensor_core_peak
from .eager_peer import _torch_softmax, aten_elementwise
from .peer_plan import PeerLaunch, PeerPlan, _plan, cdiv, from_workspace, kernel

_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "int4": 0.5}


# --- what the workload is ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Linear:
    """x[M, K] @ W.T, W stored N x K (torch's Linear): `weights` float16 / bfloat16 / int8 / int4
    (two per byte), quantized weights with fp16 scales per `group` values along K."""

    M: int
    N: int
    K: int
    weights: str
    act: str = "float16"
    group: int = 0

    @property
    def weight_bytes(self) -> int:
        return int(self.N * self.K * _BYTES[self.weights])

    @property
    def scale_bytes(self) -> int:
        return self.N * (self.K // self.group) * 2 if self.group else 0

    @property
    def act_bytes(self) -> int:
        return _BYTES[self.act]


@dataclass(frozen=True)
class DecodeAttention:
    """softmax(q K^T * scale) V for q (B, Hq, Lq, D) against K, V (B, Hkv, Lk, D)."""

    B: int
    Hq: int
    Hkv: int
    Lq: int
    Lk: int
    D: int
    dtype: str

    @property
    def elem(self) -> int:
        return _BYTES[self.dtype]

    @property
    def kv_bytes(self) -> int:
        return 2 * self.B * self.Hkv * self.Lk * self.D * self.elem


def describe_contraction(outs) -> Linear | DecodeAttention | None:
    """The contraction workload a graph computes, from its inputs (placeholders `q`, `k`, `v` for
    attention; otherwise the contraction node, the largest input as the weights and a 16-bit input
    of N x groups values as their scales); None for a graph without a contraction."""
    order = topological(list(outs))
    inputs = {t.name: t for t in order if t.op == "placeholder"}
    if {"q", "k", "v"} <= set(inputs):
        (B, Hq, Lq, D), (_, Hkv, Lk, _) = inputs["q"].shape, inputs["k"].shape
        return DecodeAttention(B, Hq, Hkv, Lq, Lk, D, inputs["q"].dtype.name)
    node = next((t for t in order if t.op == "reduce" and t.attr("contraction") is not None), None)
    if node is None:
        return None
    K = math.prod(node.inputs[0].shape[a] for a in node.attr("axes"))
    w = max(inputs.values(), key=lambda t: t.size * t.dtype.itemsize)
    N = w.shape[0]
    M = node.size // N
    kind = "int4" if w.dtype.name == "uint8" else w.dtype.name
    # the activations are M x K (an int4 weight's group scales may have as many values: N x K / 128)
    x = next((t for t in inputs.values() if t is not w and t.size == M * K and t.shape[-1] == K), None)
    act = x.dtype.name if x is not None else "float16"
    scales = [t for t in inputs.values() if t is not w and t is not x and t.dtype.is_16bit_float and t.size % N == 0]
    group = K // (scales[0].size // N) if scales and kind in ("int8", "int4") else 0
    return Linear(M, N, K, kind, act, group)


# --- plans with tensor-core work ----------------------------------------------------------------------
def _mma(ln: PeerLaunch, flops: float, dtype: str) -> PeerLaunch:
    """The launch with its tensor-core work recorded (ignored by kernel_time, added by ContractionPlan)."""
    return dataclasses.replace(ln, features={**ln.features, "tc_flops": float(flops), "tc_dtype": dtype})


def tensor_core_s(ln: PeerLaunch, gpu: GPUSpec) -> float:
    """Seconds of the launch's tensor-core FLOPs at the dense peak, on the SMs its blocks occupy."""
    flops = ln.features.get("tc_flops", 0.0)
    if not flops:
        return 0.0
    occupied = min(ln.features["blocks"], gpu.sms) / gpu.sms
    return flops / (tensor_core_peak(gpu, ln.features["tc_dtype"]) * occupied)


@dataclass(frozen=True)
class ContractionPlan(PeerPlan):
    """A peer's plan whose launches may be bound by their tensor-core work (model/library.py's
    roofline): each launch's exposed arithmetic, FLOPs at peak beyond its streaming time, is added."""

    def estimate(self, gpu: GPUSpec, compulsory: int | tuple[int, int]) -> Estimate:
        e = estimate(list(self.launches), gpu, compulsory)
        extra = 0.0
        for ln in self.launches:
            c = kernel_time(gpu, **dict(ln.cost_features))
            extra += max(0.0, tensor_core_s(ln, gpu) - max(c.dram_s, c.l2_s, c.issue_s))
        us = extra * 1e6
        return dataclasses.replace(e, total_us=e.total_us + us, issue_us=e.issue_us + us)


def _contraction_plan(peer: str, launches, what: str, **facts) -> ContractionPlan:
    p = _plan(peer, launches, what, **facts)
    return ContractionPlan(p.peer, p.launches, p.description, p.facts)


# --- cuBLAS ---------------------------------------------------------------------------------------------
SKINNY_TILE = (8, 64)  # nvjet_tst_64x8_...: 8 rows of M by 64 of N
SLAB = 64  # K per stage, both the nvjet skinny kernels and Triton's larger BLOCK_K
MIN_SLABS_PER_SPLIT = 4  # [assumed] a split keeps at least 4 K slabs


def cublas_gemm(M: int, N: int, K: int, batch: int, dtype: str, out_bytes: int, gpu: GPUSpec, a_bytes: int = 0,
                b_bytes: int = 0) -> tuple[list[PeerLaunch], dict]:  # fmt: skip
    """cuBLAS's launches for a (batch x) M x N x K GEMM with `dtype` operands (module docstring):
    library.py's tile grid when it fills the GPU; else 64 x 8 tiles for M <= 16 (the library's tiles
    otherwise), split over K with a reduce kernel or not: the heuristic is given the best of these
    by the model (generous: cuBLAS's own choice is closed source)."""
    item = _BYTES[dtype]
    a_bytes = a_bytes or int(batch * M * K * item)
    b_bytes = b_bytes or int(batch * K * N * item)
    out = batch * M * N * out_bytes
    tile = 128 if cdiv(M, 128) * cdiv(N, 128) * batch >= gpu.sms else 64
    tiles = cdiv(M, tile) * cdiv(N, tile) * batch
    ln = kernel("cublas_gemm", read=a_bytes + b_bytes, written=out, blocks=tiles, threads=256,
                in_flight=3 * 2 * tile * 32 * item / 256)  # three stages of 32-deep slabs of both operands  # fmt: skip
    library = ([_mma(ln, 2.0 * M * N * K * batch, dtype)], {"tile": (tile, tile), "split": 1, "kernels": 1})
    if tiles >= gpu.sms:
        return library
    (tm, tn), stages, threads = (SKINNY_TILE, 16, 128) if M <= 16 else ((tile, tile), 3, 256)
    tiles = cdiv(M, tm) * cdiv(N, tn) * batch
    split = max(1, min(cdiv(gpu.sms, tiles), K // (SLAB * MIN_SLABS_PER_SPLIT)))
    candidates = [library]
    for s in dict.fromkeys((1, split)):
        partial = batch * M * N * 4 * s
        main = kernel("nvjet_splitK" if s > 1 else "nvjet", read=a_bytes + b_bytes, written=partial if s > 1 else out,
                      blocks=tiles * s, threads=threads, in_flight=(stages - 1) * (tm + tn) * SLAB * item / threads,
                      l2=(cdiv(N, tn) - 1) * a_bytes)  # the activations re-read by every N tile  # fmt: skip
        launches = [_mma(main, 2.0 * cdiv(M, tm) * tm * N * K * batch, dtype)]
        if s > 1:
            reduce = kernel("splitKreduce_kernel", read=partial, written=out, blocks=cdiv(batch * M * N, 32 * 16),
                            threads=32 * 16, in_flight=16)  # fmt: skip
            launches.append(from_workspace(reduce, partial, gpu))
        candidates.append((launches, {"tile": (tm, tn), "split": s, "kernels": len(launches)}))
    return min(candidates, key=lambda p: ContractionPlan("", tuple(p[0]), "").estimate(gpu, 0).total_us)


def cublas(c, gpu: GPUSpec) -> ContractionPlan | None:
    """cuBLAS on 16-bit weights (a GEMM has no dequantizing prologue: quantized weights go to eager)."""
    if not isinstance(c, Linear) or c.weights not in ("float16", "bfloat16"):
        return None
    launches, facts = cublas_gemm(c.M, c.N, c.K, 1, c.weights, 2, gpu)
    return _contraction_plan("cublas", launches, _cublas_what(facts), **facts)


def _cublas_what(facts: dict) -> str:
    t = facts["tile"]
    return f"cuBLAS {t[0]}x{t[1]} tiles" + (f", split-K {facts['split']} + splitKreduce" if facts["split"] > 1 else "")


# --- Triton split-K -------------------------------------------------------------------------------------
COMPUTE_CONFIGS = ((128, 256, 32, 3, 8), (256, 128, 32, 3, 8), (256, 64, 32, 4, 4), (64, 256, 32, 4, 4),
                   (128, 128, 32, 4, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (128, 32, 32, 4, 4),
                   (64, 32, 32, 5, 2))  # (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps), SPLIT_K 1  # fmt: skip


def triton_configs(elem: int, gpu: GPUSpec) -> list[tuple[int, int, int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_stages, num_warps) of triton.ops.matmul's autotune list
    that `early_config_prune` keeps (the stages' tiles fit the block's shared memory)."""
    out = [(m, n, k, 1, s, w) for m, n, k, s, w in COMPUTE_CONFIGS]
    for stages in (2, 3, 4, 5, 6):
        for bm in (16, 32):
            for bk in (32, 64):
                for bn in (32, 64, 128, 256):
                    for split in (1, 2, 4, 8, 16):
                        out.append((bm, bn, bk, split, stages, 2 if bn <= 64 else 4))
    return [c for c in out if c[4] * (c[0] + c[1]) * c[2] * elem <= gpu.smem_per_block]


def triton_matmul_launches(c: Linear, cfg, gpu: GPUSpec) -> list[PeerLaunch]:
    bm, bn, bk, split, stages, warps = cfg
    e = c.act_bytes
    a_bytes, b_bytes = c.M * c.K * e, c.N * c.K * e
    gm, gn = cdiv(c.M, bm), cdiv(c.N, bn)
    threads = 32 * warps
    out = c.M * c.N * 2
    ln = kernel("matmul_kernel", read=a_bytes + b_bytes, written=out, blocks=gm * gn * split, threads=threads,
                in_flight=(stages - 1) * (bm + bn) * bk * e / threads, l2=(gn - 1) * a_bytes + (gm - 1) * b_bytes,
                atomics=c.M * c.N * split if split > 1 else 0, same=split if split > 1 else 0,
                shared=stages * (bm + bn) * bk * e)  # early_config_prune's required_shared_memory  # fmt: skip
    launches = [_mma(ln, 2.0 * gm * bm * gn * bn * c.K, c.weights)]  # tl.dot computes whole tiles
    if split > 1:  # pre_hook init_to_zero('C'): C.zero_() before the atomics
        launches.insert(0, aten_elementwise("zero_", c.M * c.N, 0, out, 2))
    return launches


def triton_splitk(c, gpu: GPUSpec) -> ContractionPlan | None:
    """triton.ops.matmul on 16-bit operands: the config the autotuner would keep (the fastest, modeled)."""
    if not isinstance(c, Linear) or c.weights not in ("float16", "bfloat16"):
        return None
    need = c.M * c.K * c.act_bytes + c.weight_bytes + c.M * c.N * 2
    best = min(triton_configs(c.act_bytes, gpu),
               key=lambda cfg: _contraction_plan("t", triton_matmul_launches(c, cfg, gpu), "").estimate(gpu, need).total_us)  # fmt: skip
    bm, bn, bk, split, stages, warps = best
    return _contraction_plan(
        "triton-splitk", triton_matmul_launches(c, best, gpu),
        f"triton.ops.matmul BLOCK {bm}x{bn}x{bk}, SPLIT_K {split}, {stages} stages, {warps} warps",
        block=(bm, bn, bk), split=split, num_stages=stages, num_warps=warps,
    )  # fmt: skip


# --- Flash-Decoding --------------------------------------------------------------------------------------
def num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
    """flash_api.cpp num_splits_heuristic: 1 split when the blocks almost fill the SMs; else the
    smallest eligible split whose wave efficiency is within 85 % of the best."""
    if batch_nheads_mblocks >= 0.8 * num_sms:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)

    def eligible(s: int) -> bool:
        return s == 1 or cdiv(num_n_blocks, s) != cdiv(num_n_blocks, s - 1)

    eff = {}
    for s in range(1, max_splits + 1):
        if eligible(s):
            waves = batch_nheads_mblocks * s / num_sms
            eff[s] = waves / math.ceil(waves)
    best = max(eff.values())
    return next(s for s, v in eff.items() if v >= 0.85 * best)


def flash_decoding_config(a: DecodeAttention, gpu: GPUSpec) -> dict:
    """mha_fwd + set_params_splitkv: the grouped query heads folded into seqlen_q, the key blocks,
    and the split."""
    swapped = a.Lq == 1 and a.Hq > a.Hkv and a.D % 8 == 0
    seqlen_q, heads = (a.Hq // a.Hkv, a.Hkv) if swapped else (a.Lq, a.Hq)
    block_n = 256 if a.D <= 64 else 128 if a.D <= 128 else 64
    n_blocks, m_blocks = cdiv(a.Lk, block_n), cdiv(seqlen_q, 64)
    splits = num_splits_heuristic(a.B * heads * m_blocks, gpu.sms * 2, n_blocks, 128)
    return {"seqlen_q": seqlen_q, "heads": heads, "block_n": block_n, "n_blocks": n_blocks, "m_blocks": m_blocks,
            "splits": splits, "swapped": swapped}  # fmt: skip


def flash_decoding(c, gpu: GPUSpec) -> ContractionPlan | None:
    if not isinstance(c, DecodeAttention) or c.dtype not in ("float16", "bfloat16"):
        return None
    f = flash_decoding_config(c, gpu)
    rows, s = c.B * f["heads"] * f["seqlen_q"], f["splits"]
    q_bytes, out = c.B * c.Hq * c.Lq * c.D * c.elem, rows * c.D * c.elem
    accum = s * rows * (c.D + 1) * 4  # out_accum and softmax_lse_accum, fp32
    blocks = f["m_blocks"] * s * c.B * f["heads"]
    main = kernel("flash_fwd_splitkv_kernel", read=q_bytes + c.kv_bytes, written=accum if s > 1 else out, blocks=blocks,
                  threads=128, in_flight=f["block_n"] * c.D * c.elem / 128, sfu=rows * c.Lk)  # fmt: skip
    # both GEMMs run on whole 64-row m blocks (kBlockM), whatever rows are valid
    flops = 2 * 2.0 * c.B * f["heads"] * f["m_blocks"] * 64 * f["n_blocks"] * f["block_n"] * c.D
    launches = [_mma(main, flops, c.dtype)]
    what = f"flash_fwd_splitkv_kernel {s} split(s) of {f['n_blocks']} key blocks of {f['block_n']}"
    if s > 1:
        combine = kernel("flash_fwd_splitkv_combine_kernel", read=accum, written=out, blocks=cdiv(rows, 4),
                         threads=128, in_flight=16)  # fmt: skip
        launches.append(from_workspace(combine, accum, gpu))
        what += " + combine"
    return _contraction_plan("flash-decoding", launches, what, **f)


# --- PyTorch eager ---------------------------------------------------------------------------------------
def pytorch_eager(c, gpu: GPUSpec) -> ContractionPlan | None:
    if isinstance(c, DecodeAttention):
        return _sdpa_math(c, gpu)
    act = c.act
    launches = []
    if c.weights == "int8":  # torchao: w.t().to(x.dtype), torch.mm, then * scale
        launches.append(aten_elementwise("to(fp16)", c.N * c.K, c.weight_bytes, c.N * c.K * 2, 1))
    elif c.weights == "int4":  # dequantize(): packed nibbles and group scales -> 16-bit weights
        launches.append(aten_elementwise("dequantize", c.N * c.K, c.weight_bytes + c.scale_bytes, c.N * c.K * 2, 1))
    gemm, facts = cublas_gemm(c.M, c.N, c.K, 1, act, 2, gpu)
    launches += gemm
    what = "F.linear: " + _cublas_what(facts)
    if c.weights == "int8":
        launches.append(aten_elementwise("mul(scale)", c.M * c.N, c.M * c.N * 2 + c.N * 2, c.M * c.N * 2, 2))
        what = "torchao int8 weight-only: to(fp16) + " + _cublas_what(facts) + " + mul(scale)"
    elif c.weights == "int4":
        what = "dequantize() + " + what
    return _contraction_plan("pytorch-eager", launches, what, **facts)


def _sdpa_math(a: DecodeAttention, gpu: GPUSpec) -> ContractionPlan:
    """_scaled_dot_product_attention_math: q * sqrt(scale); K, V repeat_interleaved to Hq heads;
    k^T * sqrt(scale); bmm; softmax; bmm (every intermediate through DRAM)."""
    e, B, Hq, L, D = a.elem, a.B, a.Hq, a.Lk, a.D
    q = B * Hq * a.Lq * D
    big = B * Hq * L * D  # K or V with every query head's copy
    launches = [aten_elementwise("mul(q, sqrt(scale))", q, q * e, q * e, e)]
    if a.Hq != a.Hkv:
        for name in ("repeat_interleave(k)", "repeat_interleave(v)"):
            launches.append(aten_elementwise(name, big, B * a.Hkv * L * D * e, big * e, e))
    launches.append(aten_elementwise("mul(k^T, sqrt(scale))", big, big * e, big * e, e))
    scores, _ = cublas_gemm(a.Lq, L, D, B * Hq, a.dtype, e, gpu)
    soft, how = _torch_softmax(B * Hq * a.Lq, L, e, gpu, log=False)
    pv, _ = cublas_gemm(a.Lq, D, L, B * Hq, a.dtype, e, gpu)
    launches += [*scores, soft, *pv]
    return _contraction_plan("pytorch-eager", launches, f"SDPA math: scale, repeat_interleave K/V, bmm, {how}, bmm")


def marlin(c, gpu: GPUSpec) -> ContractionPlan | None:
    """Marlin on int4 weights (panamera/bench/marlin_peer.py: its rules, imported here late)."""
    from .marlin_peer import marlin as plan

    return plan(c, gpu)


CONTRACTION_PEERS: dict[str, Callable] = {
    "cublas": cublas,
    "triton-splitk": triton_splitk,
    "flash-decoding": flash_decoding,
    "pytorch-eager": pytorch_eager,
    "marlin": marlin,
}


def plan_contraction_peers(c, gpu: GPUSpec) -> dict[str, PeerPlan | None]:
    """Every contraction peer's plan of one workload (None where the peer has no kernel for it)."""
    from .decode_peers import DECODE_PEERS

    return {name: f(c, gpu) for name, f in {**CONTRACTION_PEERS, **DECODE_PEERS}.items()}
