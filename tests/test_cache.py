"""The compile caches a user can see: in memory (panamera/cache.py) and on disk (`panamera cache`)."""

import time

import numpy as np

import panamera as pn
from panamera import cache
from panamera.cli import main


def _sum(shape=(8, 64), name="x"):
    return pn.sum(pn.exp(pn.placeholder(shape, "float32", name=name)) * 0.5, axis=1)


def test_a_repeated_compile_is_a_hit_well_under_a_millisecond():
    pn.compile(_sum(), target="emulator")  # the miss
    before = cache.info().hits
    times = []
    for _ in range(30):
        y = _sum()  # a new graph each time, as a user's loop builds it
        t0 = time.perf_counter()
        pn.compile(y, target="emulator")
        times.append(time.perf_counter() - t0)
    assert cache.info().hits - before == 30
    assert sorted(times)[15] < 5e-3  # measured ~0.06 ms; the budget is generous against noisy machines


def test_a_hit_is_a_new_computation_bound_by_the_new_names():
    k1 = pn.compile(_sum(name="a"), target="emulator")
    k2 = pn.compile(_sum(name="b"), target="emulator")
    assert k2 is not k1 and k2.executor is not k1.executor and k2.source == k1.source
    assert [t.name for t in k2.inputs] == ["b"]
    a = np.random.default_rng(0).random((8, 64)).astype(np.float32)
    np.testing.assert_allclose(k2(b=a), (np.exp(a) * 0.5).sum(1), rtol=1e-5)


def test_placeholder_order_is_part_of_the_key():
    p, q = pn.placeholder((4,), name="p"), pn.placeholder((4,), name="q")
    k1 = pn.compile(pn.sum(p - q), target="emulator")
    q2, p2 = pn.placeholder((4,), name="q2"), pn.placeholder((4,), name="p2")  # created the other way round
    k2 = pn.compile(pn.sum(p2 - q2), target="emulator")
    one, zero = np.ones(4, np.float32), np.zeros(4, np.float32)
    assert k1(one, zero) == 4.0 and k2(one, zero) == -4.0  # positional order is creation order
    assert k2(p2=one, q2=zero) == 4.0


def test_options_are_part_of_the_key_and_cache_false_bypasses_it():
    y = _sum((8, 4096))
    pn.compile(y, target="emulator")
    before = cache.info()
    assert pn.compile(y, target="emulator", deterministic=True).deterministic
    assert pn.compile(y, target="emulator", split=2).plan.kernels[0].blocks_per_reduction == 2
    pn.compile(y, target="emulator", cache=False)
    after = cache.info()
    assert after.hits == before.hits and after.misses == before.misses + 2


def test_disk_cache_info_clear_and_off(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PANAMERA_CACHE", str(tmp_path))
    (tmp_path / "emu_0123.so").write_bytes(b"x" * 10)
    assert main(["cache", "info"]) == 0
    assert f"kernel cache: {tmp_path} (1 file(s)" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 1 file(s)" in capsys.readouterr().out
    assert not list(tmp_path.glob("emu_*"))
    monkeypatch.setenv("PANAMERA_CACHE", "off")
    assert main(["cache", "info"]) == 0
    assert "disabled" in capsys.readouterr().out
