"""Symbolic CPU kernels against the static CPU kernels of the same size, measured on this machine.

For each workload and size: the symbolic program (one `pn.compile` over symbols, target cpu, its
class compiled before timing) and the static program compiled at that size (target cpu), timed
interleaved in one loop (`--rounds` rounds, each timing both; medians and the spread p25-p75):
- call: one whole Python call (binding, class pick, allocation, the kernels, delivery);
- kernel: the kernels' entry points alone (ctypes calls on prepared buffers);
- bind: the symbolic program's binding of the symbols and its class pick.
Ratios are symbolic / static (1.00: the same). Timings taken while other processes run are noisy:
compare the ratios, each from one interleaved loop.

    PYTHONPATH=. python bench/dynamic/cpu_symbolic.py [--rounds 15] [--threads N]
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import time

import numpy as np

import panamera as pn
from panamera.dynamic import members, specialize
from panamera.frontend import symbolic
from panamera.runtime.executor import _alloc


def workloads():
    x = pn.placeholder(("B", 768), name="x")
    y = pn.placeholder(("B", 1024), name="x")
    c = pn.placeholder(("N", 768), name="x")
    return {
        "row sum (B, 768)": ((pn.sum(x, axis=1),), "B", 768),
        "softmax (B, 1024)": ((pn.nn.softmax(y),), "B", 1024),
        "layer_norm (B, 768)": ((pn.nn.layer_norm(x),), "B", 768),
        "column sum (N, 768)": ((pn.sum(c, axis=0),), "N", 768),
    }


def _kernels_symbolic(k, a: np.ndarray, sizes: dict):
    """The symbolic class's entry points with their buffers and extents bound (as _run_cpu)."""
    ck = k._class(k.size_class(sizes))
    bufs = {f"t:{k.inputs[0].uid}": a}
    calls = []
    syms = [sizes[n] for n in k.program.parameters]
    for group, kern, fn in zip(members(k.program), ck.kernels, ck.entries):
        for m in group:
            bufs[f"t:{m.result.uid}"] = np.empty(math.prod(symbolic.evaluate(m.result.shape, sizes)), m.result.dtype.np)
        M, N = symbolic.evaluate((group[0].M, group[0].N), sizes)  # noqa: N806
        ptrs = (ctypes.c_void_p * len(kern.buffers))(*[bufs[b].ctypes.data for b in kern.buffers])
        xs = (ctypes.c_longlong * (2 + len(syms)))(M, N, *syms)
        calls.append((fn, ptrs, xs))
    return calls, bufs


def _kernels_static(s, a: np.ndarray):
    ex = s.executor
    fns = ex._entry_points()
    bufs = {ex.plan.inputs[0].key: a}
    for key, spec in ex.plan.buffers.items():
        bufs.setdefault(key, _alloc(np.empty, spec))
    calls = []
    for fn, (_, keys, host) in zip(fns, ex.kernels):
        if host is None:
            calls.append((fn, (ctypes.c_void_p * max(1, len(keys)))(*[bufs[key].ctypes.data for key in keys]), None))
    return calls, bufs


def _time(f, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t0) / reps * 1e6


def measure(dyn, st, a: np.ndarray, sizes: dict, threads: int, rounds: int) -> dict[str, list[float]]:
    """`rounds` interleaved rounds of the five timings (us per call), each ~2 ms of repeats."""
    scalls, sbufs = _kernels_symbolic(dyn, a, sizes)  # the buffers stay alive while the kernels write them
    tcalls, tbufs = _kernels_static(st, a)

    def ksym():
        for fn, p, x in scalls:
            fn(p, x, threads)

    def kst():
        for fn, p, _ in tcalls:
            fn(p, threads)

    timed = {
        "cs": lambda: dyn(a, threads=threads),
        "ct": lambda: st(a, threads=threads),
        "ks": ksym,
        "kt": kst,
        "bind": lambda: dyn.size_class(dyn.bind_sizes([a])),
    }
    reps = {k: max(1, int(2000 / max(_time(f, 1), 1.0))) for k, f in timed.items()}
    rows: dict[str, list[float]] = {k: [] for k in timed}
    for _ in range(rounds):
        for k, f in timed.items():
            rows[k].append(_time(f, reps[k]))
    del sbufs, tbufs
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sizes", default="8,256,4096")
    args = ap.parse_args()
    threads = args.threads or len(os.sched_getaffinity(0))
    rng = np.random.default_rng(0)
    print(
        f"threads {threads}; load average {os.getloadavg()[0]:.1f}; medians over {args.rounds} interleaved rounds (us)"
    )
    print(f"{'workload':24} {'size':>6} | {'call sym':>9} {'call st':>9} {'ratio':>6} | "
          f"{'kern sym':>9} {'kern st':>9} {'ratio':>6} | {'bind':>5}")  # fmt: skip
    for name, (outs, sym, n) in workloads().items():
        dyn = pn.compile(outs[0], target="cpu")
        for b in (int(v) for v in args.sizes.split(",")):
            sizes = {sym: b}
            a = (rng.random((b, n)) * 2 - 0.7).astype(np.float32)
            st = pn.compile(specialize(outs, sizes)[0], target="cpu")
            np.testing.assert_allclose(dyn(a), st(a), rtol=1e-4, atol=1e-4)  # both right (tested elsewhere)
            rows = measure(dyn, st, a, sizes, threads, args.rounds)
            med = {k: float(np.median(v)) for k, v in rows.items()}
            print(f"{name:24} {b:>6} | {med['cs']:9.1f} {med['ct']:9.1f} {med['cs'] / med['ct']:6.2f} | "
                  f"{med['ks']:9.1f} {med['kt']:9.1f} {med['ks'] / med['kt']:6.2f} | {med['bind']:5.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
