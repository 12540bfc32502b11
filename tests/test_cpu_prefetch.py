"""Software prefetches in a CPU row scan's first pass (schedule/cpu_prefetch.py chooses them,
codegen/cpu_lanes.py `prefetch_lines` emits them): forced on small rows (a model whose caches are
tiny, so precondition 4 holds), results against numpy in float64, with row tails (N not a multiple of
the W lanes), NaN/inf rows, bit-identical to the scan without prefetches and across thread counts;
the choice at the bench's sizes; one negative test per precondition.

Tolerances (float32, u = 2^-24, n the row length): a sum of n terms is off by (n - 1) u relative to
the sum of magnitudes; softmax's bound is test_cpu_rows' (exp < 1 ulp, x - m, the row's sum, the
reciprocal and the product); argmax is exact."""

from dataclasses import replace

import islpy as isl
import numpy as np
import pytest
from conftest import softmax_bound

import panamera as pn
import panamera.schedule.cpu_mapper as cpu_mapper
from panamera.compiler import lower
from panamera.model.cpu import LANE_VECTORS, Caches, CpuModel
from panamera.poly.statement import Form
from panamera.schedule.cpu_mapper import CpuMachine, map_cpu
from panamera.schedule.cpu_prefetch import choose_prefetch, unit_stride

U = 2.0**-24
MODEL = CpuModel.nominal(cores=2, simd_bytes=64)
TINY = replace(MODEL, caches=Caches(1 << 10, 4 << 10, 16 << 10))  # every test array "beyond L2"


@pytest.fixture
def force_prefetch(monkeypatch):
    """A call that makes later compiles take the prefetch choice of a machine whose caches are tiny
    (the other preconditions as they are)."""
    real = cpu_mapper.choose_prefetch

    def use() -> None:
        monkeypatch.setattr(cpu_mapper, "choose_prefetch", lambda g, model, threads=1: real(g, TINY, threads))

    return use


def _group(y):
    return lower(y, stop_after="groups", target="cpu").groups[0]


def _both(y, force):
    """(without prefetches, with them) compiled fresh (the in-memory cache keys no mapper)."""
    plain = pn.compile(y, target="cpu", cache=False)
    force()
    return plain, pn.compile(y, target="cpu", cache=False)


def test_argmax_prefetched_tails_nan_ties_threads(force_prefetch, rng):
    a = (rng.standard_normal((6, 1000)) * 3).astype(np.float32)  # 1000 = 31 x 32 + 8: a tail
    a[1, [7, 900]] = np.nan  # the first NaN wins
    a[2, [3, 640, 999]] = 50.0  # ties: the first index
    a[3, :] = -np.inf
    a[4, 998] = np.inf  # in the tail
    y = pn.argmax(pn.placeholder(a.shape, "float32"), axis=1)
    plain, k = _both(y, force_prefetch)
    assert "__builtin_prefetch" in k.source and "__builtin_prefetch" not in plain.source
    want = np.argmax(a, axis=1)
    assert want[1] == 7 and want[2] == 3 and want[3] == 0 and want[4] == 998
    for t in (1, 2, 3):
        assert np.array_equal(k(a, threads=t), want)
    assert np.array_equal(plain(a, threads=1), want)


def test_softmax_prefetched_special_rows_same_bits(force_prefetch, rng):
    a = (rng.standard_normal((5, 3001)) * 6).astype(np.float32)  # 3001: a tail of 57 after the 64-lane steps
    a[1, 2000] = np.nan
    a[2, 9] = np.inf
    a[3, :] = -np.inf
    a[3, 3000] = 1.0  # all -inf but the tail's last
    a[4, ::3] = -np.inf
    y = pn.nn.softmax(pn.placeholder(a.shape, "float32"), axis=-1)
    plain, k = _both(y, force_prefetch)
    assert "__builtin_prefetch" in k.source
    assert any(d.prefetch is not None for d in k.decisions)
    base = plain(a, threads=1)
    runs = [k(a, threads=t) for t in (1, 2, 3)]
    assert all(np.array_equal(base, r, equal_nan=True) for r in runs)
    got = runs[0].astype(np.float64)
    assert np.isnan(got[1:3]).all() and got[3, 3000] == 1.0 and (got[4, ::3] == 0).all()
    ref, tol = softmax_bound(a)
    ok = np.isfinite(ref)
    assert (np.abs(got[ok] - ref[ok]) <= tol[ok]).all()


@pytest.mark.parametrize("rows", [1, 2])
def test_short_rows_prefetched_rows_a_scan(force_prefetch, monkeypatch, rng, rows):
    """Short softmax rows, one or two a scan (codegen/cpu_interleave.py: each row's lines), 7 rows: a tail row."""
    monkeypatch.setattr(
        cpu_mapper, "choose_rows", lambda g, split, *a: rows if g.form == Form.ROW and split == 1 else 1
    )
    a = (rng.standard_normal((7, 200)) * 6).astype(np.float32)
    a[1, 7], a[2, 9], a[6, :] = np.nan, np.inf, -np.inf
    a[6, 150] = 1.0
    y = pn.nn.softmax(pn.placeholder(a.shape, "float32"), axis=-1)
    plain, k = _both(y, force_prefetch)
    assert "__builtin_prefetch" in k.source and (rows == 1 or "pn_i0 += 2" in k.source)
    base = plain(a, threads=1)
    assert all(np.array_equal(base, k(a, threads=t), equal_nan=True) for t in (1, 2))
    got = base.astype(np.float64)
    assert np.isnan(got[1:3]).all() and got[6, 150] == 1.0
    ref, tol = softmax_bound(a)
    ok = np.isfinite(ref)
    assert (np.abs(got[ok] - ref[ok]) <= tol[ok]).all()


def test_sum_all_split_prefetched(force_prefetch, rng):
    """The ALL form split over threads (a chunk a task): each chunk's scan prefetches."""
    force_prefetch()
    a = rng.standard_normal(50_003).astype(np.float32)
    k = pn.compile(pn.sum(pn.placeholder(a.shape, "float32")), target="cpu", cache=False)
    assert "__builtin_prefetch" in k.source
    ref = a.astype(np.float64).sum()
    tol = (a.size - 1) * U * np.abs(a.astype(np.float64)).sum()
    for t in (1, 2):
        assert abs(float(k(a, threads=t)) - ref) <= tol


def test_bench_sizes_prefetch():
    g = _group(pn.argmax(pn.placeholder((64, 30522)), axis=1))
    d = map_cpu(g, CpuMachine(cores=2, simd_bytes=64, name="x"), model=MODEL)
    assert d.prefetch is not None and d.prefetch.reads == ((0, 0),) and "prefetch=4096" in d.describe()


def test_precondition_1_row_or_all():
    assert choose_prefetch(_group(pn.sum(pn.placeholder((40000, 64)), axis=0)), MODEL) is None


def test_precondition_2_lanes():
    g = _group(pn.var(pn.placeholder((64, 40000)), axis=1))  # Welford: no lanes
    assert choose_prefetch(g, MODEL) is None


def test_precondition_3_unit_stride_whole_rows():
    g = _group(pn.sum(pn.placeholder((64, 40000))[:, ::2], axis=1))
    assert choose_prefetch(g, MODEL) is None
    w = pn.placeholder((40000,))  # a row broadcast to every row: no stream
    assert choose_prefetch(_group(pn.sum(pn.placeholder((64, 40000)) * w, axis=1)), MODEL).reads == ((0, 0),)
    ctx = isl.Context()
    assert unit_stride(isl.PwAff("{ [i, j] -> [(40000i + j)] }", context=ctx))
    assert not unit_stride(isl.PwAff("{ [i, j] -> [(40000i + 2j)] }", context=ctx))
    assert not unit_stride(isl.PwAff("{ [i, j] -> [(i)] }", context=ctx))


def test_precondition_4_beyond_l2():
    assert choose_prefetch(_group(pn.argmax(pn.placeholder((64, 1000)), axis=1)), MODEL) is None
    assert choose_prefetch(_group(pn.argmax(pn.placeholder((64, 1000)), axis=1)), TINY) is not None


def test_float16_rows_prefetched(force_prefetch, rng):
    """Half inputs: W x 2 bytes a step, a line each 64 bytes; the float16 result rounds once (2^-11 relative, and
    half of float16's least subnormal, 2^-25, absolute) after the float32 computation's bound."""
    a = (rng.standard_normal((3, 1000)) * 4).astype(np.float16)
    y = pn.nn.softmax(pn.placeholder(a.shape, "float16"), axis=-1)
    plain, k = _both(y, force_prefetch)
    W = LANE_VECTORS * k.decisions[0].lanes  # 8 lanes on AVX2, 16 on AVX-512: one line or two
    assert k.source.count("__builtin_prefetch") == W * 2 // 64
    got = k(a, threads=2)
    assert np.array_equal(got, plain(a, threads=1))
    ref, tol = softmax_bound(a.astype(np.float32))
    assert (np.abs(got.astype(np.float64) - ref) <= tol + 2.0**-11 * ref + 2.0**-25).all()
