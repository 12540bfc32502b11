"""Each term of the performance model (panamera/model/kernel_cost.py) pinned on a hand-computed example."""

from __future__ import annotations

import math

import pytest

import panamera as pn
from panamera.compiler import lower
from panamera.model import H100, estimate, kernel_time, limit_us
from panamera.schedule.mapping import arithmetic, streamed_bytes_per_iteration

BMAX = 0.95 * 3.35e12  # achievable read bytes/s on H100 (QuACK's cross-entropy, CALIBRATION.md)
WMAX = 0.86 * 3.35e12  # achievable written bytes/s
L0 = 350e-9  # unloaded DRAM latency
L1 = 132 * 24 * 1024 / BMAX  # loaded latency: 24 KB per SM in flight saturate BMAX (fitted to Liger's softmax)


def test_the_launch_is_net_of_the_work_its_measurement_contains():
    # CUB's single-tile kernel takes 4.86-5.29 us cold, less its own round trip and epilogue.
    assert H100.launch_s == pytest.approx(4.5e-6)
    assert kernel_time(H100, dram_bytes=0, blocks=0, threads=1, bytes_in_flight_per_thread=0).total_s == 4.5e-6


def test_a_queued_launch_costs_only_its_gap():
    # the first kernel of a call pays the floor, a kernel queued behind it 0.1 us (cccl PR #9722)
    ln = [kernel_time(H100, dram_bytes=0, blocks=0, threads=1, bytes_in_flight_per_thread=0)]

    class L:  # a launch as estimate() reads it
        cost_features = ln[0].features
        bytes_read = bytes_written = 0

    assert estimate([L(), L(), L()], H100, 0).launch_us == pytest.approx(4.5 + 2 * 0.1)


def test_the_limit_is_the_smallest_measured_kernel_and_the_best_measured_streams():
    lim = H100.limit
    assert limit_us(3_000_000, H100) == pytest.approx(lim.floor_s * 1e6 + 3e6 / (lim.eta_read * 3.35e12) * 1e6)
    both = limit_us(3_000_000, H100, written=1_000_000)
    assert both == pytest.approx(lim.floor_s * 1e6 + (2e6 / lim.eta_read + 1e6 / lim.eta_write) / 3.35e12 * 1e6)


def test_written_bytes_stream_slower_than_read_ones():
    read = kernel_time(H100, dram_bytes=64e6, blocks=132 * 8, threads=256, bytes_in_flight_per_thread=64)
    half = kernel_time(H100, dram_bytes=64e6, write_bytes=32e6, blocks=132 * 8, threads=256,
                       bytes_in_flight_per_thread=64)  # fmt: skip
    # the stream's time grows by the written half's slower rate (less a little latency: the lower
    # bandwidth loads DRAM less)
    assert half.dram_s - read.dram_s == pytest.approx(32e6 / WMAX - 32e6 / BMAX, rel=0.05)


def test_atomics_merge_at_their_types_rate():
    kw = dict(dram_bytes=0, blocks=1, threads=256, bytes_in_flight_per_thread=4, atomics=1_000_000)
    i32, f64 = (kernel_time(H100, atomic_dtype=d, **kw).atomic_s for d in ("int32", "float64"))
    assert f64 / i32 == pytest.approx(72.9 / 26.8)


def test_latency_rises_with_the_bandwidth_in_use():
    # BW * L(BW) = F with L linear from L0 (idle) to L1 (at BMAX).
    for f in (4096, 1 << 20):
        bw = H100.bandwidth(f)
        assert bw * (L0 + (L1 - L0) * bw / BMAX) == pytest.approx(f)
    assert H100.bandwidth(4096) == pytest.approx(4096 / L0, rel=0.02)  # a trickle sees the idle latency
    assert H100.bandwidth(BMAX * L1) == pytest.approx(BMAX)  # the 24 KB-per-SM rule saturates
    assert H100.bandwidth(10 * BMAX * L1) == BMAX


def test_a_tiny_kernel_pays_one_unloaded_round_trip():
    k = kernel_time(H100, dram_bytes=512, blocks=1, threads=32, bytes_in_flight_per_thread=16)
    assert k.dram_s == pytest.approx(L0, rel=0.01)  # not the 1.0 us loaded latency


def test_a_stream_pays_the_first_round_trip_then_the_bandwidth():
    k = kernel_time(H100, dram_bytes=64e6, blocks=132 * 8, threads=256, bytes_in_flight_per_thread=64)
    assert k.dram_s == pytest.approx(L1 + 64e6 / BMAX)  # the round trip at the load the stream puts on DRAM


def test_bytes_in_flight_never_exceed_what_the_kernel_moves():
    small = kernel_time(H100, dram_bytes=8192, blocks=132, threads=1024, bytes_in_flight_per_thread=64)
    bw = H100.bandwidth(8192)  # the 8 KB it moves are all it can have in flight
    assert small.dram_s == pytest.approx(H100.latency_at(bw) + 8192 / BMAX)


def test_atomics_of_earlier_waves_hide_under_streaming():
    kw = dict(dram_bytes=256e6, threads=256, bytes_in_flight_per_thread=64, atomics=1_000_000)
    one_wave = kernel_time(H100, blocks=132 * 8, **kw)  # 8 blocks of 256 threads per SM: one wave
    four_waves = kernel_time(H100, blocks=132 * 8 * 4, **kw)
    total = 1_000_000 / H100.atomic_rate
    assert one_wave.atomic_s == pytest.approx(total)  # everything merges after the stream
    assert four_waves.atomic_s == pytest.approx(total / 4)  # only the last wave's merges are exposed


def test_compare_and_swap_merges_serialize_at_an_l2_round_trip():
    kw = dict(dram_bytes=1e6, blocks=64, threads=256, bytes_in_flight_per_thread=16, atomics=128, same_address=64)
    native = kernel_time(H100, **kw)
    cas = kernel_time(H100, cas_atomics=64, **kw)
    assert native.atomic_s == pytest.approx(128 / H100.atomic_rate + 64 / H100.l2_clock_hz)
    assert cas.atomic_s == pytest.approx(128 / H100.atomic_rate + 64 * 270 / H100.clock_hz)


def test_arithmetic_binds_when_it_outlasts_the_stream():
    # 132 SMs x 64 FP64 lanes x 1.98 GHz: 1.67e13 FP64 instructions per second.
    k = kernel_time(H100, dram_bytes=1e6, blocks=132, threads=256, bytes_in_flight_per_thread=64, fp64_ops=1.67e9)
    assert k.issue_s == pytest.approx(1.67e9 / (132 * 64 * 1.98e9))
    assert k.total_s == pytest.approx(k.launch_s + k.issue_s + k.tail_s)
    few = kernel_time(H100, dram_bytes=1e6, blocks=2, threads=256, bytes_in_flight_per_thread=64, fp32_ops=1e6)
    assert few.issue_s == pytest.approx(1e6 / (2 * 128 * 1.98e9))  # only the SMs it occupies issue
    sfu = kernel_time(H100, dram_bytes=1e6, blocks=132, threads=256, bytes_in_flight_per_thread=64, sfu_ops=1e9)
    assert sfu.issue_s == pytest.approx(1e9 / (132 * 16 * 1.98e9))


def test_only_the_last_waves_epilogue_is_exposed():
    k = kernel_time(H100, dram_bytes=1e9, blocks=132 * 8 * 10, threads=256, bytes_in_flight_per_thread=64)
    assert k.tail_s == pytest.approx(400 / 1.98e9)


def _group(outs):
    return lower(outs, stop_after="groups", target="emulator").groups


def test_bytes_in_flight_count_streamed_inputs_only():
    # layer_norm: x streams (4 B per iteration); gamma and beta are broadcast parameters.
    x = pn.placeholder((64, 1024), "float32", name="x")
    g, b = pn.placeholder((1024,), "float32", name="g"), pn.placeholder((1024,), "float32", name="b")
    groups = _group([pn.nn.layer_norm(x, g, b)])
    assert [streamed_bytes_per_iteration(gr) for gr in groups] == [4]


def test_welford_in_double_counts_fp64_issue_slots():
    x = pn.placeholder((256, 1024), "float32", name="x")
    (group,) = _group([pn.var(x, axis=1)])
    work = arithmetic(group)
    welford = 16 * 256 * 1024  # merge_instructions per element, in the accumulator's precision
    acc = group.statements[0].acc
    assert (work.fp64 if acc.field.compute == "double" else work.fp32) >= welford


def test_a_split_float_max_merges_without_compare_and_swap_loops():
    # float max has no native atomic: 512 blocks serializing on one word at an L2 round trip each
    # would cost 70 us; it merges through integer atomicMax on order-preserving images instead.
    x = pn.placeholder((1024, 1024), "float32", name="x")
    k = pn.compile(pn.max(x), target="emulator", use_database=False)
    m = k.mappings[0]
    assert m.split > 32 and set(map(str, m.merges)) <= {"partials", "atomic_ws"}
    assert dict(k.plan.kernels[-1].cost_features)["cas_atomics"] == 0
    assert estimate(k.plan, H100).ratio_to_limit < 1.15
    assert math.isclose(k(x_np := __import__("numpy").random.default_rng(0).random((1024, 1024), "f4")), x_np.max())
