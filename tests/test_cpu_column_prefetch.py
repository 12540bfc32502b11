"""Two 1-thread read terms of the CPU model refit by issue 24 (helper cpufit2), one test each:
a COLUMN group's read rate per block of accumulators kept in L1, none where its blocks fit the
vector registers (model/cpu.py `column_rate`), and a prefetched first pass's rate by where its data
live (`prefetch_gain`: faster while the L3 serves, slower from DRAM alone). Structure only: no timing; the machines are
explicit (an AVX2 one with 32-byte vectors and an AVX-512 one with 64-byte)."""

from __future__ import annotations

import dataclasses

import pytest

import panamera as pn
from panamera.compiler import lower
from panamera.model.cpu import (
    NOMINAL,
    PREFETCH_DRAM,
    PREFETCH_GAIN,
    REGISTER_VECTORS,
    Caches,
    CpuModel,
    CpuWork,
    column_rate,
    kernel_time,
    prefetch_gain,
)
from panamera.schedule.cpu_cost import work

RATES = dataclasses.replace(NOMINAL, column=0.75)
AVX2 = CpuModel(2, 32, "avx2", Caches(32 << 10, 512 << 10, 32 << 20), dataclasses.replace(RATES, l3_bytes=8 << 20))
AVX512 = CpuModel(2, 64, "avx512", Caches(48 << 10, 2 << 20, 32 << 20), RATES)


def _columns(rows: int, cols: int, sums: int):
    x = pn.placeholder((rows, cols), "float32")
    outs = [pn.sum(x, axis=0), pn.sum(x * x, axis=0), pn.sum(x + 1.0, axis=0)][:sums]
    return lower(outs, stop_after="groups", target="emulator").groups[0]


def test_column_reads_pay_the_probed_ratio_per_block_of_accumulators_in_l1():
    """k blocks in L1 stream at 1 / (1 + k (1 / column - 1)) of a plain sum: the probe's ratio at
    k = 1 (its loop keeps one block), two column sums (A2#9) slower than one (A2#7); a block whose
    accumulators fit REGISTER_VECTORS registers (bias_grad's 64 columns) at the plain rate."""
    one, two = work(_columns(8192, 768, 1), block=768), work(_columns(8192, 768, 2), block=768)
    assert (one.accumulators, two.accumulators, one.block) == (1, 2, 768)
    assert column_rate(one, RATES, 32) == pytest.approx(0.75)
    assert column_rate(two, RATES, 32) == pytest.approx(1 / (1 + 2 * (1 / 0.75 - 1)))
    t1, t2 = (kernel_time(w, AVX2, tasks=1, split=1, threads=1).memory_us for w in (one, two))
    assert t2 / t1 == pytest.approx((1 + 2 / 3) / (1 + 1 / 3), rel=1e-3)
    narrow = work(_columns(65536, 64, 1), block=64)
    assert column_rate(narrow, RATES, 32) == 1.0  # 8 ymm of accumulators: registers
    plain = dataclasses.replace(narrow, column=False)
    assert kernel_time(narrow, AVX2, 1, 1, 1).memory_us == pytest.approx(kernel_time(plain, AVX2, 1, 1, 1).memory_us)


def test_column_blocks_beyond_the_registers_or_unknown_stay_in_l1():
    """Negative cases of the register rule: more accumulator vectors than REGISTER_VECTORS (three
    64-wide sums on AVX2: 24 ymm), a block the caller did not give (0), or 8-byte accumulators
    doubling the vectors all pay the L1 ratio; wider vectors (AVX-512) hold twice the columns."""
    three = work(_columns(65536, 64, 3), block=64)
    assert three.accumulators * 64 * 4 // 32 > REGISTER_VECTORS
    assert column_rate(three, RATES, 32) == pytest.approx(1 / (1 + 3 * (1 / 0.75 - 1)))
    assert column_rate(three, RATES, 64) == 1.0  # 12 zmm
    unknown = work(_columns(65536, 64, 1))
    assert unknown.block == 0 and column_rate(unknown, RATES, 32) == pytest.approx(0.75)
    wide = work(_columns(65536, 128, 1), block=128)
    assert column_rate(wide, RATES, 32) == 1.0  # 16 ymm
    assert column_rate(dataclasses.replace(wide, width=8), RATES, 32) == pytest.approx(0.75)  # 32 ymm of doubles
    assert column_rate(dataclasses.replace(wide, column=False), RATES, 32) == 1.0  # other forms: no ratio


def test_the_decisions_block_reaches_the_model():
    """schedule/cpu_cost.py `time_of` prices a compiled COLUMN kernel with its decision's block:
    bias_grad's shape models the plain read rate, A2#9's two 768-wide sums the L1 ratio twice."""
    from panamera.schedule.cpu_cost import time_of

    for rows, cols, sums, rate in ((65536, 64, 1, 1.0), (8192, 768, 2, 1 / (1 + 2 * (1 / 0.75 - 1)))):
        g = _columns(rows, cols, sums)
        d = pn.compile([pn.sum(pn.placeholder((rows, cols), "float32"), axis=0)], target="cpu").decisions[0]
        d = dataclasses.replace(d, block=cols)
        t = time_of(g, d, AVX2, 1)
        w = work(g, block=cols)
        plain = kernel_time(dataclasses.replace(w, column=False), AVX2, d.tasks, d.split, 1, d.lanes)
        assert t.memory_us == pytest.approx(plain.memory_us / rate, rel=1e-3)


def test_prefetch_gains_while_the_l3_serves_and_loses_from_dram_alone():
    """A prefetched first pass reads PREFETCH_GAIN faster while the L3 serves part of its data (up
    to twice what it holds, as `CpuModel.gbs` shares them), PREFETCH_DRAM (< 1: slower) beyond; on
    both machines."""
    assert PREFETCH_DRAM < 1.0 < PREFETCH_GAIN
    for m in (AVX2, AVX512):
        held = m.l3_held()
        assert [prefetch_gain(m, int(held * f), 1) for f in (0.5, 1.5, 1.99)] == [PREFETCH_GAIN] * 3
        assert prefetch_gain(m, int(held * 2), 1) == prefetch_gain(m, int(held * 9), 1) == PREFETCH_DRAM
    n = 64 << 20
    w = CpuWork(M=1, N=n // 4, elements=n // 4, read_bytes=n, write_bytes=4)
    slow, plain = (kernel_time(dataclasses.replace(w, prefetch=p), AVX2, 1, 1, 1).memory_us for p in (True, False))
    assert slow == pytest.approx(plain / PREFETCH_DRAM, rel=1e-3)
    small = dataclasses.replace(w, N=1 << 20, elements=1 << 20, read_bytes=4 << 20)
    fast, plain = (kernel_time(dataclasses.replace(small, prefetch=p), AVX2, 1, 1, 1).memory_us for p in (True, False))
    assert fast == pytest.approx(plain / PREFETCH_GAIN, rel=1e-2)  # its 4 bytes of writes aside
