"""The limit's forced re-read (bench/reread.py, docs/GPU_MODEL.md "The forced re-read"): counted where a
grid-wide dependence's group cannot stay on chip (BatchNorm backward NHWC at the paper's size), never
for a LayerNorm backward (its rows fit, its dgamma/dbeta columns feed no consumer) nor a bias gradient.
Graphs only: nothing is compiled or timed."""

from __future__ import annotations

import panamera as pn
from panamera.bench.baselines import compulsory_traffic
from panamera.bench.reread import LINE_BYTES, forced_reread, on_chip_bytes
from panamera.bench.train_suite import batch_norm_backward, layer_norm_backward, softmax_backward
from panamera.model import H100
from panamera.model.estimate import limit_us


def test_on_chip_capacity_is_l2_shared_memory_and_registers_of_every_sm():
    assert on_chip_bytes(H100) == 50 * 2**20 + 132 * (227 * 1024 + 65536 * 4)


def test_batch_norm_nhwc_limit_counts_the_re_read_of_dy_and_x():
    outs = batch_norm_backward((256, 56, 56, 256), True)
    rows, C, e = 256 * 56 * 56, 256, 4
    inputs = 2 * rows * C * e  # dy and x, each read before the per-channel sums resolve, then by dx
    group = 2 * rows * (LINE_BYTES // e) * e  # 32 channels share a line: 205 MB, more than fits on chip
    want = int(inputs * (1 - on_chip_bytes(H100) / group))
    assert forced_reread(outs, H100) == want and 0.4 * inputs < want < 0.45 * inputs
    read, written = compulsory_traffic(outs, H100)
    plain = compulsory_traffic(outs)
    assert (read - plain[0], written) == (want, plain[1])
    # the limit moves by the re-read at the limit's own read rate, and stays under every peer (test_train_bench)
    lim, lim0 = limit_us(read + written, H100, written), limit_us(sum(plain), H100, written)
    assert abs((lim - lim0) - want / (H100.limit.eta_read * H100.dram_bw) * 1e6) < 1e-6
    assert 1000 < lim < 1324  # every modeled plan of bench/results (torch 1325.7, Panamera 1324.2 us)


def test_a_batch_norm_whose_channels_fit_on_chip_has_no_forced_re_read():
    assert forced_reread(batch_norm_backward((32, 28, 28, 256), True), H100) == 0
    assert forced_reread(batch_norm_backward((32, 64, 56, 56), False), H100) == 0  # NCHW: a group is one channel


def test_layer_norm_backward_rows_fit_and_its_columns_feed_no_consumer():
    assert forced_reread(layer_norm_backward(4096, 16384, "float32"), H100) == 0
    # 2**20 rows: dgamma's column groups (2**20 x 128 B x 2 = 268 MB) exceed the chip, but only outputs read them
    assert forced_reread(layer_norm_backward(2**20, 1024, "float32"), H100) == 0


def test_a_long_row_that_fits_on_chip_has_no_forced_re_read():
    assert forced_reread(softmax_backward(8, 262144, "bfloat16"), H100) == 0  # QuACK's longest calibration row


def test_a_column_sum_read_again_by_its_consumer_is_counted_and_a_bias_gradient_is_not():
    dy = pn.placeholder((1 << 20, 256), "float32", name="dy")
    assert forced_reread([pn.sum(dy, axis=0)], H100) == 0
    again = forced_reread([dy - pn.sum(dy, axis=0)], H100)
    group = (1 << 20) * LINE_BYTES  # one 128-byte line of 32 columns, over every row
    assert again == int((1 << 20) * 256 * 4 * (1 - on_chip_bytes(H100) / group))
