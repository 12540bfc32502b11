"""The CPU model (model/cpu.py), its probe (runtime/cpu_probe.py), the split and threads it picks
(schedule/cpu_cost.py) and `panamera bench --measure` on the CPU (bench/cpu_measure.py).
Structure and correctness only: no figure is asserted (performance is shown by bench/cpu/)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import panamera as pn
from panamera.bench import cpu_measure
from panamera.bench.cpu_recipes import CpuWorkload, tiny_cpu
from panamera.compiler import lower
from panamera.model.cpu import Caches, CpuModel, CpuWork, Rates, call_us, kernel_time, limit_us
from panamera.runtime import cpu_probe
from panamera.schedule.cpu_cost import best_split, best_threads, time_of, work
from panamera.schedule.cpu_mapper import CpuMachine, map_cpu


def _group(t):
    return lower(t, stop_after="groups", target="emulator").groups[0]


def test_probe_is_cached_and_reused(private_cache, monkeypatch):
    caches = Caches(48 << 10, 1 << 20, 8 << 20)  # small arrays: a quick probe
    r = cpu_probe.rates(2, caches)
    assert r.threads == 2 and len(r.read_gbs) == len(r.write_gbs) == 3
    assert all(a > 0 and b > 0 for a, b in r.read_gbs + r.write_gbs) and r.add_ns > 0 and r.exp_ns > 0
    assert list(private_cache.glob("cpu_probe_*.json"))
    cpu_probe.rates.cache_clear()

    def no_probe(*a):
        raise AssertionError("probed again although cached")

    monkeypatch.setattr(cpu_probe, "measure", no_probe)
    assert cpu_probe.rates(2, caches) == r


def test_caches_from_sys(tmp_path):
    for k, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K")]):
        d = tmp_path / f"index{k}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert Caches.detect(str(tmp_path)) == Caches(32 << 10, 1 << 20, 1 << 20)  # no L3: the L2


def test_model_monotone_in_bytes_and_levels():
    m = CpuModel.nominal(cores=4, simd_bytes=64)
    times, levels = [], []
    for shift in range(10, 31, 2):
        w = CpuWork(M=1024, N=(1 << shift) // 4096, elements=(1 << shift) // 4, read_bytes=1 << shift, write_bytes=4096)
        t = kernel_time(w, m, tasks=1024, split=1)
        times.append(t.total_us)
        levels.append(t.level)
    assert times == sorted(times) and levels[0] == "L2" and levels[-1] == "DRAM"
    assert limit_us(1 << 20, m) <= call_us(1) + kernel_time(CpuWork(1, 1 << 18, 1 << 18, 1 << 20, 4), m, 4, 4).total_us
    # a transcendental per element costs more than a plain sum
    plain = CpuWork(64, 4096, 64 * 4096, 64 * 4096 * 4, 256)
    assert (
        kernel_time(plain, m, 64, 1).compute_us
        < kernel_time(CpuWork(**{**plain.__dict__, "transcendental": 1.0}), m, 64, 1).compute_us
    )


def test_work_counts_bytes_and_operations():
    x = pn.placeholder((8, 4096), "float32")
    w = work(_group(pn.sum(pn.exp(x) / 2.0, axis=1)))
    assert (w.elements, w.read_bytes, w.write_bytes) == (8 * 4096, 8 * 4096 * 4, 8 * 4)
    assert w.transcendental == 1.0 and w.division == 1.0 and w.cheap == 1.0


def test_argmax_lanes_cost_the_value_not_the_key():
    """An argmax scanned in (value, index) lanes (LaneKind.ARG) costs ARG_LANE_OPS an element at
    the value's width; with the last index (a key per element) it keeps the key's 8-byte width."""
    from panamera.schedule.cpu_cost import ARG_LANE_OPS

    x = pn.placeholder((64, 3000), "float32")
    first = work(lower(pn.argmax(x, axis=1), target="cpu", stop_after="groups").groups[0])
    last = work(lower(pn.argmax(x, axis=1, last=True), target="cpu", stop_after="groups").groups[0])
    assert (first.width, first.cheap) == (4, ARG_LANE_OPS)
    assert last.width == 8 and last.cheap > 0


def test_split_chosen_when_outputs_fewer_than_cores():
    four = CpuModel.nominal(cores=4, simd_bytes=64)
    few = _group(pn.sum(pn.placeholder((2, 1 << 20), "float32"), axis=1))
    assert best_split(few, four, lanes=16, block=1) >= 2
    many = _group(pn.sum(pn.placeholder((4096, 512), "float32"), axis=1))
    assert best_split(many, four, lanes=16, block=1) == 1
    assert best_split(few, CpuModel.nominal(cores=1, simd_bytes=64), lanes=16, block=1) == 1
    short = _group(pn.sum(pn.placeholder((1, 512), "float32"), axis=1))  # too short to be worth a merge
    assert best_split(short, four, lanes=16, block=1) == 1


def test_explain_shows_modeled_time_and_limit(private_cache):
    k = pn.compile(pn.sum(pn.placeholder((16, 1000), "float32"), axis=1), target="cpu")
    text = k.explain()
    assert "modeled" in text and "limit" in text and "machine:" in text
    p = k.modeled(1)
    assert p.total_us >= p.limit_us > 0 and len(p.kernels) == 1


def test_measure_structure_and_skips(tmp_path, private_cache):
    huge = CpuWorkload("sum all huge", "tiny", ((1 << 26,),), lambda B, x: B.sum(x), reduced=1 << 26)
    result, text = cpu_measure.run_cpu_measure(
        [*tiny_cpu()[1:], huge], out=str(tmp_path), rounds=2, min_sample_s=1e-4, inductor=False
    )
    recs = result["records"]
    threads = result["meta"]["threads"]
    assert {(r["workload"], r["threads"]) for r in recs} == {(w.name, n) for w in tiny_cpu()[1:] for n in threads}
    for r in recs:
        assert r["correct"] and r["modeled_us"] > 0 and r["limit_us"] > 0
        assert {"panamera", "numpy", "torch eager"} <= set(r["measured"]) and "torch.compile" not in r["measured"]
        assert all(v["p25_us"] <= v["median_us"] <= v["p75_us"] for v in r["measured"].values())
    assert [n for n, _ in result["meta"]["skipped"]] == ["sum all huge"]
    harness = result["meta"]["harness"]
    assert harness["worker_env"]["OMP_WAIT_POLICY"] == "PASSIVE" and "onnxruntime" in harness["implementations"]
    assert all(v["calls"] >= 2 for r in recs for v in r["measured"].values())  # timed in the workers
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["meta"]["load_average_start"] and "load average" in (tmp_path / "results.md").read_text()
    assert "sum all huge" in text and "model" in text
    assert "OpenMP spin count 0" in result["meta"]["model"]  # the workers' (passive) probe, not this process's


def test_measure_check_catches_wrong_results():
    ref = np.ones(4)
    assert cpu_measure.check(np.ones(4, np.float32), ref, 4)[2]
    assert not cpu_measure.check(np.float32([1, 1, 1, 1.01]), ref, 4)[2]
    assert not cpu_measure.check(np.int64([0, 1]), np.int64([0, 2]), 1)[2]


def test_bench_measure_command(monkeypatch, capsys):
    """`panamera bench --measure` without a GPU hands the suite, --repeat and --out to the CPU
    harness (which test_measure_structure_and_skips runs) and prints its summary."""
    from panamera.cli import main

    if not cpu_measure.measure_on_cpu():
        pytest.skip("a GPU is present: --measure times it (tests/test_bench.py)")
    seen = {}

    def fake(ws, out, plot, rounds, **kw):
        seen.update(names=[w.name for w in ws], out=out, rounds=rounds, command=kw["command"])
        return {"meta": {}, "records": []}, "measured (stand-in)\n"

    monkeypatch.setattr(cpu_measure, "run_cpu_measure", fake)
    assert main(["bench", "--suite", "tiny", "--measure", "--out", "/tmp/x", "--repeat", "2"]) == 0
    assert seen["names"] == [w.name for w in tiny_cpu()] and seen["rounds"] == 2 and seen["out"] == "/tmp/x"
    assert seen["command"].startswith("panamera bench") and "measured (stand-in)" in capsys.readouterr().out


def _woken(cores: int, wake_us: float) -> CpuModel:
    """A nominal model whose all-thread parallel region costs `wake_us` (a passive pool's wake-up)."""
    m = CpuModel.nominal(cores=cores, simd_bytes=64)
    return dataclasses.replace(m, rates=dataclasses.replace(m.rates, fork_us=(0.5, wake_us)))


@pytest.mark.parametrize("cores", [2, 4])
def test_threads_chosen_from_the_region_entry(cores):
    """A tiny reduction whose region's entry outweighs the split runs on one thread, a large one
    on every core; the choice is the decision's `threads`, which its modeled time and its kernel
    (a call asking for more threads runs on that many) both honour."""
    tiny = _group(pn.sum(pn.placeholder((1280,), "float32")))
    large = _group(pn.sum(pn.placeholder((1 << 20,), "float32")))
    woken, spinning = _woken(cores, 40.0), _woken(cores, 0.5)
    assert best_threads(tiny, woken, 16, 1) == (1, 1)
    assert best_threads(large, woken, 16, 1)[0] == cores
    assert best_threads(tiny, spinning, 16, 1)[0] == cores  # an entry as cheap on all threads: all of them
    machine = CpuMachine(cores, 64, "x")
    d = map_cpu(tiny, machine, model=woken)
    assert (d.threads, d.split) == (1, 1)
    assert time_of(tiny, d, woken, threads=cores).fork_us == woken.rates.fork(1)
    assert map_cpu(large, machine, model=woken).threads == cores
    assert map_cpu(tiny, machine, 4, model=woken).threads == cores  # a split asked for: every core


def test_one_thread_kernel_caps_a_call_and_stays_exact():
    from panamera.codegen.cpu_kernel import render_cpu

    x = pn.placeholder((1280,), "float32")
    g = _group(pn.sum(x))
    d = map_cpu(g, CpuMachine(2, 64, "x"), model=_woken(2, 40.0))
    assert "if (pn_nt > 1) pn_nt = 1;" in render_cpu("k", g, d).source
    a = np.random.default_rng(0).standard_normal(1280).astype(np.float32)
    k = pn.compile(pn.sum(x), target="cpu")
    want = a.astype(np.float64).sum()
    tol = 4 * np.finfo(np.float32).eps * np.abs(a).astype(np.float64).sum()
    for t in (1, 2, 3):
        assert abs(float(k(a, threads=t)) - want) <= tol


def test_probe_keyed_by_the_openmp_wait_policy(private_cache, monkeypatch):
    """libgomp's spin count (OMP_WAIT_POLICY, GOMP_SPINCOUNT) sets a region's entry: each setting
    is probed and cached apart, and a passive pool's wake-up is its cost, not a sign of load."""
    assert cpu_probe.spin_count({"OMP_WAIT_POLICY": "PASSIVE"}) == 0
    assert cpu_probe.spin_count({"OMP_WAIT_POLICY": "active"}) == cpu_probe.SPIN_ACTIVE
    assert cpu_probe.spin_count({"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "2M"}) == 2_000_000
    assert cpu_probe.spin_count({"GOMP_SPINCOUNT": "infinite"}) == cpu_probe.SPIN_INFINITE
    keys = set()
    for env in ({}, {"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}):
        for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        keys.add(cpu_probe._key(2))
    assert len(keys) == 2  # unset vs passive; passive with or without GOMP_SPINCOUNT=0 is one setting
    probed = iter([dataclasses.replace(CpuModel.nominal(2, 64).rates, source=f"probed {n}") for n in range(2)])
    monkeypatch.setattr(cpu_probe, "measure", lambda *a: next(probed))
    caches = Caches(48 << 10, 1 << 20, 8 << 20)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert cpu_probe.rates(2, caches).source == "probed 0"
    cpu_probe.rates.cache_clear()
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert cpu_probe.rates(2, caches).source == "probed 1"  # another setting: probed, not the first's
    assert len(list(private_cache.glob("cpu_probe_*.json"))) == 2
    assert cpu_probe.slowed((0.5, 1.5 * cpu_probe.CONTENDED_FORK_US), wakes=False)
    assert not cpu_probe.slowed((0.5, 2 * cpu_probe.CONTENDED_FORK_US), wakes=True)  # a wake-up is its cost


def test_probe_keyed_by_what_its_library_is_built_from(monkeypatch):
    """The probe times its own library: a new math prelude (the inline expf it times), probe
    source or compile flag (libmvec's) is probed again, not served the old figures."""
    from panamera.runtime import cpu

    base, built = cpu_probe._key(2, 0), cpu.flags()
    for target, attr, value in (
        (cpu, "SIMD_MATH", cpu.SIMD_MATH + "// another expf\n"),
        (cpu_probe, "SOURCE", cpu_probe.SOURCE + "// another probe\n"),
        (cpu, "flags", lambda: (*built, "-DPN_OTHER")),
    ):
        with monkeypatch.context() as m:
            m.setattr(target, attr, value)
            assert cpu_probe._key(2, 0) != base, attr
    assert cpu_probe._key(2, 0) == base


def test_contended_probe_kept_briefly(private_cache, monkeypatch):
    import os

    from panamera.model.cpu import NOMINAL

    hot = cpu_probe._extrapolated(2, NOMINAL.read_gbs, NOMINAL.write_gbs, (0.1, 0.3, 0.2, 0.05), 1.0, 9000.0)
    assert hot.source.startswith("contended") and hot.read_gbs[0][1] == 2 * hot.read_gbs[0][0]
    calm = Rates(**{**hot.__dict__, "source": "probed"})
    runs = iter([hot, calm])
    monkeypatch.setattr(cpu_probe, "measure", lambda *a: next(runs))
    caches = Caches(48 << 10, 1 << 20, 8 << 20)
    assert cpu_probe.rates(2, caches) is hot
    cpu_probe.rates.cache_clear()
    assert cpu_probe.rates(2, caches) == hot  # reused from disk while fresh
    (path,) = private_cache.glob("cpu_probe_*.json")
    os.utime(path, (0, 0))  # older than CONTENDED_TTL_S: probed again
    cpu_probe.rates.cache_clear()
    assert cpu_probe.rates(2, caches).source == "probed"


@pytest.mark.parametrize("split", [None, 2])
def test_column_blocks_of_whole_rows_and_clipped_last_block(split):
    """A COLUMN task holds whole rows up to COLUMN_BLOCK_BYTES (16 KiB) of accumulators on any ISA
    (AVX-512 and AVX2 machines built explicitly); wider rows make several blocks, the last one
    clipped (float32: 4096 outputs a block, float64: 2048). The kernel on this host (whatever its
    ISA) clips its last block too, and is exact."""
    from conftest import tolerance

    from panamera.schedule.cpu_mapper import COLUMN_BLOCK_BYTES

    for simd_bytes in (64, 32):
        for dtype in ("float32", "float64"):
            g = lower(pn.sum(pn.placeholder((5, 4100), dtype), axis=0), stop_after="groups", target="emulator")
            d = map_cpu(g.groups[0], CpuMachine(cores=2, simd_bytes=simd_bytes, name="x"))
            assert d.form == "COLUMN" and d.block * np.dtype(dtype).itemsize == COLUMN_BLOCK_BYTES
    rng = np.random.default_rng(3)
    for dtype, cols in (("float32", 4100), ("float64", 2100)):
        a = rng.standard_normal((5, cols)).astype(dtype)
        k = pn.compile(pn.sum(pn.placeholder(a.shape, dtype), axis=0), target="cpu", split=split)
        (d,) = k.decisions
        assert d.form == "COLUMN" and d.block * np.dtype(dtype).itemsize == COLUMN_BLOCK_BYTES and d.block < cols
        np.testing.assert_allclose(
            k(a), a.astype(np.float64).sum(0), rtol=tolerance(dtype, 5), atol=tolerance(dtype, 5)
        )
