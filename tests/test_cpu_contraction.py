"""target="cpu": a contraction's kernel (the BLAS or the register tile, with its tile) decided once by the
CPU mapper and carried on its decision (schedule/cpu_contraction.py `GemmPlan`); the cost and the
renderer read it. Results against float64 numpy with tolerances from K and the operands' magnitudes."""

import dataclasses

import numpy as np
import pytest
from conftest import random_array, tolerance

import panamera as pn
import panamera.model.cpu_tile as model_tile
import panamera.schedule.cpu_contraction as cpu_contraction
from panamera.codegen.cpu_host_kernels import host_blas
from panamera.codegen.cpu_tile import TileShape
from panamera.compiler import lower
from panamera.model.cpu import CpuModel
from panamera.model.cpu_gemm import GemmRates
from panamera.model.cpu_tile import GemmKernel
from panamera.schedule.cpu_cost import time_of
from panamera.schedule.cpu_mapper import CpuMachine, map_cpu


def _linear_group(m: int, n: int, k: int):
    """The one group of `x @ w.T` (torch's Linear: w stored N x K), as the bench's table1 builds it."""
    x, w = pn.placeholder((m, k), "float32", name="x"), pn.placeholder((n, k), "float32", name="w")
    return lower(x @ w.T, stop_after="groups", target="emulator").groups[0]


def _model(cores: int) -> CpuModel:
    """A nominal AVX-512 machine with this project's BLAS probe, contended (the all-thread rate no
    better than one thread's: bench/cpu's 2026-11-25 probe)."""
    m = CpuModel.nominal(cores=cores, simd_bytes=64)
    return dataclasses.replace(m, gemm=GemmRates((165.0, 72.0), 0.9, threads=cores, gflops_all=(165.0, 72.0)))


@pytest.mark.parametrize("cores", [1, 2])
def test_decision_routes_table1_to_the_tile_and_1024_cubed_to_the_blas(cores):
    """table1 128x32x1024 (`x @ w.T`) is TILE with its 8x32 tile in the mapper's decision, on 1 and 2
    cores (2, contended probe: the BLAS's pool wake-up is priced as the tile's region entry is; it went
    to the BLAS without); 1024^3 is BLAS; the cost reads the plan."""
    m, machine = _model(cores), CpuMachine(cores, 64, "x")
    d = map_cpu(_linear_group(128, 32, 1024), machine, model=m)
    assert d.gemm is not None and d.gemm.kernel is GemmKernel.TILE
    assert d.gemm.tile == TileShape(8, 2, 16) and d.describe().startswith("TILE 8x32")
    a, b = pn.placeholder((1024, 1024), "float32"), pn.placeholder((1024, 1024), "float32")
    big = lower(a @ b, stop_after="groups", target="emulator").groups[0]
    db = map_cpu(big, machine, model=m)
    assert db.gemm is not None and db.gemm.kernel is GemmKernel.BLAS and db.gemm.tile is None
    assert time_of(big, db, m).total_us == pytest.approx(db.gemm.time(m).total_us)


def test_small_contraction_has_no_gemm_plan():
    """Below the BLAS rule's flops the contraction is a generated kernel: no plan, its form's decision."""
    d = map_cpu(_linear_group(8, 8, 8), CpuMachine(2, 64, "x"), model=_model(2))
    assert d.gemm is None and not d.describe().startswith(("TILE", "BLAS"))


def test_renderer_and_cost_read_the_decision(monkeypatch):
    """host_blas prints the decision's tile, and time_of prices it on 1 and 2 threads, with every
    chooser disabled: neither decides again."""
    g = _linear_group(64, 32, 512)
    plan = cpu_contraction.plan_gemm(g, _model(2), 2)
    tile = TileShape(4, 2, 16, ksplit=2)  # not what the model would pick
    d = map_cpu(g, CpuMachine(2, 64, "x"), model=_model(2))
    d = dataclasses.replace(d, gemm=dataclasses.replace(plan, kernel=GemmKernel.TILE, tile=tile))

    def refuse(*args, **kwargs):
        raise AssertionError("a contraction's kernel chosen again")

    for mod, name in ((model_tile, "gemm_choice"), (model_tile, "gemm_tile"), (cpu_contraction, "gemm_tile")):
        monkeypatch.setattr(mod, name, refuse)
    k = host_blas("k0", g, d, in_c=True)
    assert "pn_tile_gemm<float, 4, 2, 16>(" in k.source and k.source.rstrip().endswith("pn_nt, 2);\n}")
    assert k.tile == tile and not k.calls_blas
    for t in (1, 2):
        assert time_of(g, d, _model(2), threads=t).total_us > 0


@pytest.mark.parametrize("route", ["tile", "blas"])
def test_table1_matches_numpy_on_either_route(monkeypatch, route):
    """table1 128x32x1024 through the tile (whole transposed panels: register transposes, 8 K blocks) and
    the BLAS: float64 numpy within a K-derived tolerance; the tile's bits equal on 1 and 2 threads;
    only the BLAS route holds the BLAS's thread count around a call."""
    forced = TileShape(8, 2, 16) if route == "tile" else None
    monkeypatch.setattr(cpu_contraction, "gemm_tile", lambda gm, i, m, t=1: forced)
    x, w = pn.placeholder((128, 1024), "float32"), pn.placeholder((32, 1024), "float32")
    f = pn.compile(x @ w.T, target="cpu", cache=False)
    assert f.decisions[0].gemm.kernel is (GemmKernel.TILE if forced else GemmKernel.BLAS)
    assert f.executor.blas is (forced is None)
    a = random_array((128, 1024), "float32", np.random.default_rng(11))
    b = random_array((32, 1024), "float32", np.random.default_rng(12))
    ref = a.astype(np.float64) @ b.T.astype(np.float64)
    t = tolerance("float32", 1024)
    one, two = f(a, b, threads=1), f(a, b, threads=2)
    for got in (one, two):
        np.testing.assert_allclose(got, ref, rtol=t, atol=t * np.abs(a).max() * np.abs(b).max() * np.sqrt(1024))
    if forced is not None:
        assert np.array_equal(one, two)


def test_tile_runs_on_fewer_threads_where_the_region_entry_outweighs_them():
    """A passive pool whose wake-up costs more than the second thread saves: the plan's tile runs on one
    thread (its decision's `threads`, capped in the kernel's C); with a cheap entry, on both."""
    g = _linear_group(128, 32, 1024)
    m = _model(2)
    woken = dataclasses.replace(m, rates=dataclasses.replace(m.rates, fork_us=(0.2, 400.0)))
    cheap = dataclasses.replace(m, rates=dataclasses.replace(m.rates, fork_us=(0.2, 0.3)))
    d1, d2 = (map_cpu(g, CpuMachine(2, 64, "x"), model=x) for x in (woken, cheap))
    assert d1.gemm.kernel is d2.gemm.kernel is GemmKernel.TILE
    assert (d1.threads, d1.gemm.threads, d2.threads) == (1, 1, 2)
    assert "if (pn_nt > 1) pn_nt = 1;" in host_blas("k0", g, d1, in_c=True).source
    assert time_of(g, d1, woken, threads=2).threads == 1


def test_a_call_on_fewer_threads_runs_the_plan_decided_for_them(monkeypatch):
    """The plan is decided once for each thread count a call may run on (halving): where the BLAS wins
    on 2 threads (a pool that scales, free to wake) and the tile on 1 (the BLAS's one-thread rate), the
    decision carries both (`GemmPlan.fewer`), the kernel's C branches on the call's threads, the cost
    prices each count with its own plan, and both branches match numpy."""
    machine = CpuMachine.detect()
    machine = CpuMachine(2, machine.simd_bytes, machine.name)
    m = CpuModel.nominal(cores=2, simd_bytes=machine.simd_bytes)
    m = dataclasses.replace(
        m,
        rates=dataclasses.replace(m.rates, fork_us=(0.2, 400.0)),
        gemm=GemmRates((165.0, 72.0), 0.9, threads=2, gflops_all=(4000.0, 2000.0), wake_us=0.0),
    )
    g = _linear_group(128, 32, 1024)
    d = map_cpu(g, machine, model=m)
    assert d.gemm.kernel is GemmKernel.BLAS and d.gemm.decided == 2
    (one,) = d.gemm.fewer
    assert one.kernel is GemmKernel.TILE and one.decided == 1 and d.gemm.at(1) is one and d.gemm.at(2) is d.gemm
    assert "on 1 thread(s): TILE" in d.describe()
    k = host_blas("k0", g, d, in_c=True)
    assert "if (pn_nt <= 1) {" in k.source and "pn_tile_gemm<" in k.source and "pn_gemm<float>(" in k.source
    assert k.calls_blas and k.tile == one.tile
    assert time_of(g, d, m, threads=1).total_us == pytest.approx(one.time(m, 1).total_us)
    assert time_of(g, d, m, threads=2).total_us == pytest.approx(d.gemm.time(m, 2).total_us)
    assert time_of(g, d, m, threads=1).total_us != pytest.approx(time_of(g, d, m, threads=2).total_us)
    import panamera.cpu_target as cpu_target

    monkeypatch.setattr(cpu_target.CpuMachine, "detect", staticmethod(lambda: machine))
    monkeypatch.setattr(cpu_target, "cpu_model", lambda _machine: m)
    x, w = pn.placeholder((128, 1024), "float32"), pn.placeholder((32, 1024), "float32")
    f = pn.compile(x @ w.T, target="cpu", cache=False)
    assert f.decisions[0].gemm.fewer and f.executor.blas
    a = random_array((128, 1024), "float32", np.random.default_rng(13))
    b = random_array((32, 1024), "float32", np.random.default_rng(14))
    ref = a.astype(np.float64) @ b.T.astype(np.float64)
    t = tolerance("float32", 1024)
    for threads in (1, 2):
        got = f(a, b, threads=threads)
        np.testing.assert_allclose(got, ref, rtol=t, atol=t * np.abs(a).max() * np.abs(b).max() * np.sqrt(1024))


def test_compile_plans_each_group_once_and_renders_that_plan(monkeypatch):
    """compile_cpu decides each kernel's gemm plan once (the grouping's plan carried into the mapper,
    `cpu_plans`), and renders what was decided: a contraction with a fused consumer and a plain one."""
    planned = []
    plan_gemm = cpu_contraction.plan_gemm

    def counting(g, m, threads, deterministic=False):
        planned.append(g)  # kept alive: identities stay distinct
        return plan_gemm(g, m, threads, deterministic)

    monkeypatch.setattr(cpu_contraction, "plan_gemm", counting)
    x, w, b = pn.placeholder((128, 1024), "float32"), pn.placeholder((32, 1024), "float32"), pn.placeholder((32,))
    f = pn.compile(pn.maximum(x @ w.T + b, 0.0), target="cpu", cache=False)
    assert planned and len({id(g) for g in planned}) == len(planned)
    assert any(d.gemm is not None for d in f.decisions)


def test_the_tile_is_weighed_on_the_threads_it_would_run_on():
    """A 2-thread call where a parallel region's entry costs more than the second thread saves: the
    tile is compared with the BLAS as it would run (one thread, `tile_threads`), not as a 2-thread
    region, and taken where that beats the BLAS with its pool's cost."""
    from panamera.model.cpu_tile import gemm_choice, tile_plan

    m = _model(2)
    m = dataclasses.replace(
        m,
        rates=dataclasses.replace(m.rates, fork_us=(0.2, 400.0)),
        gemm=dataclasses.replace(m.gemm, wake_us=60.0),
    )
    g = _linear_group(128, 32, 1024)
    gm = cpu_contraction.blas_call(g).gemm
    one = tile_plan(gm, 4, m, 1)[1].total_us
    kernel, t = gemm_choice(gm, 4, m, 2)
    assert kernel is GemmKernel.TILE and t.total_us == pytest.approx(one) and t.threads == 1
    d = map_cpu(g, CpuMachine(2, 64, "x"), model=m)
    assert d.gemm.kernel is GemmKernel.TILE and d.threads == 1 and not d.gemm.fewer


def test_a_kernel_calls_the_blas_only_where_its_source_runs_a_blas_plan():
    """A plan whose call on fewer threads is the BLAS (`GemmPlan.fewer`): with a BLAS callable from C
    the kernel branches to it (`calls_blas`: the BLAS's thread count held around a call); without one
    its source runs the tile alone, and it does not call the BLAS (it held that count for nothing)."""
    g = _linear_group(128, 32, 1024)
    d = map_cpu(g, CpuMachine(2, 64, "x"), model=_model(2))
    tile = dataclasses.replace(d.gemm, kernel=GemmKernel.TILE, threads=2, decided=2, fewer=())
    blas = dataclasses.replace(d.gemm, kernel=GemmKernel.BLAS, tile=None, threads=1, decided=1, fewer=())
    d = dataclasses.replace(d, gemm=dataclasses.replace(tile, fewer=(blas,)))
    in_c, alone = host_blas("k0", g, d, in_c=True), host_blas("k0", g, d, in_c=False)
    assert "pn_gemm<float>(" in in_c.source and in_c.calls_blas
    assert "pn_gemm<" not in alone.source and "pn_tile_gemm<" in alone.source and not alone.calls_blas


def test_the_choice_over_the_blas_prices_the_count_the_plan_runs_on(monkeypatch):
    """`gemm_choice` prices the tile on `tile_threads`' count, the one its plan runs on: one thread under
    2 % faster than two is not that count, so it does not win the tile the choice over the BLAS either
    (a strict minimum over the counts did, and the plan then ran two threads, slower than the BLAS)."""
    from panamera.model.cpu import KernelTime
    from panamera.model.cpu_tile import gemm_choice, tile_threads

    us = {2: 100.0, 1: 99.0}
    monkeypatch.setattr(
        model_tile, "tile_plan", lambda gm, i, m, t: (TileShape(8, 2, 16), KernelTime(us[t], 0, us[t], 0, 0, "L2", t))
    )
    monkeypatch.setattr(model_tile, "gemm_time", lambda *a: KernelTime(99.5, 0, 99.5, 0, 0, "L2", 2))
    gm = cpu_contraction.blas_call(_linear_group(128, 32, 1024)).gemm
    assert tile_threads(gm, 4, _model(2), 2) == 2
    assert gemm_choice(gm, 4, _model(2), 2)[0] is GemmKernel.BLAS
