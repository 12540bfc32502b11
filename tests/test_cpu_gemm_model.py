"""numpy's BLAS in the CPU model (model/cpu_gemm.py) and its probe (runtime/gemm_probe.py).
Structure only: no figure is asserted (performance is shown by bench/cpu/)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import panamera as pn
from panamera.compiler import lower
from panamera.model import cpu_tile
from panamera.model.cpu import Caches, CpuModel
from panamera.model.cpu_gemm import BLAS_SERIAL_MNK, HOST_STEP_US, GemmRates, gemm_time, pack_us
from panamera.runtime import gemm_probe
from panamera.schedule.cpu_blas import blas_call
from panamera.schedule.cpu_cost import time_of
from panamera.schedule.cpu_mapper import CpuMachine, map_cpu


def _linear(M, N, K, dtype="float32"):
    x, w = pn.placeholder((M, K), dtype), pn.placeholder((N, K), dtype)
    return lower(x @ w.T, stop_after="groups", target="emulator").groups[0]


def test_gemm_probe_is_cached_and_reused(private_cache, monkeypatch):
    caches = Caches(48 << 10, 1 << 20, 8 << 20)
    g = gemm_probe.rates(1, caches)
    assert g.gflops[0] > 0 and g.gflops[1] > 0 and g.call_us > 0 and "256^3" in g.source
    assert list(private_cache.glob("gemm_probe_*.json"))
    gemm_probe.rates.cache_clear()
    monkeypatch.setattr(gemm_probe, "measure", lambda *a: pytest.fail("probed again although cached"))
    assert gemm_probe.rates(1, caches) == g


def test_blas_threads_sets_and_restores_the_count():
    from threadpoolctl import threadpool_info

    from panamera.runtime.blas_threads import blas_threads

    def counts():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = counts()
    if not before:
        pytest.skip("no BLAS library loaded")
    with blas_threads(1):
        assert counts() == [1] * len(before)
        a = np.ones((64, 64), np.float32)
        assert float((a @ a)[0, 0]) == 64.0
    assert counts() == before


def test_blas_group_is_modeled_at_the_gemm_rate_not_as_a_kernel(monkeypatch):
    monkeypatch.setattr(cpu_tile, "TILE_SHARE", 1e-6)  # the tile kernel never picked: the BLAS's times
    g = _linear(128, 32, 1024)
    call = blas_call(g)
    assert call is not None and call.flops == 2 * 128 * 32 * 1024
    m = dataclasses.replace(CpuModel.nominal(cores=2, simd_bytes=64), gemm=GemmRates((100.0, 50.0), 1.0))
    d = map_cpu(g, CpuMachine(2, 64, "x"), model=m)
    t = time_of(g, d, m, threads=1)
    packed = (128 + 32) * 1024 * 4
    assert t.compute_us == pytest.approx(call.flops / 100e3)
    assert t.memory_us == pytest.approx(pack_us(packed, m.rates, "L2"))
    assert t.total_us == pytest.approx(HOST_STEP_US + 1.0 + t.memory_us + t.compute_us)
    two = time_of(g, d, m, threads=2)  # M N K over OpenBLAS's threshold: both threads pack and multiply
    assert two.threads == 2 and two.memory_us == pytest.approx(t.memory_us / 2)
    assert two.compute_us == pytest.approx(t.compute_us)  # no all-thread rate probed: one thread's
    slower = dataclasses.replace(m, gemm=GemmRates((50.0, 25.0), 1.0))
    assert time_of(g, d, slower, threads=1).compute_us == pytest.approx(2 * t.compute_us)
    g64 = _linear(128, 32, 1024, "float64")  # dgemm: the float64 rate, twice the bytes packed
    t64 = time_of(g64, map_cpu(g64, CpuMachine(2, 64, "x"), model=m), m, threads=1)
    assert t64.compute_us == pytest.approx(2 * t.compute_us) and t64.memory_us == pytest.approx(2 * t.memory_us)


def test_small_contraction_stays_a_generated_kernel():
    g = _linear(8, 8, 8)  # below BLAS_MIN_FLOPS: the generated kernel and its model
    m = CpuModel.nominal(cores=2, simd_bytes=64)
    assert blas_call(g) is None
    t = time_of(g, map_cpu(g, CpuMachine(2, 64, "x"), model=m), m, threads=1)
    assert t.fork_us < HOST_STEP_US


def test_gemm_time_levels():
    m = CpuModel.nominal(cores=2, simd_bytes=64)
    small, big = gemm_time(1 << 20, 1 << 20, 4, m), gemm_time(1 << 20, 256 << 20, 4, m)
    assert small.level == "L2" and big.level == "DRAM" and big.memory_us > 256 * small.memory_us


def test_blas_threads_as_openblas_uses_them():
    """A product of M N K at most OpenBLAS's threshold runs on one thread whatever the count; a
    larger one on all of them, its packing split and its flops at the probed rate for that many
    threads; the rate of a batch's products is decided by each product's M N K."""
    g = GemmRates((100.0, 50.0), 1.0, threads=2, gflops_all=(160.0, 80.0))
    m = dataclasses.replace(CpuModel.nominal(cores=2, simd_bytes=64), gemm=g)
    flops, packed = 2 * BLAS_SERIAL_MNK, 1 << 16
    at = {n: gemm_time(flops, packed, 4, m, threads=n) for n in (1, 2)}
    assert at[1] == at[2] and at[2].threads == 1  # at the threshold: serial
    big = {n: gemm_time(2 * flops, packed, 4, m, threads=n) for n in (1, 2)}
    assert big[2].threads == 2 and big[2].compute_us == pytest.approx(2 * flops / 160e3)
    assert big[1].compute_us == pytest.approx(2 * flops / 100e3) and big[2].memory_us == pytest.approx(
        big[1].memory_us / 2
    )
    batched = gemm_time(2 * flops, packed, 4, m, threads=2, mnk=BLAS_SERIAL_MNK)  # two products at the threshold
    assert batched.threads == 1 and batched.compute_us == big[1].compute_us


def test_gemm_probe_all_threads_rate_is_bounded_and_stored(monkeypatch):
    """The probe's all-thread rate stays between one thread's and `threads` times it (a contended
    core cannot model a loss, nor a measurement glitch a super-linear gain), and survives the disk
    format."""
    rates = iter([(1.0, [100.0, 50.0]), (1.0, [90.0, 400.0])])
    monkeypatch.setattr(gemm_probe, "_measure", lambda *a: next(rates))
    monkeypatch.setattr(gemm_probe, "_wake_us", lambda call, threads: 30.0)
    g = gemm_probe.measure(CpuModel.nominal(2, 64).rates, Caches(48 << 10, 1 << 20, 8 << 20), threads=2)
    assert g.threads == 2 and g.gflops == (100.0, 50.0) and g.gflops_all == (100.0, 100.0) and g.wake_us == 30.0
    assert "1 and 2 threads" in g.source
    assert gemm_probe._from_json(gemm_probe._to_json(g)) == g
    one = GemmRates((100.0, 50.0), 1.0)
    assert gemm_probe._from_json(gemm_probe._to_json(one)) == one


def test_blas_pool_cost_is_charged_per_call_on_more_than_one_thread(monkeypatch):
    """The probed `wake_us` is a call's cost of running on the BLAS's pool: charged once per call on
    more than one thread (in place of the OpenMP region entry that stands in where it was not
    probed), never on one; the probe takes it out of the all-thread rate's fit, and measures it as
    a small threaded product's median on every thread less a share of its one-thread median."""
    g = GemmRates((100.0, 50.0), 1.0, threads=2, gflops_all=(160.0, 80.0))
    m = dataclasses.replace(CpuModel.nominal(cores=2, simd_bytes=64), gemm=g)
    woken = dataclasses.replace(m, gemm=dataclasses.replace(g, wake_us=m.rates.fork(2) + 40.0))
    flops = 4 * BLAS_SERIAL_MNK
    one, two = gemm_time(flops, 1 << 16, 4, woken, 1), gemm_time(flops, 1 << 16, 4, woken, 2)
    assert one == gemm_time(flops, 1 << 16, 4, m, 1)  # one thread: no pool
    assert two.fork_us == pytest.approx(gemm_time(flops, 1 << 16, 4, m, 2).fork_us + 40.0)
    seen = []
    monkeypatch.setattr(gemm_probe.cpu_probe, "_median_call_us", lambda f: seen.append(f) or (10.0 + 5 * len(seen)))
    assert gemm_probe._wake_us(1.0, 2) == pytest.approx(20.0 - 1.0 - (15.0 - 1.0) / 2)  # medians 15 (1), 20 (2)
    calls = iter([(1.0, [100.0, 50.0]), (1.0, [150.0, 75.0])])
    fits = []
    monkeypatch.setattr(gemm_probe, "_measure", lambda *a: fits.append(a) or next(calls))
    monkeypatch.setattr(gemm_probe, "_wake_us", lambda call, threads: 25.0)
    gemm_probe.measure(CpuModel.nominal(2, 64).rates, Caches(48 << 10, 1 << 20, 8 << 20), threads=2)
    assert fits[1][-1] == 25.0 and len(fits[0]) == 3  # the all-thread fit takes the pool's cost out
