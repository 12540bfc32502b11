"""The on-disk kernel cache is trusted only as far as it is private (runtime/diskcache.py): a
library planted or corrupted there is never loaded, an unusable directory is a warning and a
private fallback, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import panamera as pn
from panamera.runtime import diskcache, emulator

PLANT = r"""
#include <cstdio>
#include <cstdlib>
__attribute__((constructor)) static void planted() {
    if (const char* p = std::getenv("PN_PLANTED")) { if (FILE* f = std::fopen(p, "w")) std::fclose(f); }
}
"""


@pytest.fixture
def fresh(monkeypatch):
    """No library of this process's earlier builds is reused: every build looks at the disk."""
    monkeypatch.setattr(emulator, "_loaded", {})
    monkeypatch.setattr(emulator, "_by_source", {})
    monkeypatch.setattr(diskcache, "_refused", set())


def _kernel(n=37):
    """A small kernel of its own (a shape no other test uses), compiled without the memory cache."""
    x = pn.placeholder((3, n), "float32", name="x")
    return pn.compile(pn.sum(x * 2.0, axis=1), target="emulator", cache=False)


def _check(k, n=37):
    a = np.arange(3 * n, dtype=np.float32).reshape(3, n)
    np.testing.assert_allclose(k(a), (a.astype(np.float64) * 2).sum(1), rtol=4 * n * 2**-23)


def _libs(d: Path) -> list[Path]:
    return sorted(d.glob("emu_*.so"))


def _planted(tmp_path) -> bytes:
    src = tmp_path / "plant.cpp"
    src.write_text(PLANT)
    subprocess.run(["g++", "-shared", "-fPIC", str(src), "-o", str(tmp_path / "plant.so")], check=True)
    return (tmp_path / "plant.so").read_bytes()


def test_the_cache_is_created_private_with_a_recorded_hash(tmp_path, monkeypatch, fresh):
    d = tmp_path / "new" / "cache"
    monkeypatch.setenv("PANAMERA_CACHE", str(d))
    _check(_kernel())
    assert (d.stat().st_mode & 0o777) == 0o700
    (lib,) = _libs(d)
    side = lib.with_name(lib.name + ".sha256")
    assert side.read_text().strip() == diskcache.digest(lib) and (lib.stat().st_mode & 0o077) == 0
    assert not list(d.glob(".emu_*"))  # the temporary files were renamed into place


@pytest.mark.parametrize("sidecar", ["none", "wrong", "garbage"])
def test_a_planted_library_is_never_loaded(tmp_path, monkeypatch, fresh, sidecar):
    built = tmp_path / "built"
    monkeypatch.setenv("PANAMERA_CACHE", str(built))
    _check(_kernel())
    (name,) = [p.name for p in _libs(built)]
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / name).write_bytes(_planted(tmp_path))  # the predictable name, someone else's code
    side = victim / (name + ".sha256")
    if sidecar == "wrong":
        side.write_text(diskcache.digest(built / name) + "\n")  # the digest of the genuine build
    elif sidecar == "garbage":
        side.write_bytes(b"\xff\xfe\x00not a digest")
    marker = tmp_path / "planted-code-ran"
    monkeypatch.setenv("PN_PLANTED", str(marker))
    monkeypatch.setenv("PANAMERA_CACHE", str(victim))
    monkeypatch.setattr(emulator, "_loaded", {})
    monkeypatch.setattr(emulator, "_by_source", {})
    _check(_kernel())
    assert not marker.exists()
    assert diskcache.verified(victim / name) and (victim / name).read_bytes() != (tmp_path / "plant.so").read_bytes()


def test_a_corrupt_entry_is_rebuilt(tmp_path, monkeypatch, fresh, caplog):
    monkeypatch.setenv("PANAMERA_CACHE", str(tmp_path / "a"))
    _check(_kernel())
    (built,) = _libs(tmp_path / "a")
    b = tmp_path / "b"  # another cache (this process has the first one mapped): same entry, truncated
    b.mkdir(mode=0o700)
    (b / built.name).write_bytes(built.read_bytes()[:100])  # a truncated write, a disk error
    shutil.copy(built.with_name(built.name + ".sha256"), b)
    monkeypatch.setenv("PANAMERA_CACHE", str(b))
    monkeypatch.setattr(emulator, "_loaded", {})
    monkeypatch.setattr(emulator, "_by_source", {})
    with caplog.at_level("WARNING", logger="panamera.cache"):
        _check(_kernel())
    assert "rebuilding" in caplog.text and diskcache.verified(b / built.name)


def _unusable(tmp_path, monkeypatch, how: str) -> Path:
    if how == "a file":
        d = tmp_path / "file"
        d.write_text("not a directory")
    elif how == "uncreatable":
        (tmp_path / "file").write_text("")
        d = tmp_path / "file" / "cache"
    elif how == "read-only":
        d = tmp_path / "ro"
        d.mkdir(mode=0o500)
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, m, **kw: False if Path(p) == d else real(p, m, **kw))  # as root too
    elif how == "group-writable":
        d = tmp_path / "shared"
        d.mkdir()
        d.chmod(0o770)
    elif how == "another user's":
        d = tmp_path / "theirs"
        d.mkdir(mode=0o700)
        uid = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    return d


@pytest.mark.parametrize("how", ["a file", "uncreatable", "read-only", "group-writable", "another user's"])
def test_an_unusable_cache_is_a_warning_and_a_private_fallback(tmp_path, monkeypatch, fresh, how):
    d = _unusable(tmp_path, monkeypatch, how)
    monkeypatch.setenv("PANAMERA_CACHE", str(d))
    with pytest.warns(pn.CacheWarning) as seen:
        k = _kernel()
        _check(k)
        _check(_kernel(38), 38)  # warned once per directory
    assert len(seen) == 1 and str(d) in str(seen[0].message) and "private temporary directory" in str(seen[0].message)
    _check(k)
    assert emulator.cache_dir() == diskcache.private_dir()
    assert (diskcache.private_dir().stat().st_mode & 0o777) == 0o700
    if d.is_dir():
        assert not _libs(d)


def test_the_cli_falls_back_without_a_traceback(tmp_path):
    (tmp_path / "file").write_text("")
    env = {**os.environ, "PANAMERA_CACHE": str(tmp_path / "file")}
    code = (
        "import numpy as np, panamera as pn; x = pn.placeholder((2, 5), name='x');"
        "print(pn.compile(pn.sum(x, axis=1), target='emulator')(np.ones((2, 5), np.float32)))"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and "[5. 5.]" in r.stdout
    assert "Traceback" not in r.stderr and "CacheWarning" in r.stderr


def test_concurrent_processes_share_the_cache_safely(tmp_path):
    env = {**os.environ, "PANAMERA_CACHE": str(tmp_path / "c")}
    code = (
        "import numpy as np, panamera as pn; x = pn.placeholder((2, 7), name='x');"
        "assert (pn.compile(pn.sum(x, axis=1), target='emulator')(np.ones((2, 7), np.float32)) == 7).all()"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tmp_path) for _ in range(3)]
    assert [p.wait() for p in procs] == [0, 0, 0]
    libs = _libs(tmp_path / "c")
    assert libs and all(diskcache.verified(p) for p in libs) and not list((tmp_path / "c").glob(".emu_*"))


def test_cache_clear_removes_sidecars(tmp_path, monkeypatch, fresh):
    monkeypatch.setenv("PANAMERA_CACHE", str(tmp_path))
    _check(_kernel())
    from panamera import cache

    assert cache.disk_info().files == 1 and cache.disk_clear() == 1
    assert not os.listdir(tmp_path)
    shutil.rmtree(tmp_path, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.disk_info().files == 0


def test_the_cpu_target_loads_only_verified_libraries(tmp_path, monkeypatch, fresh):
    """target='cpu' builds through the same loader: its predictable `cpu_<hash>.so` planted by
    someone else is rebuilt, never run."""
    from panamera.runtime import cpu

    x = pn.placeholder((3, 41), "float32", name="x")

    def run_once():
        monkeypatch.setattr(cpu, "_loaded", {})
        k = pn.compile(pn.sum(x * 2.0, axis=1), target="cpu")
        a = np.arange(3 * 41, dtype=np.float32).reshape(3, 41)
        np.testing.assert_allclose(k(a), (a.astype(np.float64) * 2).sum(1), rtol=4 * 41 * 2**-23)
        return k

    built = tmp_path / "built"
    monkeypatch.setenv("PANAMERA_CACHE", str(built))
    name = cpu.library_path(run_once().source).name  # the CPU probe may have built its own library here too
    assert (built / name).exists()
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / name).write_bytes(_planted(tmp_path))
    marker = tmp_path / "planted-code-ran"
    monkeypatch.setenv("PN_PLANTED", str(marker))
    monkeypatch.setenv("PANAMERA_CACHE", str(victim))
    run_once()
    assert not marker.exists() and diskcache.verified(victim / name)
