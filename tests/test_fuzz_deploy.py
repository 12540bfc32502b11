"""The deployable folder under hostile edits (subgraph/folder.py, deploy.py): mutated manifest
fields, paths leading out of the folder, truncated or changed weights (with or without a
rewritten checksum), missing files. Every outcome is a result or a PanameraError; no file
outside the folder is opened."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from panamera.errors import ModelError, PanameraError
from panamera.subgraph import folder, load_optimized, optimize, write_deployable


def _model():
    """Gather by a 0-d index, a weight added, a softmax: two subgraphs and a library node or so."""
    f = TensorProto.FLOAT
    inits = [
        numpy_helper.from_array(np.array(1, np.int64), "i"),
        numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Gather", ["x", "i"], ["g"], axis=0),
        helper.make_node("Add", ["g", "b"], ["a"]),
        helper.make_node("Softmax", ["a"], ["y"]),
        helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [3, 2, 8])],
                          [helper.make_tensor_value_info("y", f, [2, 8]), helper.make_tensor_value_info("m", f, [])],
                          initializer=inits)  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


X = {"x": np.random.default_rng(0).standard_normal((3, 2, 8)).astype(np.float32)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("saved")
    opt = optimize(_model(), target="emulator")
    write_deployable(opt, str(d))
    return d, opt.run(X)


def _outcome(d):
    """Load and run the folder: its outputs, or None for a PanameraError."""
    try:
        return load_optimized(d, target="emulator").run(X)
    except PanameraError:
        return None


def test_the_saved_folder_round_trips(saved):
    d, want = saved
    got = _outcome(d)
    assert got is not None and all(np.array_equal(got[k], want[k]) for k in want)


HOSTILE = ["/etc/hostname", "../outside.json", "kernels/../../outside.json", "", ".", "a//b", "a\\b", "\x00"]
VALUES = st.one_of(
    st.sampled_from([None, True, 0, -1, 1, 2, 10**9, 1.5, "", "x", "w0", [], [0], [[]], {}, {"a": 1}]),
    st.sampled_from(HOSTILE),
)


@st.composite
def manifest_edits(draw, man: dict):
    """The manifest with one field, one unit's field, one value or one weight entry changed."""
    man = json.loads(json.dumps(man))
    where = draw(st.sampled_from(["top", "unit", "values", "weights", "files", "drop"]))
    if where == "top":
        man[draw(st.sampled_from(sorted(man)))] = draw(VALUES)
    elif where == "drop":
        del man[draw(st.sampled_from(sorted(man)))]
    elif where == "unit":
        u = man["units"][draw(st.integers(0, len(man["units"]) - 1))]
        u[draw(st.sampled_from(sorted(u)))] = draw(VALUES)
    else:
        table = man[where]
        key = draw(st.sampled_from(sorted(table)))
        if where == "values" and table[key][0] and draw(st.booleans()):
            table[key][0][draw(st.integers(0, len(table[key][0]) - 1))] = draw(st.sampled_from([0, 1, 7, 10**6]))
        elif where == "weights" and draw(st.booleans()):
            table[key][1] = draw(st.sampled_from(["float64", "bfloat16", "object", "V8", "int8", "nonsense"]))
        elif where == "files" and draw(st.booleans()):
            table[draw(st.sampled_from(HOSTILE))] = table.pop(key)
        else:
            table[key] = draw(VALUES)
    return man


def _copy(saved, tmp_path_factory):
    d = tmp_path_factory.mktemp("folder")
    shutil.copytree(saved[0], d, dirs_exist_ok=True)
    return d


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_an_edited_manifest_gives_a_result_or_a_panamera_error(saved, tmp_path_factory, data):
    d = _copy(saved, tmp_path_factory)
    man = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps(data.draw(manifest_edits(man))))
    _outcome(d)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), rehash=st.booleans())
def test_changed_or_missing_files_give_a_result_or_a_panamera_error(saved, tmp_path_factory, data, rehash):
    d = _copy(saved, tmp_path_factory)
    man = json.loads((d / "manifest.json").read_text())
    rel = data.draw(st.sampled_from(sorted(man["files"])))
    path = d / rel
    how = data.draw(st.sampled_from(["truncate", "byte", "delete", "weights"]))
    if how == "delete":
        path.unlink()
    elif how == "weights":  # a forger's weights: another shape or dtype under the same key
        path = d / "weights.npz"
        key = data.draw(st.sampled_from(sorted(man["weights"])))
        arr = data.draw(st.sampled_from([np.zeros(3, np.float32), np.array(7, np.int64), np.ones((2, 8), np.float64)]))
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        np.savez(path, **{**arrays, key: arr})
    else:
        blob = bytearray(path.read_bytes())
        if how == "truncate":
            blob = blob[: data.draw(st.integers(0, len(blob) - 1))]
        else:
            blob[data.draw(st.integers(0, len(blob) - 1))] ^= data.draw(st.integers(1, 255))
        path.write_bytes(bytes(blob))
    if rehash and path.exists():
        man["files"][path.relative_to(d).as_posix()] = folder.digest(str(path))
        (d / "manifest.json").write_text(json.dumps(man))
    got = _outcome(d)
    if not rehash:
        assert got is None  # a checksum names the change


def test_paths_are_confined_and_changed_weights_are_named(saved, tmp_path_factory):
    d = _copy(saved, tmp_path_factory)
    man = json.loads((d / "manifest.json").read_text())
    unit = next(u for u in man["units"] if "cuda" in u)
    for bad in ["/etc/hostname", "../outside.cu", "kernels/../../outside.cu"]:
        edited = {**man, "units": [{**u, "cuda": bad} if u is unit else u for u in man["units"]]}
        (d / "manifest.json").write_text(json.dumps(edited))
        with pytest.raises(ModelError, match="not a plain relative path inside the folder"):
            load_optimized(d, target="emulator")
    os.symlink("/etc/hostname", d / "kernels" / "link.cu")
    edited = {**man, "units": [{**u, "cuda": "kernels/link.cu"} if u is unit else u for u in man["units"]]}
    (d / "manifest.json").write_text(json.dumps(edited))
    with pytest.raises(ModelError, match="leads out of the folder"):
        load_optimized(d, target="emulator")
    (d / "manifest.json").write_text(json.dumps(man))
    with np.load(d / "weights.npz") as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(d / "weights.npz", **{k: a + 1 if a.dtype.kind == "f" else a for k, a in arrays.items()})
    with pytest.raises(ModelError, match=r"weights\.npz: its SHA-256 differs"):
        load_optimized(d, target="emulator")
    (d / "manifest.json").write_text('{"format": "panamera-optimized/2", "units": ')
    with pytest.raises(ModelError, match="manifest.json: not a readable manifest"):
        load_optimized(d, target="emulator")
    (d / "manifest.json").write_text(json.dumps({**man, "opset": "18"}))
    with pytest.raises(ModelError, match="field 'opset' must be an opset number"):
        load_optimized(d, target="emulator")
