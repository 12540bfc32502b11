"""frontend/scatter.py: scatter-add of rows (an embedding's gradient) against numpy's
`np.add.at`, repeated indices included: owner computes in both merge modes, the atomic indirect
write, the model's choice between them, and the clear errors."""

import numpy as np
import pytest
from conftest import tolerance

import panamera as pn
from panamera.frontend.scatter import (
    MAX_TERMS,
    scatter_add_along,
    scatter_add_atomic,
    scatter_add_owner,
    scatter_add_rows,
)


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
        scatter_add_owner(pn.placeholder((1 << 12,), "int64", name="i"), big, rows=1 << 12)
    with pytest.raises(pn.DTypeError, match="src 'b' is bool"):
        scatter_add_atomic(pn.placeholder((4,), "int64", name="i"), pn.placeholder((4,), "bool", name="b"), rows=5)


@pytest.mark.parametrize("deterministic", [False, True])
def test_many_colliding_indices_split_across_blocks(rng, deterministic):
    index = rng.integers(0, 3, 4096)  # 4096 tokens onto 3 rows: every block collides
    src = rng.standard_normal((4096, 4)).astype(np.float32)
    ids, g = pn.placeholder(index.shape, "int64", name="ids"), pn.placeholder(src.shape, "float32", name="g")
    k = pn.compile(scatter_add_owner(ids, g, rows=3), target="emulator", deterministic=deterministic)
    mode = "partials" if deterministic else "atomic_ws"
    assert f"modes={mode}" in k.explain(), k.explain()  # the reduction's own merge: split over blocks
    want = reference(index, src, 3)
    tol = tolerance("float32", 4096)
    np.testing.assert_allclose(k(index, src), want, rtol=tol, atol=tol * np.abs(want).max())
    if deterministic:
        assert np.array_equal(k(index, src), k(index, src, order="reverse", seed=5))


@pytest.mark.parametrize("form", ["owner_computes", "atomic"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_scatter_add_along_an_axis(rng, axis, form):
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
    chosen = scatter_add_along(i, s, axis, size)  # both forms offered: each compiled as the model would take it
    k = pn.compile(chosen.inputs[("owner_computes", "atomic").index(form)], target="emulator")
    assert ("scatter_add" in k.explain()) == (form == "atomic")
    tol = tolerance("float64", shape[axis])
    np.testing.assert_allclose(k(index, src), want, rtol=tol, atol=tol)
    with pytest.raises(pn.ShapeError, match="is not index's"):
        scatter_add_along(i, pn.placeholder((3, 4), "float64", name="s2"), axis, size)


# -- the atomic indirect write -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_atomic_indirect_write_with_repeated_ids(rng, dtype):
    """One statement over the source, its write through the ids: a zeroing launch and the
    scatter every call (the second call does not add onto the first); ids out of range or equal
    to `skip` write nothing; 16-bit sources accumulate in float32."""
    from conftest import np_dtype

    index = np.array([3, 3, 0, 7, 3, 1, 7, 7, 2, 9, -1, 5] * 20, np.int64)  # 3, 7 repeat; 9, -1 outside; 5 skipped
    src = rng.standard_normal((index.size, 2, 3)).astype(np_dtype(dtype))
    ids, g = pn.placeholder(index.shape, "int64", name="ids"), pn.placeholder(src.shape, dtype, name="g")
    k = pn.compile(scatter_add_atomic(ids, g, rows=8, skip=5), target="emulator")
    roles = [(x.role, x.form) for x in k.plan.per_call]
    assert roles[:2] == [("init", ""), ("map", "MAP")], roles  # zeroed, then the scatter
    want = reference(index.clip(-1, 8) % 9, src, 9, skip=5)[:8]  # 9 and -1 land on row 8: dropped
    count = np.bincount(index[(index >= 0) & (index < 8)]).max()
    tol = tolerance(dtype, int(count))
    for order in ("forward", "shuffled"):
        got = k(index, src, order=order, seed=4)
        assert got.shape == (8, 2, 3) and got.dtype == np_dtype(dtype)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * np.abs(want).max())
        assert not got[5].any() and not got[4].any() and not got[6].any()


def test_the_model_chooses_a_form_and_deterministic_never_atomics():
    from panamera.compiler import lower

    def chosen(n, rows, width, deterministic=False):
        ids, g = pn.placeholder((n,), "int64", name="ids"), pn.placeholder((n, width), "float32", name="g")
        a = lower(scatter_add_rows(ids, g, rows), target="emulator", deterministic=deterministic)
        return [f.chosen for f in a.formulations], [f.describe() for f in a.formulations]

    assert chosen(4096, 3, 4)[0] == ["owner_computes"]  # 3 rows: every atomic collides (modeled)
    assert chosen(512, 1000, 64)[0] == ["atomic"]  # 1000 rows: owner computes reduces 1000x the ids
    got, said = chosen(512, 1000, 64, deterministic=True)
    assert got == ["owner_computes"] and "atomic (not deterministic)" in said[0]
    # over MAX_TERMS: the indirect write or sorted segments (test_scatter_sorted.py), never owner computes
    assert chosen(8192, 50257, 8)[0][0] in ("atomic", "sorted_segments")
    assert chosen(8192, 50257, 8, deterministic=True)[0] == ["sorted_segments"]


def test_an_indirect_write_has_a_kernel_of_its_own(rng):
    """Grouping precondition (poly/program.py): an element-wise statement of the scatter's extents
    would share its MAP kernel; it gets its own. And a scatter of a reduction's consumer joins no
    stitched or epilogue kernel (poly/stitch.py, poly/epilogue.py): its element is no row's own."""
    index = rng.integers(0, 6, 40)
    src = rng.standard_normal((40, 4)).astype(np.float32)
    ids, g = pn.placeholder(index.shape, "int64", name="ids"), pn.placeholder(src.shape, "float32", name="g")
    k = pn.compile([scatter_add_atomic(ids, g, rows=6), g * 2.0], target="emulator")
    assert len(k.plan.kernels) == 2
    got, twice = k(index, src)
    np.testing.assert_allclose(got, reference(index, src, 6), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(twice, src * 2)
    centered = g - pn.mean(g, axis=1, keepdims=True)
    k = pn.compile(scatter_add_atomic(ids, centered, rows=6), target="emulator")
    assert [x.form for x in k.plan.kernels] == ["ROW", "MAP"]
    want = reference(index, src - src.mean(1, keepdims=True), 6)
    np.testing.assert_allclose(k(index, src), want, rtol=1e-5, atol=1e-5)


def test_the_cpu_target_refuses_an_indirect_write():
    ids, g = pn.placeholder((5,), "int64", name="ids"), pn.placeholder((5, 3), "float32", name="g")
    with pytest.raises(pn.PanameraError, match="indirect write"):
        pn.compile(scatter_add_atomic(ids, g, rows=4), target="cpu")


def test_the_cpu_target_takes_owner_computes_deterministic_across_threads(rng):
    """The CPU has no indirect writes: its model never chooses them (it chose the atomic form and
    refused it before). Owner computes and the CPU's own sorted-scatter kernels (cpu_segments.py,
    tests/test_cpu_scatter.py) are both bit-identical at 1 and 2 threads when deterministic."""
    index, src = rng.integers(0, 20, 300), rng.standard_normal((300, 16)).astype(np.float32)
    ids, g = pn.placeholder(index.shape, "int64", name="ids"), pn.placeholder(src.shape, "float32", name="g")
    k = pn.compile(scatter_add_rows(ids, g, rows=20), target="cpu", deterministic=True)
    assert [f.chosen for f in k.formulations] in (["owner_computes"], ["sorted_segments"])
    owner = pn.compile(scatter_add_owner(ids, g, rows=20), target="cpu", deterministic=True)
    want = reference(index, src, 20)
    tol = tolerance("float32", int(np.bincount(index).max()))
    for c in (k, owner):
        one = c(index, src, threads=1)
        assert np.array_equal(one, c(index, src, threads=2))
        np.testing.assert_allclose(one, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8"])
def test_integer_rows_keep_their_dtype_in_every_form(rng, dtype):
    """An integer source: every formulation gives its own dtype (owner computes sums in it, as the
    atomic form adds in it), so the choice is built and the sums are exact; sorted segments are
    offered only for the types they take (int32, int64)."""
    ids = rng.integers(0, 5, 12)
    src = rng.integers(0, 9, (12, 3)).astype(dtype)
    t = scatter_add_rows(pn.placeholder((12,), "int64", name="ids"), pn.placeholder((12, 3), dtype, name="g"), 5)
    assert t.dtype.name == dtype and ("sorted_segments" in t.attr("names")) == (dtype == "int32")
    want = np.zeros((5, 3), np.int64)
    np.add.at(want, ids, src.astype(np.int64))
    ph = pn.placeholder((12,), "int64", name="ids"), pn.placeholder((12, 3), dtype, name="g")
    for out in (t, scatter_add_atomic(*ph, 5)):  # the atomic form adds 8-bit integers in int32
        got = np.asarray(pn.compile(out, target="emulator")(ids, src))
        assert got.dtype == np.dtype(dtype) and np.array_equal(got, want.astype(dtype))


def test_integer_values_scattered_along_an_axis(rng):
    """scatter_add_along of int32 values: both formulations in int32, the sums exact."""
    idx, src = rng.integers(0, 6, (4, 5)), rng.integers(-9, 9, (4, 5)).astype(np.int32)
    t = scatter_add_along(pn.placeholder((4, 5), "int64", name="i"), pn.placeholder((4, 5), "int32", name="s"), 1, 6)
    want = np.zeros((4, 6), np.int32)
    np.add.at(want, (np.arange(4)[:, None], idx), src)
    got = np.asarray(pn.compile(t, target="emulator")(idx, src))
    assert got.dtype == np.int32 and np.array_equal(got, want)


# scatter_add_along over MAX_TERMS (frontend/scatter.py): a line of ids takes sorted segments in a
# deterministic compile; any other shape, or a dtype sorted segments do not take, is refused naming
# the source, the axis and the limit.
LINE = (9000, 8000)  # 9000 ids into 8000 places: 72e6 owner-computes terms, over MAX_TERMS (2**26)


@pytest.mark.parametrize("lead", [False, True], ids=["rank1", "1xn-axis1"])
def test_a_large_deterministic_line_scatter_along_is_sorted_segments_and_bit_stable(rng, lead):
    n, size = LINE
    assert n * size > MAX_TERMS
    shape, axis = ((1, n), 1) if lead else ((n,), 0)
    index = rng.integers(0, size, shape).astype(np.int64)
    src = rng.standard_normal(shape).astype(np.float32)
    want = np.zeros(shape[:-1] + (size,), np.float64)
    np.add.at(want.reshape(-1), index.reshape(-1), src.reshape(-1).astype(np.float64))

    def build():
        i, s = pn.placeholder(shape, "int64", name="i"), pn.placeholder(shape, "float32", name="s")
        return pn.compile(scatter_add_along(i, s, axis, size), target="emulator", deterministic=True)

    first, second = build(), build()
    assert [f.chosen for f in first.formulations] == ["sorted_segments"]
    got = first(index, src)
    tol = tolerance("float32", int(np.bincount(index.reshape(-1)).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())))
    for k, order in ((first, "shuffled"), (second, "forward"), (second, "shuffled")):
        np.testing.assert_array_equal(k(index, src, order=order, seed=3), got)  # bits from the ids alone


def test_a_large_deterministic_scatter_along_off_a_line_is_refused_naming_it():
    """Precondition of the sorted form: every extent of index off the axis is 1 (else its keys
    would be computed, and sorted segments read the caller's index: segments.py (2))."""
    i, s = pn.placeholder((300, 300), "int64", name="i"), pn.placeholder((300, 300), "float32", name="s")
    with pytest.raises(
        pn.PanameraError, match=r"scatter_add_along of s on axis 1: 90000000 terms > MAX_TERMS 67108864"
    ):
        pn.compile(scatter_add_along(i, s, 1, 1000), target="emulator", deterministic=True)


def test_a_large_deterministic_line_scatter_along_of_a_dtype_sorted_segments_refuse_is_refused_naming_it():
    """Precondition of the sorted form: src's dtype sorts (floating point, int32, int64)."""
    n, size = LINE
    i, s = pn.placeholder((n,), "int64", name="i"), pn.placeholder((n,), "int8", name="s8")
    with pytest.raises(pn.PanameraError, match=r"scatter_add_along of s8 on axis 0: 72000000 terms > MAX_TERMS"):
        pn.compile(scatter_add_along(i, s, 0, size), target="emulator", deterministic=True)
