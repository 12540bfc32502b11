"""The deployable folder as files: every path confined to the folder, every file checksummed,
the manifest's shape checked before anything in it is used (deploy.py reads and writes it).

What is verified when a folder is loaded:

1. every path the manifest names is relative, inside the folder (no absolute path, no `..`, no
   symlink leading out of it) and listed with its SHA-256 in the manifest's `files`;
2. every listed file exists and hashes to its recorded digest: a truncated copy, changed
   weights or an edited kernel is a ModelError naming the file;
3. the manifest itself is an object of the documented fields and types (`check_manifest`);
   anything else is a ModelError naming the field.

The checksums catch corruption and edits, not a forger who rewrites the manifest too: a folder
is trusted as far as its source is (README, "What Panamera trusts").

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> open(os.path.join(d, "w.bin"), "wb").write(b"abc")
3
>>> files = checksums(d, ["w.bin"]); verify_files(d, files, "manifest.json")
>>> inside(d, "../etc/hostname", "manifest.json: unit 0's cuda")
Traceback (most recent call last):
panamera.errors.ModelError: manifest.json: unit 0's cuda '../etc/hostname' is not a plain relative path inside the folder
"""

from __future__ import annotations

import json
import os
import re
import tempfile

from ..errors import InputError, ModelError
from ..runtime.diskcache import digest

DIGEST = re.compile(r"[0-9a-f]{64}")


def inside(d: str, rel, where: str) -> str:
    """The path of `rel` in folder `d`: a relative path of plain names ('/'-separated), which
    stays in `d` once symlinks are followed. Raises ModelError naming `where` otherwise."""
    parts = rel.split("/") if isinstance(rel, str) else None
    if not parts or "\\" in rel or "\0" in rel or any(p in ("", ".", "..") for p in parts) or os.path.isabs(rel):
        raise ModelError(f"{where} {rel!r} is not a plain relative path inside the folder")
    path = os.path.normpath(os.path.join(d, *parts))
    root = os.path.realpath(d)
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise ModelError(f"{where} {rel!r} leads out of the folder (a symlink)")
    return path


def checksums(d: str, rels) -> dict[str, str]:
    """{relative path: SHA-256} of files written under `d`."""
    return {rel: digest(inside(d, rel, "file")) for rel in sorted(set(rels))}


def verify_files(d: str, files: dict, mpath: str) -> None:
    """Every file the manifest lists is in the folder and has the digest recorded for it."""
    for rel, want in files.items():
        path = inside(d, rel, f"{mpath}: file")
        if not os.path.isfile(path):
            raise ModelError(f"{path}: missing (listed in {mpath}); copy the whole folder `optimize --out` wrote")
        if digest(path) != want:
            raise ModelError(
                f"{path}: its SHA-256 differs from the one {mpath} recorded: the file was changed or damaged "
                "after `optimize` wrote it"
            )


# -- the manifest's shape -----------------------------------------------------------------------
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _strs(v) -> bool:
    return isinstance(v, list) and all(isinstance(s, str) for s in v)


def _value(v) -> bool:  # [shape or null, ONNX element type]
    if not (isinstance(v, list) and len(v) == 2 and _is_int(v[1]) and 0 <= v[1] < 64):
        return False
    return v[0] is None or (isinstance(v[0], list) and all(_is_int(x) and x >= 0 for x in v[0]))


def _unit(u) -> bool:
    if not isinstance(u, dict):
        return False
    if set(u) == {"library", "reason"}:
        return _is_int(u["library"]) and isinstance(u["reason"], str)
    if set(u) == {"subgraph", "nodes", "schedule", "cuda"}:
        nodes_ok = isinstance(u["nodes"], list) and u["nodes"] and all(_is_int(n) for n in u["nodes"])
        return _is_int(u["subgraph"]) and nodes_ok and isinstance(u["schedule"], str) and isinstance(u["cuda"], str)
    return False


FIELDS = {  # field: (check, what it must be)
    "format": (lambda v: isinstance(v, str), "a string"),
    "model": (lambda v: isinstance(v, str), "a string"),
    "gpu": (lambda v: isinstance(v, str), "a string"),
    "opset": (lambda v: _is_int(v) and 1 <= v < 1000, "an opset number"),
    "inputs": (_strs, "a list of value names"),
    "outputs": (lambda v: _strs(v) and v, "a non-empty list of value names"),
    "specialized": (lambda v: isinstance(v, dict), "an object of value name: array"),
    "weights": (
        lambda v: isinstance(v, dict) and all(isinstance(p, list) and len(p) == 2 and _strs(p) for p in v.values()),
        "an object of array key: [value name, dtype]",
    ),
    "shared": (
        lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
        "an object of value name: value name",
    ),
    "values": (
        lambda v: isinstance(v, dict) and all(_value(x) for x in v.values()),
        "an object of name: [shape, type]",
    ),
    "units": (lambda v: isinstance(v, list) and all(_unit(u) for u in v), "a list of subgraph and library units"),
    "files": (
        lambda v: isinstance(v, dict) and all(isinstance(h, str) and DIGEST.fullmatch(h) for h in v.values()),
        "an object of relative path: SHA-256",
    ),
}


def check_manifest(man, mpath: str, fmt: str) -> dict:
    """`man` if it is a manifest of format `fmt` with every field of the documented type."""
    if not isinstance(man, dict):
        raise ModelError(f"{mpath}: not a manifest (a JSON {type(man).__name__}, not an object)")
    if man.get("format") != fmt:
        raise ModelError(
            f"{mpath}: format {man.get('format')!r} is not {fmt!r}; write the folder again with "
            "`panamera optimize MODEL --out DIR`"
        )
    for name, (ok, what) in FIELDS.items():
        if name not in man:
            raise ModelError(f"{mpath}: field {name!r} is missing; rewrite the folder with `panamera optimize`")
        if not ok(man[name]):
            raise ModelError(f"{mpath}: field {name!r} must be {what}")
    return man


def _written(d: str, mpath: str, fmt: str) -> list[str]:
    """The files Panamera wrote in folder `d`, as its manifest lists them (confined to `d`)."""
    try:
        with open(mpath, encoding="utf-8") as f:
            man = check_manifest(json.load(f), mpath, fmt)
        return [inside(d, rel, f"{mpath}: file") for rel in man["files"]]
    except (OSError, ValueError, RecursionError, ModelError) as e:
        why = str(e) if isinstance(e, ModelError) else type(e).__name__
        raise InputError(
            f"--out {d}: --force cannot tell what Panamera wrote there ({why}); empty it yourself"
        ) from None


def _probe(d: str, what: str) -> None:
    """Raise InputError unless a file can be created in directory `d`."""
    try:
        with tempfile.TemporaryFile(dir=d):
            pass
    except OSError as e:
        raise InputError(f"{what}: cannot write in {d} ({e.strerror or type(e).__name__})") from None


def writable_target(path: str, what: str, directory: bool) -> None:
    """Before any work: `path` (a file, or with `directory` a folder) can be written, that is
    it or its nearest existing ancestor is a writable directory; anything else (an existing
    `path` of the other kind, a path under a file) is an InputError naming the option `what`."""
    if os.path.exists(path) and os.path.isdir(path) != directory:
        raise InputError(f"{what} {path}: exists and is {'not ' if directory else ''}a directory")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise InputError(f"{what} {path}: {parent} is a file, not a directory")
    _probe(path if directory and os.path.isdir(path) else parent, f"{what} {path}")


def check_out(out: str, model: str, force: bool, manifest: str, fmt: str) -> None:
    """Before `optimize --out OUT` does any work: OUT can be written and does not hold the
    model; it exists only with `force`, and then empty or as a folder Panamera wrote (its
    manifest lists what `clear_out` deletes)."""
    root = os.path.realpath(out)
    if os.path.commonpath([root, os.path.realpath(model)]) == root:
        raise InputError(f"--out {out}: the model {model} lies inside it; choose another --out")
    writable_target(out, "--out", directory=True)
    if not os.path.exists(out):
        return
    if not force:
        raise InputError(f"--out {out} exists; pass --force to replace what Panamera wrote there")
    if not os.listdir(out):
        return
    if not os.path.isfile(os.path.join(out, manifest)):
        raise InputError(
            f"--out {out}: holds files Panamera did not write (no {manifest}); --force replaces only a folder "
            "`optimize --out` wrote: choose another --out or empty it yourself"
        )
    _written(out, os.path.join(out, manifest), fmt)


def clear_out(out: str, manifest: str, fmt: str, extra: tuple[str, ...]) -> None:
    """Delete what Panamera wrote in folder `out` (the files its manifest lists, the manifest
    and the `extra` names), then the subfolders left empty; anything else in `out` stays."""
    mpath = os.path.join(out, manifest)
    if not os.path.isfile(mpath):
        return
    paths = _written(out, mpath, fmt)
    for path in [*paths, *(os.path.join(out, x) for x in extra), mpath]:
        if os.path.isfile(path) and not os.path.islink(path):
            os.unlink(path)
    top = os.path.normpath(out)
    for sub in sorted({os.path.dirname(p) for p in paths}, key=len, reverse=True):
        while sub.startswith(top + os.sep) and os.path.isdir(sub) and not os.listdir(sub):
            os.rmdir(sub)
            sub = os.path.dirname(sub)
