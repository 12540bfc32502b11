"""The performance model on hand-computed examples, the baselines' plans, and `panamera bench`."""

from __future__ import annotations

import json

import pytest

import panamera as pn
from panamera.bench.baselines import DETERMINISTIC, PLANS, SINGLE, UNFUSED, eager_ops, plan_all
from panamera.bench.contraction_peers import CONTRACTION_PEERS
from panamera.bench.decode_peers import DECODE_PEERS
from panamera.bench.runner import geomean, run_bench
from panamera.bench.suites import SUITES, tiny
from panamera.cli import main
from panamera.model import A100, GPUS, H100, V100, estimate, limit_us


def test_row_sum_4096_squared_on_h100_is_bandwidth_bound():
    # 4096 x 4096 float32 = 64 MiB read once; at 0.95 x 3.35 TB/s (written rows at 0.86) that is
    # 21.1 us after the first round trip (1.0 us at the load of a saturating stream), plus the
    # 4.5 us floor; the limit: the smallest measured kernel (4.85 us) and the best measured streams.
    x = pn.placeholder((4096, 4096), "float32", name="x")
    e = estimate(pn.compile(pn.sum(x, axis=1), target="emulator", use_database=False).plan, H100)
    read, written = 4096 * 4096 * 4, 4096 * 4
    stream = (read / 0.95 + written / 0.86) / 3.35e12
    assert e.dram_us == pytest.approx((H100.loaded_latency_s + stream) * 1e6, rel=1e-3)
    assert e.launches == 1 and e.launch_us == pytest.approx(4.5)
    lim = H100.limit
    assert e.limit_us == pytest.approx((lim.floor_s + (read / lim.eta_read + written / lim.eta_write) / 3.35e12) * 1e6)
    assert 1.0 <= e.ratio_to_limit < 1.1


def test_few_rows_with_one_block_each_cannot_fill_dram():
    # GPU_MODEL.md: 8 rows, one block of 256 threads each, four 16-byte loads in flight per
    # thread (the unrolled loop): F = 128 KiB in flight. Little's law with the latency rising
    # linearly from 0.35 us (unloaded) to 1.0 us (at 3.18 TB/s): BW * (L0 + k BW) = F, k =
    # (L1 - L0) / 3.18 TB/s, gives about 0.32 TB/s, a tenth of what the GPU streams.
    x = pn.placeholder((8, 2**20), "float32", name="x")
    y = pn.sum(x, axis=1)
    single = estimate(pn.compile(y, target="emulator", split=1).plan, H100)
    bmax, l0 = 0.95 * 3.35e12, 350e-9
    k = (H100.sms * 24 * 1024 / bmax - l0) / bmax
    f = 8 * 256 * 64
    bw = (-l0 + (l0 * l0 + 4 * k * f) ** 0.5) / (2 * k)
    assert bw == pytest.approx(0.32e12, rel=0.03)
    assert single.dram_us == pytest.approx((8 * 2**20 * 4 + 8 * 4) / bw * 1e6, rel=1e-3)
    multi = pn.compile(y, target="emulator")
    assert multi.mappings[0].split > 1  # Panamera splits the rows across blocks
    assert estimate(multi.plan, H100).ratio_to_limit < 1.25  # the init launch is the rest
    assert single.total_us > 6 * estimate(multi.plan, H100).total_us  # both pay the 4.5 us floor


def test_estimate_remodels_a_plan_on_another_gpu():
    x = pn.placeholder((4096, 4096), "float32", name="x")
    plan = pn.compile(pn.sum(x, axis=1), target="emulator").plan
    h, a, v = (estimate(plan, g) for g in (H100, A100, V100))
    assert h.total_us < a.total_us < v.total_us
    stream = (4096 * 4096 * 4 / 0.85 + 4096 * 4 / 0.77) / 900e9  # reads at eta, the written row sums at eta_write
    assert v.dram_us == pytest.approx((V100.loaded_latency_s + stream) * 1e6, rel=1e-3)
    assert limit_us(0, V100) == pytest.approx(5.0 + 0.45)  # no measurement on V100: a launch and a round trip
    for g in GPUS.values():
        assert g.sources and all(src.startswith("[") for _, src in g.sources)


def test_unfused_standin_is_one_kernel_per_op_and_reads_dram_each_time():
    x = pn.placeholder((256, 1024), "float32", name="x")
    y = pn.sum(pn.exp(x * 2.0), axis=1)
    assert [t.op for t in eager_ops([y])] == ["mul", "exp", "reduce"]
    plans = plan_all(lambda: [pn.sum(pn.exp(pn.placeholder((256, 1024), "float32", name="x") * 2.0), axis=1)], H100)
    eager, fused = plans[UNFUSED].estimate, plans["panamera"].estimate
    assert eager.launches == 3 and fused.launches == 1
    assert eager.dram_bytes == pytest.approx(5 * 256 * 1024 * 4, rel=0.01)  # read, write, read, write, read
    assert fused.dram_bytes == pytest.approx(256 * 1024 * 4, rel=0.01)
    assert plans[SINGLE].compiled[0].mappings[0].split == 1
    det = plans[DETERMINISTIC]
    assert det.atomics == (det.blocks if det.compiled[0].mappings[0].split > 1 else 0)  # counter arrivals only


def test_unfused_standin_scalar_reduction_takes_two_passes():
    plans = plan_all(lambda: [pn.sum(pn.placeholder((1 << 22,), "float32", name="x"))], H100)
    det = plans[DETERMINISTIC].estimate
    assert plans[UNFUSED].estimate.launches == det.launches + 1
    # the extra launch is queued behind the others: only its gap
    assert plans[UNFUSED].estimate.total_us == pytest.approx(det.total_us + H100.queued_s * 1e6, rel=1e-6)


def test_suites_cover_workloads_md():
    assert len(SUITES["single"]()) == 70  # (10 shapes x 2 ops x 2 dtypes) + (10 x 2 f16) + (10 bool)
    assert len(SUITES["subgraphs"]()) == 12
    assert len(SUITES["norms"]()) == 31  # 21 + the long rows of LLM sampling (WORKLOADS.md B)
    # C: Table 1 (3) + 3 rows x 3 weight shapes x 4 weight kinds (36) + 3 batches x 3 key lengths x 2 dtypes (18)
    # + issue 25's 5 rows x (4096x4096, 12288x5376, 14336x4096) x bf16/int8/int4 not already there (27)
    assert len(SUITES["contractions"]()) == 84
    # issue 25: 4 row kernels x 2 dtypes x 6 shapes (QuACK's three, three LLM-sampling batches)
    assert len(SUITES["long_rows"]()) == 48
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)


def test_run_bench_writes_results_summary_and_plots(tmp_path):
    records, summary = run_bench([], H100, out=str(tmp_path), plot=True, measure=False, workloads=tiny())
    assert {r["plan"] for r in records} == set(PLANS) - set(CONTRACTION_PEERS) - set(DECODE_PEERS) | {"pytorch-eager"}
    pan = [r for r in records if r["plan"] == "panamera"]
    assert all(r["best_peer"] in r["peers"] and r["speedup_over_best_peer"] > 0 for r in pan)
    assert all({"modeled_us", "ratio_to_limit", "plan"} <= set(v) for r in pan for v in r["peers"].values())
    assert "speedup over best peer" in summary
    need = {"workload", "suite", "dtype", "plan", "modeled_us", "limit_us", "ratio_to_limit", "dram_bytes",
            "compulsory_bytes", "launches", "blocks", "atomics", "compile_s"}  # fmt: skip
    doc = json.loads((tmp_path / "results.json").read_text())
    saved = doc["records"]
    assert saved == records and all(need <= set(r) for r in saved)
    meta = doc["meta"]  # self-describing: what made these figures, where and when
    assert {"panamera", "commit", "date", "command", "times", "gpu", "host"} <= set(meta)
    assert meta["gpu"]["name"] == "H100-SXM5" and meta["gpu"]["sms"] == 132 and meta["times"] == "modeled"
    assert meta["date"].endswith("+00:00") and meta["host"]["python"].count(".") == 2
    assert all(r["modeled_us"] >= r["limit_us"] * 0.999 for r in saved)
    assert "**All times are modeled**" in summary and "Geometric mean" in summary
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["headline.png", "limit_tiny.png", "speedup_tiny.png"]
    assert (tmp_path / "limit_tiny.png").read_bytes()[:4] == b"\x89PNG"


def test_contraction_workloads_are_benched_against_their_peers(tmp_path):
    # Plans only (never run): a skinny fp16 linear, an int4 one and a decode attention, small sizes.
    from panamera.bench.suites import Workload, _decode_attention, _linear

    ws = [Workload("linear 4x512x1024 w=float16", "contractions", "float16", _linear(4, 512, 1024, "float16")),
          Workload("linear 1x256x512 w=int4", "contractions", "int4", _linear(1, 256, 512, "int4")),
          Workload("decode_attention b1 L2048", "contractions", "float16", _decode_attention(1, 2048, "float16"))]  # fmt: skip
    records, summary = run_bench([], H100, out=str(tmp_path), measure=False, workloads=ws, nvrtc_times=False)
    pan = {r["workload"]: r for r in records if r["plan"] == "panamera"}
    assert set(pan["linear 4x512x1024 w=float16"]["peers"]) == {"pytorch-eager", "cublas", "triton-splitk"}
    assert set(pan["linear 1x256x512 w=int4"]["peers"]) == {"pytorch-eager", "marlin"}
    assert set(pan["decode_attention b1 L2048"]["peers"]) == {"pytorch-eager", "flash-decoding", *DECODE_PEERS}
    # the limit: q, K, V read once and the output written once (not the scores between kernels)
    kv = 2 * 8 * 2048 * 128 * 2
    assert pan["decode_attention b1 L2048"]["compulsory_bytes"] == kv + 2 * 32 * 128 * 2
    assert all(r["modeled_us"] >= r["limit_us"] * 0.999 for r in records)
    assert all(r["splits"] and "split=" in r["plan_description"] for r in pan.values())
    assert "cublas us" in summary and "flash-dec. us" in summary and "marlin us" in summary and "cub us" not in summary


def test_bench_command(tmp_path, capsys):
    assert main(["bench", "--suite", "tiny", "--gpu", "v100", "--out", str(tmp_path), "--no-measure"]) == 0
    out = capsys.readouterr().out
    assert "V100-SXM2" in out and (tmp_path / "summary.md").exists()
    assert main(["bench", "--suite", "tiny", "--plot"]) == 2  # --plot needs --out
    # Without a GPU, --measure times the CPU target: tests/test_cpu_model.py::test_bench_measure_command
