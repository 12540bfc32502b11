"""`panamera bench --measure` without a GPU: Panamera's CPU kernels (target="cpu") timed side by
side with numpy, PyTorch eager, torch.compile (Inductor's CPU backend) and onnxruntime's CPU
provider, in one run, with the CPU model's prediction beside each measured time.

Per workload (panamera/bench/cpu_recipes.py) and thread count (1, and every usable core): each
implementation runs in its own worker process (panamera/bench/cpu_isolated.py: spawned once per run, its
libraries' idle thread pools asleep rather than spinning, its thread counts set inside it:
Panamera by `threads=`, numpy's BLAS through threadpoolctl, torch by set_num_threads, Inductor
compiled per count, onnxruntime by `intra_op_num_threads`; numpy's element-wise work is
single-threaded whatever the count). Each is warmed up, then `rounds` rounds ask every worker in
an order shuffled per round (interleaved: a burst of load from other processes hits all alike)
for a sample, the mean of enough back-to-back calls to last `min_sample_s`, each call timed in
the worker; results give the median and the p25-p75 spread. Every Panamera result is checked
against the recipe in float64 numpy first, with a tolerance from the output dtype and the
reduction length. Workloads the CPU target refuses, or too large for this machine, are listed as
skipped with the reason. The run is labelled with the CPU, thread counts, the harness and its
knobs, date and the load average at its start (over 1.5: the figures are marked untrustworthy).
The whole exported models (cpu_models.py) run in the same harness.

>>> from panamera.bench.cpu_recipes import cpu_workloads
>>> [w.name for w in select(cpu_workloads(), "norms", default_only=True)][:2]
['softmax [6144x128]', 'softmax [64x30522]']
"""

from __future__ import annotations

import datetime
import json
import math
import os
from pathlib import Path

import ml_dtypes
import numpy as np

from ..errors import PanameraError
from .cpu_isolated import ORT_NO_SPIN, WorkerError
from .cpu_recipes import NOT_COVERED, CpuWorkload

PEERS = ("numpy", "torch eager", "torch.compile", "onnxruntime")
COLOURS = dict(zip(PEERS, ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")))  # one per peer, in every CPU chart
LOAD_WARNING = 1.5
MAX_INPUT_BYTES = 128 << 20
SUITES = ("single", "subgraphs", "norms", "contractions", "models")


INDUCTOR = True  # time torch.compile (each compile takes seconds; the tests turn it off)
EAGER_PEERS = ("numpy", "torch eager")  # timed beside Panamera (each a worker process: a test times fewer)


def measure_on_cpu() -> bool:
    """Whether `bench --measure` times the CPU target: no GPU for CuPy here."""
    from .runner import _gpu_available

    return not _gpu_available()


def bench_cpu(suite: str, out: str | None, plot: bool, rounds: int, command: str, progress=None) -> str:
    """`panamera bench --measure` on the CPU: "all" is the default set of the single, sub-graph,
    norm and contraction suites (about three minutes), a suite name all of its workloads, "tiny"
    four small ones, "models" the exported models against onnxruntime (cpu_models.py); returns
    the markdown summary."""
    from .cpu_recipes import cpu_workloads, tiny_cpu

    if suite == "models":
        return bench_models(out, rounds, command, progress)
    ws = tiny_cpu() if suite == "tiny" else select(cpu_workloads(), suite, default_only=suite == "all")
    _, text = run_cpu_measure(ws, out, plot, rounds, command=command, progress=progress)
    return text + (f"\nwrote {out}/results.json and {out}/results.md\n" if out else "")


def bench_models(out: str | None, rounds: int, command: str, progress=None, names: list[str] | None = None) -> str:
    """The exported models against onnxruntime (cpu_models.py); with `out`, writes
    results.json and results.md there."""
    from ..schedule.cpu_mapper import CpuMachine
    from .cpu_models import run_models, table

    load = os.getloadavg()
    machine = CpuMachine.detect()
    records, skipped = run_models(names, rounds=rounds, progress=progress)
    meta = {"cpu": machine.name, "cores": machine.cores, "command": command, "rounds": rounds,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),  # noqa: UP017
            "load_average_start": [round(x, 2) for x in load], "untrustworthy": load[0] > LOAD_WARNING,
            "skipped": skipped, "harness": harness(["panamera", "onnxruntime"])}  # fmt: skip
    warn = f" **Load average {load[0]:.2f} > {LOAD_WARNING}: untrustworthy.**" if meta["untrustworthy"] else ""
    text = (f"# Whole exported models: Panamera target='cpu' vs onnxruntime, measured ({meta['date']})\n\n"
            f"{machine.name}, {machine.cores} usable core(s); load average {load[0]:.2f}.{warn} Command: `{command}`. "
            f"Median [p25-p75] us of {rounds} interleaved rounds of whole-model runs (`OptimizedModel.run`, "
            "Panamera's CPU kernels and library nodes) and of an onnxruntime CPU session; ok: every output within "
            "twice verify.py's error budget of onnxruntime's.\n" + table(records))  # fmt: skip
    if skipped:
        text += "\n## Skipped\n\n" + "".join(f"- {n}: {why}\n" for n, why in skipped)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "results.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
        (Path(out) / "results.md").write_text(text)
        text += f"\nwrote {out}/results.json and {out}/results.md\n"
    return text


def select(workloads: list[CpuWorkload], suite: str = "all", default_only: bool = False) -> list[CpuWorkload]:
    """The workloads of `suite` ("all": every CPU suite), the default set only when asked."""
    return [w for w in workloads if (suite == "all" or w.suite == suite) and (w.default or not default_only)]


def _tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def tolerance(dtype: np.dtype, n: int) -> float:
    """Relative tolerance of a float result reduced over n values (0: exact)."""
    if dtype.kind != "f" and dtype != ml_dtypes.bfloat16:
        return 0.0
    own = float(ml_dtypes.finfo(dtype).eps)
    eps = own if dtype.itemsize >= 4 else 2.0**-23  # 16-bit inputs accumulate in fp32
    return 4 * own + eps * math.sqrt(max(n, 1)) * 8 + 16 * eps  # + libmvec's ulps


def check(got, ref, n: int) -> tuple[float, float, bool]:
    """(max error relative to the largest |reference|, tolerance, within it) over every output."""
    worst, tol, ok = 0.0, 0.0, True
    for g, r in zip(_tuple(got), _tuple(ref)):
        g = np.asarray(g)
        t = tolerance(g.dtype, n)
        if t == 0.0:
            e = float(np.count_nonzero(g != np.asarray(r)))
            good = e == 0
        else:
            e = float(np.max(np.abs(g.astype(np.float64) - r)) / max(float(np.max(np.abs(r))), 1e-30))
            good = e <= t
        worst, tol, ok = max(worst, e), max(tol, t), ok and good
    return worst, tol, ok


def _tensor(torch, a: np.ndarray):
    """A torch view of a numpy array (bfloat16, which torch.from_numpy does not take, through its bits)."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _inputs(w: CpuWorkload, rng) -> list[np.ndarray]:
    """Standard normal floats; int8 inputs are quantized weights in [-127, 127], other integer inputs
    class indices in [0, w.reduced)."""

    def one(s, d):
        if np.dtype(d) == np.int8:
            return rng.integers(-127, 128, s).astype(d)
        return rng.integers(0, w.reduced, s).astype(d) if np.dtype(d).kind in "iu" else rng.standard_normal(s).astype(d)

    return [one(s, d) for s, d in zip(w.shapes, w.input_dtypes)]


def run_workload(pool, w: CpuWorkload, threads: tuple[int, ...], rounds: int, min_sample_s: float) -> list[dict]:
    """The records of one workload, one per thread count, each implementation in its worker of
    `pool` (cpu_isolated.Pool; raises PanameraError when the CPU target refuses the workload)."""
    from .cpu_impls import find_workload
    from .cpu_isolated import WorkerError

    find_workload(w.name)  # the workers find it by name: a clear error here, not in each of them
    records = []
    for n in threads:
        loaded = pool.load({p: ("panamera.bench.cpu_impls:build", {"impl": p, "workload": w.name, "threads": n})
                            for p in pool.workers})  # fmt: skip
        pan = loaded["panamera"]
        if pan.error:
            if pan.refused:
                raise PanameraError(pan.error.partition(": ")[2] or pan.error)
            raise WorkerError(f"Panamera's worker could not build {w.name!r}: {pan.error}")
        missing = {p: v.error for p, v in loaded.items() if v.error}
        res = pool.measure(rounds, min_sample_s)
        info = pan.info
        t = res["panamera"]["median_us"]
        peer_t = {p: v["median_us"] for p, v in res.items() if p != "panamera"}
        best = min(peer_t, key=peer_t.get) if peer_t else None
        records.append({
            "suite": w.suite, "workload": w.name, "threads": n, "measured": res, "missing_peers": missing,
            "modeled_us": info["modeled_us"], "limit_us": info["limit_us"],
            "model_over_measured": round(info["modeled_us"] / t, 3),
            "best_peer": best, "speedup_over_best_peer": peer_t[best] / t if best else None,
            "max_rel_err": info["max_rel_err"], "tolerance": info["tolerance"], "correct": info["correct"],
            "plan": info["plan"],
        })  # fmt: skip
    return records


def run_cpu_measure(
    workloads: list[CpuWorkload],
    out: str | None = None,
    plot: bool = False,
    rounds: int = 7,
    min_sample_s: float = 0.002,
    peers: bool = True,
    command: str = "panamera bench --measure",
    progress=None,
    inductor: bool | None = None,
) -> tuple[dict, str]:
    """Measure `workloads` at 1 and every usable thread; returns ({"meta", "records"}, markdown)
    and, with `out`, writes results.json, results.md (and with `plot` the charts) there."""
    from ..cpu_target import cpu_model
    from ..schedule.cpu_mapper import CpuMachine

    load = os.getloadavg()
    machine = CpuMachine.detect()
    model = cpu_model(machine)
    threads = tuple(sorted({1, machine.cores}))
    ort = peers
    inductor = peers and (INDUCTOR if inductor is None else inductor)
    versions = {k: _version(k) for k in ("numpy", "torch", "onnxruntime")}  # the workers import them, not this process
    if peers and (versions["onnxruntime"] is None or _version("onnx") is None):
        ort = False
    from .cpu_isolated import Pool

    impls = ["panamera"] + (list(EAGER_PEERS) if peers else []) + (["torch.compile"] if inductor else [])
    impls += ["onnxruntime"] if ort else []
    records, skipped = [], []
    big = [w for w in workloads if w.input_bytes > MAX_INPUT_BYTES]
    skipped += [(w.name, f"inputs of {w.input_bytes >> 20} MiB exceed the bench's {MAX_INPUT_BYTES >> 20} MiB")
                for w in big]  # fmt: skip
    todo = [w for w in workloads if w not in big]
    described = model.describe()
    with Pool(impls if todo else []) as pool:
        if todo:  # the workers' model (their wait policy's probe), probed while the other workers sit idle
            probed = pool.load({"panamera": ("panamera.bench.cpu_impls:probe", {})})["panamera"]
            described = probed.info["model"] if probed.error is None else described
        for k, w in enumerate(todo):
            try:
                rs = run_workload(pool, w, threads, rounds, min_sample_s)
            except PanameraError as e:
                if isinstance(e, WorkerError):
                    raise
                skipped.append((w.name, f"refused by target='cpu': {str(e).splitlines()[0][:160]}"))
                continue
            records += rs
            _progress(progress, k, len(todo), rs[-1])
    versions = {k: v for k, v in versions.items() if v}
    meta = {
        "cpu": machine.name,
        "cores": machine.cores,
        "threads": list(threads),
        "model": described,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),  # noqa: UP017
        "load_average_start": [round(x, 2) for x in load],
        "untrustworthy": load[0] > LOAD_WARNING,
        "versions": versions,
        "rounds": rounds,
        "min_sample_s": min_sample_s,
        "harness": harness(impls),
        "command": command,
        "skipped": skipped,
        "not_covered": NOT_COVERED,
    }
    result = {"meta": meta, "records": records}
    text = summary(result)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "results.json").write_text(json.dumps(result, indent=1) + "\n")
        (Path(out) / "results.md").write_text(text)
        if plot:
            from .plots import render

            for c in charts(records):
                render(c, out)
    return result, text


def _version(dist: str) -> str | None:
    """An installed distribution's version, without importing it (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def harness(impls: list[str]) -> dict:
    """results.json's description of the harness (panamera/bench/cpu_isolated.py) and its knobs."""
    from .cpu_isolated import PASSIVE_ENV, WARM_CALLS

    return {
        "kind": "one worker process per implementation (panamera/bench/cpu_isolated.py), rounds interleaved by the "
        "parent in a shuffled order, timed inside the worker (perf_counter_ns per call) after as many untimed "
        f"calls, at least {WARM_CALLS} (warm caches), not pinned",
        "implementations": impls,
        "worker_env": dict(PASSIVE_ENV),
        "onnxruntime_session_config": dict(ORT_NO_SPIN),
        "thread_counts": "panamera threads=n; numpy's BLAS threadpoolctl set_num_threads(n); torch "
        "set_num_threads(n); onnxruntime intra_op_num_threads=n, inter_op_num_threads=1",
    }


def _progress(progress, k: int, n: int, r: dict) -> None:
    if progress:
        progress(f"[{k + 1}/{n}] {r['workload']}: t={r['threads']} panamera "
                 f"{r['measured']['panamera']['median_us']:.1f} us, modeled {r['modeled_us']:.1f} us, "
                 f"speedup over the best peer {r['speedup_over_best_peer'] or 0:.2f}x")  # fmt: skip


def _geo(xs) -> float:
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def summary(result: dict) -> str:
    """results.md: the label, then per thread count a table and the geomeans."""
    m, recs = result["meta"], result["records"]
    warn = (f"\n**Warning: load average {m['load_average_start'][0]:.2f} > {LOAD_WARNING} at the start: other "
            "processes shared the cores, the figures are untrustworthy.**\n" if m["untrustworthy"] else "")  # fmt: skip
    lines = [
        f"# Panamera target='cpu', measured ({m['date']})",
        "",
        f"{m['cpu']}, {m['cores']} usable core(s), threads {m['threads']}; load average at the start "
        f"{', '.join(f'{x:.2f}' for x in m['load_average_start'])}; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f". Command: `{m['command']}`.",
        warn,
        f"CPU model: {m['model']}.",
        "",
        f"Median [p25-p75] us of {m['rounds']} interleaved rounds (each sample >= {m['min_sample_s'] * 1e3:g} ms of "
        "calls, after as many untimed ones, timed inside the implementation's own worker process, the other workers "
        "idle with their thread "
        "pools asleep: "
        + ", ".join(f"{k}={v}" for k, v in m.get("harness", {}).get("worker_env", {}).items())
        + ", onnxruntime's spinning off). speedup: best peer's median / Panamera's. model: the CPU model's time (modeled) / Panamera's "
        "measured median (target 0.8-1.2). ok: Panamera's result within the tolerance of the float64 reference.",
    ]
    for n in m["threads"]:
        rows = [r for r in recs if r["threads"] == n]
        if not rows:
            continue
        lines += ["", f"## {n} thread(s)", "", "| suite | workload | Panamera | " + " | ".join(PEERS)
                  + " | speedup | modeled us | model | ok |", "|---|---|---|" + "---|" * len(PEERS) + "---|---|---|---|"]  # fmt: skip
        for r in rows:
            res = r["measured"]
            cell = lambda p, res=res: (f"{res[p]['median_us']:.1f} [{res[p]['p25_us']:.1f}-{res[p]['p75_us']:.1f}]"  # noqa: E731
                                       if p in res else "-")  # fmt: skip
            sp = f"{r['speedup_over_best_peer']:.2f}x" if r["speedup_over_best_peer"] is not None else "-"
            lines.append(f"| {r['suite']} | {r['workload']} | {cell('panamera')} | "
                         + " | ".join(cell(p) for p in PEERS)
                         + f" | {sp} | {r['modeled_us']:.1f} | {r['model_over_measured']:.2f} | "
                         f"{'yes' if r['correct'] else 'NO'} |")  # fmt: skip
        lines.append("")
        for suite in dict.fromkeys(r["suite"] for r in rows):
            sr = [r for r in rows if r["suite"] == suite]
            sp = [r["speedup_over_best_peer"] for r in sr if r["speedup_over_best_peer"] is not None]
            within = sum(1 for r in sr if 0.8 <= r["model_over_measured"] <= 1.2)
            fastest = sum(1 for r in sr if 0.8 <= r["modeled_us"] / r["measured"]["panamera"]["min_us"] <= 1.2)
            low = f", lowest {min(sp):.2f}x" if sp else ""
            lines.append(f"- {suite}: geomean speedup over the best peer {_geo(sp):.2f}x{low}; model within ±20 % "
                         f"of the median on {within}/{len(sr)} (of the fastest sample on {fastest}/{len(sr)})")  # fmt: skip
    if m["skipped"]:
        lines += ["", "## Skipped", ""] + [f"- {n}: {why}" for n, why in m["skipped"]]
    lines += ["", "Not in the CPU bench: " + "; ".join(f"{k}: {v}" for k, v in m["not_covered"].items()) + "."]
    return "\n".join(lines) + "\n"


def charts(records: list[dict]) -> list:
    """Per thread count: Panamera's measured speedup over each peer (bar: over the best), and the
    model's time over the measured one (0.8-1.2: the target)."""
    from .plots import BEST_BAR, Chart, Series, _cap, colour

    out = []
    for n in sorted({r["threads"] for r in records}):
        rows = [r for r in records if r["threads"] == n]
        names = tuple(f"{r['workload']}" for r in rows)
        pan = [r["measured"]["panamera"]["median_us"] for r in rows]
        series = tuple(
            Series(p, COLOURS[p], tuple(r["measured"][p]["median_us"] / t if p in r["measured"] else None
                                       for r, t in zip(rows, pan)))
            for p in PEERS
        )  # fmt: skip
        best = Series("over the best peer", BEST_BAR, tuple(r["speedup_over_best_peer"] for r in rows))
        hi = _cap(best.values, [v for s in series for v in s.values])
        clipped = tuple((nm, s.name, v) for s in series for nm, v in zip(names, s.values) if v is not None and v > hi)
        out.append(Chart(f"cpu_speedup_t{n}", f"Panamera's measured speedup over each peer, {n} thread(s)",
                         "speedup of Panamera (measured; > 1: Panamera faster)", names, series, 0.0, hi, (1.0,), best,
                         clipped=clipped))  # fmt: skip
        ratio = Series("model / measured", colour("panamera"), tuple(r["model_over_measured"] for r in rows))
        hi = _cap(ratio.values, ratio.values)
        out.append(Chart(f"cpu_model_t{n}", f"The CPU model's time over the measured one, {n} thread(s)",
                         "modeled / measured (target 0.8-1.2)", names, (ratio,), 0.0, hi, (1.0, 0.8, 1.2),
                         clipped=tuple((nm, ratio.name, v) for nm, v in zip(names, ratio.values) if v > hi)))  # fmt: skip
    return out
