#!/usr/bin/env python3
"""`make floors`: Panamera at the lowest versions it allows, on the oldest Python it allows.

Standard library only. Every dependency of pyproject.toml's `[project] dependencies` is pinned to
its floor (`name>=X` becomes the constraint `name==X`), the package is installed from this clone
into a fresh venv under build/ with those constraints (what pip resolves for everything else is
the newest that fits), and a smoke subset runs against it:

1. from a directory outside the clone: import, a sum compiled and run on the emulator against
   numpy, the shipped schedule database consulted, `panamera --help`, an error path (one line,
   exit status 2, no traceback), `python -m panamera --version`, and the bench's charts (the
   `plot` extra, pinned to its floor too);
2. tests/test_onnx_cli.py and tests/test_clear_errors.py: every CLI path and the API's errors.

    python3 scripts/check_floors.py [--python python3.10] [--keep]

The Python is `--python`, else python3.10 (requires-python's floor) where it is installed, else
python3. Needs a package index for the pinned versions (pip's cache makes a second run fast).
About a minute and a half on 2 cores. Exit status 0 when every step passes, 3 when no package
index answered (nothing was checked), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "build" / "floors-venv"
# pip's words when no package index answers (exit status 3: .ci/run goes on without this check)
NETWORK_ERRORS = ("NewConnectionError", "Network is unreachable", "Temporary failure in name resolution",
                  "ConnectTimeoutError", "Max retries exceeded")  # fmt: skip
EXTRA = "plot"  # the one optional extra that runs without a GPU: the bench's charts (matplotlib)
TESTS = ("tests/test_onnx_cli.py", "tests/test_clear_errors.py")

SMOKE = """
import numpy as np, panamera as pn
from panamera.schedule import database
x = pn.placeholder((4, 300), "float32", name="x")
k = pn.compile(pn.sum(x, axis=1), target="emulator")
a = np.random.default_rng(0).standard_normal((4, 300)).astype(np.float32)
np.testing.assert_allclose(k(a), a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)
y = pn.placeholder((1024, 768), "float16", name="y")
g, b = pn.placeholder((768,), "float16", name="g"), pn.placeholder((768,), "float16", name="b")
origin = pn.compile(pn.nn.layer_norm(y, g, b), target="emulator").origin
assert origin.startswith("from schedules/"), origin
assert not pn.__file__.startswith(%r), pn.__file__  # the installed package, not the clone's
print("smoke: panamera", pn.__version__, "from", pn.__file__, "; layer_norm", origin)
"""


def floors(extra: str | None = None, pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """{name: lowest allowed version} of the runtime dependencies, or of an extra's (each must
    have a plain `>=` floor).

    >>> floors()["click"], floors("plot")
    ('8.1', {'matplotlib': '3.7'})
    """
    text = pyproject.read_text()
    key = "dependencies" if extra is None else re.escape(extra)
    block = re.search(rf"^{key}\s*=\s*\[(.*?)\]", text, re.S | re.M)
    if block is None:
        raise SystemExit(f"check_floors: no {key} list in pyproject.toml")
    out = {}
    for req in re.findall(r'"([^"]+)"', block.group(1)):
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][^,;\s]*)", req)
        if m is None:
            raise SystemExit(f"check_floors: dependency {req!r} has no plain `>=` floor to check")
        out[m.group(1)] = m.group(2)
    return out


def copy_sources(dest: Path, root: Path = ROOT) -> Path:
    """What a build of the package reads, copied from the clone to `dest` (the files git tracks
    or would add; pyproject.toml, README.md, LICENSE and panamera/ without git), so that no
    build/ or *.egg-info left in the clone by an earlier build can slip stale files into a wheel."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "--", "pyproject.toml", "README.md",
             "LICENSE", "setup.py", "setup.cfg", "MANIFEST.in", "panamera"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        listed = [str(p.relative_to(root)) for p in root.glob("panamera/**/*") if "__pycache__" not in p.parts]
        listed += ["pyproject.toml", "README.md", "LICENSE"]
    for rel in listed:
        src = root / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _name(project: str) -> str:
    return re.sub(r"[-_.]+", "-", project).lower()


def _release(version: str) -> tuple[int, ...]:
    """'1.26' and '1.26.0' alike: the release numbers without trailing zeros.

    >>> _release("1.26.0") == _release("1.26"), _release("8.1.0") == _release("8.1.8")
    (True, False)
    """
    nums = [int(n) for n in re.findall(r"\d+", version.split("+")[0])[:4]]
    while nums and nums[-1] == 0:
        nums.pop()
    return tuple(nums)


def pick_python(asked: str | None) -> str:
    """`asked`, else the oldest Python requires-python allows (3.10: on PATH, or a pyenv version),
    else python3; each candidate must run."""
    candidates = [asked] if asked else ["python3.10"]
    if not asked and shutil.which("pyenv"):
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
        candidates += sorted(str(p) for p in Path(root or "/nonexistent").glob("versions/3.10*/bin/python3.10"))
    for name in [*candidates, "python3"]:
        path = shutil.which(name) if name else None
        if path and subprocess.run([path, "-c", "import venv"], capture_output=True).returncode == 0:
            return path
    raise SystemExit(f"check_floors: no Python interpreter {asked or 'python3'} that runs")


def step(name: str, cmd: list[str], expect: int = 0, **kw) -> bool:
    """Run `cmd`; True (and its output shown) when its exit status is not `expect`."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    lines = r.stdout.strip().splitlines()
    last = next((ln for ln in reversed(lines) if " passed" in ln), lines[-1] if lines else "")
    bad = r.returncode != expect or (expect != 0 and ("Traceback" in r.stderr or r.stderr.count("\n") != 1))
    print(f"floors: {name}: {'FAILED (exit ' + str(r.returncode) + ')' if bad else 'ok'}"
          f" ({time.perf_counter() - t0:.0f} s) {last}",
          flush=True)  # fmt: skip
    if bad:
        print(r.stdout[-4000:], r.stderr[-4000:], sep="\n", file=sys.stderr)
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", help="the interpreter of the venv (default: python3.10 where installed)")
    ap.add_argument("--keep", action="store_true", help="reuse build/floors-venv if it exists")
    args = ap.parse_args(argv)
    pins = {**floors(), **floors(EXTRA)}
    python = pick_python(args.python)
    VENV.parent.mkdir(exist_ok=True)
    constraints = VENV.parent / "floors-constraints.txt"
    constraints.write_text("".join(f"{k}=={v}\n" for k, v in pins.items()))
    print(f"floors: {', '.join(f'{k}=={v}' for k, v in pins.items())} on {python}", flush=True)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    vpy, failed = str(VENV / "bin" / "python"), False
    if not (args.keep and Path(vpy).exists()):
        shutil.rmtree(VENV, ignore_errors=True)
        with tempfile.TemporaryDirectory() as src:
            pip = [vpy, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(constraints)]
            if step("venv", [python, "-m", "venv", str(VENV)], env=env):
                return 1
            t0 = time.perf_counter()
            r = subprocess.run(
                [*pip, f"{copy_sources(Path(src))}[{EXTRA}]", "pytest"], capture_output=True, text=True, env=env
            )
            if r.returncode:
                offline = any(s in r.stderr for s in NETWORK_ERRORS)
                print(r.stderr[-4000:], file=sys.stderr)
                print(f"floors: install at the floors: {'no package index reached' if offline else 'FAILED'}")
                return 3 if offline else 1
            print(f"floors: install at the floors: ok ({time.perf_counter() - t0:.0f} s)", flush=True)

    # every dependency really is at its floor
    listed = subprocess.run([vpy, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, env=env)
    have = {_name(d["name"]): d["version"] for d in json.loads(listed.stdout or "[]")}
    off = {k: have.get(_name(k)) for k, v in pins.items() if _release(have.get(_name(k), "")) != _release(v)}
    print(f"floors: versions: {'ok' if not off else f'FAILED, not at the floors: {off}'}")
    failed |= bool(off)

    with tempfile.TemporaryDirectory() as tmp:  # outside the clone: the installed package only
        failed |= step("smoke", [vpy, "-c", SMOKE % str(ROOT / "panamera")], cwd=tmp, env=env)
        failed |= step("panamera --help", [str(VENV / "bin" / "panamera"), "--help"], cwd=tmp, env=env)
        failed |= step("python -m panamera --version", [vpy, "-m", "panamera", "--version"], cwd=tmp, env=env)
        bench = [vpy, "-m", "panamera", "bench", "--suite", "tiny", "--plot", "--out", "b"]
        failed |= step("panamera bench --suite tiny --plot", bench, cwd=tmp, env=env)
        failed |= step("an error path, one line", [vpy, "-m", "panamera", "run", "missing.onnx"], 2, cwd=tmp, env=env)
    failed |= step(
        "pytest " + " ".join(TESTS), [vpy, "-m", "pytest", "-p", "no:cacheprovider", *TESTS], cwd=ROOT, env=env
    )
    print(f"floors: {'FAILED' if failed else 'every step passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
