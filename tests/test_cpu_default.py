"""The CPU target as the default without a GPU (issue 24 item 4): ONNX `run`, deploy folders,
`--target cpu` and torch.compile on CPU tensors run the CPU target's kernels; what it refuses runs
on the emulator (ONNX) or in eager PyTorch, with the reason listed. Marked `auto_default`: the
rest of the suite pins the default to the emulator (conftest.py)."""

import numpy as np
import pytest
from conftest import random_array, tolerance
from onnx import TensorProto, helper

import panamera as pn
from panamera import compiler, options
from panamera.runtime import cuda as cuda_backend

pytestmark = pytest.mark.auto_default


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(cuda_backend, "available", lambda: False)


def _model(shape=(4, 8)):
    v = helper.make_tensor_value_info
    g = helper.make_graph(
        [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("ReduceSum", ["e"], ["s"], keepdims=0)],
        "g", [v("x", TensorProto.FLOAT, list(shape))], [v("s", TensorProto.FLOAT, [])],
    )  # fmt: skip
    return helper.make_model(g)


def test_onnx_runs_on_the_cpu_and_its_deploy_folder_too(tmp_path, rng):
    from panamera.subgraph import load_optimized, optimize
    from panamera.subgraph.deploy import write_deployable

    opt = optimize(_model())
    (sg,) = opt.subgraphs
    assert sg.on_cpu and opt.backend == "cpu" and sg.runs.target == "cpu" and sg.compiled.target == "emulator"
    x = random_array((4, 8), "float32", rng)
    s = opt.run({"x": x})["s"]
    np.testing.assert_allclose(s, np.exp(x.astype(np.float64)).sum(), rtol=tolerance("float32", 32))
    assert all(c.ok for c in opt.verify())
    write_deployable(opt, str(tmp_path / "d"))  # the GPU plan: schedules and CUDA, replayed on load
    back = load_optimized(tmp_path / "d")
    assert back.backend == "cpu"
    np.testing.assert_array_equal(back.run({"x": x})["s"], s)


def test_a_subgraph_the_cpu_refuses_runs_on_the_emulator(monkeypatch, rng):
    from panamera import cpu_target
    from panamera.subgraph import optimize
    from panamera.subgraph.report import build_report

    def refuse(*a, **k):
        raise cpu_target.CpuUnsupportedError("target='cpu': a kind this test refuses")

    monkeypatch.setattr(compiler, "TARGET_COMPILERS", {options.Target.CPU: refuse})
    opt = optimize(_model((4, 9)))  # a shape of its own: not in the in-memory compile cache
    assert build_report(opt)["subgraphs"][0]["runs_on"] == "cpu"  # planned; compiled for the CPU at the first run
    assert opt.backend == "emulator" and "this test refuses" in opt.subgraphs[0].runner_note
    x = random_array((4, 9), "float32", rng)
    np.testing.assert_allclose(
        opt.run({"x": x})["s"], np.exp(x.astype(np.float64)).sum(), rtol=tolerance("float32", 36)
    )


def test_cli_target_cpu(tmp_path, capsys):
    from panamera.cli import main

    (tmp_path / "m.onnx").write_bytes(_model().SerializeToString())
    assert main(["run", str(tmp_path / "m.onnx"), "--target", "cpu", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "cpu backend" in out and "1/1 values match" in out


def test_torch_compile_on_cpu_tensors(rng):
    torch = pytest.importorskip("torch")
    from panamera import torch_backend

    torch_backend.reset_stats()
    f = torch.compile(lambda x: torch.softmax(x, -1).sum(-1) + x.amax(-1), backend="panamera")
    x = torch.from_numpy(random_array((6, 40), "float32", rng))
    y = f(x)
    (report,) = torch_backend.stats().reports
    assert report.kernels >= 1 and not report.eager, report.describe()
    x64 = x.double()
    ref = torch.softmax(x64, -1).sum(-1) + x64.amax(-1)
    np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=tolerance("float32", 40), atol=tolerance("float32", 40))


def test_the_default_target(monkeypatch):
    """auto: cuda with a GPU, cpu without; cpu refuses a replayed GPU schedule, auto then falls
    back to the emulator (test_clear_errors checks the warning)."""
    assert options.auto_target() == "cpu"
    monkeypatch.setattr(cuda_backend, "available", lambda: True)
    assert options.auto_target() == "cuda"
    assert pn.compile(pn.sum(pn.placeholder((4,), name="x")), target="emulator").target == "emulator"
