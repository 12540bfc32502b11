"""The sorted-segment scatter-add (frontend/scatter.py `scatter_add_sorted`, schedule/segments.py,
codegen/segment_kernel.py): deterministic for any table size. Against numpy in float64
(`np.add.at`), repeated and all-equal ids, segments cut at chunk boundaries, 16-bit sources,
the bits across sort tiles, block and thread counts and thread orders, the run-time index
check, the model's choice, and one negative test per precondition."""

import numpy as np
import pytest
from conftest import np_dtype, tolerance

import panamera as pn
from panamera.compiler import lower
from panamera.dtypes import as_dtype
from panamera.frontend.scatter import scatter_add_rows, scatter_add_sorted
from panamera.schedule.scatter_problem import ScatterProblem
from panamera.schedule.segments import plan_segments
from panamera.segments import executor_of


def reference(index, src, rows, skip=None):
    out = np.zeros((rows, *src.shape[index.ndim :]), np.float64)
    flat, vals = index.reshape(-1), src.reshape(index.size, -1).astype(np.float64)
    keep = flat != skip if skip is not None else np.ones_like(flat, bool)
    np.add.at(out.reshape(rows, -1), flat[keep], vals[keep])
    return out


def close(got, want, dtype, index):
    """Within the tolerance of the longest segment's sum (fp32 accumulation for 16-bit sources,
    one rounding to the dtype at the end), scaled by the largest magnitude."""
    count = int(np.bincount(index.reshape(-1)).max())
    tol = tolerance(dtype, count)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * scale)


def compiled(n, rows, width, dtype="float32", ids_dtype="int64", skip=None):
    ids, g = pn.placeholder((n,), ids_dtype, name="ids"), pn.placeholder((n, width), dtype, name="g")
    return pn.compile(scatter_add_sorted(ids, g, rows, skip=skip), target="emulator")


@pytest.mark.parametrize(("dtype", "ids_dtype"), [("float32", "int64"), ("float64", "int32")])
def test_repeated_ids_across_merge_passes_and_chunks(rng, dtype, ids_dtype):
    """300 ids into 20 rows: segments of ~15 positions cut at the 32-position chunks; id 4
    skipped; rows no id names stay zero (the second call does not add onto the first). Merge
    passes of both parities: test_bits_do_not_move_with_tile_blocks_threads_or_order."""
    index = rng.integers(0, 20, 300).astype(ids_dtype)
    index[index == 7] = 8  # row 7: no id
    src = rng.standard_normal((300, 6)).astype(dtype)
    k = compiled(300, 20, 6, dtype, ids_dtype, skip=4)
    assert k.formulations == () and {ln.form for ln in k.plan.kernels} == {"SORTED_SEGMENTS"}
    want = reference(index, src, 20, skip=4)
    for order in ("forward", "shuffled"):
        got = k(index, src, order=order, seed=2)
        assert got.dtype == np.dtype(dtype) and got.shape == (20, 6)
        close(got, want, dtype, index)
        assert not got[4].any() and not got[7].any()


def test_all_equal_ids_and_a_3d_source(rng):
    """Every id the same: one segment over every chunk, its pieces added by the owner in order."""
    index = np.full((5, 40), 3, np.int64)
    src = rng.standard_normal((5, 40, 2, 3)).astype(np.float32)
    ids, g = pn.placeholder(index.shape, "int64", name="ids"), pn.placeholder(src.shape, "float32", name="g")
    k = pn.compile(scatter_add_sorted(ids, g, 6), target="emulator")
    got = k(index, src)
    assert got.shape == (6, 2, 3)
    close(got, reference(index, src, 6), "float32", index)
    assert not np.delete(got, 3, axis=0).any()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_sources_accumulate_in_float32(rng, dtype):
    index = rng.integers(0, 9, 200)
    src = rng.standard_normal((200, 8)).astype(np_dtype(dtype))
    got = compiled(200, 9, 8, dtype)(index, src)
    assert got.dtype == np_dtype(dtype)
    close(got, reference(index, src, 9), dtype, index)


def test_bits_do_not_move_with_tile_blocks_threads_or_order(rng):
    """The sum order depends on the ids alone: two sort tiles (4 merge passes and 1: the sorted
    keys end in either buffer), chunks per block and thread counts (so two block counts) and three
    thread orders give the same bits."""
    index = rng.integers(0, 12, 400)
    src = (rng.standard_normal((400, 8)) * 10.0 ** rng.integers(-4, 4, (400, 1))).astype(np.float32)
    ids, g = pn.placeholder(index.shape, "int64", name="ids"), pn.placeholder(src.shape, "float32", name="g")
    out = scatter_add_sorted(ids, g, 12)
    a = executor_of(out, tile=32, groups_per_block=1, threads=32)
    b = executor_of(out, tile=256, groups_per_block=4, threads=64)
    assert a.plan.launches[-1].grid[0] == 13 and b.plan.launches[-1].grid[0] == 4
    runs = [e(e.bind((index, src), {}), order=o, seed=9)[0] for e in (a, b) for o in ("forward", "reverse", "shuffled")]
    assert all(np.array_equal(runs[0], r) for r in runs[1:])
    close(runs[0], reference(index, src, 12), "float32", index)


@pytest.mark.parametrize("tile", [8, 256])
def test_each_call_zeroes_only_the_rows_no_id_names_and_clears_its_marks(rng, tile):
    """`tile` marks the rows some id names; the merge launches and `part` zero the others, `own`
    clears the marks: calls whose ids name other rows (all ids in one row, then none valid) leave
    no row of an earlier call behind. Tile 8: 3 merge passes (4 shares); 256: none (`part` alone)."""
    ids, g = pn.placeholder((60,), "int64", name="ids"), pn.placeholder((60, 5), "float32", name="g")
    e = executor_of(scatter_add_rows(ids, g, 37).inputs[2], tile=tile, groups_per_block=1, threads=32)
    assert [ln.kernel.rsplit("_", 1)[1] for ln in e.plan.launches][:2] == ["clear", "tile"]
    assert e.plan.launches[0].role == "init_once" and len(e.plan.per_call) == 3 + (tile == 8) * 3
    calls = (rng.integers(0, 37, 60), rng.integers(20, 37, 60), np.full(60, 3), np.full(60, 99))
    for index in calls:
        src = rng.standard_normal((60, 5)).astype(np.float32)
        got = e(e.bind((index, src), {}), order="shuffled", seed=3)[0]
        keep = index < 37
        if keep.any():
            close(got, reference(index[keep], src[keep], 37), "float32", index[keep])
        else:
            assert not got.any()


def test_the_plan_writes_the_table_once():
    """The modeled traffic: every row written once (the rows no id names by the zeroing blocks,
    the others by `part` or `own`), beside the pieces' partials; the bench shape within 1.10x of
    its limit (modeled, H100)."""
    from panamera.model.estimate import limit_us
    from panamera.model.gpu import H100
    from panamera.schedule.segments import expected_segments

    n, rows, width = 8192, 50257, 768
    p = plan_segments(ScatterProblem(n, rows, width, as_dtype("int64"), as_dtype("float32")))
    written = sum(w for *_, (_, w) in p.launches)
    marks, keys = expected_segments(n, rows), (p.passes + 1) * n * 8
    partials = written - rows * width * 4 - marks - keys
    assert 0 <= partials < 0.1 * rows * width * 4
    read, out = n * 8 + n * width * 4, rows * width * 4
    assert p.modeled_us < 1.10 * limit_us(read + out, H100, out)


def test_an_id_outside_the_table_is_an_input_error(rng):
    src = rng.standard_normal((6, 2)).astype(np.float32)
    k = compiled(6, 5, 2, skip=-1)
    with pytest.raises(pn.InputError, match=r"index 'ids' holds 5 at position 2, outside \[0, 5\)"):
        k(np.array([0, 1, 5, 2, -3, 4]), src)
    got = k(np.array([0, 1, -1, 2, -1, 4]), src)  # the skipped id (padding) is no error; the next call is clean
    close(
        got, reference(np.array([0, 1, 0, 2, 0, 4]), src * [[1], [1], [0], [1], [0], [1]], 5), "float32", np.arange(6)
    )


def test_deterministic_compiles_take_sorted_segments_for_large_tables():
    """Over MAX_TERMS owner computes is not offered: a deterministic compile takes sorted segments
    (it refused before); the choice is a formulation, carried as data."""

    def chosen(n, rows, width, deterministic):
        ids, g = pn.placeholder((n,), "int64", name="ids"), pn.placeholder((n, width), "float32", name="g")
        return lower(scatter_add_rows(ids, g, rows), target="emulator", deterministic=deterministic).formulations[0]

    f = chosen(8192, 50257, 768, True)
    assert f.names == ("atomic", "sorted_segments") and f.chosen == "sorted_segments"
    assert "atomic (not deterministic)" in f.describe()
    assert chosen(512, 1000, 64, True).chosen in ("owner_computes", "sorted_segments")


def test_preconditions():
    ids, g = pn.placeholder((6,), "int64", name="ids"), pn.placeholder((6, 2), "float32", name="g")
    s = scatter_add_sorted(ids, g, 4)
    with pytest.raises(pn.PanameraError, match="whole computation \\(precondition 1\\)"):
        pn.compile([s, g * 2.0], target="emulator")
    with pytest.raises(pn.PanameraError, match="precondition 2"):
        pn.compile(scatter_add_sorted(ids, g * 2.0, 4), target="emulator")
    with pytest.raises(pn.PanameraError, match="precondition 3"):
        executor_of(_float_index_node(g))
    with pytest.raises(pn.ShapeError, match="tile 48 is not a power of two"):
        executor_of(s, tile=48)
    with pytest.raises(pn.PanameraError, match="whole computation \\(precondition 1\\)"):
        pn.compile([s, g * 2.0], target="cpu")  # the CPU's own kernels: tests/test_cpu_scatter.py


def test_plan_preconditions():
    """schedule/segments.py `plan_segments` preconditions 1 and 3 (2, the tile, is above)."""
    i64, f32 = as_dtype("int64"), as_dtype("float32")
    for n, rows in ((2**31, 10), (10, 2**31)):
        with pytest.raises(pn.ShapeError, match="a sort key holds each in 31 bits"):
            plan_segments(ScatterProblem(n, rows, 4, i64, f32))
    for n, rows, width in ((0, 10, 4), (10, 0, 4), (10, 10, 0)):
        with pytest.raises(pn.ShapeError, match="each must be positive"):
            plan_segments(ScatterProblem(n, rows, width, i64, f32))


def _float_index_node(g):
    """A sorted scatter whose index is a float tensor (the frontend refuses one; built directly)."""
    from panamera.frontend.tensor import Tensor

    f = pn.placeholder((6,), "float32", name="f")
    return Tensor("scatter_sorted", (f, g), (4, 2), g.dtype, (("skip", None), ("index", "f")))


def test_a_computed_source_in_a_deterministic_compile_is_refused_clearly():
    """Precondition 2 in a larger graph: sorted segments cannot take a computed source, so a
    deterministic compile of a table too large for owner computes is refused with the reason."""
    ids, g = pn.placeholder((8192,), "int64", name="ids"), pn.placeholder((8192, 8), "float32", name="g")
    with pytest.raises(pn.PanameraError, match="not deterministic"):
        lower(scatter_add_rows(ids, g * 2.0, 50257), target="emulator", deterministic=True)


def test_sorted_segments_inside_a_larger_graph_leave_the_choice_to_a_form_that_fits():
    """Precondition 1 at the formulation stage: inside `x + scatter` (or beside another output)
    sorted segments are costed at infinity, so the model keeps the atomic form (the bench shape
    alone takes sorted segments); a deterministic compile is refused with the reason."""
    ids, g = pn.placeholder((8192,), "int64", name="ids"), pn.placeholder((8192, 768), "float32", name="g")
    x = pn.placeholder((50257, 768), "float32", name="x")
    assert lower(scatter_add_rows(ids, g, 50257), target="emulator").formulations[0].chosen == "sorted_segments"
    for outs in (x + scatter_add_rows(ids, g, 50257), [scatter_add_rows(ids, g, 50257), g * 2.0]):
        f = lower(outs, target="emulator").formulations[0]
        assert f.chosen == "atomic" and "sorted_segments (cannot take this graph)" in f.describe()
        with pytest.raises(pn.PanameraError, match="not deterministic"):
            lower(outs, target="emulator", deterministic=True)


def test_every_form_of_scatter_add_rows_drops_ids_outside_the_table(rng):
    """scatter_add_rows's contract (an id outside [0, rows) adds nothing) holds in each of its
    three forms, so the model's choice never changes an answer; `scatter_add_sorted` called
    directly checks instead (test_an_id_outside_the_table_is_an_input_error)."""
    index = np.array([0, 9, -1, 2, 2, 5, 4, 1])
    src = rng.standard_normal((8, 3)).astype(np.float32)
    ids, g = pn.placeholder(index.shape, "int64", name="ids"), pn.placeholder(src.shape, "float32", name="g")
    choose = scatter_add_rows(ids, g, 5)
    assert choose.attr("names") == ("owner_computes", "atomic", "sorted_segments")
    keep = (index >= 0) & (index < 5)
    want = reference(index[keep], src[keep], 5)
    for form in choose.inputs:
        close(pn.compile(form, target="emulator")(index, src), want, "float32", index[keep])
