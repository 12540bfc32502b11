"""Decode-attention peers from their sources' split rules (bench/decode_peers.py): FlashAttention-3's
num_splits_heuristic and FlashInfer's KV-chunk binary search, each on hand-computed cases."""

from __future__ import annotations

from panamera.bench.contraction_peers import DecodeAttention
from panamera.bench.decode_peers import fa3_decode, fa3_num_splits, flashinfer_chunk, flashinfer_decode
from panamera.model import H100


def test_fa3_does_not_split_what_fills_the_gpu_or_few_key_blocks():
    assert fa3_num_splits(106, 132, 100) == 1  # 106 M blocks >= 0.8 x 132 SMs
    assert fa3_num_splits(8, 132, 4) == 1  # at most 4 key blocks


def test_fa3_takes_the_smallest_split_within_85_percent_of_the_best_wave_efficiency():
    # 8 M blocks on 132 SMs: 16 splits fill 128 SMs (0.97); 14 is the first at >= 0.85 x 0.97
    assert fa3_num_splits(8, 132, 24) == 14


def test_fa3_decode_packs_the_query_heads_and_combines_the_splits():
    p = fa3_decode(DecodeAttention(1, 32, 8, 1, 4096, 128, "float16"), H100)
    assert p.facts == {"splits": 14, "block_n": 176, "m_blocks": 1}
    assert [ln.name for ln in p.launches] == ["flash_fwd_sm90", "flash_fwd_combine"]
    assert fa3_decode(DecodeAttention(1, 32, 8, 1, 4096, 64, "float16"), H100) is None  # tile not read


def test_flashinfer_chunks_keep_the_grid_within_occupancy_and_128_tokens():
    assert flashinfer_chunk(256, 1, 8, 528) == (8, 32)  # 4 pages would do; 128 tokens = 8 pages is the floor
    assert flashinfer_chunk(512, 32, 8, 528) == (256, 64)  # 32 requests x 2 chunks x 8 heads = 512 <= 528
    p = flashinfer_decode(DecodeAttention(1, 32, 8, 1, 4096, 128, "float16"), H100)
    assert p.facts == {"chunk_tokens": 128, "chunks": 32} and p.kernels == 2
    one = flashinfer_decode(DecodeAttention(64, 32, 8, 1, 1024, 128, "float16"), H100)
    assert one.kernels == 1 and one.facts["chunks"] == 64  # 64 x 8 = 512 blocks fit: no split
