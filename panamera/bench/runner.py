"""Run a benchmark suite: plan every workload under every baseline, model it, measure compile
time (and kernel time where a GPU is present), write results.json and summary.md."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .. import logs
from ..compiler import compile as pn_compile
from ..errors import Unsupported
from ..model.gpu import GPUSpec
from .baselines import DETERMINISTIC, PEER_NAMES, PLANS, SINGLE, STANDINS, UNFUSED, plan_all
from .suites import PAPER_MEANS, SUITES, Workload

_log = logs.get("bench")


def compile_time(build, repeat: int = 3) -> float:
    """Median seconds, as a user waits for a first compile: building the graph, planning (the
    model's search: no schedule database, no compile cache) and rendering the CUDA source."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        pn_compile(build(), target="emulator", use_database=False, cache=False)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def binary_time(build, repeat: int = 3) -> float | None:
    """Median seconds from the CUDA source to an sm_90 binary through NVRTC (the CUDA backend's
    path), or None where NVRTC is not installed."""
    from ..runtime import nvrtc

    if not nvrtc.available():
        return None
    source = pn_compile(build(), target="emulator").source
    return statistics.median(nvrtc.compile_source(source) for _ in range(repeat))


def _gpu_available() -> bool:
    from ..runtime import cuda as cuda_backend

    return cuda_backend.available()


def measure_us(run: Callable[[], object], gpu: GPUSpec, repeat: int = 20) -> float:
    """Median µs of `run` timed with CUDA events after warm-up, with L2 flushed before each run."""
    import cupy as cp

    flush = cp.empty(2 * gpu.l2_size // 4, dtype=cp.float32)
    for _ in range(3):
        run()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(repeat):
        flush.fill(0)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    return statistics.median(times)


def _measured(w: Workload, gpu: GPUSpec, repeat: int) -> dict:
    """Measured µs of Panamera's plan and of the array library's own reduction (CuPy: CUB)."""
    import cupy as cp

    outs = w.build()
    k = pn_compile(outs, target="cuda", gpu=gpu)
    rng = np.random.default_rng(0)
    arrays = []
    for t in k.inputs:
        a = rng.random(t.shape) < 0.5 if t.dtype.name == "bool" else rng.standard_normal(t.shape).astype(t.dtype.np)
        arrays.append(cp.asarray(a))
    out = {"panamera": measure_us(lambda: k(*arrays), gpu, repeat)}
    t = outs[0]
    if w.suite == "single" and t.op == "reduce":
        axes, x = t.attr("axes"), arrays[0]
        fn = {"sum": cp.sum, "max": cp.max, "and": cp.all}.get(t.attr("combiner").name)
        if fn is not None:
            out["cupy"] = measure_us(lambda: fn(x, axis=axes), gpu, repeat)
        try:
            import torch

            tx = torch.as_tensor(x, device="cuda")
            tfn = {"sum": torch.sum, "max": torch.amax, "and": torch.all}[t.attr("combiner").name]
            out["torch"] = measure_us(lambda: tfn(tx, dim=axes) if axes else tfn(tx), gpu, repeat)
        except Exception:  # PyTorch not installed (or no CUDA build): no torch column
            pass
    return out


def run_workload(
    w: Workload, gpu: GPUSpec, measure: bool = False, repeat: int = 20, compiles: int = 3, nvrtc_times: bool = True
) -> list[dict]:
    """One record per plan of `w` (PLANS order; a peer without a kernel for `w` has none). Panamera's
    record also carries every peer's modeled time, ratio and plan, and the best peer."""
    plans = plan_all(w.build, gpu, backward=w.backward)
    ct = compile_time(w.build, compiles)
    bt = binary_time(w.build, compiles) if nvrtc_times else None
    measured = _measured(w, gpu, repeat) if measure else {}
    records = []
    for name in PLANS:
        if name not in plans:
            continue
        r = plans[name]
        e = r.estimate
        rec = {
            "workload": w.name,
            "suite": w.suite,
            "dtype": w.dtype,
            "plan": name,
            "kind": "panamera" if name == "panamera" else "peer" if name in PEER_NAMES else "stand-in",
            "gpu": gpu.name,
            "modeled_us": round(e.total_us, 3),
            "limit_us": round(e.limit_us, 3),
            "ratio_to_limit": round(e.ratio_to_limit, 3),
            "parts_us": {
                k: round(getattr(e, f"{k}_us"), 3) for k in ("launch", "dram", "l2", "issue", "sfu", "tail", "atomic")
            },
            "dram_bytes": e.dram_bytes,
            "compulsory_bytes": e.compulsory_bytes,
            "launches": e.launches,
            "blocks": r.blocks,
            "atomics": r.atomics,
            "compile_s": round(ct if name == "panamera" else r.compile_s, 5),
        }
        if name == "panamera" and bt is not None:
            rec["nvrtc_s"] = round(bt, 5)
        if r.splits:
            rec["splits"] = list(r.splits)
        if r.description:
            rec["plan_description"] = r.description
        if name == "panamera":
            for lib in ("cupy", "torch"):
                if lib in measured:
                    rec[f"measured_{lib}_us"] = round(measured[lib], 3)
            if "panamera" in measured:
                rec["measured_us"] = round(measured["panamera"], 3)
        records.append(rec)
    pan = records[0]
    peers = {r["plan"]: r for r in records if r["kind"] == "peer"}
    pan["peers"] = {
        n: {"modeled_us": r["modeled_us"], "ratio_to_limit": r["ratio_to_limit"], "plan": r.get("plan_description", "")}
        for n, r in peers.items()
    }
    if peers:
        best = min(peers.values(), key=lambda r: r["modeled_us"])
        pan["best_peer"] = best["plan"]
        pan["speedup_over_best_peer"] = round(best["modeled_us"] / pan["modeled_us"], 3)
    return records


def geomean(xs) -> float:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


SHORT = {"pytorch-eager": "torch", "cub": "cub", "inductor": "inductor", "triton-tutorial": "triton",
         "tvm-default": "tvm", "quack": "quack", "liger": "liger", "fa3-decode": "fa3", "flashinfer-decode": "flashinfer",
         "cublas": "cublas", "triton-splitk": "triton split-K", "flash-decoding": "flash-dec.", "marlin": "marlin",
         DETERMINISTIC: "det.", SINGLE: "1-block*", UNFUSED: "unfused*"}  # fmt: skip


def summarize(records: list[dict], gpu: GPUSpec, command: str, skipped=()) -> str:
    """The summary tables; `skipped`: (workload, reason) of the workloads Panamera refused."""
    by = {}
    for r in records:
        by.setdefault((r["suite"], r["workload"], r["dtype"]), {})[r["plan"]] = r
    lines = [
        "# Panamera benchmark summary",
        "",
        f"Command: `{command}`. GPU model: {gpu.name}. **All times are modeled** from each plan with",
        "docs/GPU_MODEL.md unless a `measured` column says otherwise; compile times are measured on this CPU.",
        "Peers are planned from their own rules (panamera/bench/peers.py, bench/README.md); `*` marks a",
        "stand-in planned by Panamera's machinery; `-` where a peer has no kernel for the workload.",
        "",
    ]
    for suite in dict.fromkeys(k[0] for k in by):
        rows = [(k, v) for k, v in by.items() if k[0] == suite]
        cols = [c for c in (*PEER_NAMES, *STANDINS) if any(c in p for _, p in rows)]  # the plans this suite has
        peer_cols = [c for c in cols if c in PEER_NAMES]
        head = " | ".join(f"{SHORT[c]} us" for c in cols)
        lines += [
            f"## {suite}",
            "",
            f"| workload | dtype | panamera us | limit us | ratio | {head} | best peer | speedup over best peer | launches | split | compile ms |",
            "|---|---|---|---|---|" + "---|" * len(cols) + "---|---|---|---|---|",
        ]
        for (_, name, dt), p in rows:
            pa = p["panamera"]
            cells = " | ".join(f"{p[c]['modeled_us']:.1f}" if c in p else "-" for c in cols)
            best = pa.get("best_peer", "-")
            sp = f"{pa['speedup_over_best_peer']:.2f}x" if "speedup_over_best_peer" in pa else "-"
            lines.append(
                f"| {name} | {dt} | {pa['modeled_us']:.1f} | {pa['limit_us']:.1f} | {pa['ratio_to_limit']:.2f} | "
                f"{cells} | {SHORT.get(best, best)} | {sp} | {pa['launches']} | "
                f"{'/'.join(map(str, pa.get('splits', []))) or '-'} | {pa['compile_s'] * 1e3:.1f} |"
            )
        pan = [p["panamera"] for _, p in rows]
        sps = [r["speedup_over_best_peer"] for r in pan if "speedup_over_best_peer" in r]
        losses = sorted((r["speedup_over_best_peer"], r["workload"], r["dtype"]) for r in pan
                         if r.get("speedup_over_best_peer", 2) < 1.0)  # fmt: skip
        g = {c: geomean(p[c]["modeled_us"] / p["panamera"]["modeled_us"] for _, p in rows if c in p) for c in cols}
        within = sum(1 for r in pan if r["ratio_to_limit"] <= 1.10)
        peer_ratio = {c: geomean(p[c]["ratio_to_limit"] for _, p in rows if c in p) for c in peer_cols}
        lines += [
            "",
            f"Geometric mean speedup of Panamera over the best peer per workload (modeled): **{geomean(sps):.2f}x**; "
            f"Panamera is slower than the best peer on {len(losses)}/{len(sps)} workloads"
            + (f" (worst: {losses[0][1]} {losses[0][2]}, {losses[0][0]:.2f}x)" if losses else "")
            + ". "
            "Over each plan: " + ", ".join(f"{c} {g[c]:.2f}x" for c in cols if math.isfinite(g[c])) + ". "
            f"Ratio to the limit: Panamera geomean {geomean(r['ratio_to_limit'] for r in pan):.2f}, worst "
            f"{max(r['ratio_to_limit'] for r in pan):.2f}, {within}/{len(pan)} within 1.10x; peers' geomean "
            + ", ".join(f"{SHORT[c]} {peer_ratio[c]:.2f}" for c in peer_cols if math.isfinite(peer_ratio[c]))
            + ". "
            f"Compile time (graph, plan and source, no cache or database; this machine's CPU): median "
            f"{statistics.median(r['compile_s'] for r in pan) * 1e3:.1f} ms, max "
            f"{max(r['compile_s'] for r in pan) * 1e3:.1f} ms"
            + (
                f"; source to sm_90 binary through NVRTC: median "
                f"{statistics.median(r['nvrtc_s'] for r in pan if 'nvrtc_s' in r) * 1e3:.0f} ms, max "
                f"{max(r['nvrtc_s'] for r in pan if 'nvrtc_s' in r) * 1e3:.0f} ms"
                if any("nvrtc_s" in r for r in pan)
                else ""
            )
            + ".",
            "",
            f"Paper (V100, measured against vendor libraries and auto-tuned TVM/Ansor): {PAPER_MEANS.get(suite, '-')}. "
            "Our peers are modeled from their launch rules on an H100, not measured, so the figures differ in kind.",
            "",
        ]
        meas = [(n, p["panamera"]) for (_, n, _), p in rows if "measured_us" in p["panamera"]]
        if meas:
            lines += [
                "| workload | modeled us | measured us | measured CuPy us | measured torch us |",
                "|---|---|---|---|---|",
            ]
            lines += [
                f"| {n} | {r['modeled_us']:.1f} | {r['measured_us']:.1f} | {r.get('measured_cupy_us', '-')} | {r.get('measured_torch_us', '-')} |"
                for n, r in meas
            ]
            lines.append("")
    if skipped:
        lines += ["## Not planned", ""]
        lines += [f"- {w.suite} {w.name} {w.dtype}: {reason}" for w, reason in skipped]
        lines.append("")
    return "\n".join(lines)


def _git_commit() -> str | None:
    """The commit of the source tree Panamera runs from ("+dirty" with uncommitted changes), or
    None outside a git checkout (an installed wheel)."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("+dirty" if dirty else "")


def _plain(v):
    """A spec field as JSON holds it: nested dataclasses (the measured `Limit`) as dicts."""
    return dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v


def run_meta(gpu: GPUSpec, command: str, measured: bool) -> dict:
    """What makes results.json self-describing: Panamera's version and commit, the date, the
    command, the GPU spec the plans were modeled for, and the host the compile times are from.

    >>> from panamera.model.gpu import H100
    >>> m = run_meta(H100, "panamera bench", False)
    >>> sorted(m), m["gpu"]["name"], m["times"], sorted(m["gpu"]["measured_limit"])[:2]
    (['command', 'commit', 'date', 'gpu', 'host', 'panamera', 'times'], 'H100-SXM5', 'modeled', ['eta_read', 'eta_write'])
    >>> _ = json.dumps(m)
    """
    from .. import __version__

    spec = {f.name: _plain(getattr(gpu, f.name)) for f in dataclasses.fields(gpu) if f.name != "sources"}
    return {
        "panamera": __version__,
        "commit": _git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "times": "modeled and measured" if measured else "modeled",
        "gpu": spec,
        "host": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "processor": platform.processor() or None,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        },
    }


def run_bench(
    suites: list[str],
    gpu: GPUSpec,
    out: str | None = None,
    plot: bool = False,
    measure: bool | None = None,
    repeat: int = 20,
    workloads: list[Workload] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    command: str = "panamera bench",
    nvrtc_times: bool = True,
) -> tuple[list[dict], str]:
    """Run the suites (or the given workloads); returns (records, summary markdown)."""
    measure = _gpu_available() if measure is None else measure
    if measure and not _gpu_available():
        from ..errors import BackendError

        raise BackendError("bench --measure: timing kernels needs CuPy and a CUDA GPU; none is available here")
    if plot:  # before the work, not after it
        logs.require_extra(logs.Extra.MATPLOTLIB, "bench --plot")
    ws = workloads if workloads is not None else [w for s in suites for w in SUITES[s]()]
    records, skipped = [], []
    with logs.steps("workload", len(ws), _log) as bar:
        for k, w in enumerate(ws):
            what = f"{w.suite} {w.name} {w.dtype}"
            bar.step(what)
            if progress:
                progress(k, len(ws), what)
            t0 = time.perf_counter()
            try:
                records += run_workload(w, gpu, measure, repeat, nvrtc_times=nvrtc_times)
            except Unsupported as e:  # a graph Panamera refuses by name: listed, not planned
                skipped.append((w, str(e)))
                _log.warning("%s: not planned: %s", what, e)
            _log.debug("%s: %.2f s", what, time.perf_counter() - t0)
    summary = summarize(records, gpu, command, skipped)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump({"meta": run_meta(gpu, command, measure), "records": records}, f, indent=1)
        with open(os.path.join(out, "summary.md"), "w") as f:
            f.write(summary)
        if plot:
            from .plots import plot_all

            for path in plot_all(records, out):
                summary += f"\n![{os.path.basename(path)}]({os.path.basename(path)})\n"
            with open(os.path.join(out, "summary.md"), "w") as f:
                f.write(summary)
    return records, summary
