"""The CPU target's float exp (runtime/cpu.py EXP_FLUSH): a result below the smallest normal float
is 0, not subnormal (absolute error < FLT_MIN), so masked softmax scores (-100) never feed
subnormals to the products after them; every other input as expf (within libmvec's 4 ulp), NaN
stays NaN, -inf gives 0, overflow gives inf."""

from __future__ import annotations

import numpy as np

import panamera as pn


def test_exp_flushes_only_subnormal_results(rng):
    tiny = np.finfo(np.float32).tiny
    lo = np.log(np.float64(tiny))  # ln FLT_MIN = -87.3365...
    x = np.concatenate([
        rng.uniform(-80, 80, 200), rng.uniform(lo - 20, lo - 1e-4, 100), rng.uniform(lo + 1e-3, lo + 2, 100),
        [-100.0, -np.inf, np.inf, np.nan, 89.0, 0.0, -0.0, lo - 1e-3],
    ]).astype(np.float32)  # fmt: skip
    k = pn.compile(pn.exp(pn.placeholder(x.shape, "float32")), target="cpu")
    got = k(x).astype(np.float64)
    want = np.exp(x.astype(np.float64))
    sub = want < tiny
    assert (got[sub] == 0).all() and sub.sum() >= 103  # every would-be subnormal result is exactly 0
    normal = ~sub & (want <= np.finfo(np.float32).max)  # float32 overflows past it (89: inf)
    np.testing.assert_allclose(got[normal], want[normal], rtol=4 * np.finfo(np.float32).eps, atol=0)
    assert np.isnan(got[x != x]).all() and got[x == np.inf][0] == np.inf and got[x == 89.0][0] == np.inf
    assert not ((got > 0) & (got < tiny)).any()  # no subnormal anywhere
