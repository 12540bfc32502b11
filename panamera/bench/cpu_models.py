"""`panamera bench --measure --suite models` without a GPU: whole exported ONNX models (the
repository's tests/data/models, or any folder of .onnx files) run by Panamera's CPU path against
onnxruntime's CPU provider, measured in one run.

Per model: `optimize(path, target="cpu")` once (the `panamera run` path: subgraphs on the CPU
target, the rest in the array library), then at 1 and every usable thread, `rounds` interleaved
rounds of `OptimizedModel.run(feeds, threads=n)` and an onnxruntime session with
`intra_op_num_threads=n`, each in its own worker process (panamera/bench/cpu_isolated.py: idle pools
passive, onnxruntime's spinning off; medians and p25-p75), numpy's BLAS (the library's MatMul /
Gemm nodes, the host convolution's products) held at n threads too. The inputs are verify.random_inputs (token ids
within the embedding, masks); every Panamera output is checked against onnxruntime's within
verify.py's error budget of a correct float32 computation, doubled (both sides round), as
tests/test_exported_models.py does. Beside the times: the Panamera subgraphs, their CPU kernels,
how many of them numpy's BLAS runs, and the library nodes by op.

>>> [m for m in model_names() if m.startswith("gpt2")]
['gpt2-dynamo', 'gpt2-torchscript']
"""

from __future__ import annotations

import collections
import glob
import os
import time
from pathlib import Path

import numpy as np

from ..errors import PanameraError

MODELS_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "models"
TINY_MODELS = ("widedeep-torchscript",)  # the smallest model: the test's and smoke runs' choice


def model_names(directory: str | os.PathLike = MODELS_DIR) -> list[str]:
    """The .onnx files of `directory`, by name (no suffix), sorted; [] where it does not exist
    (an installed package has no tests/)."""
    return sorted(Path(p).stem for p in glob.glob(os.path.join(directory, "*.onnx")))


def _ort_session(path: str, threads: int, config: dict | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.log_severity_level = 3
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def check_against_ort(opt, feeds: dict, got: dict, expected: dict) -> tuple[float, bool]:
    """(largest error / its budget, within it): each output against onnxruntime's within twice
    verify.py's error budget (one float32 rounding added), no blanket floor."""
    from ..subgraph.verify import error_budget, reference_values

    names = list(expected)
    wide, _, _ = reference_values(opt.model, feeds, names)
    budget = error_budget(opt.model, wide)
    eps = float(np.finfo(np.float32).eps)
    worst, ok = 0.0, True
    for k, want in expected.items():
        r, a = budget.get(k, (0.0, 0.0))
        err = np.abs(np.asarray(got[k]).astype(np.float64) - want)
        allowed = 2 * (a + (r + eps) * np.abs(want))
        worst = max(worst, float(np.max(err / np.maximum(allowed, 1e-300))) if err.size else 0.0)
        ok = ok and bool((err <= allowed).all())
    return worst, ok


def counts(opt) -> dict:
    """Subgraphs, CPU kernels, BLAS calls among them, and library nodes by op."""
    runners = [sg.runner for sg in opt.subgraphs if sg.runner is not None]
    return {
        "subgraphs": len(opt.subgraphs),
        "kernels": sum(len(r.cpu_kernels) for r in runners),
        "blas": sum(1 for r in runners for k in r.cpu_kernels if k.host is not None),
        "library": dict(collections.Counter(u.node.op_type for u in opt.library)),
        "backend": opt.backend,
    }


_opt: dict = {}  # the last model optimized in this worker (both thread counts reuse it)


def build(impl: str, path: str, threads: int, feeds: dict | None = None) -> tuple:
    """A bench worker's implementation (panamera/bench/cpu_isolated.py): "panamera", `OptimizedModel.run`
    on `threads` (its info: the inputs, the check against onnxruntime, the counts, optimize_s), or
    "onnxruntime", a session on `threads` with its spinning off, fed `feeds`."""
    from .cpu_impls import _set_blas
    from .cpu_isolated import ORT_NO_SPIN

    _set_blas(threads)  # numpy's own pool: the library steps' products on `threads`, as onnxruntime
    if impl == "onnxruntime":
        sess = _ort_session(path, threads, ORT_NO_SPIN)
        ins = {i.name for i in sess.get_inputs()}
        ort_feeds = {k: v for k, v in feeds.items() if k in ins}
        return (lambda: sess.run(None, ort_feeds)), {"threads": threads}
    if _opt.get("path") != path:
        from ..subgraph.optimizer import optimize
        from ..subgraph.verify import random_inputs

        _opt.clear()
        t0 = time.perf_counter()
        opt = optimize(path, target="cpu")
        optimize_s = time.perf_counter() - t0
        feeds = random_inputs(opt.model, 0)
        got = opt.run(feeds)
        sess = _ort_session(path, 1)
        ins = {i.name for i in sess.get_inputs()}
        expected = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {k: v for k, v in feeds.items()
                                                                                    if k in ins})))  # fmt: skip
        worst, ok = check_against_ort(opt, feeds, got, expected)
        _opt.update(path=path, opt=opt, feeds=feeds, info={"optimize_s": round(optimize_s, 2),
                    "error_over_budget": worst, "correct": ok, **counts(opt)})  # fmt: skip
    opt, feeds = _opt["opt"], _opt["feeds"]
    return (lambda: opt.run(feeds, threads=threads)), {**_opt["info"], "feeds": feeds, "threads": threads}


def run_model(pool, path: str, threads: tuple[int, ...], rounds: int, min_sample_s: float) -> list[dict]:
    """The records of one model, one per thread count, Panamera and onnxruntime each in its worker
    of `pool` (cpu_isolated.Pool; raises PanameraError where Panamera cannot run it)."""
    from .cpu_isolated import WorkerError

    records = []
    for n in threads:
        pan = pool.load({"panamera": (f"{__name__}:build", {"impl": "panamera", "path": path, "threads": n})})[
            "panamera"
        ]
        if pan.error:
            if pan.refused:
                raise PanameraError(pan.error.partition(": ")[2] or pan.error)
            raise WorkerError(f"Panamera's worker could not run {path}: {pan.error}")
        info = dict(pan.info)
        feeds = info.pop("feeds")
        ort = pool.load({"onnxruntime": (f"{__name__}:build", {"impl": "onnxruntime", "path": path, "threads": n,
                                                                 "feeds": feeds})})["onnxruntime"]  # fmt: skip
        if ort.error:
            raise WorkerError(f"onnxruntime's worker could not run {path}: {ort.error}")
        res = pool.measure(rounds, min_sample_s)
        pan_t, peer = res["panamera"]["median_us"], res["onnxruntime"]["median_us"]
        records.append({"suite": "models", "workload": Path(path).stem, "threads": n, "measured": res,
                        "speedup_over_ort": peer / pan_t, **info})  # fmt: skip
    return records


def run_models(
    names: list[str] | None = None,
    directory: str | os.PathLike = MODELS_DIR,
    rounds: int = 7,
    min_sample_s: float = 0.002,
    progress=None,
) -> tuple[list[dict], list[tuple[str, str]]]:
    """(records, skipped (name, why)) of `names` (default: every model of `directory`)."""
    from ..schedule.cpu_mapper import CpuMachine

    cores = CpuMachine.detect().cores
    threads = tuple(sorted({1, cores}))
    names = model_names(directory) if names is None else names
    records, skipped = [], []
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return [], [(n, "onnxruntime is not installed") for n in names]
    from .cpu_isolated import Pool, WorkerError

    paths = {name: os.path.join(directory, f"{name}.onnx") for name in names}
    skipped += [(name, f"no {p}") for name, p in paths.items() if not os.path.exists(p)]
    todo = [name for name, p in paths.items() if os.path.exists(p)]
    with Pool(["panamera", "onnxruntime"] if todo else []) as pool:
        for k, name in enumerate(todo):
            try:
                rs = run_model(pool, paths[name], threads, rounds, min_sample_s)
            except PanameraError as e:
                if isinstance(e, WorkerError):
                    raise
                skipped.append((name, f"Panamera cannot run it: {str(e).splitlines()[0][:160]}"))
                continue
            records += rs
            if progress:
                r = rs[0]
                progress(f"[{k + 1}/{len(todo)}] {name}: t=1 panamera {r['measured']['panamera']['median_us']:.0f} us, "
                         f"onnxruntime {r['measured']['onnxruntime']['median_us']:.0f} us ({r['speedup_over_ort']:.2f}x), "
                         f"{r['kernels']} kernel(s), {r['blas']} BLAS")  # fmt: skip
    return records, skipped


def _geo(xs) -> float:
    xs = [x for x in xs if x]
    return float(np.exp(np.mean(np.log(xs)))) if xs else float("nan")


def table(records: list[dict]) -> str:
    """Markdown: per thread count, one row per model, and the geomean."""
    lines = []
    for n in sorted({r["threads"] for r in records}):
        rows = [r for r in records if r["threads"] == n]
        lines += ["", f"## Whole models, {n} thread(s)", "",
                  "| model | Panamera us | onnxruntime us | ORT / Panamera | subgraphs | kernels | BLAS | library nodes "
                  "| optimize s | error / budget | ok |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in rows:
            m = r["measured"]
            cell = lambda p, m=m: f"{m[p]['median_us']:.0f} [{m[p]['p25_us']:.0f}-{m[p]['p75_us']:.0f}]"  # noqa: E731
            lib = ", ".join(f"{op} {c}" for op, c in sorted(r["library"].items())) or "-"
            lines.append(f"| {r['workload']} | {cell('panamera')} | {cell('onnxruntime')} | {r['speedup_over_ort']:.2f}x "
                         f"| {r['subgraphs']} | {r['kernels']} | {r['blas']} | {lib} | {r['optimize_s']:.1f} "
                         f"| {r['error_over_budget']:.2g} | {'yes' if r['correct'] else 'NO'} |")  # fmt: skip
        sp = [r["speedup_over_ort"] for r in rows]
        lines += ["", f"- models: geomean onnxruntime / Panamera {_geo(sp):.2f}x, lowest {min(sp):.2f}x "
                  f"(issue 24's target: >= 0.8x, goal 1.0x)"]  # fmt: skip
    return "\n".join(lines) + "\n"
