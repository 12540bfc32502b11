"""The output row as a kept value's scratch row on target="cpu" (schedule/cpu_reuse.py `Reuse.into`,
`output_row`; codegen/cpu_rows.py `output_scratch`): softmax's sum pass writes exp(x - m) to the
output row, the last pass scales it in place. Results against numpy in float64, with NaN/inf rows
and row tails, bit-identical to the per-thread scratch row and across thread counts, at one and two
rows a scan; one negative test per precondition 5 to 8 of cpu_reuse.

Tolerance: conftest's softmax_bound (float32, u = 2^-24: exp < 1 ulp, x - m, the row's sum of
n terms, the reciprocal and the product)."""

from dataclasses import replace

import islpy as isl
import numpy as np
import pytest
from conftest import softmax_bound

import panamera as pn
import panamera.schedule.cpu_mapper as cpu_mapper
import panamera.schedule.cpu_reuse as cpu_reuse
from panamera.compiler import lower
from panamera.model.cpu import CpuModel
from panamera.poly.statement import Form, Read
from panamera.schedule.cpu_reuse import choose, output_row

MODEL = CpuModel.nominal(cores=2, simd_bytes=64)


@pytest.mark.parametrize("rows,shape", [(1, (5, 1000)), (2, (7, 200))])
def test_softmax_output_row_scratch(monkeypatch, rng, rows, shape):
    monkeypatch.setattr(
        cpu_mapper, "choose_rows", lambda g, split, *a: rows if g.form == Form.ROW and split == 1 else 1
    )
    a = (rng.standard_normal(shape) * 6).astype(np.float32)
    a[1, 7], a[2, 9], a[3, ::3] = np.nan, np.inf, -np.inf
    a[-1, :] = -np.inf  # a tail row at 2 rows a scan: all -inf but one
    a[-1, 150] = 1.0
    y = pn.nn.softmax(pn.placeholder(a.shape, "float32"), axis=-1)
    k = pn.compile(y, target="cpu", cache=False)
    assert [x.into for d in k.decisions for x in d.reuse] == [2]
    assert "the output row as scratch" in k.source and "aligned_alloc" not in k.source
    monkeypatch.setattr(cpu_reuse, "output_row", lambda g, x: None)
    own = pn.compile(y, target="cpu", cache=False)
    assert "aligned_alloc" in own.source
    want = own(a, threads=1)
    runs = [k(a, threads=t) for t in (1, 2, 3)]
    assert all(np.array_equal(want, r, equal_nan=True) for r in runs)
    got = runs[0].astype(np.float64)
    assert np.isnan(got[1:3]).all() and got[-1, 150] == 1.0 and (got[3, ::3] == 0).all()
    ref, tol = softmax_bound(a)
    ok = np.isfinite(ref)
    assert (np.abs(got[ok] - ref[ok]) <= tol[ok]).all()
    out = np.full_like(a, 7.0)  # a caller's output array: written in place
    assert k(a, threads=2, out=out) is out or np.array_equal(out, want, equal_nan=True)
    assert np.array_equal(out, want, equal_nan=True)


def _reuses(*ys):
    return [x for g in lower(list(ys), stop_after="groups", target="emulator").groups for x in choose(g, MODEL)]


def _parts(shape=(4, 1000), dtype="float32"):
    x = pn.placeholder(shape, dtype)
    e = pn.exp(x - pn.max(x, axis=1, keepdims=True))
    return e, pn.sum(e, axis=1, keepdims=True)


def test_precondition_5_one_consumer_stored_in_the_last_pass():
    e, s = _parts()
    r = _reuses(e / s, e * 2.0 / s)  # two consumers of exp(x - m)
    assert r and all(len(x.consumers) == 2 and x.into is None for x in r)


def test_precondition_6_output_type():
    r = _reuses(pn.nn.softmax(pn.placeholder((4, 1000), "float16"), axis=1, method="multipass"))
    assert r and all(x.ctype == "float" and x.into is None for x in r)


def _softmax_group():
    y = pn.nn.softmax(pn.placeholder((4, 1000), "float32"), axis=1, method="multipass")
    g = lower(y, stop_after="groups", target="emulator").groups[0]
    (x,) = choose(g, MODEL)
    assert x.into == 2
    return g, x


def _with(g, k, **changes):
    return replace(g, statements=tuple(replace(s, **changes) if n == k else s for n, s in enumerate(g.statements)))


def test_precondition_7_row_after_row():
    g, x = _softmax_group()  # the frontend's stitched rows are written row-major: an address made here
    down = isl.PwAff("{ [i, j] -> [(4j + i)] }", context=g.statements[2].write.get_ctx())
    assert output_row(_with(g, 2, write=down), x) is None


def test_precondition_8_output_read_in_the_group():
    g, x = _softmax_group()  # a group reading its own output: made here, the stitcher does not make one
    s0 = g.statements[0]
    again = s0.reads + (Read(g.statements[2].result, g.statements[2].write),)
    assert output_row(_with(g, 0, reads=again), x) is None


def test_out_aliasing_the_input_is_not_the_scratch_row(rng):
    """The sum pass writes exp(x - m) into the output row before the last pass: an `out=` that is the
    input itself, or overlaps it a row further on, must not be read back as x (the call copies
    through its own output instead; runtime/cpu_call.py `_writable`/OBJECT_CALL's overlap test)."""
    a = (rng.standard_normal((5, 1000)) * 6).astype(np.float32)
    k = pn.compile(pn.nn.softmax(pn.placeholder(a.shape, "float32"), axis=-1), target="cpu", cache=False)
    assert [x.into for d in k.decisions for x in d.reuse] == [2]
    want = k(a, threads=1)
    same = a.copy()
    k(same, threads=2, out=same)
    assert np.array_equal(same, want)
    buf = np.concatenate([a, a[:1]])  # out = the input's rows shifted by one: row i of out is row i + 1 of x
    k(buf[:5], threads=1, out=buf[1:])
    assert np.array_equal(buf[1:], want)
