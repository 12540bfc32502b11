"""The schedule database loader under hostile files: whatever is in the database directory, a
compile consulting it ends in a correct kernel or a PanameraError, never a bare exception or a
wrong answer (schedule/database.py skips what it cannot read; mapping.replay refuses what does
not fit)."""

from __future__ import annotations

import dataclasses
import json
import os
import warnings

import numpy as np
import pytest
from conftest import tolerance
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import panamera as pn
from panamera.errors import PanameraError
from panamera.schedule import database


def _softmax_ref(a):
    e = np.exp(a - a.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


# name: (build, float64 reference, reduction length); small enough for the emulator, with a
# split atomic COLUMN, a ROW, and a stitched group among their schedules.
PROGRAMS = {
    "rowsum": (lambda: pn.sum(pn.placeholder((8, 3000), "float32", name="x"), axis=1), lambda a: a.sum(1), 3000),
    "colsum": (lambda: pn.sum(pn.placeholder((3000, 8), "float32", name="x"), axis=0), lambda a: a.sum(0), 3000),
    "softmax": (lambda: pn.nn.softmax(pn.placeholder((6, 500), "float32", name="x")), _softmax_ref, 500),
}


@pytest.fixture(scope="module")
def entries():
    """The real entry of each program: what `panamera schedules` would write for it."""
    out = {}
    for name, (build, _, _) in PROGRAMS.items():
        outs = build()
        s = pn.compile(outs, target="emulator", use_database=False, cache=False).schedule
        out[name] = dataclasses.replace(s, subgraph=database.signature((outs,))).to_json()
    return out


def _compile_and_check(name: str):
    """Compile program `name` with the database consulted: a correct kernel, or a PanameraError."""
    build, ref, n = PROGRAMS[name]
    database._index.cache_clear()  # the directory's content changed under the same path
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", database.StaleScheduleWarning)
        try:
            k = pn.compile(build(), target="emulator", cache=False)
        except PanameraError:
            return None
    a = np.random.default_rng(0).standard_normal(k.inputs[0].shape).astype(np.float32)
    tol = tolerance("float32", n)
    np.testing.assert_allclose(k(a), ref(a.astype(np.float64)), rtol=tol, atol=tol)
    return k


VALUES = st.one_of(
    st.sampled_from([0, 1, -1, 2, 3, 4, 5, 8, 16, 31, 32, 64, 128, 1024, 2**31, 10**12]),
    st.sampled_from([None, True, "", "ROW", "COLUMN", "MAP", "atomic", "store", "contig", "S0", "S0+S1"]),
    st.sampled_from([[], [1], [0, 0], [[]], {}, {"a": 1}, 1.5, float("nan")]),
)


@st.composite
def mutations(draw, text: str) -> bytes:
    """One entry's text, mutated: a field replaced or dropped (in a kernel or at the top), an
    element of a list replaced, bytes overwritten or the file truncated."""
    doc = json.loads(text)
    kind = draw(st.sampled_from(["kernel", "kernel", "element", "top", "drop", "bytes", "truncate"]))
    if kind in ("bytes", "truncate"):
        data = bytearray(text.encode())
        if kind == "truncate":
            return bytes(data[: draw(st.integers(0, len(data) - 1))])
        for pos, byte in draw(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)), max_size=4)):
            data[pos] = byte
        return bytes(data)
    kernel = doc["kernels"][draw(st.integers(0, len(doc["kernels"]) - 1))]
    if kind == "top":
        doc[draw(st.sampled_from(sorted(doc)))] = draw(VALUES)
    elif kind == "drop":
        target = draw(st.sampled_from([doc, kernel]))
        del target[draw(st.sampled_from(sorted(target)))]
    else:
        key = draw(st.sampled_from(sorted(kernel)))
        lists = isinstance(kernel[key], list) and kernel[key]
        if kind == "element" and lists:
            inner = kernel[key]
            k = draw(st.integers(0, len(inner) - 1))
            if isinstance(inner[k], list) and inner[k]:
                inner, k = inner[k], draw(st.integers(0, len(inner[k]) - 1))
            inner[k] = draw(VALUES)
        else:
            kernel[key] = draw(VALUES)
    return json.dumps(doc).encode()


@settings(max_examples=45, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(sorted(PROGRAMS)), junk=st.binary(max_size=64))
def test_mutated_entries_give_a_correct_kernel_or_a_panamera_error(entries, tmp_path_factory, data, name, junk):
    root = tmp_path_factory.mktemp("db")
    (root / "h100").mkdir()
    (root / "h100" / "entry.json").write_bytes(data.draw(mutations(entries[name])))
    (root / "h100" / "junk.json").write_bytes(junk)  # a stray file beside it
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(database.ENV, str(root))
        _compile_and_check(name)


def test_a_binary_file_in_the_database_is_skipped_with_a_notice(tmp_path, monkeypatch):
    (tmp_path / "h100").mkdir()
    (tmp_path / "h100" / "binary.json").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "h100" / "deep.json").write_text("[" * 100_000)
    (tmp_path / "h100" / "dir.json").mkdir()
    monkeypatch.setenv(database.ENV, str(tmp_path))
    database._index.cache_clear()
    with pytest.warns(database.StaleScheduleWarning) as seen:
        k = pn.compile(PROGRAMS["rowsum"][0](), target="emulator", cache=False)
    notes = " | ".join(str(w.message) for w in seen)
    assert "binary.json: not UTF-8" in notes and "deep.json" in notes and "dir.json: unreadable" in notes
    assert k.origin == "chosen by the model"


def test_a_matching_entry_that_does_not_validate_is_a_stale_entry_skipped(entries, tmp_path, monkeypatch):
    doc = json.loads(entries["colsum"])
    doc["kernels"][0]["chunk"] = 1  # the blocks no longer cover the reduction
    (tmp_path / "h100").mkdir()
    (tmp_path / "h100" / "colsum.json").write_text(json.dumps(doc))
    monkeypatch.setenv(database.ENV, str(tmp_path))
    database._index.cache_clear()
    with pytest.warns(database.StaleScheduleWarning, match="colsum.json: skipped"):
        k = pn.compile(PROGRAMS["colsum"][0](), target="emulator", cache=False)
    assert k.origin == "chosen by the model"
    assert os.environ[database.ENV] == str(tmp_path)
