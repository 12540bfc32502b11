"""Several rows a pass on target="cpu" (schedule/cpu_rows.py chooses R, codegen/cpu_interleave.py
emits it): results against numpy in float64 with row counts that leave tail rows (M % R), the same
bits as one row a pass and on 1, 2 and 3 threads, NaN/inf rows; one negative test per precondition
of `choose_rows`.

Tolerances (float32, u = 2^-24, n the row length): a sum of n terms is off by (n - 1) u relative to
the sum of magnitudes; softmax's bound is test_cpu_exp_flush's (exp < 1 ulp, x - m, the row's sum,
the reciprocal and the product)."""

import numpy as np
import pytest
from conftest import softmax_bound

import panamera as pn
import panamera.schedule.cpu_mapper as cpu_mapper
import panamera.schedule.cpu_rows as cpu_rows
from panamera.compiler import lower
from panamera.model.cpu import LANE_VECTORS, CpuModel
from panamera.poly.statement import Form
from panamera.schedule.cpu_rows import choose_rows

U = 2.0**-24
MODEL = CpuModel.nominal(cores=2, simd_bytes=64)


@pytest.fixture
def force_rows(monkeypatch):
    """Compile with every split-free ROW group at R rows a pass (whatever the model says)."""

    def use(r: int) -> None:
        monkeypatch.setattr(
            cpu_mapper, "choose_rows", lambda g, split, *a: r if g.form == Form.ROW and split == 1 else 1
        )

    return use


def _softmax_rows(rng, m: int, n: int = 128) -> np.ndarray:
    a = (rng.standard_normal((m, n)) * 6).astype(np.float32)
    a[1, 7], a[2, 9], a[m - 1, :] = np.nan, np.inf, -np.inf  # NaN, inf - inf, the last (a tail) row -inf but one
    a[m - 1, 5] = 1.0
    a[3, ::3] = -np.inf
    return a


@pytest.mark.parametrize("rows,m", [(2, 7), (3, 11), (4, 9)])
def test_softmax_rows_tails_threads_and_one_row_bits(force_rows, rng, rows, m):
    a = _softmax_rows(rng, m)
    y = pn.nn.softmax(pn.placeholder(a.shape, "float32"), axis=-1)
    force_rows(1)
    one = pn.compile(y, target="cpu", cache=False)(a, threads=1)
    force_rows(rows)
    k = pn.compile(y, target="cpu", cache=False)
    assert f"pn_i0 += {rows}" in k.source  # the rows-a-pass loop (codegen/cpu_interleave.py)
    runs = [k(a, threads=t) for t in (1, 2, 3)]
    assert all(np.array_equal(one, r, equal_nan=True) for r in runs)
    ref, tol = softmax_bound(a)
    got = runs[0].astype(np.float64)
    assert np.isnan(got[1:3]).all() and got[m - 1, 5] == 1.0 and (got[3, ::3] == 0).all()
    ok = np.isfinite(ref)
    assert (np.abs(got[ok] - ref[ok]) <= tol[ok]).all()


@pytest.mark.parametrize("op", ["sum", "max", "argmax", "layer_norm"])
def test_other_row_groups_rows_3(force_rows, rng, op):
    """Plain (sum) and NaN-watched (max) lanes interleaved; argmax's and Welford's passes run once a
    row in the group's scope (the fallback of row_pass); 5 rows at R = 3: a tail of 2."""
    a = (rng.standard_normal((5, 200)) * 3).astype(np.float32)
    a[1, 4] = np.nan
    x = pn.placeholder(a.shape, "float32")
    y = {
        "sum": lambda: pn.sum(x, axis=-1),
        "max": lambda: pn.max(x, axis=-1),
        "argmax": lambda: pn.argmax(x, axis=-1),
        "layer_norm": lambda: pn.nn.layer_norm(x),
    }[op]()
    force_rows(1)
    one = pn.compile(y, target="cpu", cache=False)(a, threads=1)
    force_rows(3)
    k = pn.compile(y, target="cpu", cache=False)
    assert "pn_i0 += 3" in k.source
    runs = [np.asarray(k(a, threads=t)) for t in (1, 2, 3)]
    assert all(np.array_equal(one, r, equal_nan=True) for r in runs)
    x64 = a.astype(np.float64)
    got = runs[0].astype(np.float64)
    if op == "sum":
        ref = x64.sum(-1)
        tol = 199 * U * np.abs(x64).sum(-1) + U * np.abs(ref)
        assert np.isnan(got[1]) and (np.abs(got - ref)[[0, 2, 3, 4]] <= tol[[0, 2, 3, 4]]).all()
    elif op == "max":
        assert np.array_equal(got, x64.max(-1), equal_nan=True)
    elif op == "argmax":
        assert np.array_equal(got, x64.argmax(-1))
    else:
        mu = x64.mean(-1, keepdims=True)
        ref = (x64 - mu) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
        assert np.isnan(got[1]).all()
        fine = [0, 2, 3, 4]  # Welford's mean and M2 over 200 terms, the rsqrt and the product: 64 n u, loose
        assert (np.abs(got[fine] - ref[fine]) <= 64 * 200 * U * (1 + np.abs(ref[fine]))).all()


def _group(y):
    return lower(y, stop_after="groups", target="emulator").groups[0]


def test_choose_rows_takes_rows_for_short_plain_rows():
    g = _group(pn.sum(pn.placeholder((1024, 128)), axis=-1))
    assert choose_rows(g, 1, 16, (), MODEL) == 4


def test_precondition_1_split_or_not_row():
    g = _group(pn.sum(pn.placeholder((1024, 128)), axis=-1))
    assert choose_rows(g, 2, 16, (), MODEL) == 1
    assert choose_rows(_group(pn.sum(pn.placeholder((128, 1024)), axis=0)), 1, 16, (), MODEL) == 1


def test_precondition_2_one_row():
    assert choose_rows(_group(pn.sum(pn.placeholder((1, 128)), axis=-1)), 1, 16, (), MODEL) == 1


def test_precondition_3_struct_or_arg_lanes():
    assert choose_rows(_group(pn.argmax(pn.placeholder((1024, 128)), axis=-1)), 1, 16, (), MODEL) == 1
    ln = pn.nn.layer_norm(pn.placeholder((1024, 128)))
    assert all(choose_rows(g, 1, 16, (), MODEL) == 1 for g in lower(ln, stop_after="groups", target="emulator").groups)


def test_precondition_4_registers(monkeypatch):
    g = _group(pn.sum(pn.placeholder((1024, 128)), axis=-1))
    monkeypatch.setattr(cpu_rows, "row_registers", lambda model: 7)  # a row's 4 vectors: no 2 rows fit
    assert choose_rows(g, 1, 16, (), MODEL) == 1


def test_precondition_4_half_the_isa_registers():
    """AVX2's 16 registers leave 8 to the rows' lanes: softmax's NaN-watched max (8 vectors) one
    row a pass, where AVX-512's 32 take two; its exp pass steps one register of lanes."""
    from panamera.schedule.cpu_lane_kind import pass_vectors

    g = _group(pn.nn.softmax(pn.placeholder((1024, 128)), axis=-1, method="multipass"))
    avx2 = CpuModel.nominal(cores=2, simd_bytes=32)
    assert cpu_rows.row_registers(avx2) == 8 and cpu_rows.row_registers(MODEL) == 16
    assert cpu_rows.lane_vectors(g) == 2 * LANE_VECTORS and pass_vectors([g.statements[1]]) == 1
    assert choose_rows(g, 1, 8, (), avx2) == 1 and choose_rows(g, 1, 16, (), MODEL) == 2


def test_precondition_5_model_gain():
    g = _group(pn.sum(pn.placeholder((16, 65536)), axis=-1))  # long rows: the combines are nothing
    assert choose_rows(g, 1, 16, (), MODEL) == 1


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_softmax_log_softmax_rows_other_dtypes(force_rows, rng, dtype):
    """8-byte lanes (half as many a vector) and a 16-bit store, at R = 2 over 5 rows of 97 (a tail
    row and a tail of each scan): the one-row bits, and test_cpu_softmax's float64 bounds."""
    from test_cpu_softmax import _bounds, _within

    a = (rng.standard_normal((5, 97)) * 4).astype(pn.dtypes.as_dtype(dtype).np)
    x = pn.placeholder(a.shape, dtype)
    ys = [pn.nn.softmax(x, axis=-1), pn.nn.log_softmax(x, axis=-1)]
    force_rows(1)
    one = pn.compile(ys, target="cpu", cache=False)(a)
    force_rows(2)
    k = pn.compile(ys, target="cpu", cache=False)
    assert "pn_i0 += 2" in k.source
    got = k(a, threads=2)
    assert all(np.array_equal(p, q) for p, q in zip(one, got))
    sm, sm_tol, lsm, lsm_tol = _bounds(a, dtype)
    _within(got[0], sm, sm_tol, f"softmax {dtype}")
    _within(got[1], lsm, lsm_tol, f"log_softmax {dtype}")
