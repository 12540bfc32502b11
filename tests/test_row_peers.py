"""QuACK and Liger-Kernel as peers (bench/row_peers.py) and torch.compile's looped rows re-read from
DRAM beyond L2 (bench/peer_plan.py `reread`), each on hand-computed cases from their sources' rules."""

from __future__ import annotations

import pytest

from panamera.bench.peers import Work, inductor, reread
from panamera.bench.row_peers import liger, liger_settings, quack, quack_config
from panamera.model import H100


def work(pattern: str, M: int, N: int, e: int = 2) -> Work:
    return Work(pattern, (), (), M, N, e, 4 if pattern == "cross_entropy" else e, 0)


def test_quack_threads_per_row_block_and_cluster():
    assert quack_config(256, 2) == {"threads_per_row": 32, "threads": 128, "rows_per_block": 4, "cluster_n": 1,
                                    "vec": 8, "per_thread": 8}  # fmt: skip
    big = quack_config(65536, 2)  # 128 KB rows: a cluster of 4 blocks of 256 threads per row
    assert (big["threads_per_row"], big["threads"], big["cluster_n"], big["per_thread"]) == (256, 256, 4, 64)
    assert quack_config(262144, 2)["cluster_n"] == 16 and quack_config(16384, 2)["cluster_n"] == 1


def test_quack_reads_the_row_once_and_writes_once():
    p = quack(work("softmax", 32768, 4096), H100)
    (ln,) = p.launches
    assert ln.features["dram_bytes"] == 2 * 32768 * 4096 * 2 and ln.features["l2_bytes"] == 0
    assert p.blocks == 32768 // 2  # 64 threads per row, 2 rows per block of 128
    assert quack(work("layer_norm", 64, 256), H100) is None  # no such QuACK kernel in the sources read


def test_liger_settings_and_its_block_rms_norm():
    assert [liger_settings(n) for n in (1024, 2048, 8192, 32768)] == [(1024, 4), (2048, 8), (8192, 16), (32768, 32)]
    assert liger_settings(131072) is None  # beyond 65536: no Liger kernel
    assert liger(work("rms_norm", 8192, 131072), H100) is None
    short = liger(work("rms_norm", 32768, 256), H100)  # BLOCK_SIZE <= 256 and >= 32K rows: 16 rows a program
    assert short.facts["rows_per_program"] == 16 and short.blocks == 2048
    assert liger(work("rms_norm", 4096, 256), H100).blocks == 4096  # one program per row


def test_inductor_looped_rows_are_re_read_from_dram_past_l2():
    # the rows in flight (resident blocks x row bytes) beyond half of L2 come back from DRAM
    fits = reread(32768, 4096 * 2, 256, 2, H100)  # 1056 resident rows x 8 KB = 8.3 MB
    assert fits == {"l2": 32768 * 4096 * 2, "read": 0}
    spills = reread(32768, 65536 * 2, 256, 2, H100)  # 1056 x 128 KB = 132 MB: a fifth hits
    assert spills["read"] == pytest.approx(32768 * 65536 * 2 * (1 - 25 * 2**20 / (1056 * 131072)))
    p = inductor(work("softmax", 32768, 65536), H100)
    assert "re-read from 38% L2" in p.description  # 528 resident blocks of 16 warps x 128 KB: 69 MB


def test_peers_count_residency_with_their_own_registers():
    """Peers' blocks per SM follow Panamera's rule (`GPUSpec.resident_blocks`, registers included) with the
    registers their compilers' output shows: eager LayerNorm fp32 39 (12 blocks of 128 per SM, not 16), so fewer
    rows are in flight and more of its second pass hits L2; bf16 32 (16, as before); eager RMSNorm, its own
    instantiation, bf16 27 (16: threads bind). Inductor's looped row kernels
    (24-32: 32) and CUB's DeviceReduce (32) stay bound by threads."""
    from panamera.bench.peers import CUB_REGISTERS, EAGER_LN_REGISTERS, cub_device_reduce, pytorch_eager

    ln_fp32, rms_bf16 = EAGER_LN_REGISTERS[("layer_norm", 4)], EAGER_LN_REGISTERS[("rms_norm", 2)]
    assert (H100.resident_blocks(128, registers=ln_fp32), H100.resident_blocks(128)) == (12, 16)
    assert H100.resident_blocks(128, registers=rms_bf16) == 16  # 27 registers: bound by threads, as before
    (rms,) = pytorch_eager(work("rms_norm", 4096, 8192, 2), H100).launches
    assert rms.features["registers"] == 27
    assert reread(4096, 16384 * 4, 128, 2, H100, registers=39)["read"] < reread(4096, 16384 * 4, 128, 2, H100)["read"]
    (ln,) = pytorch_eager(work("layer_norm", 4096, 16384, 4), H100).launches
    assert ln.features["registers"] == 39
    assert ln.features["l2_bytes"] == reread(4096, 16384 * 4, 128, 2, H100, registers=39)["l2"]
    (ln,) = inductor(work("softmax", 32768, 65536), H100).launches
    assert ln.features["registers"] == 32 and H100.resident_blocks(512, registers=32) == 4
    k1, _ = cub_device_reduce(2**24, 4, 4, H100, 4)[0]
    assert k1.features["registers"] == CUB_REGISTERS[4] == 32
    assert k1.features["blocks"] == min(2**24 // 4096, H100.resident_blocks(256, registers=32) * H100.sms * 5)
