#!/usr/bin/env python3
"""`make gpu-check`: validate Panamera on the NVIDIA GPU of this machine in one command.

Standard library only: it runs before Panamera's dependencies are installed. It finds the GPU
(nvidia-smi), installs what is missing from wheels/ without a package registry (fetched
beforehand by scripts/fetch_wheels.sh; a registry is tried only when there is no wheels/), then
runs `python -m panamera.gpucheck`, which writes everything into one folder.

    python3 scripts/gpu_check.py [--out DIR] [--skip-bench | --only STEP,...] [--suites S,...]

(`python -m panamera.gpucheck --list` prints the steps and what each device call runs.)

Without a GPU it prints one line and exits 0 in CI-like runs (CI=true, GITHUB_ACTIONS, ...), 2
when asked directly.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WHEELS = REPO / "wheels"
VENV = REPO / ".venv-gpu"
# import name -> requirement (what scripts/fetch_wheels.sh downloads)
REQUIRED = {
    "islpy": "islpy>=2024.1",
    "numpy": "numpy>=1.26",
    "networkx": "networkx>=3.0",
    "ml_dtypes": "ml_dtypes>=0.4",
    "onnx": "onnx>=1.16",
    "click": "click>=8.1",
    "rich": "rich>=13",
    "threadpoolctl": "threadpoolctl>=3.1",
    "pytest": "pytest>=8",
    "cupy": "cupy-cuda12x[ctk]>=14",
}
CI_VARIABLES = ("GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "JENKINS_URL", "TF_BUILD", "CIRCLECI", "TRAVIS")


def ci_like(env: dict) -> bool:
    """Whether this looks like a CI run, where no GPU is the normal case, not a failure.

    >>> ci_like({"CI": "true"}), ci_like({"GITHUB_ACTIONS": "true"}), ci_like({}), ci_like({"CI": "0"})
    (True, True, False, False)
    """
    return env.get("CI", "").lower() in ("1", "true", "yes") or any(env.get(v) for v in CI_VARIABLES)


def detect_gpu() -> str | None:
    """The name of GPU 0 as nvidia-smi lists it ("NVIDIA H100 80GB HBM3"), or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"^GPU 0: (.+?)(?: \(UUID|$)", r.stdout, re.M)
    return m.group(1).strip() if r.returncode == 0 and m else None


def slug(name: str) -> str:
    """A folder-safe device name.

    >>> slug("NVIDIA H100 80GB HBM3")
    'h100-80gb-hbm3'
    """
    s = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")
    return s or "gpu"


def missing(python: str) -> list[str]:
    """The requirements whose module `python` cannot import."""
    probe = (
        "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    )
    r = subprocess.run([python, "-c", probe, *REQUIRED], capture_output=True, text=True)
    if r.returncode:
        return list(REQUIRED.values())
    return [REQUIRED[m] for m in r.stdout.split()]


def environment() -> str:
    """An interpreter with every requirement: this one if it has them all, else .venv-gpu (with
    the system's packages visible, so a preinstalled CuPy or PyTorch is reused) filled from
    wheels/."""
    if not missing(sys.executable):
        return sys.executable
    python = str(VENV / "bin" / "python")
    if not Path(python).exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(VENV)], check=True)
    need = missing(python)
    if need:
        source = ["--no-index", "--find-links", str(WHEELS)] if WHEELS.is_dir() else []
        print(f"gpu-check: installing {' '.join(need)} from {WHEELS if source else 'the package registry'}")
        r = subprocess.run([python, "-m", "pip", "install", "-q", *source, *need])
        if r.returncode:
            raise SystemExit(
                "gpu-check: installing failed; on a machine with a registry run scripts/fetch_wheels.sh "
                "and bring wheels/ along"
            )
    return python


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="results folder (default: bench/gpu-check-<date>-<device>)")
    ap.add_argument("--skip-bench", action="store_true", help="correctness and sanitizers only")
    ap.add_argument("--only", help="comma-separated steps: paths, pytest, sanitizers, bench, onnx")
    ap.add_argument("--suites", help="the bench step's suites, comma-separated (default: all)")
    args = ap.parse_args(argv)
    gpu = detect_gpu()
    if gpu is None:
        print("gpu-check: no NVIDIA GPU on this machine (nvidia-smi lists none): nothing to check")
        return 0 if ci_like(os.environ) else 2
    python = environment()
    out = Path(args.out or REPO / "bench" / f"gpu-check-{datetime.date.today():%Y-%m-%d}-{slug(gpu)}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    cmd = [python, "-m", "panamera.gpucheck", "--out", str(out), "--device", gpu]
    cmd += ["--skip-bench"] if args.skip_bench else []
    cmd += ["--only", args.only] if args.only else []
    cmd += ["--suites", args.suites] if args.suites else []
    return subprocess.call(cmd, cwd=REPO, env=env)


if __name__ == "__main__":
    sys.exit(main())
