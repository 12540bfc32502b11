"""Occupancy by shared memory (issue 21): the resident blocks per SM are the least of the thread,
block, register and shared-memory rules (`GPUSpec.resident_blocks`, the CUDA occupancy
calculator's rules: a block's shared memory plus the 1 KB the driver reserves, out of 164 KB per
SM on A100 and 228 KB on H100), and every plan passes its block's shared memory to the model as
data from the stage that decided it."""

import dataclasses

import pytest

import panamera as pn
from panamera.bench.peers import plan_peers
from panamera.compiler import lower
from panamera.model import A100, H100, kernel_time
from panamera.model.detect import spec_from_properties
from panamera.model.gpu import V100
from panamera.schedule.cost import stitched_cost
from panamera.schedule.decision import Residence
from panamera.schedule.mapping import map_group
from panamera.schedule.onchip import blocks_per_sm, shared_bytes
from panamera.schedule.tc_tiling import candidates, landed, smem_bytes, tc_cost, tiles
from panamera.schedule.tensor_core import Mma, analyse

TILE = 48 * 1024  # a tensor-core tile's K slabs and accumulators at the 48 KB static limit


@pytest.mark.parametrize("threads", [256, 512])
def test_a_48_kb_block_fits_three_times_on_a100_and_four_times_on_h100(threads):
    # A100: 164 KB // (48 + 1) KB = 3; H100: 228 KB // 49 KB = 4; 512 threads alone would allow 4
    assert A100.resident_blocks(threads, shared_bytes=TILE) == 3
    assert H100.resident_blocks(threads, shared_bytes=TILE) == 4
    assert V100.resident_blocks(threads, shared_bytes=TILE) == 2  # 96 KB, nothing reserved on cc 7.0


def test_the_rules_take_the_least():
    assert H100.resident_blocks(1024, shared_bytes=TILE) == 2  # threads bind
    assert H100.resident_blocks(32, shared_bytes=1024) == 32  # blocks per SM bind (64 x 2 KB would be 114)
    assert H100.resident_blocks(32, shared_bytes=6 * 1024) == 32  # 228 // 7 KB: the 1 KB reserve counts
    assert H100.resident_blocks(32, shared_bytes=7 * 1024) == 28
    assert H100.resident_blocks(128, registers=255) == 2  # 65536 // (255 x 128)
    assert H100.resident_blocks(1024, shared_bytes=227 * 1024) == 1  # the largest block still runs


def test_a_plan_without_shared_memory_is_unchanged():
    kw = dict(dram_bytes=2**28, blocks=8 * A100.sms, threads=256, bytes_in_flight_per_thread=16)
    for gpu in (A100, H100):
        assert gpu.resident_blocks(256) == gpu.resident_blocks(256, 0, 0) == 8
        plain, zero = kernel_time(gpu, **kw), kernel_time(gpu, **kw, shared_bytes=0)
        assert plain == zero and "shared_bytes" not in dict(plain.features)


def test_shared_memory_lowers_the_bytes_in_flight_and_adds_waves():
    # 8 x 108 blocks of 256 threads, 16 bytes in flight each: 8 per SM keep 32 KB in flight, 3 only 12 KB
    kw = dict(dram_bytes=2**28, blocks=8 * A100.sms, threads=256, bytes_in_flight_per_thread=16, atomics=8 * A100.sms)
    plain, tiled = kernel_time(A100, **kw), kernel_time(A100, **kw, shared_bytes=TILE)
    assert tiled.dram_s > plain.dram_s and tiled.atomic_s < plain.atomic_s  # 3 waves: less of the merges exposed
    assert dict(tiled.features)["shared_bytes"] == TILE  # recorded: a replay re-models the same kernel


def test_a_tensor_core_plan_passes_its_tiles_shared_memory():
    x, w = pn.placeholder((256, 512), "float16", name="x"), pn.placeholder((256, 512), "float16", name="w")
    g = lower(x @ w.T, stop_after="mappings", target="emulator").groups[0]
    ops = analyse(g)
    for d in list(candidates(g, ops, H100, None, False))[:6]:
        land = landed(d)
        want = land.bytes if land else smem_bytes(Mma(d.mma), *tiles(d))
        assert dict(tc_cost(g, A100, d).features)["shared_bytes"] == want


def test_detected_gpus_take_the_drivers_shared_memory_per_sm():
    props = {"name": "NVIDIA A100-SXM4-80GB", "major": 8, "minor": 0, "sharedMemPerMultiprocessor": 167936,
             "reservedSharedMemPerBlock": 1024}  # fmt: skip
    g = spec_from_properties(props)
    assert (g.smem_per_sm, g.smem_reserved_per_block) == (A100.smem_per_sm, 1024) == (164 * 1024, 1024)
    assert spec_from_properties({"name": "NVIDIA A100-SXM4-80GB", "major": 8}).smem_per_sm == A100.smem_per_sm
    assert dataclasses.replace(A100, smem_per_sm=100 * 1024).resident_blocks(256, TILE) == 2  # sm_86's 100 KB


def test_pytorch_softmax_stages_rows_in_shared_memory_below_48_kb_only():
    # SoftMax.cu host_softmax: max_elements_per_smem = (sharedMemPerBlock - one float per warp) / sizeof(T), with
    # sharedMemPerBlock 48 KB (not the opt-in): 10240 floats (40 KB) are staged, 16384 (64 KB) take three passes
    def eager(n):
        return plan_peers([pn.nn.softmax(pn.placeholder((64, n), "float32", name="x"))], H100)["pytorch-eager"]

    staged, looped = eager(10240).launches[0], eager(16384).launches[0]
    assert staged.name == "cunn_SoftMaxForwardSmem" and staged.features["shared_bytes"] == 10240 * 4 + 32 * 4
    assert looped.name == "cunn_SoftMaxForward" and "shared_bytes" not in looped.features


def test_rows_kept_in_shared_memory_pass_their_bytes_and_bound_the_blocks():
    k = pn.compile(
        pn.nn.softmax(pn.placeholder((64, 8192), "float32", name="x")), target="emulator", use_database=False
    )
    (g,) = [g for g in k.groups if g.stitched]
    d = dataclasses.replace(map_group(g, A100, split=1).decision, onchip=Residence.SHARED)
    kept = shared_bytes(g, d)
    assert dict(stitched_cost(g, A100, d).features)["shared_bytes"] == kept > 0
    assert blocks_per_sm(A100, g, d) == min(A100.resident_blocks(d.threads, kept), 1024 // d.threads)
    memory = dataclasses.replace(d, onchip=Residence.MEMORY)
    assert "shared_bytes" not in dict(stitched_cost(g, A100, memory).features)  # nothing kept: unchanged
