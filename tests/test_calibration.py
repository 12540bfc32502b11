"""The performance model against published GPU measurements (the project's CALIBRATION.md):
every row's kernel is modeled from its own plan on the GPU it was measured on (CUB's single-tile
or two-kernel DeviceReduce on H200; QuACK's, Liger's, torch.compile's and eager PyTorch's row
kernels on H100, bench/calibration.py) and must land within +-10 % of the measurement, except the
rows listed in `calibration.GAPS` with the reason the model misses them. No row may beat the
limit (model/estimate.py `limit_us`), which is built from measured terms only.
"""

from __future__ import annotations

import pytest

from panamera.bench.calibration import GAPS, ROWS, gap, limit_of, modeled_us
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
    assert len(fit) >= 72
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


def test_a_chain_of_dependent_steps_issues_in_series():
    """model/gpu.py: a kernel of `round_trips` dependent steps per wave lasts at least the chain's latency plus
    its issue (each step's work waits for its load), while a plain stream's issue hides under it."""
    from panamera.model.gpu import kernel_time

    kw = dict(dram_bytes=2**27, blocks=528, threads=512, bytes_in_flight_per_thread=8, sfu_ops=2**30)
    plain, chain = kernel_time(H100, **kw), kernel_time(H100, **kw, round_trips=64)
    assert plain.dram_s < plain.issue_s  # the issue binds alone: max(DRAM, issue)
    latency = 64 * H100.latency_at(kw["dram_bytes"] / plain.dram_s)
    assert chain.dram_s == pytest.approx(latency + chain.issue_s)
    assert chain.total_s > plain.total_s + 0.9 * latency
