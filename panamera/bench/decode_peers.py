"""Decode-attention peers that H100 users run today, each planned from its own source's split
rules and modeled by the same model as Panamera (contraction_peers.py keeps Flash-Decoding, the
FlashAttention-2 split-KV path, where users still meet it).

- **FlashAttention-3** (repository Dao-AILab/flash-attention, `hopper/heuristics.h`
  `num_splits_heuristic`, `should_pack_gqa`; `hopper/flash_api.cpp`): the query heads of one KV
  head are packed into the rows of an M block (PackGQA: decode has one query per head); the key
  blocks are 176 wide for head dim 128 [from `tile_size_fwd_sm90`, read as of 2025]; the split:
  one when the M blocks already give 80 % of the SMs a block, one when there are at most 4 key
  blocks, else the smallest split whose wave efficiency is within 85 % of the best, over at most
  min(128, SMs, key blocks) splits; a split writes fp32 partials that `FlashAttnFwdCombine` merges.
  Three warpgroups per block (a TMA producer and two MMA consumers), two K/V stages in flight.
- **FlashInfer** (repository flashinfer-ai/flashinfer, `include/flashinfer/attention/scheduler.cuh`
  `PartitionPagedKVCacheBinarySearchMinNumPagePerBatch`, `DecodePlan`; `decode.cuh`
  `BatchDecodeWithPagedKVCacheKernel`): grid (requests x KV chunks, KV heads); the chunk is the
  smallest number of pages (at least 128 tokens) that keeps the grid within the occupancy-limited
  maximum (blocks per SM x SMs); a split request's partial states are merged by
  `VariableLengthMergeStates`. Threads: head_dim / vec lanes (vec = 16 bytes) x the GQA group x
  enough rows for 128 threads; two cp.async stages of K and V in flight.
"""

from __future__ import annotations

import math

from ..model.gpu import GPUSpec
from .contraction_peers import ContractionPlan, DecodeAttention, _contraction_plan, _mma
from .peer_plan import cdiv, from_workspace, kernel

FA3_BLOCK_N = {128: 176}  # hopper tile_size_fwd_sm90, non-causal (other head dims: not modeled)
FA3_THREADS = 384  # a producer warpgroup and two consumer warpgroups
FLASHINFER_BLOCKS_PER_SM = 4  # [assumed] the occupancy DecodePlan asks the driver for (shared memory bound)
PAGE = 16  # tokens per page (FlashInfer's usual page size)


def fa3_num_splits(total_mblocks: int, sms: int, n_blocks: int, max_splits: int = 128) -> int:
    """hopper/heuristics.h num_splits_heuristic (KV heads under 50 MB: no L2 split)."""
    if total_mblocks >= 0.8 * sms or n_blocks <= 4:
        return 1
    top = min(max_splits, sms, n_blocks)
    eff = {}
    for s in range(1, top + 1):
        waves = total_mblocks * s / sms
        eff[s] = waves / math.ceil(waves)
    best = max(eff.values())
    return next(s for s, v in eff.items() if v >= 0.85 * best)


def fa3_decode(c, gpu: GPUSpec) -> ContractionPlan | None:
    if not isinstance(c, DecodeAttention) or c.dtype not in ("float16", "bfloat16") or c.D not in FA3_BLOCK_N:
        return None
    group = c.Hq // c.Hkv
    block_m = 128 if c.D <= 128 else 64
    m_blocks = cdiv(c.Lq * group, block_m)  # PackGQA: the group's query heads are rows of one block
    block_n = FA3_BLOCK_N[c.D]
    n_blocks = cdiv(c.Lk, block_n)
    total = c.B * c.Hkv * m_blocks
    s = fa3_num_splits(total, gpu.sms, n_blocks)
    rows = c.B * c.Hq * c.Lq
    q_bytes, out = rows * c.D * c.elem, rows * c.D * c.elem
    accum = s * rows * (c.D + 1) * 4
    in_flight = 2 * 2 * block_n * c.D * c.elem / FA3_THREADS  # two stages of a K and a V tile (TMA)
    main = kernel("flash_fwd_sm90", read=q_bytes + c.kv_bytes, written=accum if s > 1 else out, blocks=total * s,
                  threads=FA3_THREADS, in_flight=in_flight, sfu=rows * c.Lk)  # fmt: skip
    flops = 2 * 2.0 * c.B * c.Hkv * m_blocks * block_m * n_blocks * block_n * c.D
    launches = [_mma(main, flops, c.dtype)]
    what = f"FA3 sm90 PackGQA: {s} split(s) of {n_blocks} key blocks of {block_n}"
    if s > 1:
        combine = kernel("flash_fwd_combine", read=accum, written=out, blocks=cdiv(rows, 8), threads=256,
                         in_flight=4 * 16)  # fmt: skip
        launches.append(from_workspace(combine, accum, gpu))
        what += " + combine"
    return _contraction_plan("fa3-decode", launches, what, splits=s, block_n=block_n, m_blocks=m_blocks)


def flashinfer_chunk(pages: int, requests: int, kv_heads: int, max_grid: int) -> tuple[int, int]:
    """PartitionPagedKVCacheBinarySearchMinNumPagePerBatch for `requests` of `pages` pages each:
    (pages per chunk, chunks in all), the chunk at least 128 tokens."""
    low, high = max(128 // PAGE, 1), max(pages, 1)
    while low < high:
        mid = (low + high) // 2
        if requests * cdiv(pages, mid) * kv_heads > max_grid:
            low = mid + 1
        else:
            high = mid
    return low, requests * cdiv(max(pages, 1), low)


def flashinfer_decode(c, gpu: GPUSpec) -> ContractionPlan | None:
    if not isinstance(c, DecodeAttention) or c.dtype not in ("float16", "bfloat16") or c.Lq != 1:
        return None
    group = c.Hq // c.Hkv
    vec = max(16 // c.elem, c.D // 32)
    bdx = c.D // vec
    threads = max(128, bdx * group)
    pages = cdiv(c.Lk, PAGE)
    chunk, batches = flashinfer_chunk(pages, c.B, c.Hkv, FLASHINFER_BLOCKS_PER_SM * gpu.sms)
    split = batches > c.B
    rows = c.B * c.Hq
    q_bytes, out = rows * c.D * c.elem, rows * c.D * c.elem
    tmp = batches * c.Hq * (c.D + 1) * 4 if split else 0
    in_flight = 2 * 2 * vec * c.elem  # two cp.async stages of a K and a V vector per thread
    main = kernel("BatchDecodeWithPagedKVCacheKernel", read=q_bytes + c.kv_bytes, written=tmp or out,
                  blocks=batches * c.Hkv, threads=threads, in_flight=in_flight, sfu=rows * c.Lk)  # fmt: skip
    launches = [main]
    what = f"FlashInfer decode: {batches} chunk(s) of {chunk * PAGE} tokens x {c.Hkv} KV heads"
    if split:
        launches.append(kernel("VariableLengthMergeStates", read=tmp, written=out, blocks=rows, threads=128,
                               in_flight=16))  # fmt: skip
        what += " + merge"
    return _contraction_plan("flashinfer-decode", launches, what, chunk_tokens=chunk * PAGE, chunks=batches)


DECODE_PEERS = {"fa3-decode": fa3_decode, "flashinfer-decode": flashinfer_decode}
