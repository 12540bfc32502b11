"""A stitched group's passes in the CPU model (schedule/cpu_cost.py `work`, model/cpu.py `streamed`).
Structure only: no figure is asserted (performance is shown by bench/cpu/)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import panamera as pn
from panamera.compiler import lower
from panamera.model.cpu import CpuModel, CpuWork, call_us, kernel_time, limit_us, streamed
from panamera.schedule.cpu_cost import work


def _group(t):
    return lower(t, stop_after="groups", target="cpu").groups[0]


def _softmax(M, N):
    x = pn.placeholder((M, N), "float32")
    e = pn.exp(x - pn.max(x, axis=1, keepdims=True))
    return _group(e / pn.sum(e, axis=1, keepdims=True))


def test_passes_add_up_to_the_whole():
    w = work(_softmax(64, 30522))
    assert len(w.passes) == 3
    assert sum(p.read_bytes for p in w.passes) == w.read_bytes == w.passes[0].read_bytes  # the first pass reads x
    assert sum(p.reread_bytes for p in w.passes) == w.reread_bytes and w.passes[0].reread_bytes == 0
    assert sum(p.write_bytes for p in w.passes) == w.write_bytes == w.passes[2].write_bytes
    assert [p.transcendental for p in w.passes] == [0.0, 1.0, 1.0] and w.transcendental == 2.0  # exp in both (no reuse)
    assert sum(p.cheap for p in w.passes) == pytest.approx(w.cheap)


def test_a_pass_of_one_value_per_row_reads_no_row():
    x = pn.placeholder((16, 4096), "float32")
    lse = pn.log(pn.sum(pn.exp(x - pn.max(x, axis=1, keepdims=True)), axis=1))  # the last pass: one value a row
    w = work(_group(lse + pn.max(x, axis=1)))
    last = w.passes[-1]
    assert last.elements == 16 and last.reread_bytes == 0 and last.read_bytes == 0


def test_long_rows_stream_their_passes_short_rows_overlap():
    m = CpuModel.nominal(cores=1, simd_bytes=64)
    m = replace(
        m, rates=replace(m.rates, read_gbs=((60.0, 60.0), (5.0, 5.0), (5.0, 5.0)))
    )  # pass 0 memory-bound, pass 1 (exp) not
    long_w, short_w = work(_softmax(64, 30522)), work(_softmax(6144, 128))
    assert streamed(long_w, m) and not streamed(short_w, m)
    t = kernel_time(long_w, m, tasks=64, split=1, threads=1)
    whole = kernel_time(replace(long_w, passes=()), m, tasks=64, split=1, threads=1)  # max of the sums
    assert t.total_us > 1.05 * whole.total_us and t.memory_us == pytest.approx(whole.memory_us)
    s = kernel_time(short_w, m, tasks=6144, split=1, threads=1)
    assert s.total_us == pytest.approx(kernel_time(replace(short_w, passes=()), m, 6144, 1, 1).total_us)


def test_rates_fall_smoothly_past_l2_and_the_limit_stays_below():
    m = CpuModel.nominal(cores=1, simd_bytes=64)
    sizes = [k << 19 for k in range(1, 12)]  # 0.5 .. 5.5 MB around a 2 MB L2
    rates = [m.gbs(n, 1) for n in sizes]
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    assert rates[0] == m.rates.bandwidth("L2", 1) and rates[-1] == m.rates.bandwidth("L3", 1)
    for n in sizes:
        w = CpuWork(M=1, N=n // 4, elements=n // 4, read_bytes=n, write_bytes=4)
        assert limit_us(n + 4, m, 1) <= call_us(1) + kernel_time(w, m, tasks=1, split=1, threads=1).total_us


def test_a_column_reduction_hides_its_accumulate_under_the_stream():
    """COLUMN work (each element accumulated into an L1 block) takes the longer of its memory and
    compute terms, as a row reduction does (warm, the generated column loop streams at a plain sum's
    rate: model/cpu.py, the note after L3_MAX)."""
    x = pn.placeholder((8192, 768), "float32")
    col = work(_group(pn.sum(x, axis=0)))
    m = CpuModel.nominal(cores=1, simd_bytes=64)
    t = kernel_time(col, m, tasks=1, split=1, threads=1)
    assert t.total_us == pytest.approx(t.fork_us + max(t.memory_us, t.compute_us))
