"""Whole-model figures and the deployable result: `optimize --out DIR` writes what `run DIR`
and `load_optimized(DIR)` run without optimizing again; `run --repeat` times the model."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import panamera.stages
import panamera.subgraph.optimizer
from panamera.cli import cli
from panamera.errors import ModelError
from panamera.subgraph import folder, load_optimized, optimize, write_deployable
from panamera.subgraph.report import build_report, roofline_us

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import onnx_models  # noqa: E402


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "encoder.onnx"
    path.write_bytes(onnx_models.encoder(seq=16, hidden=32, heads=2))
    return str(path)


def _cli(*args):
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return r


def test_whole_model_figure_counts_library_nodes(encoder):
    opt = optimize(encoder, shapes={"batch": (2,)}, target="emulator")
    rep = build_report(opt)
    w = rep["whole_model"]
    lib = sum(n["modeled_us"] for n in rep["library"])
    assert any(n["op"] == "MatMul" and n["modeled_us"] > 0 for n in rep["library"])
    assert w["library_modeled_us"] == pytest.approx(lib, abs=1e-2)
    assert w["modeled_us"] == pytest.approx(rep["totals"]["modeled_us"] + lib, abs=1e-2)
    assert w["per_node_modeled_us"] == pytest.approx(rep["totals"]["unfused_modeled_us"] + lib, abs=1e-2)
    assert w["per_node_launches"] > w["launches"] and w["speedup_vs_per_node"] > 1
    views = [u for u in opt.library if u.node.op_type in ("Reshape", "Transpose")]
    assert all(roofline_us(opt.model, u.node, opt.gpu)[1] == (u.node.op_type != "Reshape") for u in views)


def test_deployable_round_trip_without_reoptimizing(encoder, tmp_path, monkeypatch):
    out = tmp_path / "enc"
    r = _cli("optimize", encoder, "--shape", "batch=2", "--out", str(out), "--target", "emulator")
    assert r.exit_code == 0, r.output
    assert "Whole model:" in r.output and "one kernel per ONNX node" in r.output
    man = json.loads((out / "manifest.json").read_text())
    assert (out / "weights.npz").is_file() and (out / "graph.onnx").is_file()
    assert all((out / u["schedule"]).is_file() and (out / u["cuda"]).is_file() for u in man["units"] if "subgraph" in u)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 16, 32)).astype(np.float32)}
    feeds.update({k: v for k, v in np.load(_inputs(encoder, tmp_path)).items() if k != "x"})
    want = optimize(encoder, shapes={"batch": (2,)}, target="emulator").run(feeds)

    def no_search(*a, **k):
        raise AssertionError("the planner ran: the load re-optimized")

    monkeypatch.setattr(panamera.subgraph.optimizer, "partition", no_search)
    monkeypatch.setattr(panamera.stages, "map_group", no_search)
    got = load_optimized(out, target="emulator").run(feeds)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    np.savez(tmp_path / "in.npz", **feeds)
    r = _cli("run", str(out), "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "o.npz"), "--verify")
    assert r.exit_code == 0, r.output
    assert "values match" in r.output and "float64 reference" in r.output and "promotion failed" not in r.output
    with np.load(tmp_path / "o.npz") as z:
        for k in want:
            np.testing.assert_array_equal(z[k], want[k])


def _inputs(model: str, tmp_path) -> str:
    """An .npz with every input of `model` but x (random, as the verifier draws them)."""
    from panamera.subgraph.verify import random_inputs

    opt = optimize(model, shapes={"batch": (2,)}, target="emulator")
    np.savez(tmp_path / "rest.npz", **random_inputs(opt.model, 0))
    return str(tmp_path / "rest.npz")


def test_tampered_kernel_is_refused(tmp_path):
    from onnx import TensorProto, helper

    v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "g", [v("x", [2, 8])], [v("y", [2, 8])])
    opt = optimize(helper.make_model(g), target="emulator")
    man = write_deployable(opt, str(tmp_path))
    cu = tmp_path / man["units"][0]["cuda"]
    cu.write_text(cu.read_text() + "// edited\n")
    with pytest.raises(ModelError, match=r"\.cu: its SHA-256 differs from the one .*manifest.json recorded"):
        load_optimized(tmp_path, target="emulator")
    man["files"][man["units"][0]["cuda"]] = folder.digest(str(cu))  # the checksum rewritten too
    (tmp_path / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ModelError, match="differs from the saved one"):  # the byte-for-byte comparison stays
        load_optimized(tmp_path, target="emulator")
    os.remove(tmp_path / "weights.npz")
    with pytest.raises(ModelError, match="weights.npz: missing"):
        load_optimized(tmp_path, target="emulator")


def test_run_repeat_is_labelled_measured(encoder):
    r = _cli("run", encoder, "--shape", "batch=2", "--target", "emulator", "--repeat", "3")
    assert r.exit_code == 0, r.output
    assert (
        "measured on the CPU emulator (emulator backend): p50" in r.output
        and "over 3 run(s) after 1 warm-up run(s), wall clock" in r.output
    )
