"""The package people install: the wheel carries everything Panamera reads at run time and nothing
of the clone's; installed into a fresh venv it runs the README's user commands from outside the
clone and plans as the source tree does; version, metadata, changelog, README and floors agree;
`python -m panamera` is the command, and the command speaks its own spelling."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import panamera as pn
from panamera.schedule import database

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_floors", ROOT / "scripts" / "check_floors.py")
check_floors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_floors)  # the stdlib-only floors script: its pyproject parser and source copy
FENCE = re.compile(r"(?:<!-- readme-test: (?P<mark>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)


def _readme_block(lang: str, marked: str = "") -> str:
    """The first README block of `lang` whose readme-test marker mentions `marked`."""
    return next(
        m["body"] for m in FENCE.finditer((ROOT / "README.md").read_text()) if m["lang"] == lang and marked in (m["mark"] or "")
    )  # fmt: skip


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """A copy of what a build reads from the clone (the files git tracks or would add)."""
    return check_floors.copy_sources(tmp_path_factory.mktemp("src"))


@pytest.fixture(scope="module")
def wheel(sources, tmp_path_factory) -> Path:
    """The wheel, built from that copy (no build isolation: no package index)."""
    out = tmp_path_factory.mktemp("dist")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(out),
        str(sources),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("panamera-*.whl")
    return whl


def test_the_wheel_carries_what_the_package_reads_and_nothing_of_the_clone(wheel, sources):
    names = set(zipfile.ZipFile(wheel).namelist())
    dist = f"panamera-{pn.__version__}.dist-info/"
    assert wheel.name == f"panamera-{pn.__version__}-py3-none-any.whl"
    assert all(n.startswith(("panamera/", dist)) for n in names), sorted(n for n in names if "/" not in n)
    shipped = {n for n in names if n.startswith("panamera/schedules/")}
    entries = {f"panamera/schedules/{p.relative_to(database.PACKAGE_DIR).as_posix()}" for p in database.PACKAGE_DIR.rglob("*.json")}  # fmt: skip
    assert len(entries) >= 300 and shipped == entries
    assert {"panamera/runtime/cuda_emulation.h", "panamera/py.typed", "panamera/__main__.py", dist + "licenses/LICENSE"} <= names  # fmt: skip
    # every file of the package in the clone, code and data alike, is in the wheel
    assert {
        p.relative_to(sources).as_posix() for p in (sources / "panamera").rglob("*") if p.is_file()
    } - names == set()


def test_the_wheels_metadata(wheel):
    meta = HeaderParser().parsestr(
        zipfile.ZipFile(wheel).read(f"panamera-{pn.__version__}.dist-info/METADATA").decode()
    )
    assert meta["Version"] == pn.__version__ and meta["License-Expression"] == "Apache-2.0"
    assert meta["Author"] and meta["Keywords"] and meta.get_all("Project-URL")
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers and any(
        c.startswith("Topic :: Software Development :: Compilers") for c in classifiers
    )
    requires = {r for r in meta.get_all("Requires-Dist") if "extra ==" not in r}
    assert requires == {f"{k}>={v}" for k, v in check_floors.floors().items()}  # what scripts/check_floors.py pins


def test_the_gpu_check_bootstrap_asks_for_the_same_floors():
    _gc = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(_gc)
    _gc.loader.exec_module(gpu_check)  # stdlib only: it installs the dependencies before they exist
    assert {f"{k}>={v}" for k, v in check_floors.floors().items()} <= set(gpu_check.REQUIRED.values())


def test_no_module_imports_what_python_3_10_lacks():
    """requires-python is 3.10 (the floors check runs it): enum.StrEnum is 3.11's, so panamera/enums.py
    is the one place that imports it (with its 3.10 stand-in); a module importing it from enum broke
    the package on 3.10 (schedule/cpu_exp_range.py, 0.9.0's first cut)."""
    import ast

    bad = []
    for path in (ROOT / "panamera").rglob("*.py"):
        if path.name == "enums.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "enum" and node.level == 0:
                bad += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names if a.name in {"StrEnum", "verify"}]
    assert not bad, bad


def test_version_changelog_and_readme_agree():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(r"^## (\S+)", changelog, re.M)[1] == pn.__version__  # the newest entry is this version
    assert f"panamera-{pn.__version__}-py3-none-any.whl" in _readme_block("", "test_package")
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    readme = (ROOT / "README.md").read_text()
    assert readme.index("pip install") < readme.index("make test")  # a user's install comes before the developer's


def test_every_repository_path_the_package_cites_exists():
    cited = {
        m.group(0)
        for p in (ROOT / "panamera").rglob("*.py")
        for m in re.finditer(r"(?<![\w/.])(?:docs|shared|examples|scripts|bench|tests)/[\w./-]+\.(?:md|py|sh)\b", p.read_text())
    }  # fmt: skip
    assert "docs/GPU_MODEL.md" in cited
    assert [c for c in sorted(cited) if not (ROOT / c).is_file()] == []  # shared/GPU_MODEL.md was one


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel; its dependencies are this environment's (a .pth file, so no
    index is needed and this environment's own panamera stays invisible)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)], check=True, timeout=120)
    site = Path(subprocess.check_output([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())  # fmt: skip
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "_panamera_test_deps.pth").write_text("\n".join(deps) + "\n")
    cmd = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", "--no-index", str(wheel)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return venv


def _run(venv: Path, cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_installed_wheel_runs_the_readmes_user_commands_outside_the_clone(installed, tmp_path):
    py = str(installed / "bin" / "python")
    # the README's install block, less pip (done above) and `panamera demo` (a minute of emulator runs)
    block = [ln.split("  #")[0].strip() for ln in _readme_block("", "test_package").splitlines()]
    commands = [c for c in block if c.startswith("panamera ") and c != "panamera demo"]
    assert {"panamera --version", "panamera --help"} <= set(commands)
    for c in commands:
        r = _run(installed, c.split(), tmp_path)
        assert r.returncode == 0, f"{c}\n{r.stdout}\n{r.stderr}"
    r = _run(installed, [py, "-m", "panamera", "--version"], tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"panamera {pn.__version__}"
    # the README's first example, as a user pastes it
    (tmp_path / "example.py").write_text(_readme_block("python"))
    r = _run(installed, [py, "example.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    # the installed package plans as the source tree does: the same database entry
    y = pn.placeholder((1024, 768), "float16", name="x")
    g, b = pn.placeholder((768,), "float16", name="gamma"), pn.placeholder((768,), "float16", name="beta")
    here = pn.compile(pn.nn.layer_norm(y, g, b), target="emulator").origin
    assert here.startswith("from schedules/"), here
    probe = (
        "import panamera as pn\n"
        "x = pn.placeholder((1024, 768), 'float16', name='x')\n"
        "g, b = pn.placeholder((768,), 'float16', name='gamma'), pn.placeholder((768,), 'float16', name='beta')\n"
        "print(pn.__file__)\n"
        "print(pn.compile(pn.nn.layer_norm(x, g, b), target='emulator').origin)\n"
    )
    r = _run(installed, [py, "-c", probe], tmp_path)
    assert r.returncode == 0, r.stderr
    where, origin = r.stdout.split("\n")[:2]
    assert Path(where).is_relative_to(installed) and origin == here
    # gpu-check needs the clone's tests/ and examples/: it says so, in one line
    r = _run(installed, [py, "-m", "panamera.gpucheck", "--out", str(tmp_path / "gc")], tmp_path)
    assert r.returncode == 2 and "from a clone" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.auto_default
def test_python_m_panamera_and_the_clis_spelling_of_the_emulator_warning(tmp_path, monkeypatch):
    v = helper.make_tensor_value_info
    g = helper.make_graph(
        [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("ReduceSum", ["e"], ["s"], keepdims=0)],
        "g", [v("x", TensorProto.FLOAT, [4, 8])], [v("s", TensorProto.FLOAT, [])],
    )  # fmt: skip
    (tmp_path / "m.onnx").write_bytes(helper.make_model(g).SerializeToString())
    np.savez(tmp_path / "in.npz", x=np.ones((4, 8), np.float32))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, even where there is one: --target auto is cpu
    cmd = [sys.executable, "-m", "panamera", "run", "m.onnx", "--inputs", "in.npz", "--repeat", "1"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "(cpu backend)" in r.stdout and "warning" not in r.stderr, r.stdout + r.stderr
    # auto's fallback to the emulator (a program the CPU target refuses) warns: Python's spelling,
    # and the CLI's in `shell`
    monkeypatch.setattr(pn.runtime.cuda, "available", lambda: False)
    x = pn.placeholder((4,), name="x")
    saved = pn.compile(pn.sum(x), target="emulator").schedule
    with pytest.warns(pn.EmulatorWarning, match='target="emulator" says so') as w:
        pn.compile(pn.sum(x), schedule=saved)
    assert "--target emulator says so" in w[0].message.shell


def test_panamera_schedules_writes_where_pn_compile_looks(monkeypatch, tmp_path):
    from panamera.cli import main

    seen = []
    monkeypatch.setattr("panamera.bench.schedules.write_database", lambda out, gpus: seen.append(out) or [])
    monkeypatch.delenv(database.ENV, raising=False)
    assert main(["schedules"]) == 0 and seen == [str(database.PACKAGE_DIR)]  # the shipped database
    monkeypatch.setenv(database.ENV, str(tmp_path))
    assert main(["schedules"]) == 0 and seen[-1] == str(tmp_path)
