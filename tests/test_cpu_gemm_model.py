"""numpy's BLAS in the CPU model (model/cpu_gemm.py) and its probe (runtime/gemm_probe.py).
Structure only: no figure is asserted (performance is shown by bench/cpu/)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import panamera as pn
from panamera.compiler import lower
from panamera.model.cpu import Caches, CpuModel
from panamera.model.cpu_gemm import HOST_STEP_US, GemmRates, gemm_time, pack_us
from panamera.runtime import cpu_probe, gemm_probe
from panamera.schedule.cpu_blas import blas_call
from panamera.schedule.cpu_cost import time_of
from panamera.schedule.cpu_mapper import CpuMachine, map_cpu


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PANAMERA_CACHE", str(tmp_path / "cache"))
    cpu_probe.rates.cache_clear()
    gemm_probe.rates.cache_clear()
    yield tmp_path / "cache"
    cpu_probe.rates.cache_clear()
    gemm_probe.rates.cache_clear()


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


def test_blas_group_is_modeled_at_the_gemm_rate_not_as_a_kernel():
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
    assert time_of(g, d, m, threads=2) == t  # numpy's BLAS ignores the kernels' threads
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
