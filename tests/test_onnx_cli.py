"""The `panamera` command on ONNX models: optimize / explain / run, schedules, bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from panamera.cli import cli, main

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import onnx_models  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    paths = {}
    for name, data in (
        ("encoder", onnx_models.encoder(seq=32, hidden=64, heads=2)),
        ("convnet", onnx_models.convnet(c=16, hw=8, groups=4)),
    ):
        paths[name] = str(d / f"{name}.onnx")
        with open(paths[name], "wb") as f:
            f.write(data)
    return paths


def run_cli(*args):
    """(exit status, stdout, stderr) of main(), which is what the console script runs."""
    runner = CliRunner()
    result = runner.invoke(cli, list(args), standalone_mode=False, catch_exceptions=True)
    return result


def panamera(*args):
    return subprocess.run([sys.executable, "-m", "panamera.cli", *args], capture_output=True, text=True, timeout=600)


def test_optimize_writes_report_kernels_and_verifies(models, tmp_path):
    out = tmp_path / "build"
    # the GPU model's routing (the emulator runs the plans): with the CPU target every MatMul Panamera
    # can plan runs in its program whatever the model says (route.HOST_PANAMERA)
    r = panamera(
        "optimize", models["encoder"], "--shape", "batch=2", "--out", str(out), "--verify", "--target", "emulator"
    )
    assert r.returncode == 0, r.stderr
    assert re.search(r"verify: (\d+)/\1 values match", r.stdout), r.stdout
    rep = json.loads((out / "report.json").read_text())
    ops = [[n["op"] for n in s["nodes"]] for s in rep["subgraphs"]]
    # scale, mask and softmax fused into one subgraph with the QK^T MatMul: the model routes it to
    # Panamera since its scale and mask run in its own launch (poly/epilogue.py)
    assert ["MatMul", "Mul", "Add", "Softmax"] in ops
    for s in rep["subgraphs"]:
        assert (out / s["cuda_file"]).read_text().count("__global__") >= 1
        assert s["unfused_launches"] >= s["launches"] >= 1
        assert s["modeled_us"] > 0
    lib = {n["op"] for n in rep["library"]}
    assert "Transpose" not in lib  # a layout change is an access of Panamera's kernels
    # every MatMul was routed by the model, both figures in its reason, whichever side runs it
    routed = [r["reason"] for s in rep["subgraphs"] for r in s["routed"]]
    reasons = [n["reason"] for n in rep["library"] if n["op"] == "MatMul"] + routed
    assert len(reasons) == 3 and all("library: " in w and "Panamera: " in w and "us modeled" in w for w in reasons)
    assert "Transpose" in (out / "report.md").read_text()


def test_optimize_refuses_existing_out_without_force(models, tmp_path):
    r = panamera("optimize", models["convnet"], "--out", str(tmp_path))
    assert r.returncode == 2 and "exists; pass --force" in r.stderr and "Traceback" not in r.stderr
    r = panamera("optimize", models["convnet"], "--out", str(tmp_path), "--force")
    assert r.returncode == 0, r.stderr


def test_run_whole_model_matches_reference(models, tmp_path):
    rng = np.random.default_rng(0)
    img = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", img=img)
    r = panamera(
        "run",
        models["convnet"],
        "--inputs",
        str(tmp_path / "in.npz"),
        "--output",
        str(tmp_path / "out.npz"),
        "--verify",
    )
    assert r.returncode == 0, r.stderr
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(models["convnet"]).run(None, {"img": img})[0]
    got = np.load(tmp_path / "out.npz")["logp"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_explain_one_node(models):
    r = run_cli("explain", models["convnet"], "--node", "gn", "--target", "emulator")
    assert r.exit_code == 0, r.output
    assert "GroupNormalization" in r.output and "Panamera plan" in r.output and "__global__" in r.output
    r = run_cli("explain", models["convnet"], "--node", "conv", "--target", "emulator")
    # a Conv is routed by the model like a MatMul (issue 20): both figures and the verdict
    out = " ".join(r.output.split())
    assert "routed: Conv 'conv': memory-bound" in out and "us modeled (tensor cores)" in out


def test_optimize_and_explain_say_how_matmuls_were_routed(models):
    r = run_cli("optimize", models["encoder"], "--shape", "batch=2", "--target", "emulator")
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())  # rich wraps long lines
    assert "routed to Panamera: memory-bound" in out and "us modeled (tensor cores)" in out
    r = run_cli("explain", models["encoder"], "--shape", "batch=2", "--node", "fc1", "--target", "emulator")
    assert r.exit_code == 0, r.output
    assert "routed: MatMul 'fc1': memory-bound" in " ".join(r.output.split())
    r = run_cli("explain", models["encoder"], "--shape", "batch=2", "--node", "pv", "--target", "emulator")
    assert "runs in the array library (on the device with a GPU): memory-bound" in " ".join(r.output.split())
    assert "Panamera: " in r.output


def test_schedules_round_trip_and_refusal(models, tmp_path):
    sd = tmp_path / "sched"
    r = panamera("optimize", models["convnet"], "--save-schedules", str(sd))
    assert r.returncode == 0, r.stderr
    files = sorted(os.listdir(sd))
    assert files and all(f.endswith(".H100-SXM5.json") for f in files)
    doc = json.loads((sd / files[0]).read_text())
    assert doc["format"] == "panamera-schedule/3" and doc["kernels"]
    r = panamera("optimize", models["convnet"], "--schedules", str(sd), "--verify")
    assert r.returncode == 0, r.stderr
    # The same schedules for a model whose shapes changed are refused with a clear message.
    other = tmp_path / "other.onnx"
    other.write_bytes(onnx_models.convnet(c=16, hw=12, groups=4))
    r = panamera("optimize", str(other), "--schedules", str(sd))
    assert r.returncode == 2 and "saved for subgraph" in r.stderr, r.stderr
    # A corrupt schedule file.
    (sd / files[0]).write_text("{not json")
    r = panamera("optimize", models["convnet"], "--schedules", str(sd))
    assert r.returncode == 2 and "not a readable schedule" in r.stderr


def test_schedule_for_another_gpu_is_refused(models, tmp_path):
    sd = tmp_path / "s"
    assert panamera("optimize", models["convnet"], "--save-schedules", str(sd)).returncode == 0
    r = panamera("optimize", models["convnet"], "--schedules", str(sd), "--gpu", "a100")
    assert r.returncode == 2 and "no saved schedule" in r.stderr


@pytest.mark.parametrize(
    "content, message",
    [
        (b"hello, not a model", "not an ONNX model"),
        (None, "truncated"),
        (b"", "not an ONNX model"),
    ],
)
def test_bad_files_give_one_line_errors(models, tmp_path, content, message):
    path = tmp_path / "m.onnx"
    if content is None:
        data = open(models["encoder"], "rb").read()
        content = data[: len(data) // 3]
        message = "not an ONNX model"
    path.write_bytes(content)
    r = panamera("optimize", str(path))
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_missing_file_and_debug_traceback(tmp_path):
    r = panamera("optimize", str(tmp_path / "nope.onnx"))
    assert r.returncode == 2 and "no such file" in r.stderr
    r = panamera("--debug", "optimize", str(tmp_path / "nope.onnx"))
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_symbolic_shape_stays_symbolic_or_is_fixed(models):
    r = panamera("optimize", models["encoder"], "--hint", "batch=2", "--target", "emulator")
    assert r.returncode == 0 and "kept symbolic: dim_params {'batch': 2}" in r.stdout, r.stderr  # issue 22
    r = panamera("optimize", models["encoder"], "--shape", "batch=2x2")
    assert r.returncode == 2 and "give one value" in r.stderr
    r = panamera("optimize", models["encoder"], "--shape", "q=1x2x3")
    assert r.returncode == 2 and "rank" in r.stderr
    r = panamera("optimize", models["encoder"], "--shape", "nonsense")
    assert r.returncode == 2 and "NAME=DIMS" in r.stderr


def test_unsupported_op_stays_with_library_and_is_reported(tmp_path):
    v = helper.make_tensor_value_info
    g = helper.make_graph(
        [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("TopK", ["e", "k"], ["vals", "idx"], axis=1),
         helper.make_node("ReduceMax", ["vals"], ["m"], keepdims=0)],
        "g", [v("x", TensorProto.FLOAT, [4, 16])], [v("m", TensorProto.FLOAT, []), v("idx", TensorProto.INT64, [4, 3])],
        initializer=[helper.make_tensor("k", TensorProto.INT64, [1], [3])],
    )  # fmt: skip
    path = tmp_path / "topk.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString())
    r = panamera("optimize", str(path), "--verify")
    assert r.returncode == 0, r.stderr
    assert "library: TopK" in r.stdout and "not supported by Panamera" in r.stdout
    assert "verify: 3/3" in r.stdout  # m, idx and the Exp subgraph's output e


def test_names_with_quotes_newlines_and_unicode_never_reach_cuda(tmp_path):
    bad = 'we"ird\nnäme */ #define X'
    v = helper.make_tensor_value_info
    g = helper.make_graph(
        [helper.make_node("Exp", [bad], ['e"x'], name='no"de\nñ'),
         helper.make_node("ReduceSum", ['e"x'], ["out ü"], name="r*/", keepdims=0)],
        "g", [v(bad, TensorProto.FLOAT, [4, 8])], [v("out ü", TensorProto.FLOAT, [])],
    )  # fmt: skip
    path = tmp_path / "weird.onnx"
    path.write_bytes(helper.make_model(g).SerializeToString())
    out = tmp_path / "o"
    r = panamera("optimize", str(path), "--out", str(out), "--verify")
    assert r.returncode == 0, r.stderr
    for f in os.listdir(out / "kernels"):
        src = (out / "kernels" / f).read_text()
        assert src.isascii() and 'we"ird' not in src and "#define X" not in src
    r = run_cli("explain", str(path), "--node", "r*/", "--target", "emulator")
    assert r.exit_code == 0 and "ReduceSum" in r.output


def test_run_rejects_wrong_inputs(models, tmp_path):
    np.savez(tmp_path / "bad.npz", img=np.zeros((2, 3, 8, 8), np.float64))
    r = panamera("run", models["convnet"], "--inputs", str(tmp_path / "bad.npz"))
    assert r.returncode == 2 and "expected dtype float32" in r.stderr
    np.savez(tmp_path / "missing.npz", other=np.zeros(3))
    r = panamera("run", models["convnet"], "--inputs", str(tmp_path / "missing.npz"))
    assert r.returncode == 2 and "missing model input" in r.stderr
    (tmp_path / "junk.npz").write_text("junk")
    r = panamera("run", models["convnet"], "--inputs", str(tmp_path / "junk.npz"))
    assert r.returncode == 2 and "not a readable .npz" in r.stderr


def test_main_returns_status_codes(models):
    assert main(["optimize", "/nonexistent.onnx"]) == 2
    assert main(["--help"]) == 0


def test_run_specializes_axes_given_as_inputs(tmp_path):
    v = helper.make_tensor_value_info
    g = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], "g",
        [v("x", TensorProto.FLOAT, [3, 5]), v("axes", TensorProto.INT64, [1])], [v("y", TensorProto.FLOAT, [3])],
    )  # fmt: skip
    path = tmp_path / "axes.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    np.savez(tmp_path / "in.npz", x=x, axes=np.array([1]))
    r = panamera(
        "run", str(path), "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "o.npz"), "--verify"
    )
    assert r.returncode == 0, r.stderr
    # a subprocess sees the real default: the CPU target without a GPU
    assert "1 Panamera subgraph(s)" in r.stdout and re.search(r"(cpu|cuda) backend", r.stdout), r.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], x.sum(1))
