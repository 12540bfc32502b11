"""Does a CPU call's team placement (panamera/runtime/cpu_team.py) pay here, now? One process, so one
load: each named CPU-bench workload's Panamera program built twice, as shipped ("placed") and with its
entry's `pn_team_place` call removed ("unplaced": the scheduler alone decides where the woken worker
runs), and onnxruntime's CPU session, each at 1 and 2 threads, sampled in an order shuffled per round.
Prints medians (us) and the 1 -> 2 thread speedups, with the load average. Run it under the CPU bench's
passive pools:

    OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=0 python scripts/cpu_team_ab.py 20 "A2#7 f32[64x128x768]"

Measured here (issue 24) at load 7-8 every 2-thread figure was noise; idle, expect the two builds alike.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import numpy as np

from panamera.bench.cpu_impls import build as build_peer
from panamera.bench.cpu_impls import find_workload, inputs
from panamera.bench.cpu_measure import _tuple
from panamera.bench.cpu_recipes import PanameraBackend
from panamera.compiler import compile as pn_compile
from panamera.frontend.tensor import placeholder
from panamera.runtime.cpu import build
from panamera.runtime.cpu_call import buffer_order
from panamera.runtime.cpu_team import TEAM_CALL
from panamera.runtime.executor import _alloc


def calls(name: str) -> dict:
    """(variant, threads) -> a no-argument call, for the workload `name`."""
    w = find_workload(name)
    holders = [placeholder(s, d, name=f"x{k}") for k, (s, d) in enumerate(zip(w.shapes, w.input_dtypes))]
    k = pn_compile(list(_tuple(w.recipe(PanameraBackend(), *holders))), target="cpu")
    if k.executor.fast() is None:
        raise SystemExit(f"{name}: not one C entry (a BLAS step): not compared")
    src = k.cpu_source
    libs = {"placed": build(src), "unplaced": build(src.replace(TEAM_CALL, "", 1) + "\n// unplaced\n")}
    bufs = {t.key: a for t, a in zip(k.plan.inputs, inputs(w))}
    bufs.update({key: _alloc(np.empty, spec) for key, spec in k.plan.buffers.items() if key not in bufs})
    order = buffer_order(k.plan)
    table = (ctypes.c_void_p * len(order))(*[bufs[x].ctypes.data for x in order])
    out = {}
    for tag, lib in libs.items():
        f = lib.pn_program
        f.argtypes, f.restype = (ctypes.c_void_p, ctypes.c_int), None
        out.update({(tag, t): (lambda f=f, t=t, keep=bufs: f(table, t)) for t in (1, 2)})  # keep: the arrays live
    out.update({("onnxruntime", t): build_peer("onnxruntime", name, t)[0] for t in (1, 2)})
    return out


def sample(f, seconds: float = 2e-3) -> float:
    """Microseconds per call: the mean of back-to-back calls over `seconds`, after 4 untimed ones."""
    for _ in range(4):
        f()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        f()
        n += 1
    return (time.perf_counter() - t0) / n * 1e6


def main(rounds: int, names: list[str]) -> None:
    rng = np.random.default_rng(0)
    for name in names:
        fns = calls(name)
        res: dict = {x: [] for x in fns}
        load0 = os.getloadavg()[0]
        for _ in range(rounds):
            for i in rng.permutation(len(fns)):
                x = list(fns)[i]
                res[x].append(sample(fns[x]))
        m = {x: float(np.median(v)) for x, v in res.items()}
        row = " | ".join(
            f"{v} {m[v, 1]:.0f} -> {m[v, 2]:.0f} ({m[v, 1] / m[v, 2]:.2f}x)"
            for v in ("unplaced", "placed", "onnxruntime")
        )
        print(f"{name}: {row} | load {load0:.1f}-{os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
