"""Measured, side by side in one run: Panamera's CPU target (target="cpu") against numpy, PyTorch
eager and torch.compile (Inductor's C++/OpenMP backend) on reductions and norms.

Per workload and thread count: every implementation is warmed up, then `--rounds` rounds run
each implementation once in an order shuffled per round (interleaved, so that a burst of load
from other processes hits all of them alike), each sample the mean of `--inner` back-to-back
calls; the table gives the median and the interquartile range (p25-p75) in milliseconds.
numpy is single-threaded for these ops; Inductor is compiled once, with all threads.
Every Panamera result is checked against numpy in float64 first (max relative error shown).

    PYTHONPATH=. python bench/cpu_measure.py            # writes bench/cpu/results.{md,json}
    PYTHONPATH=. python bench/cpu_measure.py --no-inductor --rounds 5
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import time
from pathlib import Path

import numpy as np

import panamera as pn
from panamera.schedule.cpu_mapper import CpuMachine

OUT = Path(__file__).parent / "cpu"


def workloads():
    """(name, panamera outputs builder, numpy fn, torch fn, input shapes)."""
    import torch

    def ln_np(x, w, b):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b

    def sm_np(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    return [
        ("row sum(exp) 256x8192", lambda x: pn.sum(pn.exp(x), axis=1), lambda a: np.exp(a).sum(1),
         lambda t: torch.exp(t).sum(1), [(256, 8192)]),
        ("row sum 4096x1024", lambda x: pn.sum(x, axis=1), lambda a: a.sum(1), lambda t: t.sum(1), [(4096, 1024)]),
        ("row max 4096x1024", lambda x: pn.max(x, axis=1), lambda a: a.max(1), lambda t: t.amax(1), [(4096, 1024)]),
        ("column sum 4096x1024", lambda x: pn.sum(x, axis=0), lambda a: a.sum(0), lambda t: t.sum(0), [(4096, 1024)]),
        ("sum all 2^22", lambda x: pn.sum(x), lambda a: a.sum(), lambda t: t.sum(), [(1 << 22,)]),
        ("few rows mean 4x2^20", lambda x: pn.mean(x, axis=1), lambda a: a.mean(1), lambda t: t.mean(1), [(4, 1 << 20)]),
        ("softmax 1024x1024", lambda x: pn.nn.softmax(x, axis=1), sm_np, lambda t: torch.softmax(t, 1), [(1024, 1024)]),
        ("layer_norm 1024x768", lambda x, w, b: pn.nn.layer_norm(x, w, b), ln_np,
         lambda x, w, b: torch.nn.functional.layer_norm(x, (768,), w, b), [(1024, 768), (768,), (768,)]),
    ]  # fmt: skip


def sample(fn, inner: int) -> float:
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner * 1e3


def peers(k, arrays, tensors, np_fn, torch_fn, n: int, inductor) -> dict:
    """The implementations of one workload at n threads (torch's thread count is set by the caller)."""
    impls = {
        "panamera": lambda: k(*arrays, threads=n),
        "numpy": lambda: np_fn(*arrays),
        "torch eager": lambda: torch_fn(*tensors),
    }
    if inductor is not None:
        impls["torch.compile (Inductor)"] = lambda: inductor(*tensors)
    return impls


def measure(impls: dict, rounds: int, inner: int) -> dict:
    for fn in impls.values():  # warm-up
        for _ in range(3):
            fn()
    samples = {k: [] for k in impls}
    names = list(impls)
    for _ in range(rounds):
        random.shuffle(names)
        for k in names:
            samples[k].append(sample(impls[k], inner))
    out = {}
    for k, s in samples.items():
        q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0]] * 3
        out[k] = {"median_ms": statistics.median(s), "p25_ms": q[0], "p75_ms": q[2], "min_ms": min(s)}
    return out


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--only", default="", help="substring of the workload names to run")
    args = ap.parse_args()
    machine = CpuMachine.detect()
    threads = sorted({1, machine.cores})
    rng = np.random.default_rng(0)
    rows = []
    for name, build, np_fn, torch_fn, shapes in workloads():
        if args.only and args.only not in name:
            continue
        holders = [pn.placeholder(s, "float32", name=f"a{k}") for k, s in enumerate(shapes)]
        k = pn.compile(build(*holders), target="cpu")
        arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        tensors = [torch.from_numpy(a) for a in arrays]
        ref = np_fn(*[a.astype(np.float64) for a in arrays])
        got = np.asarray(k(*arrays), np.float64)
        err = float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))
        inductor = None
        if not args.no_inductor:
            torch.set_num_threads(machine.cores)
            torch._dynamo.reset()
            inductor = torch.compile(torch_fn)
            inductor(*tensors)
        for n in threads:
            torch.set_num_threads(n)
            impls = peers(k, arrays, tensors, np_fn, torch_fn, n, inductor if n == machine.cores else None)
            res = measure(impls, args.rounds, args.inner)
            rows.append(
                {
                    "workload": name,
                    "threads": n,
                    "plan": k.explain().splitlines()[1:],
                    "max_rel_err": err,
                    "results": res,
                }
            )
            best = min(v["median_ms"] for kk, v in res.items() if kk != "panamera")
            print(f"{name:28s} t={n} panamera {res['panamera']['median_ms']:.3f} ms, best peer {best:.3f} ms, "
                  f"speedup {best / res['panamera']['median_ms']:.2f}x", flush=True)  # fmt: skip
    meta = {
        "cpu": machine.name,
        "cores": machine.cores,
        "simd_bytes": machine.simd_bytes,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "rounds": args.rounds,
        "inner": args.inner,
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (OUT / "results.md").write_text(table(meta, rows))
    print(table(meta, rows))


def table(meta: dict, rows: list) -> str:
    peers = ["numpy", "torch eager", "torch.compile (Inductor)"]
    lines = [
        f"# Panamera target='cpu', measured ({meta['date']})",
        "",
        f"{meta['cpu']}, {meta['cores']} usable cores, SIMD {meta['simd_bytes'] * 8} bits; torch {meta['torch']}, "
        f"numpy {meta['numpy']}; load average at the end {', '.join(f'{x:.1f}' for x in meta['load_average'])} "
        "(a shared machine: spreads are wide, hence also the best-of speedup). Median [p25-p75] ms of "
        f"{meta['rounds']} interleaved rounds x {meta['inner']} calls. Speedup: best peer / Panamera.",
        "",
        "| workload | threads | Panamera | "
        + " | ".join(peers)
        + " | speedup (median) | speedup (min) | max rel err |",
        "|---|---|---|" + "---|" * len(peers) + "---|---|---|",
    ]

    def cell(r):
        return f"{r['median_ms']:.3f} [{r['p25_ms']:.3f}-{r['p75_ms']:.3f}]" if r else "-"

    speedups = {}
    for row in rows:
        res = row["results"]
        best = min(v["median_ms"] for k, v in res.items() if k != "panamera")
        s = best / res["panamera"]["median_ms"]
        s_min = min(v["min_ms"] for k, v in res.items() if k != "panamera") / res["panamera"]["min_ms"]
        speedups.setdefault(row["threads"], []).append(s)
        lines.append(
            f"| {row['workload']} | {row['threads']} | {cell(res['panamera'])} | "
            + " | ".join(cell(res.get(p)) for p in peers)
            + f" | {s:.2f}x | {s_min:.2f}x | {row['max_rel_err']:.1e} |"
        )
    lines.append("")
    for n, s in sorted(speedups.items()):
        geo = float(np.exp(np.mean(np.log(s))))
        lines.append(f"- {n} thread(s): geomean speedup (medians) {geo:.2f}x over the best peer, lowest {min(s):.2f}x")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
