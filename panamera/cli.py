"""The `panamera` command.

    panamera demo                           the single-reduction suite on the emulator
    panamera optimize model.onnx --out DIR  partition, compile, write kernels and a report
    panamera explain model.onnx --node NAME one subgraph in full (--section plan|source|...: a part)
    panamera run model.onnx --inputs in.npz run the whole model (or `run DIR`, an optimized one)
    panamera cache info|clear               the on-disk kernel cache
    panamera --version

Errors (usage errors too) and warnings are one line each; an error exits with status 2 (1 for a
failed check, 3 for a bug). Every command takes -q (warnings and errors only), -v (stage times)
and --debug (-v and the traceback), before or after its name (cli_base.py); progress goes to
stderr through panamera.logs: a bar on a terminal, plain lines when piped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import sys
import time
import warnings

import click
import numpy as np

from . import __version__, logs
from . import compile as pn_compile
from .cli_base import PanameraGroup
from .errors import EmulatorWarning, InputError, ModelError, OptionError, PanameraError, ScheduleError
from .explain import DEFAULT as DEFAULT_SECTIONS
from .explain import Section
from .frontend import ops, placeholder
from .model.gpu import GPUS

_log = logs.get("cli")

# (name, form, shape, axes): A1 shapes scaled down so that the emulator runs them in seconds.
DEMO_SUITE = [
    ("all-128", "ALL", (128,), None),
    ("all-65536", "ALL", (65536,), None),
    ("all-1024x1024/16", "ALL", (256, 256), None),
    ("row-768x768/4", "ROW", (192, 768), (1,)),
    ("row-768x21128/16", "ROW", (48, 21128), (1,)),
    ("row-nchw", "ROW", (4, 16, 14, 14), (0, 2, 3)),
    ("col-768x768/4", "COLUMN", (768, 192), (0,)),
    ("col-21128x768/16", "COLUMN", (21128, 48), (0,)),
    ("col-nhwc", "COLUMN", (4, 14, 14, 16), (0, 1, 2)),
]


def run_demo() -> int:
    rng = np.random.default_rng(0)
    rows = []
    failed = 0
    todo = [(name, form, shape, axes, op) for name, form, shape, axes in DEMO_SUITE for op in ("sum", "max", "all")]
    with logs.steps("demo", len(todo), _log) as bar:
        for name, form, shape, axes, op in todo:
            bar.step(f"{op} {name}")
            dtype = "bool" if op == "all" else "float32"
            x = placeholder(shape, dtype, name="x")
            y = getattr(ops, op)(x, axis=axes)
            t0 = time.perf_counter()
            k = pn_compile(y, target="emulator")
            ct = time.perf_counter() - t0
            a = rng.random(shape) > 0.001 if dtype == "bool" else rng.standard_normal(shape).astype(np.float32)
            out = k(a)
            ref = getattr(np, op)(a.astype(np.float64) if dtype != "bool" else a, axis=axes)
            ok = np.allclose(out, ref, rtol=1e-4, atol=1e-3)
            failed += not ok
            ln = k.plan.kernels[0]
            m = k.mappings[0]
            rows.append(
                (
                    f"{op} {name}",
                    form,
                    f"{m.M}x{m.N}",
                    str(ln.grid[:2]),
                    str(ln.block[:2]),
                    m.vec,
                    ln.blocks_per_reduction,
                    ",".join(ln.modes),
                    len(k.plan.per_call),
                    f"{k.plan.modeled_us:.1f}",
                    f"{ct * 1e3:.0f}",
                    "ok" if ok else "WRONG",
                )
            )
    head = (
        "workload",
        "form",
        "MxN",
        "grid",
        "block",
        "vec",
        "split",
        "combine",
        "launches",
        "H100 us (modeled, plan)",
        "compile ms",
        "vs numpy",
    )
    widths = [max(len(str(r[c])) for r in rows + [head]) for c in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    print(f"\n{len(rows) - failed}/{len(rows)} results match numpy (emulator backend; times modeled for H100).")
    return 1 if failed else 0


# -- helpers ----------------------------------------------------------------------------------
def _shapes(values) -> dict:
    out = {}
    for v in values:
        name, sep, dims = v.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
        except ValueError:
            shape = None
        if not sep or not name or shape is None or any(d < 0 for d in shape):
            raise InputError(f"--shape {v!r}: expected NAME=DIMS like x=2x128")
        out[name] = shape
    return out


def _load_npz(path: str) -> dict:
    if not os.path.isfile(path):
        raise InputError(f"--inputs {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as e:
        raise InputError(f"--inputs {path}: not a readable .npz file ({type(e).__name__})") from None


def _console():
    from rich.console import Console

    c = Console(highlight=False)
    return c if c.is_terminal else Console(highlight=False, width=200)  # piped: plain, unwrapped


def _table(title, head, rows):
    from rich.table import Table

    t = Table(title=title, show_lines=False)
    for h in head:
        t.add_column(h)
    for r in rows:
        t.add_row(*[str(c) for c in r])
    return t


def _optimize(model, shapes, target, gpu, specialize=None, schedules=None):
    from .subgraph import optimize

    return optimize(model, shapes, specialize, target=target, gpu=GPUS[gpu], schedules=schedules)


def _dynamic(model, shapes: dict, hints, target, gpu, feeds=None, **options):
    """The DynamicModel of an ONNX model whose dim_params `shapes` leave symbolic (issue 22), or
    None; `hints` (DIM=N) or the feeds' sizes are where its figures are modeled."""
    from .subgraph.dynamic_model import bind, dim_params, optimize_dynamic, unfixed

    if not unfixed(model, shapes):
        return None
    sized = {k: v[0] for k, v in _shapes(hints).items() if len(v) == 1}
    if len(sized) != len(hints):
        raise InputError(f"--hint {hints!r}: expected DIM=N, one size per symbolic dim")
    sized.update(bind(dim_params(model), feeds or {}))
    sized.update({k: v[0] for k, v in shapes.items() if len(v) == 1 and k in dim_params(model)})
    return optimize_dynamic(model, sized, target=target, gpu=GPUS[gpu], **options)


def _specialize_from(model, feeds: dict) -> dict:
    from .subgraph.convert import shape_inputs

    return {k: feeds[k] for k in shape_inputs(model) if k in feeds}


def _schedule_reader(directory: str, gpu_name: str):
    from .schedule.saved import Schedule

    if not os.path.isdir(directory):
        raise ScheduleError(f"--schedules {directory}: no such directory")

    def read(k: int, signature: str):
        path = os.path.join(directory, f"sg{k}.{gpu_name}.json")
        if not os.path.isfile(path):
            raise ScheduleError(f"{path}: no saved schedule for subgraph {k} ({signature})")
        with open(path) as f:
            s = Schedule.from_json(f.read(), path)
        if s.subgraph != signature:
            raise ScheduleError(f"{path}: saved for subgraph {s.subgraph!r}, but subgraph {k} is now {signature!r}")
        return s

    return read


def _verify(opt, feeds, seed=0, rtol=None, atol=None, against="reference") -> dict:
    """Verify `opt` and describe the outcome: ok, the summary line, and every mismatch."""
    checks = opt.verify(feeds, seed=seed, rtol=rtol, atol=atol, against=against)
    bad = [c for c in checks if not c.ok]
    refs = ", ".join(dict.fromkeys(c.reference for c in checks))
    given = "given inputs" if feeds is not None else f"random inputs, seed {seed}"
    return {
        "ok": not bad,
        "summary": f"verify: {len(checks) - len(bad)}/{len(checks)} values match ({refs}; {given}; {opt.backend} backend)",
        "mismatches": [{"value": c.value, "reference": c.reference, "detail": c.detail} for c in bad],
    }


def _verify_and_print(console, opt, feeds, seed=0, rtol=None, atol=None, against="reference") -> bool:
    v = _verify(opt, feeds, seed, rtol, atol, against)
    for m in v["mismatches"]:
        console.print(f"[red]MISMATCH[/red] {m['value']!r} vs {m['reference']}: {m['detail']}")
    console.print(v["summary"], markup=False)
    return v["ok"]


# -- commands ---------------------------------------------------------------------------------
shape_opt = click.option(
    "--shape", "shape", multiple=True, metavar="NAME=DIMS", help="fix a symbolic input shape, e.g. x=2x128"
)
target_opt = click.option(
    "--target",
    type=click.Choice(["auto", "cpu", "cuda", "emulator"]),
    default="auto",
    show_default=True,
    help="where the subgraphs run: auto is cuda with a GPU, else cpu (OpenMP C++; plans and reports stay the "
    "GPU's, a subgraph cpu refuses runs on the emulator, the reason printed)",
)
verify_opt = click.option(
    "--verify",
    type=click.Choice(["reference", "onnxruntime"]),
    is_flag=False,
    flag_value="reference",
    default=None,
    help="compare every output with a float64 reference (--verify=onnxruntime: with onnxruntime too)",
)
seed_opt = click.option("--seed", type=int, default=0, show_default=True, help="seed of the random verification inputs")
rtol_opt = click.option("--rtol", type=click.FloatRange(min=0), help="widen --verify's relative tolerance to this")
atol_opt = click.option("--atol", type=click.FloatRange(min=0), help="widen --verify's absolute tolerance to this")
gpu_opt = click.option(
    "--gpu",
    type=click.Choice(sorted(GPUS)),
    default="h100",
    show_default=True,
    help="GPU the plans are made and modeled for",
)


@click.group(cls=PanameraGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="panamera", message="%(prog)s %(version)s")
def cli():
    """Panamera: a polyhedral, reduction-parallelizing compiler for deep-learning operators.

    Every command takes -v (stage times), -q (no progress) and --debug (tracebacks), before or
    after its name; progress goes to stderr (a bar on a terminal, plain lines when piped)."""


@cli.command()
def demo():
    """Compile, run and check the single-reduction suite; print the plans."""
    sys.exit(run_demo())


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(file_okay=False), help="write kernels, report.md and report.json here")
@click.option("--force", is_flag=True, help="replace what an earlier `optimize --out` wrote in --out")
@verify_opt
@click.option("--inputs", type=click.Path(dir_okay=False), help=".npz of model inputs (for --verify; else random)")
@seed_opt
@rtol_opt
@atol_opt
@click.option("--save-schedules", type=click.Path(file_okay=False), help="write one schedule file per subgraph here")
@click.option("--schedules", type=click.Path(file_okay=False), help="replay the schedules saved here")
@shape_opt
@click.option("--hint", multiple=True, metavar="DIM=N",
              help="a symbolic dim's size hint for the modeled figures (dims no --shape fixes stay symbolic)")  # fmt: skip
@target_opt
@gpu_opt
def optimize(model, out, force, verify, inputs, seed, rtol, atol, save_schedules, schedules, shape, hint, target, gpu):
    """Partition MODEL, compile its memory-intensive subgraphs and report the plans. Symbolic dims
    (dim_param) that no --shape fixes stay symbolic: the subgraphs are compiled once for every size
    (the figures are modeled at --hint sizes, 8 by default) and `--out` runs at every size."""
    from .subgraph import deploy, folder
    from .subgraph.report import build_report, whole_model_line, write_outputs

    if verify == "onnxruntime":
        logs.require_extra(logs.Extra.ONNXRUNTIME, "--verify=onnxruntime")
    console = _console()
    if out:  # before any work: a writable folder, not holding the model, replaced only if Panamera wrote it
        folder.check_out(out, model, force, deploy.MANIFEST, deploy.FORMAT)
    feeds = _load_npz(inputs) if inputs else None
    spec = _specialize_from(model, feeds) if feeds else None
    reader = _schedule_reader(schedules, GPUS[gpu].name) if schedules else None
    dm = _dynamic(model, _shapes(shape), hint, target, gpu, feeds, schedules=reader)
    opt = dm.hinted if dm else _optimize(model, _shapes(shape), target, gpu, spec, reader)
    if out:
        from .subgraph.dynamic_deploy import EXTRA, write_dynamic

        folder.clear_out(out, deploy.MANIFEST, deploy.FORMAT, ("report.md", "report.json", *EXTRA))
        os.makedirs(out, exist_ok=True)
        report = write_dynamic(dm, out) if dm else write_outputs(opt, out)
    else:
        report = build_report(opt)
    rows = [
        (s["label"], " ".join(n["op"] for n in s["nodes"]), s["launches"], f"{s['modeled_us']:.1f}",
         f"{s['unfused_modeled_us']:.1f} ({s['unfused_launches']})",
         f"{s['speedup_vs_unfused']:.2f}x" if s["speedup_vs_unfused"] else "-", f"{s['compile_s'] * 1e3:.0f}")
        for s in report["subgraphs"]
    ]  # fmt: skip
    console.print(_table(f"{os.path.basename(model)}: subgraphs ({opt.gpu.name}, modeled)",
                         ("subgraph", "ops", "launches", "us", "unfused us (launches)", "speedup", "compile ms"), rows))  # fmt: skip
    for lib in report["library"]:
        console.print(f"library: {lib['op']} {lib['name']!r}: {lib['reason']}", markup=False)
    for s in report["subgraphs"]:
        for r in s["routed"]:
            console.print(f"{s['label']}: {r['op']} {r['name']!r} routed to Panamera: {r['reason']}", markup=False)
        if s["alone"]:
            console.print(f"{s['label']} is alone: {s['alone']}", markup=False)
    console.print(whole_model_line(report["whole_model"]) + f" ({opt.gpu.name}, modeled)", markup=False)
    if dm:
        console.print(f"kept symbolic: {dm.describe()}", markup=False)
    if save_schedules:
        os.makedirs(save_schedules, exist_ok=True)
        for sg in opt.subgraphs:
            sched = dataclasses.replace(sg.compiled.schedule, subgraph=sg.signature)
            with open(os.path.join(save_schedules, f"sg{sg.id}.{opt.gpu.name}.json"), "w") as f:
                f.write(sched.to_json())
        console.print(f"schedules: {len(opt.subgraphs)} file(s) in {save_schedules}")
    if out:
        console.print(
            f"wrote {out}/report.md, {out}/report.json, {len(opt.subgraphs)} kernel file(s) and the deployable "
            f"model ({out}/manifest.json; run it with `panamera run {out}`)",
            markup=False,
        )
    checked = dm.at(dm.hints) if dm else opt  # the symbolic programs, at the hint
    if verify and not _verify_and_print(console, checked, feeds, seed, rtol, atol, verify):
        sys.exit(1)


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--node", required=True, help="name of a node in the subgraph to explain")
@click.option(
    "--section", "section", multiple=True, type=click.Choice(["subgraph", *[s.value for s in Section], "all"]),
    help="show only this part (repeatable): subgraph (its ops and why), or a part of the plan; default: all",
)  # fmt: skip
@shape_opt
@target_opt
@gpu_opt
def explain(model, node, section, shape, target, gpu):
    """Show the subgraph holding NODE: its ops, plan, isl schedule and CUDA (or only --section's)."""
    from .subgraph.optimizer import Subgraph
    from .subgraph.report import why_alone

    console = _console()
    opt = _optimize(model, _shapes(shape), target, gpu)
    unit = opt.subgraph_of(node)
    if not isinstance(unit, Subgraph):
        where = "on the host, even with a GPU" if unit.host else "on the device with a GPU"
        console.print(
            f"node {node!r} ({unit.node.op_type}) runs in the array library ({where}): {unit.reason}", markup=False
        )
        return
    wanted = [s for s in section if s != "all"] if "all" not in section else []
    if not wanted or "subgraph" in wanted:
        console.print(f"{unit.label}: " + ", ".join(f"{n.label!r} ({n.op_type})" for n in unit.nodes), markup=False)
        console.print(f"inputs {list(unit.inputs) + list(unit.weights)} -> outputs {list(unit.outputs)}", markup=False)
        for n in unit.nodes:
            route = opt.partition.route(n) if opt.partition else None
            if route is not None:
                console.print(f"routed: {n.op_type} {n.label!r}: {route.reason}", markup=False)
        if why_alone(opt, unit):
            console.print(f"alone: {why_alone(opt, unit)}", markup=False)
    parts = [s for s in wanted if s != "subgraph"]
    if parts or not wanted:
        which = parts or [*DEFAULT_SECTIONS, Section.SOURCE]
        console.print(unit.compiled.explain(which), markup=False)


@cli.command()
@click.argument("model", type=click.Path())
@click.option("--inputs", type=click.Path(dir_okay=False), help=".npz with one array per model input (else random)")
@click.option("--output", type=click.Path(dir_okay=False), help="write the outputs to this .npz")
@verify_opt
@seed_opt
@rtol_opt
@atol_opt
@click.option(
    "--repeat", type=click.IntRange(min=0), default=0, help="time N runs of the whole model on the backend in use"
)
@click.option(
    "--warmup", type=click.IntRange(min=0), default=1, show_default=True, help="untimed runs before --repeat's"
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (outputs, timing, verify) instead of text")
@click.option(
    "--profile", "profile_runs", type=click.IntRange(min=0), default=0,
    help="time N more runs per kind of step (medians: subgraph/cpu_chain.profile) and print the table",
)  # fmt: skip
@shape_opt
@target_opt
@gpu_opt
def run(model, inputs, output, verify, seed, rtol, atol, repeat, warmup, as_json, profile_runs, shape, target, gpu):
    """Run MODEL (an .onnx file, or a directory written by `optimize --out`, which runs without
    optimizing again) on INPUTS: Panamera kernels for the subgraphs, the array library for the rest.
    --repeat N times N runs after --warmup ones and prints p50, p90 and min (wall clock); --profile N
    prints where a run's time goes, per kind of step."""
    from .subgraph import load_optimized
    from .subgraph.verify import random_inputs

    if verify == "onnxruntime":
        logs.require_extra(logs.Extra.ONNXRUNTIME, "--verify=onnxruntime")
    console = _console()
    if output:
        from .subgraph.folder import writable_target

        writable_target(output, "--output", directory=False)
    feeds = _load_npz(inputs) if inputs else None
    dm = None
    if os.path.isdir(model):
        from .subgraph.dynamic_deploy import is_dynamic, load_dynamic

        if shape:
            raise InputError(f"--shape: {model} is an optimized directory; its shapes were fixed by `optimize`")
        dm = load_dynamic(model, target) if is_dynamic(model) else None
        opt = dm.hinted if dm else load_optimized(model, target)
    else:
        dm = _dynamic(model, _shapes(shape), (), target, gpu, feeds)
        opt = (
            dm.hinted
            if dm
            else _optimize(model, _shapes(shape), target, gpu, _specialize_from(model, feeds) if feeds else None)
        )
    if feeds is None:
        feeds = {**random_inputs(opt.model, seed), **opt.model.specialized}
    if dm:  # symbolic dims: the model at the feeds' sizes, its symbolic programs shared by every size
        opt = dm.at(dm.sizes(feeds))
    t0 = time.perf_counter()
    outs = opt.run(feeds)
    dt = time.perf_counter() - t0
    host = {k: (v.get() if type(v).__module__.startswith("cupy") else np.asarray(v)) for k, v in outs.items()}
    means = {k: float(np.mean(a.astype(np.float64))) if a.size else float("nan") for k, a in host.items()}
    timing = opt.measure(feeds, repeat, warmup) if repeat else None
    steps = None
    if profile_runs:
        from .subgraph.cpu_chain import describe, profile

        steps = profile(opt, feeds, profile_runs)
    if output:
        np.savez(output, **host)
    checked = _verify(opt, feeds if inputs else None, seed, rtol, atol, verify) if verify else None
    if as_json:
        doc = {
            "model": model, "target": str(opt.target), "backend": opt.backend,
            "subgraphs": len(opt.subgraphs), "library_nodes": len(opt.library), "run_s": dt,
            "outputs": {k: {"dtype": str(a.dtype), "shape": list(a.shape), "mean": means[k] if math.isfinite(means[k]) else None}
                        for k, a in host.items()},
            "timing": timing.to_dict() if timing else None, "verify": checked,
            "profile": [{"step": k, "count": n, "us": us} for k, n, us in steps] if steps else None,
        }  # fmt: skip
        click.echo(json.dumps(doc, indent=1))
    else:
        for name, a in host.items():
            console.print(f"{name}: {a.dtype}{list(a.shape)} mean {means[name]:.6g}", markup=False)
        console.print(
            f"ran {len(opt.subgraphs)} Panamera subgraph(s) and {len(opt.library)} library node(s) in {dt:.3f} s "
            f"({opt.target})",
            markup=False,
        )
        for sg in opt.subgraphs:  # what the CPU target refused ran on the emulator: say why
            if sg.runner_note:
                console.print(f"{sg.label}: ran on the emulator: {sg.runner_note}", markup=False)
        if timing:
            console.print(timing.describe(), markup=False)
        if steps:
            console.print(describe(steps), markup=False)
        if checked:
            for m in checked["mismatches"]:
                console.print(f"[red]MISMATCH[/red] {m['value']!r} vs {m['reference']}: {m['detail']}")
            console.print(checked["summary"], markup=False)
    if checked and not checked["ok"]:
        sys.exit(1)


@cli.command()
@click.option(
    "--suite",
    type=click.Choice(["single", "subgraphs", "norms", "contractions", "training", "steps", "models", "all", "tiny"]),
    default="all",
    show_default=True,
)
@click.option(
    "--gpu",
    type=click.Choice(sorted(GPUS)),
    default="h100",
    show_default=True,
    help="GPU the plans are made and modeled for",
)
@click.option("--out", type=click.Path(file_okay=False), help="write results.json and summary.md (and plots) here")
@click.option("--plot", is_flag=True, help="write PNG bar charts to --out (needs matplotlib)")
@click.option(
    "--measure/--no-measure",
    default=None,
    help="time kernels on the GPU (default: when CuPy sees one); without a GPU, --measure times the CPU target "
    "against numpy, torch, Inductor and onnxruntime (bench/cpu/)",
)
@click.option("--repeat", default=20, show_default=True, help="timed runs per kernel (median) with --measure")
def bench(suite, gpu, out, plot, measure, repeat):
    """Reproduce the paper's experiments: every workload planned as Panamera, deterministic,
    single-block and eager, modeled on the GPU (and timed where one is present)."""
    from .bench import run_bench
    from .bench.suites import SUITES, tiny

    if plot and not out:
        raise InputError("--plot writes PNG files: give --out DIR")
    if plot:
        logs.require_extra(logs.Extra.MATPLOTLIB, "bench --plot")
    console = _console()
    if suite == "steps":  # training steps of small models through torch.compile (panamera/bench/train_steps.py)
        from .bench.train_steps import run_steps

        text = run_steps(gpu=GPUS[gpu])[1]
        console.print(text, markup=False)
        if out:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "steps.md"), "w") as f:
                f.write(text)
        return
    suites = list(SUITES) if suite == "all" else [suite]
    workloads = tiny() if suite == "tiny" else None
    argv = sys.argv[1:]  # the command as typed (options before `bench` too); else what it amounts to
    cmd = shlex.join(["panamera", *argv]) if "bench" in argv else f"panamera bench --suite {suite} --gpu {gpu}"
    from .bench.cpu_measure import measure_on_cpu

    if measure and measure_on_cpu():  # issue 24: no GPU, so the CPU target is timed against CPU peers
        from .bench.cpu_measure import bench_cpu

        console.print(bench_cpu(suite, out, plot, repeat, cmd, lambda m: console.print(m, markup=False)), markup=False)
        return
    if suite == "models":  # whole exported models vs onnxruntime: measured on the CPU target only
        raise OptionError("bench --suite models times the CPU target against onnxruntime: give --measure (no GPU)")
    _, summary = run_bench(suites, GPUS[gpu], out, plot, measure, repeat, workloads, None, cmd)
    console.print(summary, markup=False)
    if out:
        console.print(f"wrote {out}/results.json and {out}/summary.md", markup=False)


@cli.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="default: the database pn.compile consults ($PANAMERA_SCHEDULES, else the package's panamera/schedules/)",
)
@click.option(
    "--gpu", "gpus", multiple=True, type=click.Choice(sorted(GPUS)), default=("h100", "a100"), show_default=True
)
def schedules(out, gpus):
    """Fill the schedule database: every workload of docs/WORKLOADS.md planned by the model for
    each GPU, one JSON per workload and GPU (what `pn.compile` replays)."""
    from .bench.schedules import write_database
    from .schedule import database

    out = out or str(database.directory() or database.PACKAGE_DIR)
    written = write_database(out, [GPUS[g] for g in gpus])
    _console().print(f"wrote {len(written)} schedules to {out}/", markup=False)


@cli.group()
def cache():
    """The on-disk kernel cache ($PANAMERA_CACHE, default ~/.cache/panamera; =off disables it)."""


@cache.command("info")
def cache_info():
    """Where the kernel cache is, how many libraries it holds and their size."""
    from .cache import disk_info

    print(disk_info().describe())


@cache.command("clear")
def cache_clear():
    """Delete every cached kernel library (they are rebuilt when needed)."""
    from .cache import disk_clear, disk_info

    n, where = disk_clear(), disk_info().path
    print(f"kernel cache: removed {n} file(s) from {where}" if where else "kernel cache: disabled, nothing to clear")


# click >= 8.2 raises NoArgsIsHelpError for `panamera` or `panamera cache` alone; 8.1 prints the help
# and raises Exit(0) itself, so the clause in main() catches nothing there.
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _shell_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line, a PanameraWarning's advice in the CLI's spelling (`--target emulator`)."""
    _one_line_warning(getattr(message, "shell", None) or message, category, filename, lineno, file, line)


def _usage_line(e: click.ClickException) -> str:
    """A click error as one line, with the help command to run."""
    ctx = getattr(e, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"panamera: error: {e.format_message()}{hint}"


_held: list[str] = []  # warnings about the results, shown once the command has some


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = f"panamera: warning: {str(message).splitlines()[0]}"
    if issubclass(category, EmulatorWarning):  # about the results: shown after them, never before an error
        _held.append(text)
    else:
        _print_warning(text)


def _print_warning(text: str) -> None:
    c = logs.console()  # above a progress bar, where one is drawn
    if c is not None:
        c.print(text, markup=False, highlight=False, soft_wrap=True)
    else:
        print(text, file=sys.stderr)


def _release_held() -> None:
    for text in dict.fromkeys(_held):
        _print_warning(text)
    _held.clear()


def main(argv=None) -> int:
    """Entry point: one-line errors with exit status 2 (1 for a failed check, 3 for a bug),
    one-line warnings, tracebacks with --debug."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    _held.clear()
    try:
        with warnings.catch_warnings():
            if not debug:
                warnings.showwarning = _shell_warning
            cli.main(args=args, prog_name="panamera", standalone_mode=False)
    except click.exceptions.Exit as e:
        return e.exit_code
    except _NO_ARGS_IS_HELP as e:  # `panamera` or `panamera cache` alone: the help
        print(e.format_message())
        return 0
    except click.ClickException as e:
        print(_usage_line(e), file=sys.stderr)
        return e.exit_code
    except click.exceptions.Abort:
        print("panamera: aborted", file=sys.stderr)
        return 130
    except SystemExit as e:
        _release_held()
        return e.code if isinstance(e.code, int) else 1
    except (PanameraError, ModelError) as e:
        if debug:
            raise
        print(f"panamera: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug: say so briefly, the traceback is one flag away
        if debug:
            raise
        if isinstance(e, OSError) and e.filename is not None:  # the file system refused: named, not a bug
            print(f"panamera: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
            return 2
        print(
            f"panamera: internal error: {type(e).__name__}: {e} (run with --debug for the traceback)", file=sys.stderr
        )
        return 3
    _release_held()
    return 0


if __name__ == "__main__":
    sys.exit(main())
