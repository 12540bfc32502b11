"""What the `panamera` command says while it works and how it reads (issue 19, items 5 and 7):
-v / -q / --debug on every command, progress lines when piped and a bar on a terminal, optional
dependencies checked before the work, `explain --section`, `run --repeat --json`."""

from __future__ import annotations

import io
import json
import logging
import re

import click
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from panamera import logs
from panamera.cli import cli, main
from panamera.cli_base import PanameraGroup, verbosity
from panamera.errors import MissingDependency


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """Exp then ReduceSum over a (4, 8) input: one subgraph, one kernel, compiled in well under a second."""
    v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    g = helper.make_graph(
        [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("ReduceSum", ["e"], ["y"], keepdims=0)],
        "g", [v("x", [4, 8])], [v("y", [])],
    )  # fmt: skip
    path = tmp_path_factory.mktemp("m") / "m.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return str(path)


def invoke(*args):
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return r


@pytest.fixture
def probe():
    """A throw-away group with one command that reports the verbosity its options asked for."""

    @click.group(cls=PanameraGroup)
    def tool():
        pass

    @tool.command()
    def show():
        click.echo(verbosity())

    @tool.group()
    def sub():
        pass

    @sub.command()
    def deep():
        click.echo(verbosity())

    return tool


@pytest.mark.parametrize(
    "args, want",
    [
        (["show"], "normal"),
        (["-v", "show"], "debug"),
        (["show", "-v"], "debug"),
        (["show", "--verbose"], "debug"),
        (["show", "-q"], "quiet"),
        (["-q", "show"], "quiet"),
        (["show", "--quiet"], "quiet"),
        (["show", "--debug"], "debug"),
        (["--debug", "show"], "debug"),
        (["sub", "deep", "-q"], "quiet"),
        (["-v", "sub", "deep"], "debug"),
    ],
)
def test_verbosity_options_before_or_after_any_command(probe, args, want):
    r = CliRunner().invoke(probe, args, catch_exceptions=False)
    assert r.exit_code == 0 and r.output.strip() == want


@pytest.mark.parametrize(
    "name", ["demo", "optimize", "explain", "run", "bench", "schedules", "cache info", "cache clear"]
)
def test_every_command_documents_the_common_options(name):
    r = invoke(*name.split(), "--help")
    assert r.exit_code == 0
    assert all(flag in r.output for flag in ("-v, --verbose", "-q, --quiet", "--debug")), r.output


def test_logging_is_reset_after_a_command(probe):
    CliRunner().invoke(probe, ["show", "-v"])
    assert logging.getLogger("panamera").level == logging.NOTSET and logs.console() is None


def test_piped_run_prints_progress_lines_on_stderr(model, monkeypatch):
    quick = invoke("run", model, "--target", "emulator", "--repeat", "2")
    assert quick.exit_code == 0 and quick.stderr == ""  # work of well under INTERVAL says nothing
    monkeypatch.setattr(logs, "INTERVAL", 0.0)  # as if every step took long
    r = invoke("run", model, "--target", "emulator", "--repeat", "2")
    assert r.exit_code == 0
    err = r.stderr
    assert "panamera: compiling subgraph 1/1: Exp+ReduceSum" in err
    assert re.search(r"panamera: timed run 1/3: warm-up\npanamera: timed run 2/3", err), err
    assert "y: float32[] mean" in r.stdout and "panamera:" not in r.stdout


def test_quiet_prints_no_progress_and_verbose_prints_stage_times(model):
    quiet = invoke("run", model, "--target", "emulator", "-q")
    assert quiet.exit_code == 0 and quiet.stderr == "" and "y: float32[]" in quiet.stdout
    from panamera import cache

    cache.clear()  # compile again, stage by stage
    loud = invoke("run", "-v", model, "--target", "emulator")
    assert re.search(r"panamera: debug: compiler: stage mappings: [\d.]+ ms", loud.stderr), loud.stderr
    assert "panamera: debug: compiler: compile: 1 kernel(s)" in loud.stderr


def test_debug_after_the_command_shows_the_traceback(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    assert main(["run", str(bad)]) == 2
    with pytest.raises(Exception):  # noqa: B017  (the error itself, not a one-line message)
        main(["run", str(bad), "--debug"])


def test_a_terminal_gets_a_bar_not_lines():
    buf = io.StringIO()
    from rich.console import Console

    logs.configure(logs.Verbosity.NORMAL, Console(file=buf, force_terminal=True, width=100), bar=True)
    try:
        with logs.steps("compiling subgraph", 2, logs.get("t"), interval=0.0) as s:
            s.step("a")
            s.step("b")
    finally:
        logs.reset()
    out = buf.getvalue()
    assert "compiling subgraph 1/2" not in out  # no plain lines: a bar drawn with control codes
    assert "\x1b[" in out


def test_plain_lines_are_throttled(caplog, monkeypatch):
    clock = iter(range(0, 1000, 1))  # the work starts at 0 s, step k at k + 1 s
    monkeypatch.setattr(logs.time, "perf_counter", lambda: float(next(clock)))
    with caplog.at_level(logging.INFO, logger="panamera"):
        with logs.steps("workload", 10, logs.get("t"), interval=3) as s:
            for k in range(10):
                s.step(str(k))
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:3] == ["workload 3/10: 2", "workload 6/10: 5", "workload 9/10: 8"]  # at 3, 6 and 9 s
    assert lines[3] == "workload: 10 step(s) in 11.0 s" and len(lines) == 4


def test_missing_optional_dependency_is_reported_before_the_work(monkeypatch, model, tmp_path):
    real = logs.importlib.util.find_spec
    monkeypatch.setattr(logs.importlib.util, "find_spec", lambda m, *a: None if m == "onnxruntime" else real(m, *a))
    r = CliRunner().invoke(cli, ["run", model, "--verify=onnxruntime"])
    assert isinstance(r.exception, MissingDependency) and "pip install onnxruntime" in str(r.exception)
    assert "compiling subgraph" not in r.stderr  # nothing was compiled first
    monkeypatch.setattr(logs.importlib.util, "find_spec", lambda m, *a: None if m == "matplotlib" else real(m, *a))
    r = CliRunner().invoke(cli, ["bench", "--suite", "tiny", "--plot", "--out", str(tmp_path)])
    assert isinstance(r.exception, MissingDependency) and "panamera[plot]" in str(r.exception)
    assert not list(tmp_path.iterdir())  # no workload was benched
    assert main(["bench", "--suite", "tiny", "--plot", "--out", str(tmp_path)]) == 2


def test_run_repeat_json_has_warmup_and_percentiles(model):
    r = invoke("run", model, "--target", "emulator", "--repeat", "3", "--warmup", "2", "--json", "-q")
    doc = json.loads(r.stdout)
    t = doc["timing"]
    assert (t["warmup"], t["repeat"], len(t["times_s"])) == (2, 3, 3)
    assert t["min_s"] <= t["p50_s"] <= t["p90_s"] <= max(t["times_s"])
    assert doc["outputs"]["y"]["dtype"] == "float32" and doc["outputs"]["y"]["shape"] == []
    assert doc["backend"] == "emulator" and doc["verify"] is None


def test_run_repeat_text_says_percentiles(model):
    r = invoke("run", model, "--target", "emulator", "--repeat", "2", "--verify")
    assert re.search(r"p50 [\d.]+ ms, p90 [\d.]+ ms, min [\d.]+ ms over 2 run\(s\) after 1 warm-up", r.stdout)
    assert "verify: 1/1 values match" in r.stdout


def test_run_json_reports_verify(model):
    doc = json.loads(invoke("run", model, "--target", "emulator", "--json", "--verify", "-q").stdout)
    assert doc["verify"]["ok"] and doc["verify"]["mismatches"] == [] and doc["timing"] is None


def test_explain_section(model):
    plan = invoke("explain", model, "--node", "Exp_0", "--target", "emulator", "--section", "plan", "-q").stdout
    assert plan.startswith("Panamera plan:") and "__global__" not in plan and "launch pn_" not in plan
    source = invoke("explain", model, "--node", "Exp_0", "--target", "emulator", "--section", "source", "-q").stdout
    assert "__global__" in source and "Panamera plan" not in source
    both = invoke("explain", model, "--node", "Exp_0", "--target", "emulator", "--section", "subgraph",
                  "--section", "launches", "-q").stdout  # fmt: skip
    assert both.startswith("sg0_Exp_ReduceSum:") and "launch pn_" in both and "Panamera plan" not in both
    full = invoke("explain", model, "--node", "Exp_0", "--target", "emulator", "-q").stdout
    assert all(s in full for s in ("sg0_Exp_ReduceSum:", "Panamera plan", "launch pn_", "__global__", "model ("))
    bad = CliRunner().invoke(cli, ["explain", model, "--node", "Exp_0", "--section", "nope"])
    assert bad.exit_code == 2 and "nope" in bad.output
