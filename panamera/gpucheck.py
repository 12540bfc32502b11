"""The steps of `make gpu-check` (scripts/gpu_check.py finds the GPU and installs what is missing,
then runs `python -m panamera.gpucheck --out DIR --device NAME`):

1. correctness: tests/test_cuda.py and tests/test_first_contact.py under pytest (junit.xml);
2. compute-sanitizer memcheck, racecheck and synccheck on one kernel of each template
   (`template_cases`, run by `python -m panamera.gpucheck --driver`), skipped with a note
   when compute-sanitizer is absent;
3. the paths no GPU has run yet, one kernel each (panamera/gpucheck_paths.py: clusters by
   barriers and by mbarriers, warpgroup MMAs, mma.sync, cp.async stages), checked against numpy
   and timed beside their peers (paths.json, paths.md), in a child process (`--paths FILE`);
4. `panamera bench --suite all --measure` (CUDA events, L2 flushed, median of repeats);
5. the ONNX examples (examples/onnx_models.py) through `panamera run --verify`.

`--only STEP,...` runs some of them (`STEPS`); a later call into the same folder keeps the
earlier calls' steps and records in its report. `--list` prints what each device call runs.

Everything lands in one folder: measurements.json (every step and measurement),
modeled_vs_measured.md (per workload, with the ratio), summary.md, junit.xml and pytest.txt,
sanitizer-<tool>.txt, onnx.txt and bench/ (results.json, summary.md).

>>> print(modeled_vs_measured([{"plan": "panamera", "suite": "single", "workload": "w",
...     "dtype": "float32", "modeled_us": 10.0, "measured_us": 12.5}]).splitlines()[-1])
| single | w | float32 | 10.0 | 12.5 | 1.25 | - | - |
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .enums import StrEnum

# Steps 1 and 4 run files of the repository, which a pip-installed package lacks: they need a clone.
REPO = Path(__file__).resolve().parent.parent
TESTS = ("tests/test_cuda.py", "tests/test_first_contact.py")
EXAMPLES = "examples/onnx_models.py"


def missing_from_clone(repo: Path = REPO) -> list[str]:
    """The repository files the steps run that are not beside the package (an installed wheel).

    >>> missing_from_clone(Path("/nonexistent"))
    ['tests/test_cuda.py', 'tests/test_first_contact.py', 'examples/onnx_models.py']
    """
    return [f for f in (*TESTS, EXAMPLES) if not (repo / f).is_file()]


KEEP_LINES = 200  # of each tool's output: the folder stays a few files and a few hundred KB


class Outcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


class SanitizerTool(StrEnum):
    MEMCHECK = "memcheck"  # out-of-bounds and misaligned accesses
    RACECHECK = "racecheck"  # shared-memory hazards (a missing __syncthreads)
    SYNCCHECK = "synccheck"  # barriers in divergent code


@dataclass(frozen=True)
class StepResult:
    """One step's outcome, its wall time, one line of detail, and the files it wrote."""

    name: str
    outcome: Outcome
    seconds: float
    detail: str
    files: tuple[str, ...] = ()


def _tail(text: str, n: int = KEEP_LINES) -> str:
    lines = text.splitlines()
    return "\n".join(([f"[... {len(lines) - n} lines cut ...]"] if len(lines) > n else []) + lines[-n:]) + "\n"


def _run(cmd: list[str], log: Path, timeout: float) -> tuple[int, str, float]:
    """Run `cmd`, keep the tail of its output in `log`; (exit status, output, seconds)."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)
        rc, text = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = 124, f"{e.stdout or ''}{e.stderr or ''}\n[timed out after {timeout:.0f} s]"
    except OSError as e:
        rc, text = 127, str(e)
    log.write_text(f"$ {' '.join(cmd)}\n" + _tail(text if isinstance(text, str) else str(text)))
    return rc, text, time.perf_counter() - t0


# -- one kernel of each template: what the sanitizers run ---------------------------------------
@dataclass(frozen=True)
class Case:
    """A small computation that exercises one kernel template; `shows(k)` says it does."""

    name: str
    build: Callable[[np.random.Generator], tuple]  # -> (outputs, input arrays, numpy reference)
    options: dict
    shows: Callable[[object], bool]


def _x(shape, dtype="float32"):
    from . import frontend

    return frontend.placeholder(shape, dtype, name="x")


def _kernel_text(k) -> str:
    return "\n".join(rk.source for rk in k.kernels)


def template_cases() -> list[Case]:
    """Map, reduce, split reduce, deterministic, stitched, stitched split across blocks (a
    cooperative launch, and on sm_90 a thread-block cluster), Welford and argmax, at sizes the
    sanitizers (10-100x slower) run in seconds."""
    import panamera as pn

    def modes(k) -> set[str]:
        return {str(m) for ln in k.plan.kernels for m in ln.modes}

    def row(shape, fn, ref):
        return lambda rng: (lambda a: (fn(_x(shape)), [a], ref(a.astype(np.float64))))(
            rng.standard_normal(shape).astype(np.float32)
        )

    def softmax(a):
        e = np.exp(a - a.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    return [
        Case("map", row((1 << 16,), lambda x: x * 2.0 + 1.0, lambda a: a * 2 + 1), {}, lambda k: modes(k) <= {"store"}),
        Case("reduce", row((64, 1024), lambda x: pn.sum(x, axis=1), lambda a: a.sum(1)), {"split": 1},
             lambda k: modes(k) == {"store"}),
        Case("split_reduce", row((2, 1 << 17), lambda x: pn.sum(x, axis=1), lambda a: a.sum(1)), {"split": 8},
             lambda k: "atomic_ws" in modes(k)),
        Case("deterministic", row((2, 1 << 17), lambda x: pn.sum(x, axis=1), lambda a: a.sum(1)),
             {"split": 8, "deterministic": True}, lambda k: "partials" in modes(k)),
        Case("stitched", row((64, 1024), lambda x: pn.nn.softmax(x), softmax), {},
             lambda k: any(g.stitched for g in k.groups)),
        Case("stitched_split", row((2, 1 << 15), lambda x: pn.nn.softmax(x), softmax), {"gpu": "a100"},
             lambda k: any(m.cooperative for m in k.mappings)),  # planned without clusters: cooperative
        Case("cluster", row((2, 1 << 15), lambda x: pn.nn.softmax(x), softmax), {},  # the GPU's own plan:
             lambda k: any(m.cluster > 1 for m in k.mappings) or k.gpu.max_cluster == 1),  # sm_90: clusters
        Case("welford", row((64, 4096), lambda x: pn.var(x, axis=1), lambda a: a.var(1)), {},
             lambda k: "pn_welford<" in _kernel_text(k)),
        Case("argmax", row((64, 4096), lambda x: pn.argmax(x, axis=1), lambda a: a.argmax(1)), {},
             lambda k: "pn_argkey_max" in _kernel_text(k)),
    ]  # fmt: skip


def run_case(case: Case, target: str) -> float:
    """Compile and run one case on `target`; the largest error against numpy (AssertionError
    when the case does not exercise its template or the result is wrong)."""
    import panamera as pn

    outputs, arrays, ref = case.build(np.random.default_rng(0))
    k = pn.compile(outputs, target=target, use_database=False, **case.options)
    assert case.shows(k), f"{case.name}: the plan does not use the {case.name} template:\n{k.explain()}"
    out = k(*arrays)
    out = out.get() if type(out).__module__.startswith("cupy") else np.asarray(out)
    err = float(np.max(np.abs(out.astype(np.float64) - ref) / (1 + np.abs(ref))))
    assert err < 1e-4, f"{case.name}: error {err:.3g} against numpy"
    return err


def driver(target: str = "cuda") -> int:
    """Run every template case once, then every path of gpucheck_paths at small shapes (what
    compute-sanitizer watches: racecheck and synccheck see the cluster and mbarrier protocols);
    0 when all match numpy."""
    from . import gpucheck_paths

    failed = 0
    for case in template_cases():
        try:
            print(f"{case.name}: ok (max error {run_case(case, target):.2g})")
        except AssertionError as e:
            failed += 1
            print(f"{case.name}: FAILED {e}")
    for rec in gpucheck_paths.run_paths(target, small=True, timed=False):
        failed += rec["outcome"] == "failed"
        print(f"{rec['path']}: {rec['outcome']} {rec.get('error', rec.get('detail', ''))}")
    return 1 if failed else 0


# -- the steps ----------------------------------------------------------------------------------
def run_pytest(out: Path, python: str = sys.executable) -> StepResult:
    junit = out / "junit.xml"
    cmd = [python, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", f"--junitxml={junit}", *TESTS]
    rc, text, dt = _run(cmd, out / "pytest.txt", timeout=300)
    last = next((ln for ln in reversed(text.splitlines()) if " in " in ln and ("passed" in ln or "failed" in ln)), "")
    outcome = Outcome.PASSED if rc == 0 else Outcome.FAILED
    return StepResult("pytest", outcome, dt, last.strip("= ") or f"exit {rc}", ("junit.xml", "pytest.txt"))


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, or in the CUDA toolkit ($CUDA_HOME, /usr/local/cuda)."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "bin", "compute-sanitizer").is_file():
            return str(Path(root, "bin", "compute-sanitizer"))
    return None


def run_sanitizers(out: Path, python: str = sys.executable, sanitizer: str | None = None) -> list[StepResult]:
    """Each tool over the template driver; skipped (one result saying why) without the tool."""
    if sanitizer is None:
        note = "compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): install the CUDA toolkit"
        return [StepResult("compute-sanitizer", Outcome.SKIPPED, 0.0, note)]
    results = []
    for tool in SanitizerTool:
        log = out / f"sanitizer-{tool}.txt"
        cmd = [sanitizer, "--tool", str(tool), "--error-exitcode", "99", python, "-m", "panamera.gpucheck", "--driver"]
        rc, text, dt = _run(cmd, log, timeout=300)
        summary = next((ln for ln in reversed(text.splitlines()) if "ERROR SUMMARY" in ln), f"exit {rc}")
        outcome = Outcome.PASSED if rc == 0 else Outcome.FAILED
        results.append(StepResult(f"sanitizer {tool}", outcome, dt, summary.strip("= "), (log.name,)))
    return results


def run_paths_step(out: Path, python: str = sys.executable) -> StepResult:
    """gpucheck_paths in a child process (a kernel that faults loses only this step): paths.json
    and paths.md."""
    from . import gpucheck_paths

    data = out / "paths.json"
    rc, text, dt = _run([python, "-m", "panamera.gpucheck", "--paths", str(data)], out / "paths.txt", timeout=300)
    records = json.loads(data.read_text()) if data.is_file() else []
    (out / "paths.md").write_text(gpucheck_paths.table(records) + "\n")
    failed = [r["path"] for r in records if r["outcome"] == "failed"]
    ran = sum(r["outcome"] == "passed" for r in records)
    outcome = Outcome.FAILED if rc or failed or not records else Outcome.PASSED
    detail = f"{ran} of {len(records)} paths passed" + (f"; failed: {', '.join(failed)}" if failed else "")
    return StepResult(
        "paths", outcome, dt, detail if records else f"exit {rc}", ("paths.json", "paths.md", "paths.txt")
    )


def gpu_key(device: str) -> str:
    """The model's GPU for a device name (H100 when the device is none of them).

    >>> gpu_key("NVIDIA A100-SXM4-80GB"), gpu_key("NVIDIA H100 80GB HBM3"), gpu_key("NVIDIA L4")
    ('a100', 'h100', 'h100')
    """
    name = device.lower()
    return next((k for k in ("h100", "a100", "v100") if k in name), "h100")


def run_bench_step(out: Path, device: str, suites: list[str] | None = None) -> tuple[StepResult, list[dict]]:
    """`panamera bench --measure` over `suites` (all by default; a subset is its own step and
    folder, bench-<suites>, so two calls can split the suites)."""
    from .bench.runner import run_bench
    from .bench.suites import SUITES
    from .model.gpu import GPUS

    t0 = time.perf_counter()
    key = gpu_key(device)
    names = suites or list(SUITES)
    tag = "" if suites is None else "-" + "-".join(names)
    command = f"panamera bench --suite {','.join(names) if suites else 'all'} --measure --gpu {key}"
    name, folder = f"bench{tag}", out / f"bench{tag}"
    try:
        records, _ = run_bench(names, GPUS[key], out=str(folder), measure=True, command=command)
    except Exception as e:  # one failed workload must not lose the other steps' results
        return StepResult(name, Outcome.FAILED, time.perf_counter() - t0, f"{type(e).__name__}: {e}"), []
    n = sum(1 for r in records if "measured_us" in r)
    detail = f"{n} workloads measured, modeled for {key}"
    return StepResult(name, Outcome.PASSED, time.perf_counter() - t0, detail, (f"{folder.name}/results.json",)), records


def onnx_feeds(model_bytes: bytes, symbolic: int = 2) -> tuple[dict, dict]:
    """Random inputs for a model (every symbolic dimension = `symbolic`) and their shapes."""
    import onnx
    from onnx import helper

    model = onnx.load_from_string(model_bytes)
    init = {t.name for t in model.graph.initializer}
    rng, feeds, shapes = np.random.default_rng(0), {}, {}
    for v in model.graph.input:
        if v.name in init:
            continue
        tt = v.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else symbolic for d in tt.shape.dim)
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        feeds[v.name] = rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.zeros(shape, dt)
        if any(not d.HasField("dim_value") for d in tt.shape.dim):
            shapes[v.name] = shape
    return feeds, shapes


def run_onnx(out: Path, python: str = sys.executable, target: str = "cuda") -> StepResult:
    sys.path.insert(0, str(REPO / Path(EXAMPLES).parent))
    import onnx_models

    t0, lines, ok = time.perf_counter(), [], True
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in (("encoder", onnx_models.encoder()), ("convnet", onnx_models.convnet())):
            path, npz = Path(tmp, f"{name}.onnx"), Path(tmp, f"{name}.npz")
            path.write_bytes(data)
            feeds, shapes = onnx_feeds(data)
            np.savez(npz, **feeds)
            cmd = [python, "-m", "panamera.cli", "run", str(path), "--inputs", str(npz), "--verify"]
            cmd += ["--target", target]
            for k, s in shapes.items():
                cmd += ["--shape", f"{k}={'x'.join(map(str, s))}"]
            rc, text, _ = _run(cmd, Path(tmp, f"{name}.log"), timeout=300)  # a hang is exit 124, not a crash
            ok &= rc == 0
            lines += [f"$ panamera run {name}.onnx --verify --target {target} (exit {rc})", text]
    (out / "onnx.txt").write_text(_tail("\n".join(lines)))
    outcome = Outcome.PASSED if ok else Outcome.FAILED
    return StepResult("onnx examples", outcome, time.perf_counter() - t0, "encoder, convnet", ("onnx.txt",))


# -- the report ---------------------------------------------------------------------------------
def modeled_vs_measured(records: list[dict]) -> str:
    """Markdown: per workload Panamera's modeled and measured µs and their ratio (measured /
    modeled), with CuPy's and PyTorch's measured µs where present."""
    rows = [r for r in records if r.get("plan") == "panamera" and "measured_us" in r]
    lines = [
        "| suite | workload | dtype | modeled us | measured us | measured / modeled | CuPy us | PyTorch us |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["measured_us"] / r["modeled_us"] if r["modeled_us"] else math.nan
        lines.append(
            f"| {r['suite']} | {r['workload']} | {r['dtype']} | {r['modeled_us']:.1f} | {r['measured_us']:.1f} | "
            f"{ratio:.2f} | {r.get('measured_cupy_us', '-')} | {r.get('measured_torch_us', '-')} |"
        )
    return "\n".join(lines)


def geomean_ratio(records: list[dict]) -> float:
    """Geometric mean of measured / modeled over the measured workloads (nan without any)."""
    xs = [r["measured_us"] / r["modeled_us"] for r in records if r.get("plan") == "panamera" and r.get("measured_us")]
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def earlier(out: Path, steps: list[StepResult], records: list[dict]) -> tuple[list[StepResult], list[dict]]:
    """This call's steps and bench records after those an earlier call into `out` recorded (its
    measurements.json), a step or workload run again replacing the earlier one's result."""
    path = out / "measurements.json"
    if not path.is_file():
        return steps, records
    data = json.loads(path.read_text())
    names = {s.name for s in steps}
    kept = [StepResult(**(s | {"outcome": Outcome(s["outcome"]), "files": tuple(s["files"])})) for s in data["steps"]]
    kept = [s for s in kept if s.name not in names]

    def key(r):
        return r.get("suite"), r.get("workload"), r.get("dtype"), r.get("plan")

    new = {key(r) for r in records}
    return kept + steps, [r for r in data["records"] if key(r) not in new] + records


def write_report(out: Path, device: str, steps: list[StepResult], records: list[dict]) -> list[Path]:
    """measurements.json, modeled_vs_measured.md and summary.md in `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    steps, records = earlier(out, steps, records)
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    data = {"device": device, "date": stamp, "steps": [asdict(s) for s in steps], "records": records}
    paths = [out / "measurements.json", out / "modeled_vs_measured.md", out / "summary.md"]
    paths[0].write_text(json.dumps(data, indent=1, default=str))
    g = geomean_ratio(records)
    paths[1].write_text(
        f"# Modeled vs measured on {device} ({stamp})\n\nGeometric mean of measured / modeled: {g:.2f}.\n\n"
        + modeled_vs_measured(records)
        + "\n"
    )
    table = ["| step | outcome | seconds | detail |", "|---|---|---|---|"]
    table += [f"| {s.name} | {s.outcome} | {s.seconds:.0f} | {s.detail} |" for s in steps]
    paths[2].write_text(
        f"# gpu-check on {device} ({stamp})\n\n" + "\n".join(table) + "\n\nFiles: "
        + ", ".join(sorted({f for s in steps for f in s.files} | {p.name for p in paths})) + "\n"
    )  # fmt: skip
    return paths


STEPS = ("paths", "pytest", "sanitizers", "bench", "onnx")  # the never-run paths first: the newest news


def steps_for(only: str | None, skip_bench: bool) -> tuple[str, ...]:
    """The steps a call runs: `only` (comma-separated names of `STEPS`), else all, less bench
    with `skip_bench`.

    >>> steps_for(None, True), steps_for("bench", False)
    (('paths', 'pytest', 'sanitizers', 'onnx'), ('bench',))
    """
    chosen = tuple(only.split(",")) if only else STEPS
    unknown = [s for s in chosen if s not in STEPS]
    if unknown:
        raise SystemExit(f"gpu-check: unknown step(s) {', '.join(unknown)}: the steps are {', '.join(STEPS)}")
    return tuple(s for s in STEPS if s in chosen and not (skip_bench and s == "bench"))


def plan_text(arch: int = 90) -> str:
    """What `make gpu-check` runs as device calls of at most 10 minutes (the first has every check,
    the others the measured bench), and the paths step's kernels on a device of compute
    capability `arch` x 10."""
    from . import gpucheck_paths

    lines = [
        "call 1: python3 scripts/gpu_check.py --skip-bench   # steps: " + ", ".join(steps_for(None, True)),
        "        (timeouts, not estimates: paths, pytest and each sanitizer tool 300 s, onnx 2 x 300 s;",
        "        the report is rewritten after each step, so a call cut short keeps the steps it finished)",
        "call 2: python3 scripts/gpu_check.py --only bench --suites single,subgraphs,norms",
        "call 3: python3 scripts/gpu_check.py --only bench --suites contractions,training,long_rows",
        "        (panamera bench --measure, split in two so that each fits one call; same folder, one report)",
        f"paths on sm_{arch}:",
    ]
    return "\n".join(lines + ["  " + ln for ln in gpucheck_paths.plan_lines(arch)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m panamera.gpucheck", description="the steps of make gpu-check")
    ap.add_argument("--out", type=Path, help="the results folder")
    ap.add_argument("--device", default="GPU", help="the device name, for the report")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--only", help=f"comma-separated steps to run ({', '.join(STEPS)})")
    ap.add_argument("--suites", help="the bench step's suites, comma-separated (default: all)")
    ap.add_argument("--list", action="store_true", help="print what each device call runs, and exit")
    ap.add_argument("--driver", action="store_true", help="run one kernel per template (under compute-sanitizer)")
    ap.add_argument("--paths", type=Path, help="run gpucheck_paths on the device, its records as JSON to PATHS")
    ap.add_argument("--target", default="cuda", choices=["cuda", "emulator"], help="the driver's target")
    args = ap.parse_args(argv)
    if args.list:
        print(plan_text())
        return 0
    if args.driver:
        return driver(args.target)
    if args.paths:
        from . import gpucheck_paths

        records = gpucheck_paths.run_paths(args.target)
        args.paths.write_text(json.dumps(records, indent=1, default=str))
        print(gpucheck_paths.table(records))
        return 1 if any(r["outcome"] == "failed" for r in records) else 0
    if args.out is None:
        ap.error("--out is required")
    missing = missing_from_clone()
    if missing:
        print(
            f"gpu-check: error: runs the repository's {', '.join(missing)}, which an installed package lacks: "
            "run it from a clone (make gpu-check); --driver alone needs only the package",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    run = steps_for(args.only, args.skip_bench)
    steps: list[StepResult] = []
    records: list[dict] = []
    for name in run:  # the report rewritten after each step: a call cut short keeps what it did
        if name == "paths":
            steps.append(run_paths_step(args.out))
        elif name == "pytest":
            steps.append(run_pytest(args.out))
        elif name == "sanitizers":
            steps += run_sanitizers(args.out, sanitizer=find_sanitizer())
        elif name == "bench":
            step, records = run_bench_step(args.out, args.device, args.suites.split(",") if args.suites else None)
            steps.append(step)
        else:
            steps.append(run_onnx(args.out))
        write_report(args.out, args.device, steps, records)
    for s in steps:
        print(f"gpu-check: {s.name}: {s.outcome} ({s.seconds:.0f} s) {s.detail}")
    print(f"gpu-check: results in {args.out}")
    return 0 if all(s.outcome != Outcome.FAILED for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
