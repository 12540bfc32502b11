"""The performance model against published GPU measurements (the project's CALIBRATION.md):
every row's kernel is modeled from its own plan on the GPU it was measured on (CUB's single-tile
or two-kernel DeviceReduce on H200; QuACK's, Liger's, torch.compile's and eager PyTorch's row
kernels on H100, bench/calibration.py) and must land within +-10 % of the measurement, except the
rows listed in `calibration.GAPS` with the reason the model misses them. No row may beat the
limit (model/estimate.py `limit_us`), which is built from measured terms only.
"""

from __future__ import annotations

import pytest

from panamera.bench.calibration import GAPS, ROWS, gap, limit_of, modeled_us, plan_of
from panamera.model import H100, H200

TOL = 0.10
IDS = [r.name for r in ROWS]


def test_every_source_row_is_in_the_table():
    """CALIBRATION.md: Q 9 series x 11 shapes (Liger's two stop at 65K), L 4 x 5, C 7."""
    by = {s: sum(1 for r in ROWS if r.source == s) for s in "QLC"}
    assert by == {"Q": 9 * 11 - 4, "L": 20, "C": 7}


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_model_reproduces_the_measurement(row):
    m = modeled_us(row)
    why = gap(row)
    if why is not None:  # a known gap stays one: a row that now fits must leave GAPS
        assert m is None or abs(m / row.measured_us - 1) > TOL, f"{row.name} now fits: remove its GAPS entry"
        return
    assert m is not None, f"{row.name}: no plan"
    assert m == pytest.approx(row.measured_us, rel=TOL), f"{row.name}: modeled {m:.1f} us"


def test_most_rows_are_reproduced():
    """The gaps stay the exception: at least the QuACK, Liger and CUB rows outside GAPS, and
    every gap names a series that exists."""
    fit = [r for r in ROWS if gap(r) is None]
    assert len(fit) >= 83
    for source, impl, pattern, _ in GAPS:
        assert any((r.source, r.impl, r.pattern) == (source, impl, pattern) for r in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_no_measurement_beats_the_limit(row):
    assert row.measured_us >= limit_of(row), f"{row.name}: measured {row.measured_us:.2f} < limit {limit_of(row):.2f}"


def test_limit_is_tight_where_measured():
    """The limit's terms are the best measurements themselves: the smallest CUB kernel sits on
    it, and QuACK's best streams come within 2 % of it."""
    cub8 = next(r for r in ROWS if r.impl == "cub" and r.N == 256)
    assert limit_of(cub8) == pytest.approx(cub8.measured_us, rel=0.01)
    ce = next(r for r in ROWS if r.impl == "quack" and r.pattern == "cross_entropy" and r.N == 65536)
    assert limit_of(ce) == pytest.approx(ce.measured_us, rel=0.02)


def test_terms_cite_their_measurements():
    """Every calibrated term carries its source: measured, fitted, spec, derived or assumed."""
    for gpu in (H100, H200):
        names = " ".join(k for k, _ in gpu.sources)
        for term in ("eta", "eta_write", "launch_s", "queued_launch_s", "atomic_rates", "saturating_kb_per_sm"):
            assert term in names, (gpu.name, term)
        for _, why in gpu.sources:
            assert why.startswith(("[measured]", "[fitted]", "[spec]", "[derived]", "[assumed]")), why


def test_atomic_rates_differ_by_dtype():
    """triton-lang/triton PR #10059: int32 72.9, int64 39.2, float64 26.8 G/s."""
    assert [H100.atomic_rate_of(d) / 1e9 for d in ("int32", "int64", "float64")] == [72.9, 39.2, 26.8]


def test_a_queued_kernel_costs_almost_nothing():
    """CUB 2^16 (two kernels) within 10 % of 2^12 (one kernel), as measured (5.35 vs 5.29 us)."""
    two = next(r for r in ROWS if r.impl == "cub" and r.N == 2**16)
    one = next(r for r in ROWS if r.impl == "cub" and r.N == 2**12)
    assert modeled_us(two) == pytest.approx(modeled_us(one), rel=0.10)


def test_the_floor_counts_its_round_trip_once():
    """`launch_s` is CUB's single-tile time less that kernel's own unloaded round trip and epilogue, so a
    cold kernel reading a few KB pays one round trip, not two: it lands on the single-tile rows (4.86-5.29,
    mean 5.05 us; with the round trip counted twice it would be 5.4). A stream's first round trip is at its
    load: the one small stream measured cold and without a host gap (CUB 2^20 on H200, NVBench) spends at
    least the model's DRAM time past the floor and epilogues, and more than an unloaded start would give."""
    from panamera.model.estimate import estimate

    single = [r for r in ROWS if r.impl == "cub" and r.N <= 4096]  # CUB's single-tile kernel, 64 B to 16 KB
    measured = [r.measured_us for r in single]
    for r in single:
        e = estimate(plan_of(r), H200, r.traffic)
        assert e.dram_us == pytest.approx(H200.dram_latency_s * 1e6, rel=0.05)  # one round trip, unloaded
        assert e.total_us == pytest.approx(e.launch_us + e.dram_us + e.tail_us)
        assert min(measured) <= e.total_us <= max(measured)
        assert e.total_us == pytest.approx(sum(measured) / len(measured), rel=0.02)
        assert e.total_us + e.dram_us > max(measured)  # the round trip counted twice would miss them all
    cub20 = next(r for r in ROWS if r.impl == "cub" and r.N == 2**20)
    e = estimate(plan_of(cub20), H200, cub20.traffic)
    unloaded_start = H200.dram_latency_s + sum(cub20.traffic) / H200.stream_bw(*cub20.traffic)
    loaded_excess = H200.loaded_latency_s - H200.dram_latency_s  # 0.39 us on H200
    assert e.dram_us - unloaded_start * 1e6 > 0.5 * loaded_excess * 1e6  # the stream starts at its load
    assert e.dram_us <= cub20.measured_us - e.launch_us - e.tail_us  # 1.69 <= 2.13 us: no excess to take back


def test_a_chain_of_dependent_steps_issues_in_series():
    """model/kernel_cost.py: a kernel of `round_trips` dependent steps per wave lasts at least the chain's latency plus
    its issue (each step's work waits for its load), while a plain stream's issue hides under it."""
    from panamera.model.kernel_cost import kernel_time

    kw = dict(dram_bytes=2**27, blocks=528, threads=512, bytes_in_flight_per_thread=8, sfu_ops=2**30)
    plain, chain = kernel_time(H100, **kw), kernel_time(H100, **kw, round_trips=64)
    assert plain.dram_s < plain.issue_s  # the issue binds alone: max(DRAM, issue)
    latency = 64 * H100.latency_at(kw["dram_bytes"] / plain.dram_s)
    assert chain.dram_s == pytest.approx(latency + chain.issue_s)
    assert chain.total_s > plain.total_s + 0.9 * latency
