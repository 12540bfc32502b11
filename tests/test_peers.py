"""Each peer's plan reproduced on a small case that its cited rule decides (panamera/bench/peers.py)."""

from __future__ import annotations

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
        e = p.estimate(H100, 1024 * 1024 * 4 + 4)
        assert e.total_us > 0 and e.launches == p.kernels, name
        assert p.description
