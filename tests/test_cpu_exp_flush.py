"""The CPU target's float exp (runtime/cpu.py EXP_FLUSH, inline): a result below 1.42 FLT_MIN (x below
-125.5 ln2) is 0, never subnormal (absolute error < 1.7e-38), so masked softmax scores (-100) never
feed subnormals to the products after them; every other input as expf within 2 ulp, NaN stays NaN,
-inf gives 0, overflow gives inf."""

from __future__ import annotations

import numpy as np

import panamera as pn


def test_exp_flushes_only_subnormal_results(rng):
    tiny = np.finfo(np.float32).tiny
    lo = -125.5 * np.log(2.0)  # -86.99: where n = round(x / ln2) reaches -126 (EXP_FLUSH)
    top = np.log(np.float64(np.finfo(np.float32).max))  # 88.72
    x = np.concatenate([
        rng.uniform(-80, 80, 200), rng.uniform(lo - 20, lo - 1e-3, 100), rng.uniform(lo + 1e-3, lo + 2, 100),
        rng.uniform(-0.35, 0.35, 100), rng.uniform(top - 1, top - 1e-5, 50),
        [-100.0, -np.inf, np.inf, np.nan, -np.nan, 89.0, 0.0, -0.0, lo - 1e-3, -87.4, 88.5, top + 1e-4],
        [-3e38, -1e7, 1e7, 3e38, 120.0, -88.7, -88.76, 88.74, 88.76, -87.6],
    ]).astype(np.float32)  # fmt: skip
    k = pn.compile(pn.exp(pn.placeholder(x.shape, "float32")), target="cpu")
    got = k(x).astype(np.float64)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64))
    sub = x.astype(np.float64) < lo
    assert (got[sub] == 0).all() and sub.sum() >= 109  # every result below 1.42 FLT_MIN is exactly 0
    assert (want[sub] < 1.42 * tiny).all()  # (an absolute error below 1.7e-38)
    normal = ~sub & (want <= np.finfo(np.float32).max)  # float32 overflows past it (89: inf)
    np.testing.assert_allclose(got[normal], want[normal], rtol=2 * np.finfo(np.float32).eps, atol=0)
    over = x.astype(np.float64) > top  # inf, 89, 1e7, 3e38, 120, 88.74, 88.76, top + 1e-4
    assert np.isnan(got[x != x]).all() and (got[over] == np.inf).all() and over.sum() == 8
    assert not ((got > 0) & (got < tiny)).any()  # no subnormal anywhere


def test_short_row_softmax_special_rows_and_thread_counts(rng):
    """softmax over 128-column rows (the bench's [6144x128] kernel, fewer rows): a NaN row, a row with
    +inf (inf - inf: NaN, as numpy), a row of -inf but one entry, masked -inf entries (exactly 0) and
    rows past exp's cutoff; the same bits on 1, 2 and 3 threads; within the float32 bound elsewhere
    (exp < 1 ulp, x - m and the row's sum of 128 terms, the reciprocal and the product)."""
    a = (rng.standard_normal((40, 128)) * 6).astype(np.float32)
    a[1, 7], a[2, 9], a[3, :] = np.nan, np.inf, -np.inf
    a[3, 5] = 1.0
    a[4, ::3] = -np.inf
    a[5, :64] -= 200.0  # exp(x - m) below the flush for half the row
    k = pn.compile(pn.nn.softmax(pn.placeholder(a.shape, "float32"), axis=-1), target="cpu")
    runs = [k(a, threads=t) for t in (1, 2, 3)]
    assert all(np.array_equal(runs[0], r, equal_nan=True) for r in runs[1:])
    x = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(-1, keepdims=True))
        ref = e / e.sum(-1, keepdims=True)
        d = np.where(np.isfinite(x), x.max(-1, keepdims=True) - x, 0.0)
    got = runs[0].astype(np.float64)
    assert np.isnan(got[1:3]).all() and np.isnan(ref[1:3]).all()
    assert got[3, 5] == 1.0 and (got[3, np.arange(128) != 5] == 0).all() and (got[4, ::3] == 0).all()
    u = 2.0**-24
    tol = ((d + 2 + 2) * u + (127 + d.max(-1, keepdims=True) + 2) * u + u) * ref + 1.7e-38
    ok = np.isfinite(ref)
    assert (np.abs(got[ok] - ref[ok]) <= tol[ok]).all()
