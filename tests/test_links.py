"""Every link and image in the READMEs resolves in a fresh clone: each relative target exists next to
the README that names it and is not git-ignored, and no README points outside the repository."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "bench/README.md", "bench/results/summary.md"]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")
INLINE = re.compile(r"!?\[[^\]\n]*\]\(\s*(<[^>\n]*>|[^)\s]+)(?:\s+\"[^\"\n]*\")?\s*\)")  # [t](x), ![a](x), [t](x "t")
REFDEF = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*(<[^>\n]*>|\S+)", re.M)  # [ref]: x


def targets(text: str) -> list[str]:
    """Link and image targets of a markdown text, outside code blocks and code spans."""
    text = CODE.sub("", FENCE.sub("", text))
    return [m.group(1).strip("<>") for rx in (INLINE, REFDEF) for m in rx.finditer(text)]


def relative(target: str) -> str | None:
    """The path part of a relative target; None for URLs, mailto and pure #anchors."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "//")):
        return None
    return target.split("#", 1)[0].split("?", 1)[0] or None


def _ignored(path: Path) -> bool:
    if not shutil.which("git") or not (ROOT / ".git").exists():
        return False
    r = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", str(path)], capture_output=True)
    return r.returncode == 0


def test_targets_parser():
    md = '[a](x.md) ![b](img/p.png) [c](https://e.org) [d](#top) [e](y.md#sec) [f](<z w.md> "t")\n'
    md += "`[g](code.md)`\n```\n[h](fenced.md)\n```\n[r]: ref.md\n[m](mailto:a@b.c)\n"
    assert [relative(t) for t in targets(md)] == ["x.md", "img/p.png", None, None, "y.md", "z w.md", None, "ref.md"]


@pytest.mark.parametrize("doc", DOCS)
def test_every_relative_link_resolves(doc):
    path = ROOT / doc
    assert path.is_file(), f"{doc} is missing"
    rel = [t for t in map(relative, targets(path.read_text(encoding="utf-8"))) if t]
    assert rel or doc.endswith("summary.md"), f"{doc}: no relative links found; is the parser broken?"
    missing = [t for t in rel if not (path.parent / t).exists()]
    assert not missing, f"{doc}: links to missing files: {missing}"
    escaping = [t for t in rel if not (path.parent / t).resolve().is_relative_to(ROOT)]
    assert not escaping, f"{doc}: links out of the repository: {escaping}"
    ignored = [t for t in rel if _ignored(path.parent / t)]
    assert not ignored, f"{doc}: links to git-ignored files, absent in a fresh clone: {ignored}"


@pytest.mark.parametrize("doc", DOCS)
def test_no_path_into_the_shared_folder(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert "shared/" not in text, f"{doc} names shared/ (outside the repository); cite docs/ instead"


def test_readme_images_are_committed_results():
    text = (ROOT / "bench/README.md").read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
    assert len(images) >= 6
    for img in images:
        p = ROOT / "bench" / img
        assert p.suffix == ".png" and p.stat().st_size > 1000 and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", img
