"""BatchNorm backward as reductions the polyhedral model plans (issue 23 item 2): per channel,
sum(dy) and sum(dy * x_hat) over N, H, W, and dx from both, in NCHW and NHWC.

What coalescing gives, and so the kernels asserted here:
- NCHW: the channel c sits between the reduced N and H·W, so the per-channel sums read a strided
  ROW (i = c, j = n·HW + hw, a jump of C·HW at every HW). dx is stitched into the same kernel as
  the sums: one launch; when the model splits the rows across blocks, a cooperative launch.
- NHWC: the channel is innermost, so the sums are one COLUMN reduction (M = C, N = N·H·W) and dx
  a consumer of their final values at its own channel: the model stitches them (poly/column_stitch.py)
  into one cooperative launch over the row space (i = n·H·W + h·W + w, j = c; a ROW-form kernel:
  column partials, a grid-wide merge, then dx; tests/test_column_stitch.py). With a forced split
  the planner does not stitch: the sums split across blocks (one atomic per block per channel),
  then a MAP kernel for dx, two launches.

References are numpy float64 from the same rounded inputs; tolerances come from `tolerance(dtype,
n)` with n = N·H·W (the reduction length) times the magnitudes of dx's three terms.
"""

import numpy as np
import pytest
from conftest import np_dtype, tolerance

import panamera as pn
from panamera.model.gpu import A100

LAYOUTS = {"nchw": ((0, 2, 3), lambda n, c, h, w: (n, c, h, w)), "nhwc": ((0, 1, 2), lambda n, c, h, w: (n, h, w, c))}


def bn_backward(shape, layout: str, dtype: str):
    """pn's BatchNorm backward from the forward's saved mean and rstd (torch's decomposition):
    (dx, dgamma, dbeta) and the placeholders (x, dy, mean, rstd, gamma)."""
    axes, _ = LAYOUTS[layout]
    cshape = tuple(s if k not in axes else 1 for k, s in enumerate(shape))
    x, dy = pn.placeholder(shape, dtype, name="x"), pn.placeholder(shape, dtype, name="dy")
    mean, rstd, gamma = (pn.placeholder(cshape, "float32" if dtype != "float64" else dtype, name=n) for n in "mrg")
    acc = "float32" if dtype in ("float16", "bfloat16") else dtype
    m = int(np.prod([shape[a] for a in axes]))
    xh, d = (x.astype(acc) - mean) * rstd, dy.astype(acc)
    sdy = pn.sum(d, axis=axes, keepdims=True)
    sdx = pn.sum(d * xh, axis=axes, keepdims=True)
    dx = (gamma * rstd / m) * (m * d - sdy - xh * sdx)
    c = int(np.prod(cshape))
    return (dx.astype(dtype), sdx.reshape((c,)), sdy.reshape((c,))), (x, dy, mean, rstd, gamma)


def reference(arrays, layout: str):
    """numpy float64: dx, dgamma, dbeta, and the magnitudes of their terms (for the tolerances):
    the largest of dx's, and per channel the sums of |dy * x_hat| and |dy|."""
    axes, _ = LAYOUTS[layout]
    x, dy, mean, rstd, gamma = (a.astype(np.float64) for a in arrays)
    m = np.prod([x.shape[a] for a in axes])
    xh = (x - mean) * rstd
    sdy, sdx = dy.sum(axis=axes, keepdims=True), (dy * xh).sum(axis=axes, keepdims=True)
    dx = gamma * rstd / m * (m * dy - sdy - xh * sdx)
    size = np.abs(gamma * rstd / m) * (m * np.abs(dy).max() + np.abs(sdy) + np.abs(xh).max() * np.abs(sdx))
    terms = (np.abs(dy * xh).sum(axis=axes).ravel(), np.abs(dy).sum(axis=axes).ravel())
    return dx, sdx.ravel(), sdy.ravel(), size.max(), terms


def inputs(shape, layout, dtype, rng):
    axes, _ = LAYOUTS[layout]
    x = rng.normal(1.0, 2.0, shape)
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    stats = "float32" if dtype != "float64" else dtype
    return [
        x.astype(np_dtype(dtype)),
        rng.normal(size=shape).astype(np_dtype(dtype)),
        mean.astype(stats),
        (1 / np.sqrt(var + 1e-5)).astype(stats),
        rng.normal(1.0, 0.5, mean.shape).astype(stats),
    ]


def check(k, arrays, layout, dtype, **call):
    """dx within tolerance(dtype, n) of its terms' magnitude; dgamma and dbeta, computed and
    returned in the accumulation dtype (float32 for 16-bit inputs), within that dtype's tolerance."""
    dx_ref, dg_ref, db_ref, size, (dg_terms, db_terms) = reference(arrays, layout)
    n = int(np.prod([arrays[0].shape[a] for a in LAYOUTS[layout][0]]))
    acc = "float32" if dtype in ("float16", "bfloat16") else dtype
    dx, dg, db = k(*arrays, **call)
    np.testing.assert_allclose(dx.astype(np.float64), dx_ref, rtol=0, atol=tolerance(dtype, n) * size)
    for got, ref, terms in ((dg, dg_ref, dg_terms), (db, db_ref, db_terms)):  # a sum of n terms: within tol·Σ|term|
        assert np.all(np.abs(got.astype(np.float64) - ref) <= tolerance(acc, n) * terms)
    return dx, dg, db


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_float64_both_layouts_with_the_kernels_coalescing_gives(layout, rng, launches_pay_the_floor):
    shape = LAYOUTS[layout][1](2, 4, 5, 6)
    outs, ins = bn_backward(shape, layout, "float64")
    k = pn.compile(list(outs), target="emulator")
    forms = [x.form for x in k.plan.kernels]
    assert forms == ["ROW"]  # NHWC: the column stitch's row space
    check(k, inputs(shape, layout, "float64", rng), layout, "float64")


@pytest.mark.parametrize("deterministic", [False, True])
def test_nhwc_split_across_blocks_one_merge_per_block(deterministic, rng):
    """N·H·W = 2048 rows of 2 channels, the column sums split across 8 blocks."""
    shape = (8, 16, 16, 2)
    outs, _ = bn_backward(shape, "nhwc", "float64")
    k = pn.compile(list(outs), target="emulator", deterministic=deterministic, split=8)
    red, dx = k.plan.kernels
    assert (red.form, dx.form) == ("COLUMN", "MAP") and red.blocks_per_reduction == 8
    assert set(red.modes) == ({"partials"} if deterministic else {"atomic_ws"})
    arrays = inputs(shape, "nhwc", "float64", rng)
    first = check(k, arrays, "nhwc", "float64", order="reverse", seed=3)
    if deterministic:  # ordered partials: bit-identical under another thread order
        again = k(*arrays, order="shuffled", seed=11)
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)


def test_nchw_rows_split_across_blocks_in_one_cooperative_launch(rng):
    """2 channels of 65536: the model splits each row across blocks and keeps dx in the kernel
    (a cooperative launch: the blocks of a row exchange partials, then compute dx). Planned for an
    A100: on sm_90 the model makes each row's blocks one thread-block cluster (tests/test_cluster.py)."""
    shape = (16, 2, 64, 64)
    outs, _ = bn_backward(shape, "nchw", "float64")
    k = pn.compile(list(outs), target="emulator", gpu=A100)
    (launch,) = k.plan.kernels
    assert launch.form == "ROW" and launch.blocks_per_reduction > 1 and launch.cooperative
    check(k, inputs(shape, "nchw", "float64", rng), "nchw", "float64", order="reverse", seed=5)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_bfloat16_within_tolerances_from_dtype_and_length(layout, rng, launches_pay_the_floor):
    shape = LAYOUTS[layout][1](4, 3, 6, 6)
    outs, _ = bn_backward(shape, layout, "bfloat16")
    k = pn.compile(list(outs), target="emulator")
    assert len(k.plan.kernels) == 1
    check(k, inputs(shape, layout, "bfloat16", rng), layout, "bfloat16")
