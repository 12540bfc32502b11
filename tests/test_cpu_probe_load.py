"""The CPU probe under load (runtime/cpu_probe.py `judge`): a probe taken while other processes
held the cores is kept briefly, never cached for good; its trials that lost a core are dropped
(runtime/cpu_probe_trials.py). One test per rule of `judge`, and a real
probe under a faked load. Structure only: no figure of this machine is asserted."""

from __future__ import annotations

import dataclasses
import os

import pytest

from panamera.model.cpu import NOMINAL, Caches
from panamera.runtime import cpu_probe, cpu_probe_trials
from panamera.runtime.cpu_probe import Verdict, judge

IDLE = [(50.0, 105.0), (29.0, 58.0), (29.0, 58.0)]  # GB/s (one thread, two): an idle probe here
FORK = (0.8, 4.9)  # us: a passive pool's wake-up on two threads, idle


def test_an_idle_probe_is_settled():
    assert judge(2, FORK, IDLE, IDLE, True, 0.0) == (Verdict.SETTLED, "")
    assert judge(1, FORK, [(50.0, 1.0)] * 3, IDLE, True, 9.0)[0] is Verdict.SETTLED  # one thread: nothing shared


def test_rule_1_a_slow_region_entry_is_contended():
    assert judge(2, (0.8, 2 * cpu_probe.CONTENDED_FORK_US), IDLE, IDLE, False, 0.0)[0] is Verdict.CONTENDED


def test_a_passive_pools_slow_wake_up_is_its_cost_not_load():
    """On the AMD EPYC guests a passive 2-thread region takes 45-54 us to enter, idle: settled."""
    assert judge(2, (0.8, 50.0), IDLE, IDLE, True, 0.0) == (Verdict.SETTLED, "")


def test_rule_2_a_collapsed_all_thread_rate_is_contended():
    collapsed = [IDLE[0], (29.0, 5.5), IDLE[2]]  # the 01:47 probe's DRAM: 5.5 GB/s on two threads
    assert judge(2, FORK, IDLE, collapsed, True, 0.0) == (Verdict.CONTENDED, "2 threads streamed slower than one")


def test_rule_3_a_figure_of_preempted_trials_is_contended():
    """Less than WHOLE_MIN of some all-thread figure's trials held their cores throughout: contended."""
    verdict, why = judge(2, FORK, IDLE, IDLE, True, 0.0, whole=cpu_probe.WHOLE_MIN / 2)
    assert verdict is Verdict.CONTENDED and "held their cores" in why
    assert judge(2, FORK, IDLE, IDLE, True, 0.0, whole=cpu_probe.WHOLE_MIN)[0] is Verdict.SETTLED


def test_rule_5_the_load_average_makes_a_probe_provisional():
    """The trials that held their cores stand under load, but the region's entry and the shared
    levels are the load's: kept briefly (the 03:00 passive probe, L2 51/50 GB/s, ran under load)."""
    verdict, why = judge(2, FORK, IDLE, IDLE, True, cpu_probe.LOADED_CORES + 1.0)
    assert verdict is Verdict.PROVISIONAL and "load average" in why
    assert judge(2, FORK, IDLE, IDLE, True, cpu_probe.LOADED_CORES)[0] is Verdict.SETTLED


def test_rule_4_an_unscaled_l2_rate_is_provisional():
    flat = [(51.0, 50.0), *IDLE[1:]]  # 03:00 passive probe: no 2-thread scaling of a per-core cache
    verdict, why = judge(2, FORK, flat, IDLE, True, 0.0)
    assert verdict is Verdict.PROVISIONAL and "L2 read 51" in why
    scaled = [(50.0, cpu_probe.SCALING_MIN * 2 * 50.0), *IDLE[1:]]
    assert judge(2, FORK, scaled, IDLE, True, 0.0)[0] is Verdict.SETTLED


def test_a_probe_under_a_faked_load_is_measured_and_kept_briefly(private_cache, monkeypatch):
    """measure() times every thread under load too (its trials that lost a core are dropped); the
    load average makes it provisional (at least): `rates` keeps it CONTENDED_TTL_S, then probes again."""
    monkeypatch.setattr(cpu_probe, "others_load", lambda: 3.0)
    caches = Caches(48 << 10, 1 << 20, 8 << 20)  # small arrays: a quick probe
    hot = cpu_probe.rates(2, caches)
    assert cpu_probe.provisional(hot.source)  # provisional; contended where the real load preempted the trials
    cpu_probe.rates.cache_clear()
    calm = dataclasses.replace(hot, source="probed now")
    monkeypatch.setattr(cpu_probe, "measure", lambda *a: calm)
    assert cpu_probe.rates(2, caches) == hot  # fresh on disk: reused
    (path,) = private_cache.glob("cpu_probe_*.json")
    os.utime(path, (0, 0))  # older than CONTENDED_TTL_S
    cpu_probe.rates.cache_clear()
    assert cpu_probe.rates(2, caches) is calm


def test_a_probe_whose_trials_lost_their_cores_is_extrapolated(monkeypatch):
    """Where no trial held its cores throughout (faked: RAN_MIN above 1), the all-thread figures
    are extrapolated from one thread's and the probe is contended."""
    monkeypatch.setattr(cpu_probe_trials, "RAN_MIN", 2.0)
    monkeypatch.setattr(cpu_probe_trials, "SAMPLES", 3)
    monkeypatch.setattr(cpu_probe, "others_load", lambda: 0.0)
    r = cpu_probe.measure(2, Caches(48 << 10, 1 << 20, 8 << 20))
    assert r.source.startswith("contended") and "0 % of an all-thread figure's trials held their cores" in r.source
    assert all(full == 2 * one for one, full in r.read_gbs)


def test_a_provisional_probe_is_kept_briefly(private_cache, monkeypatch):
    unscaled = dataclasses.replace(NOMINAL, threads=2, source="provisional probe (L2 read 51 GB/s ...): now")
    runs = iter([unscaled, dataclasses.replace(unscaled, source="probed")])
    monkeypatch.setattr(cpu_probe, "measure", lambda *a: next(runs))
    caches = Caches(48 << 10, 1 << 20, 8 << 20)
    assert cpu_probe.rates(2, caches) is unscaled
    cpu_probe.rates.cache_clear()
    assert cpu_probe.rates(2, caches) == unscaled
    (path,) = private_cache.glob("cpu_probe_*.json")
    os.utime(path, (0, 0))
    cpu_probe.rates.cache_clear()
    assert cpu_probe.rates(2, caches).source == "probed"


def test_region_entry_is_the_extra_of_all_threads_after_the_callers_work_alone():
    """fork_us on `threads` threads is one thread's (its ctypes call included) plus the median extra
    of an all-thread region entered after GAP_S of the caller's work; one thread: no extra; an
    all-thread entry faster than one thread's adds nothing."""
    calls: list = []

    def after(t):
        calls.append(t)
        return 50e-6 if t > 1 else 1e-6

    one, full = cpu_probe.region_entry(lambda: None, after, 2)
    assert full - one == pytest.approx(49.0) and set(calls) == {1, 2}
    single = cpu_probe.region_entry(lambda: None, after, 1)
    assert single[0] == single[1]
    fast = cpu_probe.region_entry(lambda: None, lambda t: 1e-6 / t, 2)
    assert fast[1] == fast[0]
