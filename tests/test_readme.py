"""The README runs as written: every ```python block of README.md (in order, one namespace, as a
reader pastes them) and every command of its shell blocks (in a fresh directory, `python` and
`panamera` from this environment). A block that cannot run here says so just above its fence:

    <!-- readme-test: gpu -->              needs an NVIDIA GPU
    <!-- readme-test: torch -->            needs PyTorch (the dev extra installs it): run where it is
    <!-- readme-test: skip: REASON -->     not run, for the reason given

bench/README.md has no code blocks; its one command, `make bench`, is README.md's."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"(?:<!-- readme-test: (?P<mark>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)


def blocks(path: Path) -> list[tuple[str, str, str]]:
    """(marker, language, body) of every fenced block of a markdown file."""
    return [(m["mark"] or "", m["lang"], m["body"]) for m in FENCE.finditer(path.read_text())]


def commands(body: str) -> list[str]:
    """The commands of a shell block, comments stripped."""
    out = []
    for line in body.splitlines():
        cmd = line.split("  #")[0].split(" # ")[0].strip()
        if cmd and not cmd.startswith("#"):
            out.append(cmd)
    return out


def test_every_block_is_run_or_marked_with_a_reason():
    for path in (ROOT / "README.md", ROOT / "bench" / "README.md"):
        for mark, lang, _body in blocks(path):
            assert lang in ("", "python", "sh", "bash"), f"{path.name}: unknown block language {lang!r}"
            assert mark in ("", "gpu", "torch") or re.fullmatch(r"skip: .{10,}", mark), f"{path.name}: marker {mark!r}"
    assert not blocks(ROOT / "bench" / "README.md")  # if it grows blocks, run them here


def test_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    runs = {""} | ({"torch"} if importlib.util.find_spec("torch") else set())
    code = [body for mark, lang, body in blocks(ROOT / "README.md") if lang == "python" and mark in runs]
    assert len(code) >= 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # target="auto" warns once here: no GPU
        for body in code:
            exec(compile(body, "README.md", "exec"), namespace)  # noqa: S102


def test_shell_blocks_run(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    cmds = [
        c for mark, lang, body in blocks(ROOT / "README.md") if lang != "python" and not mark for c in commands(body)
    ]
    assert any(c.startswith("panamera run") for c in cmds)
    for cmd in cmds:
        r = subprocess.run(shlex.split(cmd), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"


def test_gpu_blocks_are_marked():
    marked = [body for m, _, body in blocks(ROOT / "README.md") if m == "gpu"]
    assert marked and all("gpu" in body for body in marked)
