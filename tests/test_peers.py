"""Each peer's plan reproduced on a small case that its cited rule decides (panamera/bench/peers.py)."""

from __future__ import annotations

import pytest

import panamera as pn
from panamera.bench.peers import aten_reduce_config, cub_policy, inductor_num_splits, plan_peers
from panamera.model import H100


def _peers(outs):
    return plan_peers(outs, H100)


def test_pytorch_reduce_config_splits_a_long_sum_across_128_blocks():
    # Reduce.cuh setReduceConfig: 512 threads (block 512x1, input vectorized by 4); 2048 values per
    # thread >= 256 and grid 1 <= 132 SMs x 4 blocks: ctas = max(min(528, 2048/16), 2048/256) = 128.
    c = aten_reduce_config(1, 1 << 20, "ALL", 4, 4, H100)
    assert c["block"] == (512, 1) and c["vectorize_input"] and c["ctas_per_output"] == 128
    p = _peers([pn.sum(pn.placeholder((1 << 20,), "float32", name="x"))])["pytorch-eager"]
    assert p.kernels == 1 and p.blocks == 128 and p.launches[0].features["threads"] == 512


def test_pytorch_column_sum_vectorizes_along_outputs():
    # 21128 x 768 column sum: output_vec_size 4, block 32 x 4 (128 threads), grid 6 x 331.
    c = aten_reduce_config(768, 21128, "COLUMN", 4, 4, H100)
    assert c["output_vec_size"] == 4 and c["block"] == (32, 4) and c["grid"] == (6, 331)


def test_pytorch_softmax_kernels():
    # SoftMax.cu host_softmax: 128 columns -> persistent warp softmax (4 warps, 2 rows each);
    # 30522 columns -> 1024 threads, 30 values per thread (not < 10), 30522 % 4 != 0: cunn_SoftMaxForward.
    small = _peers([pn.nn.softmax(pn.placeholder((6144, 128), "float32", name="x"))])["pytorch-eager"]
    assert small.blocks == 768 and small.launches[0].features["threads"] == 128
    big = _peers([pn.nn.softmax(pn.placeholder((64, 30522), "float32", name="x"))])["pytorch-eager"]
    assert big.launches[0].name == "cunn_SoftMaxForward" and big.blocks == 64
    assert big.launches[0].features["threads"] == 1024


def test_pytorch_layer_norm_is_one_vectorized_kernel():
    x = pn.placeholder((1024, 768), "float32", name="x")
    g, b = pn.placeholder((768,), "float32", name="g"), pn.placeholder((768,), "float32", name="b")
    p = _peers([pn.nn.layer_norm(x, g, b)])["pytorch-eager"]
    assert p.kernels == 1 and p.blocks == 1024 and p.launches[0].features["threads"] == 128
    assert p.launches[0].bytes_written == 1024 * 768 * 4 + 2 * 1024 * 4  # Y, then mean and rstd (fp32)


def test_pytorch_rms_norm_writes_its_rstd_alone():
    # layer_norm_kernel.cu _fused_rms_norm_cuda allocates Y and rstd only (the rms_norm template has no mean)
    x, g = pn.placeholder((1024, 768), "float32", name="x"), pn.placeholder((768,), "float32", name="g")
    p = _peers([pn.nn.rms_norm(x, g)])["pytorch-eager"]
    assert p.kernels == 1 and p.launches[0].bytes_written == 1024 * 768 * 4 + 1024 * 4


def test_cub_device_reduce_grid_for_65536_floats():
    # tuning_reduce.cuh sm60+ policy: 256 threads x 16 items (tile 4096): 16 tiles -> 16 blocks, then
    # the single-tile kernel.
    assert cub_policy(4) == (256, 16, 4)
    p = _peers([pn.sum(pn.placeholder((65536,), "float32", name="x"))])["cub"]
    assert p.kernels == 2 and [ln.features["blocks"] for ln in p.launches] == [16, 1]
    one = _peers([pn.sum(pn.placeholder((4096,), "float32", name="x"))])["cub"]
    assert one.kernels == 1  # fits one tile
    rows = _peers([pn.sum(pn.placeholder((768, 768), "float32", name="x"), axis=1)])["cub"]
    assert rows.kernels == 1 and rows.blocks == 768  # DeviceSegmentedReduce: one block per segment
    assert _peers([pn.nn.softmax(pn.placeholder((8, 64), "float32", name="x"))])["cub"] is None


def test_inductor_split_for_a_column_sum():
    # ir.py outer_reduction_splits: 768 outputs x 21128 -> target 1056 // 6 xblocks, split size 38
    # (a divisor of 21128 near 31), 21128 / (4 x 38) -> 139 splits: two kernels.
    assert inductor_num_splits(768, 21128, "OUTER", H100) == 139
    p = _peers([pn.sum(pn.placeholder((21128, 768), "float32", name="x"), axis=0)])["inductor"]
    assert p.kernels == 2 and p.facts["split"] == 139
    assert inductor_num_splits(1, 10_000_000, "INNER", H100, "argmax") == 1  # argmax is never split
    assert inductor_num_splits(4096, 8192, "INNER", H100) == 1  # enough outputs


def test_triton_softmax_block_and_warps():
    # 02-fused-softmax: BLOCK_SIZE = next_pow2(30522) = 32768, num_warps 16; one program per row.
    p = _peers([pn.nn.softmax(pn.placeholder((64, 30522), "float32", name="x"))])["triton-tutorial"]
    assert p.facts == {"block_size": 32768, "num_warps": 16}
    assert p.blocks == 64 and p.launches[0].features["threads"] == 512


def test_tvm_row_sum_uses_32_by_32_blocks():
    # topi/cuda/reduction.py: 32 outputs per block (threadIdx.y), 32 threads per output (threadIdx.x).
    p = _peers([pn.sum(pn.placeholder((768, 768), "float32", name="x"), axis=1)])["tvm-default"]
    assert p.blocks == 24 and p.launches[0].features["threads"] == 1024
    a = _peers([pn.sum(pn.placeholder((65536,), "float32", name="x"))])["tvm-default"]
    assert a.blocks == 1 and a.launches[0].features["threads"] == 1024  # all-reduce: one block


def test_every_peer_is_modeled_by_the_same_model():
    outs = [pn.sum(pn.placeholder((1024, 1024), "float32", name="x"))]
    for name, p in _peers(outs).items():
        if p is None:  # the row kernels' peers have no kernel for a plain sum
            assert name in ("quack", "liger")
            continue
        e = p.estimate(H100, 1024 * 1024 * 4 + 4)
        assert e.total_us > 0 and e.launches == p.kernels, name
        assert p.description


# --- contraction peers (panamera/bench/contraction_peers.py) ------------------------------------------
def test_contractions_go_to_the_contraction_peers():
    from panamera.bench.suites import _decode_attention, _linear

    lin = _peers(_linear(4, 256, 512, "int4")())
    assert lin["pytorch-eager"] is not None and lin["cublas"] is None and lin["triton-splitk"] is None
    assert lin["marlin"] is not None  # int4 (group 128) x fp16 with N, K multiples of Marlin's 128 x 128 tile
    assert "cub" not in lin  # the reductions' peers do not see a contraction
    att = _peers(_decode_attention(2, 1024, "float16")())
    assert att["flash-decoding"] is not None and att["cublas"] is None


def test_describe_contraction_reads_the_workload():
    from panamera.bench.contraction_peers import DecodeAttention, Linear, describe_contraction
    from panamera.bench.suites import _decode_attention, _linear

    assert describe_contraction(_linear(4, 256, 512, "int4")()) == Linear(4, 256, 512, "int4", "float16", 128)
    # 32 rows of 4096 x 4096: the group scales (4096 x 32) have as many values as the activations
    assert describe_contraction(_linear(32, 4096, 4096, "int4")()).group == 128
    assert describe_contraction(_linear(1, 64, 128, "int8")()) == Linear(1, 64, 128, "int8", "float16", 128)
    assert describe_contraction(_linear(2, 64, 128, "bfloat16", "bfloat16")()).weights == "bfloat16"
    assert describe_contraction(_decode_attention(2, 1024, "bfloat16")()) == DecodeAttention(
        2, 32, 8, 1, 1024, 128, "bfloat16"
    )
    assert describe_contraction([pn.sum(pn.placeholder((8, 8), name="x"))]) is None


def test_cublas_is_the_library_roofline_where_its_tiles_fill_the_gpu():
    # model/library.py: 4096^3 fp16 on 128x128 tiles is compute-bound (141 us); the peer's launch
    # carries the same bytes, grid and tensor-core FLOPs, so the same model gives the same time.
    from panamera.bench.contraction_peers import Linear, cublas
    from panamera.model.library import library_matmul

    for M, N, K in ((4096, 4096, 4096), (1024, 512, 1024)):
        p = cublas(Linear(M, N, K, "float16"), H100)
        lib = library_matmul(H100, M, N, K, 1, "float16")
        assert p.kernels == 1 and p.estimate(H100, 0).total_us == pytest.approx(lib.total_s * 1e6, rel=1e-9)


def test_cublas_skinny_gemm_uses_64x8_tiles_and_splits_k_when_few_tiles():
    # Observed nvjet_tst_64x8_..._splitK + splitKreduce_kernel: 16 x 64 outputs give 2 tiles of 8x64;
    # 66 splits fill the 132 SMs (K = 65536 allows up to 256 of 4 slabs): two kernels.
    from panamera.bench.contraction_peers import Linear, cublas

    p = cublas(Linear(16, 64, 65536, "float16"), H100)
    assert p.facts == {"tile": (8, 64), "split": 66, "kernels": 2}
    assert [ln.name for ln in p.launches] == ["nvjet_splitK", "splitKreduce_kernel"]
    g = cublas(Linear(1, 4096, 4096, "float16"), H100)  # 64 tiles with 16 stages in flight stream the weights
    stream = (H100.launch_s + H100.loaded_latency_s + 4096 * 4096 * 2 / H100.achievable_bw) * 1e6
    assert g.facts["tile"] == (8, 64) and g.estimate(H100, 0).total_us < 1.05 * stream


def test_triton_splitk_autotunes_over_the_matmul_configs():
    # triton.ops.matmul: 9 compute-bound configs + get_configs_io_bound's 5 x 2 x 2 x 4 x 5 = 400;
    # early_config_prune drops what overflows shared memory (V100: 96 KB per block).
    from panamera.bench.contraction_peers import Linear, triton_configs, triton_splitk
    from panamera.model import V100

    assert len(triton_configs(2, H100)) == 409 and len(triton_configs(2, V100)) < 409
    p = triton_splitk(Linear(16, 64, 65536, "float16"), H100)  # 1 output tile, K huge: split K
    assert p.facts["split"] == 16 and p.facts["block"][0] == 16
    assert p.launches[0].name == "zero_" and p.launches[1].features["atomics"] == 16 * 64 * 16
    assert triton_splitk(Linear(1024, 512, 1024, "float16"), H100).facts["split"] == 1  # tiles fill the GPU


def test_marlin_stripes_and_serial_reduction():
    # marlin_cuda: 128 x 128 tiles up to 16 rows, 64 x 256 beyond; blocks = SMs, stripes of
    # ceil(tiles / SMs) tiles, k fastest, rounded to whole groups of 128 along K.
    from panamera.bench.contraction_peers import Linear
    from panamera.bench.marlin_peer import marlin, marlin_config
    from panamera.model.library import mma_sync_peak

    # 4096^2: 32 x 32 tiles over 132 SMs -> stripes of 8 on 128 blocks, 4 blocks per column slice
    (f,) = marlin_config(Linear(1, 4096, 4096, "int4", group=128), H100)
    assert (f["thread_k"], f["thread_n"], f["iters"], f["blocks"], f["chain"]) == (128, 128, 8, 128, 4)
    # 32 rows of 12288 x 5376: 84 x 48 tiles of 64 x 256, ceil(4032 / 132) = 31 rounded to 2 K tiles a group
    (f,) = marlin_config(Linear(32, 12288, 5376, "int4", group=128), H100)
    assert (f["thread_k"], f["thread_n"], f["m_blocks"], f["iters"], f["blocks"]) == (64, 256, 2, 32, 126)
    assert len(marlin_config(Linear(200, 4096, 4096, "int4", group=128), H100)) == 2  # 3 x 64 rows side by side, 8 more
    for c in (Linear(1, 4096, 4096, "bfloat16"), Linear(1, 4160, 4096, "int4", group=128),
              Linear(1, 4096, 4096, "int4", "bfloat16", 128)):  # fmt: skip
        assert marlin(c, H100) is None  # no kernel: not int4 x fp16, or N not a multiple of the tile
    # 64 rows are bound by mma.sync on H100 (the tensor cores' issue, padded to 4 m blocks), plus the serial chain
    p = marlin(Linear(64, 12288, 5376, "int4", group=128), H100)
    ln = p.launches[0]
    assert ln.features["mma_flops"] == 2.0 * 64 * 12288 * 5376
    mma_us = ln.features["mma_flops"] / (mma_sync_peak(H100, "float16") * ln.features["blocks"] / H100.sms) * 1e6
    assert p.estimate(H100, 0).total_us >= H100.launch_s * 1e6 + mma_us


def test_flash_decoding_split_rule():
    # flash_api.cpp: the comment's own example, 48 heads on 108 SMs -> 2 splits (efficiency 0.89);
    # decode with 32/8 grouped heads folds the 4 query heads into seqlen_q (8 "heads", 1 m-block);
    # 4096 keys are 32 blocks of 128: eligible splits 1-8, 11, 16, 32 -> 32 fill 256 of 264 slots.
    from panamera.bench.contraction_peers import DecodeAttention, flash_decoding, num_splits_heuristic

    assert num_splits_heuristic(48, 108, 64, 128) == 2
    assert num_splits_heuristic(212, 264, 64, 128) == 1  # >= 80 % of the SMs: no split
    p = flash_decoding(DecodeAttention(1, 32, 8, 1, 4096, 128, "float16"), H100)
    assert p.facts["swapped"] and p.facts["heads"] == 8 and p.facts["seqlen_q"] == 4 and p.facts["splits"] == 32
    assert [ln.name for ln in p.launches] == ["flash_fwd_splitkv_kernel", "flash_fwd_splitkv_combine_kernel"]
    assert p.launches[0].features["blocks"] == 256
    big = flash_decoding(DecodeAttention(16, 32, 8, 1, 131072, 128, "float16"), H100)
    kv = 2 * 16 * 8 * 131072 * 128 * 2
    assert big.facts["splits"] == 2 and big.launches[0].bytes_read == kv + 16 * 32 * 128 * 2  # K, V read once


def test_pytorch_eager_sdpa_math_and_dequantize_then_cublas():
    # attention.cpp _scaled_dot_product_attention_math: scale q, repeat_interleave K and V to 32 heads,
    # scale k^T, bmm, softmax over the key length, bmm: the scores go through DRAM.
    from panamera.bench.contraction_peers import DecodeAttention, Linear, pytorch_eager

    p = pytorch_eager(DecodeAttention(4, 32, 8, 1, 4096, 128, "float16"), H100)
    names = [ln.name for ln in p.launches]
    assert names[:4] == ["mul(q, sqrt(scale))", "repeat_interleave(k)", "repeat_interleave(v)", "mul(k^T, sqrt(scale))"]
    assert p.launches[1].bytes_written == 4 * 32 * 4096 * 128 * 2  # K copied for every query head
    assert "cunn_SoftMax" in p.launches[5].name and p.launches[5].bytes_read == 4 * 32 * 4096 * 2
    # torchao int8 weight-only: w.to(fp16) (reads 1 byte, writes 2 per weight), torch.mm, * scale
    q = pytorch_eager(Linear(1, 4096, 4096, "int8", group=4096), H100)
    assert q.launches[0].name == "to(fp16)" and q.launches[0].bytes_written == 4096 * 4096 * 2
    assert q.launches[-1].name == "mul(scale)"
    q4 = pytorch_eager(Linear(1, 4096, 4096, "int4", group=128), H100)
    assert q4.launches[0].bytes_read == 4096 * 2048 + 4096 * 32 * 2  # packed nibbles and group scales


def test_tensor_core_work_binds_a_compute_bound_peer():
    # 4096^3 fp16: 137 GFLOP at 989 TFLOP/s on all 132 SMs = 139 us, far above its 100 MB stream.
    from panamera.bench.contraction_peers import Linear, cublas, tensor_core_s

    p = cublas(Linear(4096, 4096, 4096, "float16"), H100)
    assert tensor_core_s(p.launches[0], H100) == pytest.approx(2 * 4096**3 / 989e12, rel=1e-9)
    e = p.estimate(H100, 0)
    assert e.issue_us == pytest.approx(e.total_us - e.launch_us - e.dram_us - e.tail_us, rel=1e-6)
