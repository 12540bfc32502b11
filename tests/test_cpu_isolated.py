"""The CPU bench's isolated harness (panamera/bench/cpu_isolated.py): its mechanics with a stand-in
implementation, not timings."""

import os

import pytest

from panamera.bench.cpu_isolated import PASSIVE_ENV, WARM_CALLS, Pool, WorkerError

FAKE = "panamera.bench.cpu_isolated:counter"


def test_workers_are_separate_passive_and_interleaved_per_round():
    """Each implementation in its own process, started with the passive wait knobs; every round
    times every worker exactly once; the calls are made (and counted) in the worker."""
    names = ["a", "b"]
    with Pool(names) as pool:
        loaded = pool.load({k: (FAKE, {"tag": k}) for k in names})
        res = pool.measure(rounds=4, min_sample_s=0.0)
        log = pool.log
    pids = {loaded[k].info["pid"] for k in names}
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(loaded[k].info["tag"] == k and loaded[k].info["env"] == PASSIVE_ENV for k in names)
    assert all(v.one_call_us > 0 and v.error is None for v in loaded.values())
    timed = [k for k, op in log if op == "time"]
    assert [op for _, op in log[:2]] == ["load"] * 2 and len(timed) == 8
    assert all(sorted(timed[r * 2 : r * 2 + 2]) == names for r in range(4))  # each worker once a round
    for v in res.values():
        assert v["calls"] == 4  # min_sample_s 0: one call a sample, made in the worker
        assert v["warm_calls"] == 4 * WARM_CALLS  # each sample after untimed calls (its data back in cache)
        assert v["min_us"] <= v["p25_us"] <= v["median_us"] <= v["p75_us"]
        assert v["fastest_call_us"] <= v["min_us"] and v["idle_cpu_us"] >= 0


def test_failing_builds_are_reported_and_left_out(monkeypatch):
    """A factory's exception comes back as the worker's error (a PanameraError as `refused`), the
    worker stays usable and is left out of the rounds; without `passive` the knobs are unset; a
    worker that dies or stays silent is a WorkerError quoting its stderr."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    with Pool(["ok", "bad", "refused"], passive=False) as pool:
        loaded = pool.load(
            {"ok": (FAKE, {}), "bad": (FAKE, {"fail": "no such op"}), "refused": (FAKE, {"refuse": True})}
        )
        assert loaded["bad"].error == "ValueError: no such op" and not loaded["bad"].refused
        assert loaded["refused"].refused and "refused by the stand-in" in loaded["refused"].error
        assert loaded["ok"].info["env"] == dict.fromkeys(PASSIVE_ENV)  # the parent's ACTIVE not passed on
        assert set(pool.measure(rounds=2, min_sample_s=0.0)) == {"ok"}
        assert pool.load({"bad": (FAKE, {})})["bad"].error is None  # the same worker builds again
        assert set(pool.measure(rounds=1, min_sample_s=0.0)) == {"ok", "bad"}
        with pytest.raises(WorkerError, match=r"bench worker 'bad' failed(.|\n)*the stand-in exits"):
            pool.load({"bad": (FAKE, {"die": True})})  # a worker that dies: a clear error with its stderr
        pool.LOAD_S = 0.2
        with pytest.raises(WorkerError, match="bench worker 'ok' failed.*no answer within 0.2 s"):
            pool.load({"ok": (FAKE, {"hang_s": 30.0})})  # one that hangs: ended after the wait
