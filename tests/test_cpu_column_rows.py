"""COLUMN kernels whose blocks are in L1 add COLUMN_ROWS input rows per load and store of their
blocks (model/cpu.py `column_rows`, codegen/cpu_column.py): against numpy float64 with a tail of
rows (fewer than a step), a clipped last block and two sums sharing the loads; the same bits as one
row a step; one negative test per precondition (another form, blocks held in registers)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tolerance

import panamera as pn
import panamera.model.cpu as model_cpu
from panamera.model.cpu import COLUMN_ROWS
from panamera.poly.statement import Form

STEP = f"pn_j + {COLUMN_ROWS}"  # the stepped loop's bound in the source


def _column(shape, op: str, **kw):
    x = pn.placeholder(shape, "float32", name="x")
    outs = [pn.max(x, axis=0)] if op == "max" else [pn.sum(x, axis=0), pn.sum(x * x, axis=0)][: 1 + (op == "sums")]
    return pn.compile(outs, target="cpu", **kw)


@pytest.mark.parametrize(
    "shape, op",
    [
        ((5 * COLUMN_ROWS + 5, 768), "sum"),  # five steps and a tail of 5 rows
        ((5, 768), "max"),  # the tail alone
        ((3 * COLUMN_ROWS + 3, 4100), "sums"),  # the last block clipped (4096-float blocks), x and x^2
    ],
)
def test_column_rows_in_steps_against_numpy(shape, op, rng):
    k = _column(shape, op)
    (d,) = k.decisions
    assert d.form == Form.COLUMN and d.column_rows == COLUMN_ROWS and STEP in k.cpu_source
    a = (rng.random(shape) * 2 - 0.7).astype(np.float32)
    x = a.astype(np.float64)
    refs = [x.max(0)] if op == "max" else [x.sum(0), (x * x).sum(0)][: 1 + (op == "sums")]
    outs = k(a, threads=1)
    for out, ref in zip(outs, refs, strict=True):
        if op == "max":
            np.testing.assert_array_equal(out, ref.astype(np.float32))
        else:
            tol = tolerance("float32", shape[0])
            np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_column_rows_keep_the_bits_of_one_row_a_step(rng, monkeypatch):
    """The combines run in the same order on the same values: a step of COLUMN_ROWS rows gives the
    bits one row a step gives (only the block's loads and stores between rows go)."""
    shape = (7 * COLUMN_ROWS + 3, 768)
    a = (rng.random(shape) * 2 - 0.7).astype(np.float32)
    stepped = _column(shape, "sums", cache=False)
    monkeypatch.setattr(model_cpu, "COLUMN_ROWS", 1)
    single = _column(shape, "sums", cache=False)
    assert single.decisions[0].column_rows == 1 and STEP not in single.cpu_source
    for x, y in zip(stepped(a, threads=1), single(a, threads=1), strict=True):
        np.testing.assert_array_equal(x, y)


def test_precondition_1_other_forms_scan_one_row_a_step():
    x = pn.placeholder((64, 768), "float32", name="x")
    k = pn.compile(pn.sum(x, axis=1), target="cpu")
    assert k.decisions[0].form != Form.COLUMN and k.decisions[0].column_rows == 1 and "pn_j +" not in k.cpu_source


def test_precondition_2_blocks_held_in_registers_scan_one_row_a_step(rng):
    """64 float columns (8 AVX2 or 4 AVX-512 vectors): g++ keeps the block in registers, no load or
    store to save, so the isl scan's one row a step stays."""
    k = _column((100, 64), "sum")
    (d,) = k.decisions
    assert d.form == Form.COLUMN and d.column_rows == 1 and STEP not in k.cpu_source
    a = (rng.random((100, 64)) * 2 - 0.7).astype(np.float32)
    ref = a.astype(np.float64).sum(0)
    tol = tolerance("float32", 100)
    (out,) = k(a, threads=1)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol * np.abs(ref).max())
