"""The CPU model's 1-thread terms refit by issue 24 (helpers cpumodel3, cpuprobe3), one test per term:
the per-call floor (model/cpu.py CALL_US), the probe's L2 read rate (runtime/cpu_probe.py: the
sum's independent lanes, one thread's share of the L2 buffer), its loops timed inside their region,
and the terms the probe adds (`lane_op_ns`, the L3's extent, the column ratio, the overlap).
Structure only: no timing."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import types

import numpy as np
import pytest

from panamera.model.cpu import (
    CACHE_FILL,
    COLUMN_BLOCK_BYTES,
    LANE_VECTORS,
    NOMINAL,
    Caches,
    CpuModel,
    CpuWork,
    call_us,
    element_ns,
    kernel_time,
)
from panamera.runtime import cpu_probe
from panamera.runtime.cpu_probe_source import COLUMN_BLOCK
from panamera.runtime.cpu_probe_trials import Timed
from panamera.schedule.cpu_cost import work


def test_call_floor_excludes_the_ctypes_call_the_region_entry_holds():
    """A tiny kernel's call is the Python side plus the probe's region entry (itself timed through
    ctypes), not both with a ctypes call each: a 1280-element sum with the idle probe's 1-thread
    entry (0.89 us) models the measured 3.3-3.4 us floor, not the 5.0 of the double count."""
    rates = NOMINAL.__class__(**{**NOMINAL.__dict__, "fork_us": (0.89, 47.0)})
    m = CpuModel(2, 64, "x", Caches(48 << 10, 2 << 20, 32 << 20), rates)
    w = CpuWork(M=1, N=1280, elements=1280, read_bytes=1280 * 4, write_bytes=4)
    total = call_us(1) + kernel_time(w, m, tasks=1, split=1, threads=1).total_us
    assert 3.0 <= total <= 3.8, total
    assert call_us(3) - call_us(1) == pytest.approx(1.4)  # each further output, unchanged


def _fake_lib(seen: list):
    def sum_(pb, n, reps, t, warm, out):
        seen.append(("sum", n, t))
        out[0], out[1] = 1e-4 * n / 2**20, 1.0

    def triad(a, b, c, n, reps, t, warm, out):
        seen.append(("triad", n, t))
        out[0], out[1] = 1e-4 * n / 2**20, 1.0

    noop = lambda *a: None  # noqa: E731
    names = ("pn_add", "pn_lanes", "pn_exp", "pn_div", "pn_empty", "pn_entry")
    return types.SimpleNamespace(
        pn_sum=sum_, pn_triad=triad, pn_column=sum_, pn_sum_exp=sum_, **{k: noop for k in names}
    )


def test_probe_reads_one_threads_share_of_the_l2_buffer(monkeypatch):
    """At one thread the L2 samples read half of one core's L2 (the 2-thread buffer is one half per
    core: read whole by one thread it spilled out of L2); L3 and beyond read the whole buffer."""
    seen: list = []
    import panamera.runtime.cpu as rcpu

    monkeypatch.setattr(rcpu, "build", lambda src: _fake_lib(seen))
    once = lambda *samples: [Timed(s(1)[0] or 1e-4, 0.0, 1.0) for s in samples]  # noqa: E731
    monkeypatch.setattr(cpu_probe, "_trials", once)
    monkeypatch.setattr(cpu_probe, "region_entry", lambda *a: (1.0, 1.0))
    monkeypatch.setattr(cpu_probe, "others_load", lambda: 0.0)
    caches = Caches(48 << 10, 256 << 10, 4 << 20)
    cpu_probe.measure(2, caches)
    l2 = (caches.l2 // 2) // 4  # one core's half, in floats
    sums = [(n, t) for k, n, t in seen if k == "sum"]
    sums = sums[sums.index((l2, 1)) :]  # after the L3's extent (`l3_extent`: one thread, doubling buffers)
    assert sums[:2] == [(l2, 1), (2 * l2, 2)]  # L2: one thread its half, two threads both
    assert sums[2][0] == sums[3][0] > 2 * l2  # L3: the same (whole) buffer on 1 and 2 threads
    triads = [(n, t) for k, n, t in seen if k == "triad"]
    third = (2 * l2 // 3) // cpu_probe.LANES * cpu_probe.LANES  # whole blocks of lanes
    assert triads[0] == (third // 2 // cpu_probe.LANES * cpu_probe.LANES, 1) and triads[1] == (third, 2)


def test_probe_loops_add_every_element_timed_inside_their_region():
    """The read sum keeps LANE_VECTORS x 16 lanes (the row scans' accumulators, not one register
    bound by the add's latency); it, the column sum (rows of the kernels' 16 KiB block), the sum
    of exps and the triad, one template over their bodies (pn_region), add every element on one
    thread and on two (each its share; a warm-up run first or not), and report the slowest
    thread's wall seconds and the least share of them a thread ran."""
    assert f"acc[{LANE_VECTORS * 16}]" in cpu_probe.SOURCE and "PN_W" not in cpu_probe.SOURCE
    assert COLUMN_BLOCK * 4 == COLUMN_BLOCK_BYTES == 16384 and f"blk[{COLUMN_BLOCK}]" in cpu_probe.SOURCE
    lib = cpu_probe._library()
    x = (np.arange(8 * COLUMN_BLOCK, dtype=np.float32) % 7) / 8
    y = np.zeros(3 * x.size, np.float32)
    out = (ctypes.c_double * 2)()
    for t, warm in ((1, 0), (2, 0), (2, 1)):
        keep = 1 + warm  # the warm-up's sum is kept too
        assert lib.pn_sum(x.ctypes.data, x.size, 3, t, warm, out) == pytest.approx((2 + keep) * float(x.sum()))
        assert out[0] > 0 and 0.0 < out[1] <= 1.5
        exps = lib.pn_sum_exp(x.ctypes.data, x.size, 1, t, warm, out)
        assert exps == pytest.approx(keep * float(np.exp(x.astype(np.float64)).sum()), rel=1e-5)
        cols = x.reshape(-1, COLUMN_BLOCK).sum(0)
        assert lib.pn_column(x.ctypes.data, x.size, 1, t, warm, out) == pytest.approx(keep * (cols[0] + cols[-1]))
        y[x.size :] = np.concatenate([x, 2 * x])
        parts = [y[k * x.size :].ctypes.data for k in range(3)]
        lib.pn_triad(*parts, x.size, 2, t, warm, out)
        assert np.array_equal(y[: x.size], x + np.float32(0.5) * (2 * x)) and out[0] > 0


def _with(**kw) -> CpuModel:
    m = CpuModel(2, 32, "x", Caches(32 << 10, 512 << 10, 32 << 20), NOMINAL)
    return dataclasses.replace(m, rates=dataclasses.replace(NOMINAL, **kw))


def test_cheap_ops_priced_at_the_lanes_throughput_not_a_dependent_adds_latency():
    """element_ns prices a cheap operation at `lane_op_ns` (the probe's op_ns); an unmeasured op_ns
    (an older cache entry, NOMINAL) falls back to add_ns; exp and division keep their own rates."""
    w = CpuWork(M=1, N=8, elements=8, read_bytes=32, write_bytes=4, cheap=3.0)
    lanes = _with(add_ns=0.12, op_ns=0.04).rates
    assert element_ns(w, lanes, 8) == pytest.approx(3 * 0.04)
    assert element_ns(w, _with(add_ns=0.12, op_ns=0.0).rates, 8) == pytest.approx(3 * 0.12)
    e = dataclasses.replace(w, cheap=1.0, transcendental=1.0)
    assert element_ns(e, lanes, 8) == pytest.approx(lanes.exp_ns)  # the exp's rate, its add included once


def test_l3_extent_measured_sets_the_level():
    """With the probe's L3 extent (l3_bytes) the model's L3 ends at CACHE_FILL of it; without, at
    CACHE_FILL of the L3 the OS reports (at most L3_MAX)."""
    measured, reported = _with(l3_bytes=8 << 20), _with()
    assert measured.level(5 << 20, 1) == "L3" and measured.level(7 << 20, 1) == "DRAM"
    assert reported.level(7 << 20, 1) == "L3" and reported.level(25 << 20, 1) == "DRAM"
    assert measured.l3_held() == CACHE_FILL * (8 << 20)


def test_column_form_reads_at_the_probed_column_ratio():
    """A COLUMN group's work says so (schedule/cpu_cost.py `work`), and its reads take 1 / column
    as long; other forms, or column = 1 (unmeasured), are unchanged."""
    import panamera as pn
    from panamera.compiler import lower

    g = lower(pn.sum(pn.placeholder((4096, 768), "float32"), axis=0), stop_after="groups", target="emulator").groups[0]
    w = work(g)
    assert (
        w.column
        and not work(
            lower(
                pn.sum(pn.placeholder((768, 4096), "float32"), axis=1), stop_after="groups", target="emulator"
            ).groups[0]
        ).column
    )
    slow, plain = _with(column=0.5), _with()
    t_slow, t_plain = (kernel_time(w, m, tasks=1, split=1, threads=1).memory_us for m in (slow, plain))
    assert t_slow == pytest.approx(2 * t_plain, rel=1e-3)  # its 3 KiB of writes aside
    row = dataclasses.replace(w, column=False)
    assert kernel_time(row, slow, 1, 1, 1).memory_us == pytest.approx(t_plain)


def test_overlap_adds_the_unhidden_share_of_the_shorter_part():
    """A kernel's body is max(memory, compute) + (1 - overlap) x min(...): overlap 1 (unmeasured)
    is the longer alone, 0 their sum."""
    w = CpuWork(M=1, N=1 << 20, elements=1 << 20, read_bytes=4 << 20, write_bytes=4, cheap=20.0)
    for ov in (1.0, 0.5, 0.0):
        t = kernel_time(w, _with(overlap=ov), tasks=1, split=1, threads=1)
        lo, hi = sorted((t.memory_us, t.compute_us))
        assert t.total_us - t.fork_us == pytest.approx(hi + (1 - ov) * lo)


def test_probe_json_round_trip_and_older_entries_load():
    """The probe's new figures survive its cache; an entry without them (an older probe) loads
    with the defaults that leave the model as it was."""
    r = dataclasses.replace(NOMINAL, op_ns=0.05, l3_bytes=8 << 20, column=0.8, overlap=0.6)
    assert cpu_probe._from_json(cpu_probe._to_json(r)) == r
    old = json.loads(cpu_probe._to_json(NOMINAL))
    for k in ("op_ns", "l3_bytes", "column", "overlap"):
        old.pop(k)
    back = cpu_probe._from_json(json.dumps(old))
    assert (back.lane_op_ns, back.l3_bytes, back.column, back.overlap) == (NOMINAL.add_ns, 0, 1.0, 1.0)


def _groups(y):
    from panamera.compiler import lower

    return lower(y, target="emulator", stop_after="groups").groups[0]


def test_combines_fold_the_registers_of_lanes_each_pass_steps():
    """A pass that evaluates exp steps one register of lanes (schedule/cpu_lane_kind.py
    `pass_vectors`), so its combine folds log2(1) = 0 whole-register steps where a cheap pass's
    folds log2(LANE_VECTORS): softmax's max pass keeps LANE_VECTORS, its exp-sum pass 1, and the
    stitched whole's combines are the sum of its passes' (a plain sum: LANE_VECTORS)."""
    import panamera as pn
    from panamera.model.cpu import combine_ns

    x = pn.placeholder((64, 1000), "float32")
    sm = work(_groups(pn.nn.softmax(x, axis=1, method="multipass")))
    assert [p.vectors for p in sm.passes if p.row_combines] == [LANE_VECTORS, 1]
    assert work(_groups(pn.sum(x, axis=1))).vectors == LANE_VECTORS
    r, m = NOMINAL, CpuModel(1, 64, "x", Caches(48 << 10, 2 << 20, 32 << 20), NOMINAL)
    folds = sum(p.M * p.row_combines * combine_ns(r, 16, p.struct, p.vectors) for p in sm.passes) * 1e-3
    every = dataclasses.replace(sm, passes=tuple(dataclasses.replace(p, vectors=LANE_VECTORS) for p in sm.passes))
    saved = kernel_time(every, m, 1, 1, 1).compute_us - kernel_time(sm, m, 1, 1, 1).compute_us
    assert folds > 0 and saved == pytest.approx(64 * 2 * 16 * r.add_ns * 1e-3)


def test_reuse_prices_recomputation_at_the_lanes_throughput():
    """schedule/cpu_reuse.py prices a recomputed cheap operation as element_ns does (`lane_op_ns`),
    not at a dependent add's latency: log_softmax's x - m (one subtraction) is kept in a scratch row
    when the add's latency (1 ns) is its price, and recomputed at the lanes' 0.04 ns a value."""
    import panamera as pn
    from panamera.schedule.cpu_reuse import choose

    lsm = _groups(pn.nn.log_softmax(pn.placeholder((4, 1000), "float32"), axis=1, method="multipass"))
    assert [x.ops for x in choose(lsm, _with(add_ns=1.0, op_ns=0.0))] == ["sub"]
    assert choose(lsm, _with(add_ns=1.0, op_ns=0.04)) == ()


def test_split_merge_is_the_last_tasks_combine_without_a_barrier():
    """A split reduction merges LAST (schedule/cpu_mapper.py `merge_mode`): each output's last task
    combines its partials, with no barrier, so the merge does not pay part of a region's entry (a
    passive pool's wake-up): it is the same for a 1 us and a 50 us entry, and grows with the
    partials combined."""
    w = CpuWork(M=64, N=65536, elements=64 * 65536, read_bytes=64 * 65536 * 4, write_bytes=256, column=True)
    cheap, woken = _with(fork_us=(1.0, 1.0)), _with(fork_us=(1.0, 50.0))
    m1 = kernel_time(w, cheap, tasks=2, split=2, threads=2).merge_us
    assert m1 == kernel_time(w, woken, tasks=2, split=2, threads=2).merge_us > 0
    assert kernel_time(w, cheap, tasks=4, split=4, threads=2).merge_us == pytest.approx(2 * m1)
    assert kernel_time(w, cheap, tasks=1, split=1, threads=2).merge_us == 0.0
