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
