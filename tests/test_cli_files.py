"""What the CLI does to a user's files (issue 18): `optimize --out DIR --force` replaces only what
Panamera wrote and never a model inside DIR; an unwritable --out or --output is a one-line error
before any work; an error is never preceded by the emulator warning."""

from __future__ import annotations

import json

import pytest
from onnx import TensorProto, helper

import panamera.compiler
from panamera.cli import main
from panamera.subgraph import folder


@pytest.fixture
def model(tmp_path):
    v = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8])  # noqa: E731
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "g", [v("x")], [v("y")])
    path = tmp_path / "model.onnx"
    path.write_bytes(helper.make_model(g).SerializeToString())
    return path


def _optimize(model, out, *extra):
    return main(["optimize", str(model), "--out", str(out), "--target", "emulator", *extra])


def test_force_replaces_only_what_panamera_wrote(model, tmp_path, capsys):
    out = tmp_path / "out"
    assert _optimize(model, out) == 0
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    (out / "notes.txt").write_text("mine")
    (out / "kernels" / "mine.cu").write_text("// mine")
    (out / "kernels" / "old.cu").unlink(missing_ok=True)
    assert _optimize(model, out) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert _optimize(model, out, "--force") == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "kernels" / "mine.cu").read_text() == "// mine"
    now = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert now == sorted([*written, "notes.txt", "kernels/mine.cu"])


def test_force_refuses_a_model_inside_out_and_a_folder_panamera_did_not_write(tmp_path, model, capsys):
    inner = tmp_path / "work" / "model.onnx"
    inner.parent.mkdir()
    inner.write_bytes(model.read_bytes())
    assert _optimize(inner, inner.parent, "--force") == 2
    err = capsys.readouterr().err
    assert "lies inside it" in err and inner.is_file() and err.count("\n") == 1
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "data.txt").write_text("keep")
    assert _optimize(model, theirs, "--force") == 2
    assert "holds files Panamera did not write" in capsys.readouterr().err
    assert (theirs / "data.txt").read_text() == "keep"
    (theirs / "manifest.json").write_text(json.dumps({"format": "panamera-optimized/2", "files": {"/etc/x": "0"}}))
    assert _optimize(model, theirs, "--force") == 2
    assert "cannot tell what Panamera wrote" in capsys.readouterr().err and (theirs / "data.txt").is_file()


def test_a_hostile_manifest_cannot_make_force_delete_outside(tmp_path, model):
    out = tmp_path / "out"
    assert _optimize(model, out) == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    man = json.loads((out / "manifest.json").read_text())
    man["files"]["../victim.txt"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(man))
    assert _optimize(model, out, "--force") == 2
    assert victim.read_text() == "keep"


@pytest.mark.parametrize("where", ["file-parent", "is-a-file"])
def test_unwritable_out_and_output_are_one_line_errors(tmp_path, model, capsys, where):
    (tmp_path / "f").write_text("")
    out = tmp_path / "f" / "out" if where == "file-parent" else tmp_path / "f"
    assert _optimize(model, out) == 2
    err = capsys.readouterr().err
    assert err.startswith("panamera: error: ") and "--out" in err and err.count("\n") == 1 and "Traceback" not in err
    output = tmp_path / "f" / "o.npz" if where == "file-parent" else tmp_path
    assert main(["run", str(model), "--target", "emulator", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("panamera: error: ") and "--output" in err and err.count("\n") == 1


def test_a_read_only_out_is_an_error_before_any_work(tmp_path, model, capsys, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(folder.tempfile, "TemporaryFile", refuse)  # as root, chmod does not refuse
    monkeypatch.setattr(panamera.subgraph, "optimize", lambda *a, **k: pytest.fail("optimized first"))
    assert _optimize(model, tmp_path / "ro") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"panamera: error: --out {tmp_path / 'ro'}: cannot write in {tmp_path}") and "denied" in err


def test_a_tampered_folder_fails_after_loading_and_no_warning_precedes_the_error(tmp_path, model, capsys):
    out = tmp_path / "out"
    assert main(["optimize", str(model), "--out", str(out)]) == 0  # --target auto, no GPU here
    io = capsys.readouterr()
    assert "wrote" in io.out and "warning" not in io.err
    # A folder whose kernel was edited and its checksum rewritten: the load compiles, then fails.
    man = json.loads((out / "manifest.json").read_text())
    cu = out / next(u["cuda"] for u in man["units"] if "cuda" in u)
    cu.write_text(cu.read_text() + "// edited\n")
    man["files"][cu.relative_to(out).as_posix()] = folder.digest(str(cu))
    (out / "manifest.json").write_text(json.dumps(man))
    assert main(["run", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("panamera: error: ")
        and "differs from the saved one" in err
        and "panamera: warning" not in err
        and err.count("\n") == 1
    )
