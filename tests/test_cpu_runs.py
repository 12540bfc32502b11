"""target="cpu": rows that flatten several axes (codegen/cpu_runs.py): the row pass scans runs of j over
which every address is affine, so no division per element is left in its loops. Results against
numpy in float64, with tolerances from the dtype and the reduction length."""

import numpy as np
import pytest
from conftest import random_array, tolerance

import panamera as pn
from panamera.codegen.cpu_runs import MIN_RUN

EPS32 = 2.0**-24


def _bn_bound(a: np.ndarray, eps: float) -> tuple[np.ndarray, float, float]:
    """float64 batch_norm of `a` (NCHW, gamma 1, beta 0) and bounds on the float32 kernel's error:
    the statistics within `tolerance(float32, n)` (relative to the row's magnitude, n = N*H*W), the
    output within |y| * (rsqrt's and the variance's relative error) + |mean error| / sigma."""
    x = a.astype(np.float64)
    axes = (0, 2, 3)
    n = a.size // a.shape[1]
    mean, var = x.mean(axes), x.var(axes)
    y = (x - mean[None, :, None, None]) / np.sqrt(var + eps)[None, :, None, None]
    t = tolerance("float32", n)
    mag = np.abs(x).max(axes)
    sigma = np.sqrt(var + eps)
    c = (slice(None), None, None)  # per channel, broadcast over (H, W)
    y_err = np.abs(y) * (t * mag**2 / (var + eps) + 8 * EPS32)[c] + (t * mag / sigma)[c]
    return y, t, y_err


@pytest.mark.parametrize("shape", [(4, 8, 7, 9), (3, 4, 2, 2)])
def test_batch_norm_nchw_rows_scan_runs(shape, rng):
    """NCHW batch_norm reduces (N, H, W) per channel: j = n * HW + hw. With HW = 63 >= MIN_RUN the
    row pass scans runs of 63 (`pn_q` per block, no `% 63` left); HW = 4 < MIN_RUN keeps the
    division. Both agree with float64, and 1 and 2 threads give the same bits."""
    x = pn.placeholder(shape, "float32", name="x")
    y, mean, var = pn.nn.batch_norm(x, eps=1e-5)
    k = pn.compile([y, mean, var], target="cpu")
    hw = shape[2] * shape[3]
    src = k.cpu_source
    if hw >= MIN_RUN:
        assert "pn_q" in src and f"% {hw})" not in src
    else:
        assert "pn_q" not in src and f"% {hw})" in src
    a = random_array(shape, "float32", rng) * 3 + 1
    got = k(a, threads=1)
    ref, t, y_err = _bn_bound(a, 1e-5)
    x64 = a.astype(np.float64)
    mag = np.abs(x64).max((0, 2, 3))
    assert np.all(np.abs(got[1] - x64.mean((0, 2, 3))) <= t * mag)
    assert np.all(np.abs(got[2] - x64.var((0, 2, 3))) <= t * mag**2)
    assert np.all(np.abs(got[0] - ref) <= y_err)
    for g2, g1 in zip(k(a, threads=2), got):
        np.testing.assert_array_equal(g2, g1)


def test_sums_over_flattened_axes_scan_runs(rng):
    """sum and max over axes (0, 2) of [5, 6, 40] (lanes_pass over runs of 40), and of all of a
    transposed [40, 999] (runs of 40 at stride 999), split in two chunks (asked: the model's split follows the host) whose
    bound (19980) is not a run's end. A NaN propagates across runs and chunks; 1 and 2 threads."""
    x = pn.placeholder((5, 6, 40), "float32", name="x")
    z = pn.placeholder((40, 999), "float32", name="z")
    zt = pn.transpose(z)
    k = pn.compile([pn.sum(x, axis=(0, 2)), pn.max(x, axis=(0, 2))], target="cpu")
    kt = pn.compile(
        [pn.sum(zt), pn.max(zt)], target="cpu", split=2
    )  # the split explicit: the model's depends on the host
    assert kt.decisions[0].split == 2 and (40 * 999 // 2) % 40
    for c in (k, kt):
        assert "pn_q" in c.cpu_source and "% 40)" not in c.cpu_source
    a, b = random_array((5, 6, 40), "float32", rng), random_array((40, 999), "float32", rng)
    a[3, 2, 17] = np.nan
    for threads in (1, 2):
        for got, arr, axes in ((k(a, threads=threads), a, (0, 2)), (kt(b, threads=threads), b, None)):
            ref = np.nansum(arr.astype(np.float64), axis=axes)
            n = arr.size // np.size(ref)
            t = tolerance("float32", n)
            s, m = got
            np.testing.assert_allclose(s, np.where(np.isnan(arr.max(axes)), np.nan, ref), rtol=t, atol=t * n)
            np.testing.assert_array_equal(m, arr.max(axes))


def test_row_run_preconditions():
    """row_run: None without a division in j, for runs below MIN_RUN, with parameters, or when isl
    cannot write every address without a division in r; else the longest run, and the address."""
    import islpy as isl

    from panamera.codegen.cpu_runs import row_run

    dom = isl.Set("{ [i, j] : 0 <= i < 4 and 0 <= j < 600 }")
    plain = isl.PwAff("{ [i, j] -> [(600i + j)] }")
    assert row_run([plain], dom, 600) is None
    short = isl.PwAff("{ [i, j] -> [(4i + 3j - 2*((j) mod 4))] }")  # runs of 4 < MIN_RUN
    assert row_run([short], dom, 600) is None
    a = isl.PwAff("{ [i, j] -> [(120i + 4j - 3*((j) mod 40))] }")  # j = 40 q + r: 120 i + 160 q + r
    b = isl.PwAff("{ [i, j] -> [(2j - ((j) mod 20))] }")  # runs of 20 only
    assert row_run([a], dom, 600).m == 40
    assert row_run([a], dom, 600).address(a) == "(((120 * i) + (120 * pn_q)) + j)"
    # runs of 20 make both affine: isl's gist keeps a's floor((20 q + r) / 40), the run form (value at
    # r = 0 plus a constant slope) drops it
    both = row_run([a, b], dom, 600)
    assert both.m == 20 and both.address(a) == "(((120 * i) + j) + (120 * pn_floordiv(pn_q, 2)))"
    # a slope that changes within every run of 20 (r + r // 10 * 5): no form, no run (40 would not fit b)
    bent = isl.PwAff("{ [i, j] -> [(j + 5 * floor((j) / 10))] }")
    assert row_run([bent, b], dom, 600) is None
    pdom = isl.Set("[n] -> { [i, j] : 0 <= i < 4 and 0 <= j < 600 }")
    assert row_run([a], pdom, 600) is None


@pytest.mark.parametrize("rows, cols", [(8, 24), (5, 7)])
def test_elementwise_broadcast_scans_runs(rows, cols, rng):
    """A MAP group over a row-broadcast bias (GELU's tanh form, x + b then x^3): with 24 >= MIN_RUN
    columns the loop runs over i in runs of 24 (`pn_q`, no `% 24` left, the cube as two products);
    7 < MIN_RUN keeps the flat loop. Both against float64."""
    x, b = pn.placeholder((rows, cols), "float32", name="x"), pn.placeholder((cols,), "float32", name="b")
    h = x + b
    y = 0.5 * h * (1.0 + pn.tanh(0.7978845834732056 * (h + 0.044715 * pn.power(h, 3.0))))
    k = pn.compile(y, target="cpu")
    runs = cols >= MIN_RUN
    assert ("pn_q" in k.source) is runs and (f"% {cols})" in k.source) is not runs, k.source
    X, B = random_array((rows, cols), "float32", rng), random_array((cols,), "float32", rng)
    H = X.astype(np.float64) + B
    ref = 0.5 * H * (1.0 + np.tanh(0.7978845834732056 * (H + 0.044715 * H**3)))
    t = tolerance("float32", 16)  # a chain of ~16 roundings and libm's tanh (a few ulp)
    np.testing.assert_allclose(k(X, B), ref, rtol=t, atol=t * float(np.abs(H).max() ** 3))


def test_split_invariant_keeps_what_reads_the_index():
    """split_invariant hoists only top-level declarations that read neither i nor a kept value: a
    value of a kept one stays, a nested block stays whole, a store stays, the kept order is kept."""
    from panamera.codegen.cpu_runs import split_invariant

    lines = [
        "const float a = pn_ld(&in1[pn_floordiv(pn_q, 2)]);",
        "const float x = pn_ld(&in0[i]);",
        "const float y = x * a;",  # reads a kept value
        "{",
        "  const float z = a + 1.0f;",  # nested: stays
        "}",
        "const float b = rsqrtf(a + 1e-05f);",
        "pn_st(&out0[i], y * b);",
    ]
    hoisted, kept = split_invariant(lines)
    assert hoisted == [lines[0], lines[6]]
    assert kept == [ln for k, ln in enumerate(lines) if k not in (0, 6)]
    assert split_invariant(["const float w = in0[j];"], index="j") == ([], ["const float w = in0[j];"])


def test_split_invariant_keeps_reads_after_kept_writes():
    """What a kept line may write stays kept below it: a load from a buffer a kept store wrote (it
    would read the value before the loop's store), a value of a non-const variable a kept line
    declares or assigns; a called function's name (pn_st) is not a write."""
    from panamera.codegen.cpu_runs import split_invariant

    lines = [
        "pn_st(&out0[i], 1.0f);",
        "const float a = pn_ld(&out0[pn_q]);",  # reads the buffer the store above wrote
        "float s = pn_ld(&in0[i]);",
        "s += 1.0f;",
        "const float b = s * 2.0f;",  # reads a non-const kept variable
        "const float c = pn_ld(&in1[pn_q]);",  # nothing kept wrote in1: hoisted
    ]
    hoisted, kept = split_invariant(lines)
    assert hoisted == [lines[5]] and kept == lines[:5]
