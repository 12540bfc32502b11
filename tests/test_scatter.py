"""frontend/scatter.py: scatter-add of rows (an embedding's gradient) against numpy's
`np.add.at`, repeated indices included, in both merge modes, and its clear errors."""

import numpy as np
import pytest
from conftest import tolerance

import panamera as pn
from panamera.frontend.scatter import MAX_TERMS, scatter_add_rows


def reference(index, src, rows, skip=None):
    out = np.zeros((rows, *src.shape[index.ndim :]), np.float64)
    flat, vals = index.reshape(-1), src.reshape(index.size, -1)
    keep = flat != skip if skip is not None else np.ones_like(flat, bool)
    np.add.at(out.reshape(rows, -1), flat[keep], vals[keep].astype(np.float64))
    return out


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_repeated_indices_add_up(rng, deterministic, dtype):
    index = np.array([[3, 3, 0, 7, 3, 1], [7, 7, 2, 0, 5, 3]], np.int64)  # 3 and 7 repeat; 5 is skipped
    src = rng.standard_normal((2, 6, 4, 3)).astype(dtype)
    ids, g = pn.placeholder(index.shape, "int64", name="ids"), pn.placeholder(src.shape, dtype, name="g")
    k = pn.compile(scatter_add_rows(ids, g, rows=8, skip=5), target="emulator", deterministic=deterministic)
    got, want = k(index, src), reference(index, src, 8, skip=5)
    assert got.shape == (8, 4, 3) and got.dtype == np.dtype(dtype)
    tol = tolerance(dtype, index.size)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    assert not got[5].any() and not got[4].any() and not got[6].any()
    if deterministic:
        assert np.array_equal(got, k(index, src, order="reverse", seed=3))


def test_clear_errors():
    g = pn.placeholder((4, 3), "float32", name="g")
    with pytest.raises(pn.DTypeError, match="index 'i' has dtype float32"):
        scatter_add_rows(pn.placeholder((4,), "float32", name="i"), g, rows=5)
    with pytest.raises(pn.ShapeError, match="src 'g' of shape \\(4, 3\\) does not start with the shape \\(5,\\)"):
        scatter_add_rows(pn.placeholder((5,), "int64", name="i"), g, rows=5)
    with pytest.raises(pn.ShapeError, match="rows must be positive"):
        scatter_add_rows(pn.placeholder((4,), "int64", name="i"), g, rows=0)
    big = pn.placeholder((1 << 12, 1 << 8), "float32", name="big")
    with pytest.raises(pn.PanameraError, match=f"over the owner-computes form's {MAX_TERMS}"):
        scatter_add_rows(pn.placeholder((1 << 12,), "int64", name="i"), big, rows=1 << 12)


@pytest.mark.parametrize("deterministic", [False, True])
def test_many_colliding_indices_split_across_blocks(rng, deterministic):
    index = rng.integers(0, 3, 4096)  # 4096 tokens onto 3 rows: every block collides
    src = rng.standard_normal((4096, 4)).astype(np.float32)
    ids, g = pn.placeholder(index.shape, "int64", name="ids"), pn.placeholder(src.shape, "float32", name="g")
    k = pn.compile(scatter_add_rows(ids, g, rows=3), target="emulator", deterministic=deterministic)
    mode = "partials" if deterministic else "atomic_ws"
    assert f"modes={mode}" in k.explain(), k.explain()  # the reduction's own merge: split over blocks
    want = reference(index, src, 3)
    tol = tolerance("float32", 4096)
    np.testing.assert_allclose(k(index, src), want, rtol=tol, atol=tol * np.abs(want).max())
    if deterministic:
        assert np.array_equal(k(index, src), k(index, src, order="reverse", seed=5))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_scatter_add_along_an_axis(rng, axis):
    from panamera.frontend.scatter import scatter_add_along

    shape, size = (3, 4, 5), 6
    index = rng.integers(0, size, shape)
    src = rng.standard_normal(shape)
    want = np.zeros(shape[:axis] + (size,) + shape[axis + 1 :])
    for p in np.ndindex(*shape):
        q = list(p)
        q[axis] = index[p]
        want[tuple(q)] += src[p]
    i, s = pn.placeholder(shape, "int64", name="i"), pn.placeholder(shape, "float64", name="s")
    k = pn.compile(scatter_add_along(i, s, axis, size), target="emulator")
    tol = tolerance("float64", shape[axis])
    np.testing.assert_allclose(k(index, src), want, rtol=tol, atol=tol)
    with pytest.raises(pn.ShapeError, match="is not index's"):
        scatter_add_along(i, pn.placeholder((3, 4), "float64", name="s2"), axis, size)
