"""Occupancy by registers (issue 21): a kernel's launch bounds cap the registers ptxas may give a
thread (`launch_bound_registers`: __launch_bounds__(T, B) leaves 65536 / (T x B), in units of 8),
the registers bound the blocks an SM holds (`GPUSpec.resident_blocks`, allocated per warp in units
of 256), `kernel_time` applies them where the plan knows them, and the co-residency of a
cooperative launch (`co_resident`) counts both the launch bounds and the block's shared memory."""

import dataclasses

import pytest

import panamera as pn
from panamera.bench.peers import Work
from panamera.bench.row_peers import LIGER_REGISTERS, liger
from panamera.model import H100, kernel_time
from panamera.model.gpu import launch_bound_registers
from panamera.schedule.cost import stitched_cost
from panamera.schedule.decision import Residence
from panamera.schedule.derived import co_resident, resident_per_sm
from panamera.schedule.mapping import map_group
from panamera.schedule.onchip import blocks_per_sm
from panamera.schedule.persistent import block_counts, row_grids
from panamera.schedule.rtile import register_budget


def test_launch_bounds_cap_the_registers():
    """ptxas -v here: Triton's .maxntid 1024 (32 warps) gives Liger's 65536 kernels 64 registers;
    Panamera's __launch_bounds__(256, 4) keeps its kernels at 64 or fewer (14-64 measured)."""
    assert launch_bound_registers(1024) == 64
    assert launch_bound_registers(256, 4) == launch_bound_registers(512, 2) == 64
    assert launch_bound_registers(384, 2) == 80  # 85 rounded down to the allocation unit
    assert launch_bound_registers(128) == 255  # one block of 128 threads: the per-thread maximum binds
    assert all(r <= 64 for (_, block, _), r in LIGER_REGISTERS.items() if block >= 32768)


def test_registers_are_allocated_per_warp_in_units_of_256():
    assert H100.resident_blocks(256, registers=32) == 8
    assert H100.resident_blocks(256, registers=33) == 6  # 40 per thread: 51 warps, 6 blocks of 8
    assert H100.resident_blocks(256, registers=64) == 4 == 1024 // 256
    assert H100.resident_blocks(512, registers=124) == 1  # Liger's RMSNorm at 16384, 16 warps


def test_kernel_time_applies_the_registers():
    """Blocks of 256 threads with 16 bytes each in flight: 8 per SM keep 32 KB in flight, 4 (64
    registers) 16 KB, below the 24 KB that saturate the stream: slower; no registers: unchanged."""
    kw = dict(dram_bytes=2**28, blocks=16 * H100.sms, threads=256, bytes_in_flight_per_thread=16)
    plain, capped = kernel_time(H100, **kw), kernel_time(H100, **kw, registers=64)
    assert capped.dram_s > plain.dram_s
    assert kernel_time(H100, **kw, registers=32) == plain  # 32 registers: the thread rule binds anyway
    assert "registers" not in dict(plain.features) and dict(capped.features)["registers"] == 64


@pytest.mark.parametrize("pattern", ["softmax", "rms_norm"])
def test_liger_kernels_carry_their_registers(pattern):
    """16 warps at 16384 elements: 80 (softmax) and 124 (RMSNorm) registers, one block per SM."""
    ln = liger(Work(pattern, (), (), 32768, 16384, 2, 2, 0), H100).launches[0]
    regs = ln.features["registers"]
    assert regs == LIGER_REGISTERS[(pattern, 16384, 2)]
    assert H100.resident_blocks(ln.features["threads"], registers=regs) == 1


@pytest.mark.parametrize("threads", [32, 64, 128, 256, 512, 1024])
def test_co_resident_is_the_launch_bounds_rule(threads):
    """Without shared memory, what __launch_bounds__(T, 1024 / T) guarantees: 1024 threads per SM."""
    assert co_resident(H100, threads) == H100.sms * min(H100.max_blocks_sm, max(1, 1024 // threads))


def test_co_resident_counts_shared_memory():
    """Four blocks of 256 threads fit by registers; with 60 KB each (+1 KB reserved) only three of
    228 KB; on an SM of 64 KB one."""
    assert co_resident(H100, 256, shared_bytes=60 * 1024) == 3 * H100.sms
    small = dataclasses.replace(H100, smem_per_sm=64 * 1024)
    assert co_resident(small, 256, shared_bytes=40 * 1024) == small.sms
    assert co_resident(H100, 256, shared_bytes=1024) == co_resident(H100, 256)


def test_panamera_plans_are_modeled_at_their_launch_bounds():
    """Every candidate's cost carries the registers its __launch_bounds__ leave, so kernel_time's
    resident blocks are the ones onchip.blocks_per_sm and co_resident count (one rule); a row kept
    in registers asks for more registers and gets fewer blocks."""
    k = pn.compile(
        pn.nn.softmax(pn.placeholder((64, 8192), "float32", name="x")), target="emulator", use_database=False
    )
    (g,) = [g for g in k.groups if g.stitched]
    d = map_group(g, H100, split=1).decision
    for res in (Residence.MEMORY, Residence.SHARED, Residence.REGISTERS):
        dd = dataclasses.replace(d, onchip=res)
        f = dict(stitched_cost(g, H100, dd).features)
        assert f["registers"] == register_budget(dd) == launch_bound_registers(dd.threads, dd.min_blocks)
        assert H100.resident_blocks(dd.threads, f.get("shared_bytes", 0), f["registers"]) == blocks_per_sm(H100, g, dd)
    assert blocks_per_sm(H100, g, dataclasses.replace(d, onchip=Residence.REGISTERS)) <= 1024 // d.threads


def test_one_residency_for_pipelines_and_persistent_grids():
    """`derived.resident_per_sm` is the schedule stage's one residency (launch bounds' registers,
    shared memory): a persistent grid's bounds ask for its ceil(B / SMs) blocks per SM, so that
    many are co-resident whatever the default 1024 / T says; one block of 1024 threads per SM
    under the default bounds (64 registers) is what `row_grids` and the cost count."""
    assert resident_per_sm(H100, 256) == 4 == co_resident(H100, 256) // H100.sms
    assert resident_per_sm(H100, 256, min_blocks=8) == 8  # 32 registers: the thread rule
    assert co_resident(H100, 256, min_blocks=5) == 5 * H100.sms  # 48 registers: 5 blocks of 8 warps
    assert resident_per_sm(H100, 1024) == 1 < H100.resident_blocks(1024)
    assert row_grids(4096, H100, 1024, 16384 * 8) == []  # 132 rows of 128 KiB in flight fit half the L2
    assert row_grids(4096, H100, 512, 16384 * 8) == [H100.sms]  # 264 do not: one block per SM loops
    assert block_counts(4096, H100, 256)[-1] == 8 * H100.sms  # a persistent grid may ask for 8 per SM
