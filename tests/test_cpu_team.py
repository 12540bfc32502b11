"""The CPU target's team placement (runtime/cpu_team.py): a call's other OpenMP threads are kept off the
caller's core, learnt once per calling thread, and nothing is placed where placement cannot help or the
user bound the threads. Each case runs in a fresh Python thread (libgomp: its own pool; the table is
thread_local), through a tiny library that reports the table. Structure only: no timing is asserted."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from panamera.runtime.cpu_team import TEAM_SOURCE

HARNESS = (
    TEAM_SOURCE
    + r"""
#ifdef PN_TEAM_PLACE
extern "C" int pn_team_test(int nt, int nested) {
  if (nested) {
#pragma omp parallel num_threads(2)
    { if (omp_get_thread_num() == 0) pn_team_place(nt); }
  } else {
    pn_team_place(nt);
  }
#pragma omp parallel num_threads(nt)
  { }
  return pn_team_off ? -1 : pn_team_known;  // -1: placement off; else the threads learnt
}
extern "C" int pn_team_state() { return pn_team_known; }
#endif
"""
)
CORES = len(os.sched_getaffinity(0))
pytestmark = [
    pytest.mark.skipif(CORES < 2 or not sys.platform.startswith("linux"), reason="placement needs 2 cores on Linux"),
    pytest.mark.skipif("OMP_PROC_BIND" in os.environ, reason="the user's OMP_PROC_BIND turns placement off"),
]


def _lib():
    from panamera.runtime.cpu import build

    lib = build(HARNESS)
    lib.pn_team_test.argtypes, lib.pn_team_test.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    lib.pn_team_state.argtypes, lib.pn_team_state.restype = (), ctypes.c_int
    return lib


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def _masks() -> dict[int, set[int]]:
    """Every thread of this process: its allowed cores."""
    return {int(p.name): os.sched_getaffinity(int(p.name)) for p in Path("/proc/self/task").iterdir()}


def test_the_team_is_learnt_once_and_kept_off_the_callers_core():
    lib, allowed = _lib(), os.sched_getaffinity(0)

    def call():
        before = set(_masks())  # this fresh thread's pool does not exist yet: its worker is new
        known = lib.pn_team_test(2, 0)
        again = lib.pn_team_test(2, 0)  # learnt once: the same table
        return known, again, os.sched_getaffinity(0), {t: m for t, m in _masks().items() if t not in before}

    known, again, caller, new = _in_thread(call)
    assert known == again == 1 and caller == allowed  # the caller itself is never pinned
    assert len(new) == 1
    (mask,) = new.values()
    assert mask < allowed and len(mask) == len(allowed) - 1  # every allowed core but the caller's


def test_one_thread_places_nothing():
    assert _in_thread(lambda: _lib().pn_team_test(1, 0)) == 0


def test_inside_a_parallel_region_nothing_is_placed():
    assert _in_thread(lambda: _lib().pn_team_test(2, 1)) == 0


def test_a_caller_allowed_one_core_places_nothing():
    lib, core = _lib(), min(os.sched_getaffinity(0))

    def call():
        os.sched_setaffinity(0, {core})  # this thread only
        return lib.pn_team_test(2, 0)

    assert _in_thread(call) == -1


def test_panamera_cpu_place_0_turns_it_off(monkeypatch):
    monkeypatch.setenv("PANAMERA_CPU_PLACE", "0")  # read by C getenv when a thread first runs 2 threads
    assert _in_thread(lambda: _lib().pn_team_test(2, 0)) == -1


def _fresh(code: str, **env) -> str:
    """The last word `code` prints in a fresh process (libgomp reads its environment when it loads)."""
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, cwd=root, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.split()[-1]


def test_the_users_omp_proc_bind_stands():
    assert (
        _fresh("from tests.test_cpu_team import _lib; print(_lib().pn_team_test(2, 0))", OMP_PROC_BIND="true") == "-1"
    )


def test_a_forked_child_forgets_the_parents_threads():
    code = (
        "import os; from tests.test_cpu_team import _lib; lib = _lib(); assert lib.pn_team_test(2, 0) == 1\n"
        "pid = os.fork()\n"
        "if pid == 0: os._exit(10 + lib.pn_team_state())\n"
        "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) - 10)"
    )
    assert _fresh(code) == "0"


def test_a_program_entry_places_its_team_and_results_hold():
    import panamera as pn

    x = pn.placeholder((64, 96), "float32")
    k = pn.compile(pn.sum(x, axis=0), target="cpu")
    assert "void pn_program(void** pn_b, int pn_nt) {\n  pn_team_place(pn_nt);" in k.cpu_source
    a = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)
    ref = a.astype(np.float64).sum(0)
    tol = 8 * np.finfo(np.float32).eps * np.sqrt(64) * np.abs(a).sum(0).max()  # 64 terms of float32
    for threads in (1, 2):
        assert np.abs(_in_thread(lambda t=threads: k(a, threads=t)) - ref).max() <= tol
