"""Symbolic schedules in the schedule database (issue 22): written, looked up by the symbolic
signature, replayed and validated; a stale entry skipped with a notice."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from conftest import tolerance

import panamera as pn
from panamera.bench.symbolic_suite import SymbolicWorkload, write_symbolic
from panamera.errors import StaleScheduleWarning
from panamera.model.gpu import H100
from panamera.schedule import database


def _rowsum():
    return [pn.sum(pn.placeholder(("B", 96), name="x") * 2.0, axis=-1)]


WORKLOAD = SymbolicWorkload("rowsum-96", _rowsum, ({"B": 3}, {"B": 200}))


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setenv(database.ENV, str(tmp_path))
    (path,) = write_symbolic(tmp_path, [H100], [WORKLOAD])
    return path


def test_symbolic_signature_names_the_symbols():
    a, a2, b = (pn.sum(pn.placeholder((s, 96), name=n), axis=-1) for s, n in (("B", "x"), ("B", "y"), ("N", "x")))
    assert database.signature((a,)) == database.signature((a2,))  # tensor names do not matter
    assert database.signature((a,)) != database.signature((b,))  # symbol names do: one name is one value


def test_an_entry_is_written_looked_up_and_replayed(db, rng):
    doc = json.loads(db.read_text())
    assert doc["format"] == "panamera-symbolic-schedule/1" and len(doc["classes"]) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleScheduleWarning)
        k = pn.compile(_rowsum()[0], target="emulator", gpu="h100", cache=False)
    assert k.origin == f"from schedules/{db.relative_to(db.parents[1]).as_posix()}"
    assert "class plans: from schedules/" in k.explain()
    assert k.stats()["classes_planned"] == 0 and len(k.schedule.classes) == 2  # both classes from the entry
    x = rng.standard_normal((3, 96)).astype(np.float32)
    tol = 4 * tolerance("float32", 96)
    np.testing.assert_allclose(
        k(x), 2.0 * x.astype(np.float64).sum(-1), rtol=tol, atol=2 * tol * np.abs(x).sum(-1).max()
    )
    assert k.stats()["classes_planned"] == 0  # B = 3's class came from the entry


def test_a_stale_entry_is_skipped_with_a_notice(db):
    doc = json.loads(db.read_text())
    doc["classes"][0]["kernels"][0]["statement"] = "S9"  # the program has no such statement any more
    db.write_text(json.dumps(doc))
    with pytest.warns(StaleScheduleWarning, match="schedules/.*skipped.*S9"):
        k = pn.compile(_rowsum()[0], target="emulator", gpu="h100", cache=False)
    assert k.origin == "chosen by the model"


def test_a_database_off_or_a_deterministic_compile_plans_by_the_model(db, monkeypatch):
    k = pn.compile(_rowsum()[0], target="emulator", gpu="h100", cache=False, deterministic=True)
    assert k.origin == "chosen by the model"
    monkeypatch.setenv(database.ENV, "off")
    assert pn.compile(_rowsum()[0], target="emulator", gpu="h100", cache=False).origin == "chosen by the model"


def test_a_fused_attention_entry_is_replayed(tmp_path, monkeypatch):
    def att():
        q = pn.placeholder((1, 4, 1, 16), name="q")
        return [pn.nn.attention(q, *(pn.placeholder((1, 2, "T", 16), name=n) for n in ("k", "v")))]

    monkeypatch.setenv(database.ENV, str(tmp_path))
    write_symbolic(tmp_path, [H100], [SymbolicWorkload("att", att, ({"T": 5}, {"T": 300}))])
    k = pn.compile(att()[0], target="emulator", gpu="h100", cache=False)
    assert k.origin.startswith("from schedules/") and k.program.formulations == ("attention=fused",)
    assert len(k.schedule.classes) == 2 and k.stats()["classes_planned"] == 0
