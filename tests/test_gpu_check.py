"""`make gpu-check` without a GPU: its pieces run, its report is laid out, its wheels cover the
dependencies, and without a GPU it says so in one line."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from panamera import gpucheck

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import gpu_check  # noqa: E402  (the stdlib-only bootstrap, scripts/gpu_check.py)

FIXTURE = Path(__file__).parent / "data" / "gpu_check_records.json"


def _name(requirement: str) -> str:
    """The normalized distribution name of a requirement ("cupy-cuda12x[ctk]>=14" -> "cupy-cuda12x")."""
    return re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _script_packages() -> list[str]:
    text = (REPO / "scripts" / "fetch_wheels.sh").read_text()
    block = re.search(r"PACKAGES=\((.*?)\n\)", text, re.S).group(1)
    return re.findall(r'"([^"]+)"', block)


def test_the_wheel_script_covers_every_dependency():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in meta["dependencies"]} | {"pytest", _name(meta["optional-dependencies"]["cuda12"][0])}
    listed = {_name(p) for p in _script_packages()}
    assert wanted <= listed, wanted - listed
    assert "cupy-cuda12x[ctk]>=14" in _script_packages() and meta["optional-dependencies"]["cuda12"] == [
        "cupy-cuda12x[ctk]>=14"
    ]
    text = (REPO / "scripts" / "fetch_wheels.sh").read_text()
    for flag in ("--only-binary=:all:", "--python-version 3.12", "--platform manylinux2014_x86_64"):
        assert flag in text
    # what the bootstrap installs is what the script downloads
    assert {_name(r) for r in gpu_check.REQUIRED.values()} <= listed
    assert "/wheels/" in (REPO / ".gitignore").read_text().splitlines()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
@pytest.mark.parametrize("ci,status", [("true", 0), (None, 2)])
def test_without_a_gpu_one_line_and_the_exit_status(ci, status, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", *gpu_check.CI_VARIABLES)}
    env["PATH"] = str(tmp_path)  # no nvidia-smi there
    if ci:
        env["CI"] = ci
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check.py")], capture_output=True, text=True, env=env
    )
    assert r.returncode == status, r.stderr
    assert r.stdout.count("\n") == 1 and "no NVIDIA GPU" in r.stdout and not r.stderr


def test_the_makefile_runs_the_script():
    text = (REPO / "Makefile").read_text()
    assert re.search(r"^gpu-check:\n\t\$\(PY\) scripts/gpu_check.py$", text, re.M)


def test_the_modeled_vs_measured_table_from_a_recorded_json():
    records = json.loads(FIXTURE.read_text())
    table = gpucheck.modeled_vs_measured(records).splitlines()
    assert len(table) == 2 + 3  # header, rule, one row per measured Panamera workload (not the eager plans)
    assert table[2] == "| single | sum-row-768x768 | float32 | 4.2 | 5.1 | 1.21 | 6.0 | - |"
    assert table[4].split(" | ")[5] == "1.50"
    assert gpucheck.geomean_ratio(records) == pytest.approx((5.1 / 4.2 * 0.9 * 1.5) ** (1 / 3))


def test_the_folder_layout(tmp_path):
    steps = [
        gpucheck.StepResult("pytest", gpucheck.Outcome.PASSED, 12.0, "40 passed in 11.9s", ("junit.xml", "pytest.txt")),
        *gpucheck.run_sanitizers(tmp_path, sanitizer=None),
    ]
    paths = gpucheck.write_report(tmp_path, "NVIDIA H100 80GB HBM3", steps, json.loads(FIXTURE.read_text()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["measurements.json", "modeled_vs_measured.md", "summary.md"]
    data = json.loads(paths[0].read_text())
    assert data["device"] == "NVIDIA H100 80GB HBM3" and len(data["records"]) == 6
    assert [s["outcome"] for s in data["steps"]] == ["passed", "skipped"]
    assert "compute-sanitizer not found" in data["steps"][1]["detail"]
    summary = paths[2].read_text()
    assert "| compute-sanitizer | skipped |" in summary and "junit.xml" in summary
    assert "Geometric mean of measured / modeled: 1.18" in paths[1].read_text()
    assert sum(p.stat().st_size for p in paths) < 100_000


def test_sanitizer_step_with_a_stand_in_tool(tmp_path):
    tool = tmp_path / "compute-sanitizer"  # echoes what the real tool prints at the end
    tool.write_text("#!/bin/sh\necho '========= ERROR SUMMARY: 0 errors'\n")
    tool.chmod(0o755)
    results = gpucheck.run_sanitizers(tmp_path, sanitizer=str(tool))
    assert [r.name for r in results] == ["sanitizer memcheck", "sanitizer racecheck", "sanitizer synccheck"]
    assert all(r.outcome == gpucheck.Outcome.PASSED and r.detail == "ERROR SUMMARY: 0 errors" for r in results)
    assert "--tool racecheck" in (tmp_path / "sanitizer-racecheck.txt").read_text()


def test_the_sanitizer_driver_covers_every_template_on_the_emulator():
    cases = gpucheck.template_cases()
    assert [c.name for c in cases] == [
        "map", "reduce", "split_reduce", "deterministic", "stitched", "stitched_split", "cluster", "welford", "argmax",
    ]  # fmt: skip
    for case in cases:
        assert gpucheck.run_case(case, "emulator") < 1e-4


def test_onnx_feeds_fix_symbolic_dimensions():
    sys.path.insert(0, str(REPO / "examples"))
    import onnx_models

    feeds, shapes = gpucheck.onnx_feeds(onnx_models.encoder(seq=32, hidden=64, heads=2))
    assert shapes and all(s[0] == 2 for s in shapes.values())
    assert all(feeds[k].shape == s for k, s in shapes.items())
    assert all(a.dtype == np.float32 for a in feeds.values())


# -- the paths no GPU has run yet (panamera/gpucheck_paths.py) -----------------------------------
from panamera import gpucheck_paths  # noqa: E402

PATHS = [
    "stitched_cluster_mbarrier", "stitched_cluster_barrier", "reduce_cluster_mbarrier", "reduce_cluster_barrier",
    "wgmma_f16", "wgmma_s8", "mma_sync_f16", "cp_async_pipeline",
]  # fmt: skip


def test_every_path_runs_and_matches_numpy_on_the_emulator():
    """The builders a device call runs, at small shapes on H100's plans: each plan takes its path
    and its result is within the dtype-derived tolerance of numpy's float64 (int8: exact)."""
    records = gpucheck_paths.run_paths("emulator", small=True)
    assert [r["path"] for r in records] == PATHS
    assert all(r["outcome"] == "passed" for r in records), gpucheck_paths.table(records)
    assert all(r["error"] <= r["tolerance"] for r in records if r["tolerance"])
    assert next(r for r in records if r["path"] == "wgmma_s8")["error"] == 0.0


def test_the_listing_names_both_calls_every_path_and_the_pending_one(capsys):
    assert gpucheck.main(["--list"]) == 0
    text = capsys.readouterr().out
    assert "call 1: python3 scripts/gpu_check.py --skip-bench" in text and "--only bench" in text
    assert all(f"  {p}: " in text for p in PATHS)
    assert "dynamic_smem: no case (held tiles in dynamic shared memory" in text  # run by the training bench
    on_a100 = gpucheck_paths.plan_lines(80)
    assert sum("skipped (needs sm_90" in ln for ln in on_a100) == 6 and "cp_async_pipeline: fp32" in on_a100[7]


def test_steps_and_a_second_call_into_the_same_folder(tmp_path):
    assert gpucheck.steps_for(None, False) == gpucheck.STEPS
    assert gpucheck.steps_for("paths,bench", True) == ("paths",)
    with pytest.raises(SystemExit, match="unknown step\\(s\\) bnech"):
        gpucheck.steps_for("bnech", False)
    first = [gpucheck.StepResult("pytest", gpucheck.Outcome.PASSED, 60.0, "45 passed", ("junit.xml",))]
    gpucheck.write_report(tmp_path, "NVIDIA H100 80GB HBM3", first, [])
    bench = [gpucheck.StepResult("bench", gpucheck.Outcome.PASSED, 400.0, "6 workloads measured")]
    paths = gpucheck.write_report(tmp_path, "NVIDIA H100 80GB HBM3", bench, json.loads(FIXTURE.read_text()))
    data = json.loads(paths[0].read_text())
    assert [s["name"] for s in data["steps"]] == ["pytest", "bench"] and len(data["records"]) == 6
    assert "| pytest | passed |" in paths[2].read_text() and "| bench | passed |" in paths[2].read_text()
    again = json.loads(FIXTURE.read_text())[:1]  # one workload measured again by a third call
    again[0] = again[0] | {"measured_us": 99.0}
    gpucheck.write_report(tmp_path, "NVIDIA H100 80GB HBM3", [], again)
    data = json.loads(paths[0].read_text())
    assert len(data["records"]) == 6 and sum(r.get("measured_us") == 99.0 for r in data["records"]) == 1


def test_the_paths_step_reads_its_child_and_writes_the_table(tmp_path):
    """A stand-in interpreter writes what `python -m panamera.gpucheck --paths FILE` would: one
    path passed and timed beside its peer, one failed; the step fails naming it."""
    child = tmp_path / "python"
    recs = [
        {"path": "wgmma_f16", "outcome": "passed", "error": 0.01, "tolerance": 0.2, "us": 30.0,
         "peer": "cupy.matmul (cuBLAS)", "peer_us": 25.0},
        {"path": "reduce_cluster_mbarrier", "outcome": "failed", "detail": "deadlock"},
    ]  # fmt: skip
    child.write_text(f"#!/bin/sh\ncat > \"$4\" <<'EOF'\n{json.dumps(recs)}\nEOF\nexit 1\n")
    child.chmod(0o755)
    step = gpucheck.run_paths_step(tmp_path, python=str(child))
    assert (
        step.outcome == gpucheck.Outcome.FAILED
        and step.detail == "1 of 2 paths passed; failed: reduce_cluster_mbarrier"
    )
    table = (tmp_path / "paths.md").read_text()
    assert "| wgmma_f16 | passed | 0.01 / 0.2 | 30.0 | cupy.matmul (cuBLAS) | 25.0 | 1.20 |" in table
