"""Data movement as access relations (frontend/movement.py, poly/movement.py): every op against
numpy (data movement is exact: compared for equality), fusion shown by kernel counts, gathers as
non-affine reads, and one negative test per precondition of poly/movement.py."""

import numpy as np
import pytest

import panamera as pn
from panamera.compiler import lower
from panamera.frontend.movement import AxisMap, Boundary
from panamera.poly.access import AccessKind, access_kind
from panamera.poly.movement import must_materialize
from panamera.poly.stitch import row_local


def run(y, *arrays):
    k = pn.compile(y, target="emulator")
    return k, k(*arrays)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_slices_steps_and_negative_steps(rng, dtype):
    a = rng.integers(-9, 9, (7, 9)).astype(dtype)
    x = pn.placeholder(a.shape, dtype, name="x")
    for starts, ends, steps in [
        ((1, 0), (6, 9), (2, 3)),
        ((6, 8), (-8, 0), (-1, -2)),
        ((-3, 100), (-100, -100), (-2, -4)),
    ]:
        want = a[starts[0] : ends[0] : steps[0], starts[1] : ends[1] : steps[1]]
        k, got = run(pn.slice(x, starts, ends, steps=steps), a)
        np.testing.assert_array_equal(got, want)
        assert len(k.plan.kernels) == 1


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_modes(rng, mode):
    a = rng.standard_normal((5, 4)).astype(np.float32)
    x = pn.placeholder(a.shape, "float32", name="x")
    pads = ((2, 7), (0, 3)) if mode != "constant" else ((2, 1), (3, 0))
    kw = {"constant_values": 1.5} if mode == "constant" else {}
    _, got = run(pn.pad(x, pads, mode, 1.5), a)
    np.testing.assert_array_equal(got, np.pad(a, pads, mode, **kw))


def test_pad_negative_crops(rng):
    a = rng.standard_normal((6, 5)).astype(np.float32)
    _, got = run(pn.pad(pn.placeholder(a.shape, name="x"), ((-2, 1), (1, -3)), "edge"), a)
    np.testing.assert_array_equal(got, np.pad(a[2:, :2], ((0, 1), (1, 0)), "edge"))


def test_reflect_pad_is_piecewise_quasi_affine():
    x = pn.placeholder((5,), name="x")
    prog = lower(pn.pad(x, ((3, 3),), "reflect") * 2.0, stop_after="program", target="emulator").program
    (st,) = prog.statements
    assert st.reads[0].addr.n_piece() > 1  # isl keeps the mirror as pieces, no string formatting


def test_concat_split_tile_tri(rng):
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    x, y = pn.placeholder(a.shape, name="x"), pn.placeholder(b.shape, name="y")
    k, got = run(pn.concatenate([x, y * 2.0, x], axis=1), a, b)
    np.testing.assert_array_equal(got, np.concatenate([a, b * 2, a], axis=1))
    assert len(k.plan.kernels) == 1
    parts = pn.split(x, [1, 3], axis=1)
    _, got = run(list(parts), a)
    for g, w in zip(got, np.split(a, [1], axis=1)):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(run(pn.tile(x, (2, 1, 3)), a)[1], np.tile(a, (2, 1, 3)))
    np.testing.assert_array_equal(run(pn.tril(x, -1), a)[1], np.tril(a, -1))
    np.testing.assert_array_equal(run(pn.triu(x, 2), a)[1], np.triu(a, 2))


def test_qkv_split_into_heads_is_one_kernel(rng):
    """A QKV projection split into q, k, v, each reshaped and transposed into (B, H, S, D): the
    three parts are accesses of one input, written by one kernel (same extents, fused)."""
    b, s, h, d = 2, 5, 3, 4
    a = rng.standard_normal((b, s, 3 * h * d)).astype(np.float32)
    x = pn.placeholder(a.shape, name="qkv")
    heads = [pn.transpose(p.reshape(b, s, h, d), (0, 2, 1, 3)) for p in pn.split(x, 3, axis=-1)]
    k, got = run(heads, a)
    for g, w in zip(got, np.split(a, 3, axis=-1)):
        np.testing.assert_array_equal(g, w.reshape(b, s, h, d).transpose(0, 2, 1, 3))
    assert len(k.plan.kernels) == 1


def test_depth_space_round_trip(rng):
    a = rng.standard_normal((2, 8, 3, 5)).astype(np.float32)
    x = pn.placeholder(a.shape, name="x")
    for mode in ("DCR", "CRD"):
        k, got = run(pn.space_to_depth(pn.depth_to_space(x, 2, mode), 2, mode), a)
        np.testing.assert_array_equal(got, a)
        assert len(k.plan.kernels) == 1


def test_resize_nearest_integer_scales(rng):
    a = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    x = pn.placeholder(a.shape, name="x")
    _, got = run(pn.resize_nearest(x, (1, 2, 6, 12), (1, 1, 2, 3)), a)
    np.testing.assert_array_equal(got, a.repeat(2, axis=2).repeat(3, axis=3))


def test_transpose_reshape_softmax_is_one_kernel(rng):
    """Attention's head split: Transpose -> Reshape -> Softmax reads x through the permuted
    access; nothing materializes."""
    a = rng.standard_normal((2, 16, 4, 8)).astype(np.float32)
    x = pn.placeholder(a.shape, name="x")
    k, got = run(pn.nn.softmax(pn.transpose(x, (0, 2, 1, 3)).reshape(2, 4, 128), axis=-1), a)
    t = a.astype(np.float64).transpose(0, 2, 1, 3).reshape(2, 4, 128)
    e = np.exp(t - t.max(-1, keepdims=True))
    tol = 4 * 2**-23 * 128**0.5
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=tol, atol=tol)
    assert len(k.plan.kernels) == 1


def rotary(q, cos, sin):
    d = q.shape[-1] // 2
    x1, x2 = pn.slice(q, (0,), (d,), (-1,)), pn.slice(q, (d,), (2 * d,), (-1,))
    return q * cos + pn.concatenate([-x2, x1], axis=-1) * sin


def test_rotary_embedding_slices_fuse(rng):
    """The Slice / Concat / multiply of rotary embeddings, then a norm over the head: one kernel."""
    b, h, s, d = 2, 3, 5, 8
    qa = rng.standard_normal((b, h, s, d)).astype(np.float32)
    ang = rng.standard_normal((s, d)).astype(np.float32)
    ca, sa = np.cos(ang), np.sin(ang)
    q, c, si = (
        pn.placeholder(qa.shape, name="q"),
        pn.placeholder(ca.shape, name="c"),
        pn.placeholder(sa.shape, name="s"),
    )
    k, got = run(rotary(q, c, si), qa, ca, sa)
    q64 = qa.astype(np.float64)
    want = q64 * ca + np.concatenate([-q64[..., d // 2 :], q64[..., : d // 2]], -1) * sa
    tol = 4 * 2**-23
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert len(k.plan.kernels) == 1
    k, got = run(pn.sum(rotary(q, c, si) ** 2, axis=-1), qa, ca, sa)
    tol = 4 * 2**-23 * d**0.5
    np.testing.assert_allclose(got, (want**2).sum(-1), rtol=tol, atol=tol)
    assert len(k.plan.kernels) == 1


def test_gather_is_a_non_affine_read(rng):
    emb = rng.standard_normal((11, 6)).astype(np.float32)
    ids = np.array([[0, 10, -1], [4, 4, 2]], np.int64)
    e, i = pn.placeholder(emb.shape, name="emb"), pn.placeholder(ids.shape, "int64", name="ids")
    y = pn.take(e, i, axis=0) * 2.0
    prog = lower(y, stop_after="program", target="emulator").program
    (st,) = prog.statements
    gathered = [r for r in st.reads if r.indirect is not None]
    assert len(gathered) == 1 and gathered[0].tensor is e
    assert access_kind(gathered[0], "i", 4, st.domain) == AccessKind.GATHER
    k, got = run(y, emb, ids)
    np.testing.assert_array_equal(got, np.take(emb, ids, axis=0) * 2)
    assert len(k.plan.kernels) == 1


def test_embedding_gather_then_softmax_is_one_kernel(rng):
    """The gathered rows feed a reduction: the index's producers (a cast) and the gather fuse
    into the reduction's statement like any element-wise producer."""
    emb = rng.standard_normal((5, 16)).astype(np.float32)
    ids = rng.integers(0, 5, (3, 4))
    e, i = pn.placeholder(emb.shape, name="emb"), pn.placeholder(ids.shape, "int64", name="ids")
    k, got = run(pn.nn.softmax(pn.take(e, i.astype("int32")), axis=-1), emb, ids)
    t = emb.astype(np.float64)[ids]
    want = np.exp(t - t.max(-1, keepdims=True))
    tol = 4 * 2**-23 * 16**0.5
    np.testing.assert_allclose(got, want / want.sum(-1, keepdims=True), rtol=tol, atol=tol)
    assert len(k.plan.kernels) == 1


def test_gather_elements(rng):
    a = rng.standard_normal((4, 5)).astype(np.float32)
    ind = rng.integers(-5, 5, (4, 3))
    _, got = run(pn.take_along_axis(pn.placeholder(a.shape, name="a"), pn.placeholder(ind.shape, "int64"), 1), a, ind)
    np.testing.assert_array_equal(got, np.take_along_axis(a, ind % 5, axis=1))


@pytest.mark.parametrize(
    ("xshape", "ishape", "batch_dims"),
    [((3, 4, 5), (6, 2), 0), ((3, 4), (2, 2), 0), ((2, 3, 4), (2, 5, 1), 1), ((2, 3, 4, 5), (2, 3, 7, 2), 2)],
)
def test_gather_nd_every_batch_dims_and_negative_indices(rng, xshape, ishape, batch_dims):
    """GatherND is one non-affine read of x itself (the reshape of x into (prod(leading), rest)
    is looked through): its flat subscript is an int64 expression of the index tensor, fused."""
    from panamera.subgraph.numpy_ops import gather_nd

    a = rng.standard_normal(xshape).astype(np.float32)
    depth = [xshape[batch_dims + j] for j in range(ishape[-1])]
    ind = np.stack([rng.integers(-n, n, ishape[:-1]) for n in depth], -1)
    x, i = pn.placeholder(xshape, name="x"), pn.placeholder(ishape, "int64", name="i")
    y = pn.gather_nd(x, i, batch_dims)
    (st,) = lower(y, stop_after="program", target="emulator").program.statements
    assert [r.tensor for r in st.reads if r.indirect is not None] == [x]
    k, got = run(y, a, ind)
    np.testing.assert_array_equal(got, gather_nd(a, ind, batch_dims))
    assert len(k.plan.kernels) == 1


def test_gather_nd_bad_arguments_name_the_op():
    x = pn.placeholder((2, 3, 4), name="x")
    with pytest.raises(pn.ShapeError, match="gather_nd of 'x'.*batch_dims 1"):
        pn.gather_nd(x, pn.placeholder((3, 5, 1), "int64"), 1)
    with pytest.raises(pn.ShapeError, match="gather_nd of 'x'"):
        pn.gather_nd(x, pn.placeholder((5, 4), "int64"))
    with pytest.raises(pn.AxisError, match="gather_nd of 'x': batch_dims 2"):
        pn.gather_nd(x, pn.placeholder((2, 3), "int64"), 2)
    with pytest.raises(pn.DTypeError, match="gather_nd of 'x'.*integers"):
        pn.gather_nd(x, pn.placeholder((2, 1), "float32"))


# -- one negative test per precondition of poly/movement.py ------------------------------------
def test_precondition_1_a_remap_leaving_its_input_is_refused():
    x = pn.placeholder((4,), name="x")
    y = pn.remap(x, (4,), [AxisMap(((0, 1),), offset=1, boundary=Boundary.NONE)])
    with pytest.raises(pn.LegalityError, match="leaves \\[0, 4\\)"):
        pn.compile(y, target="emulator")


def test_precondition_2_a_gathered_producer_is_materialized_first(rng):
    emb = rng.standard_normal((7, 4)).astype(np.float32)
    ids = np.array([3, 0, 6], np.int64)
    e, i = pn.placeholder(emb.shape, name="emb"), pn.placeholder(ids.shape, "int64", name="ids")
    produced = pn.exp(e)
    y = pn.take(produced, i)
    assert must_materialize([y]) == {produced}
    k, got = run(y, emb, ids)
    tol = 4 * 2**-23
    np.testing.assert_allclose(got, np.exp(emb.astype(np.float64))[ids], rtol=tol, atol=tol)
    assert len(k.plan.kernels) == 2  # exp first, then the gather: never inlined at a loaded index


def test_precondition_2_gather_nd_materializes_its_producer_not_the_reshape(rng):
    """GatherND reads x through a reshape (frontend/gather.gather_nd): the reshape is looked
    through (gather_source), so a computed x is materialized itself, and a placeholder is read
    in place (no copy kernel)."""
    a = rng.standard_normal((3, 4, 2)).astype(np.float32)
    ind = np.array([[2, -1], [0, 3]], np.int64)
    x, i = pn.placeholder(a.shape, name="x"), pn.placeholder(ind.shape, "int64", name="i")
    produced = pn.exp(x)
    y = pn.gather_nd(produced, i)
    assert must_materialize([y]) == {produced}
    k, got = run(y, a, ind)
    tol = 4 * 2**-23
    np.testing.assert_allclose(got, np.exp(a.astype(np.float64))[[2, 0], [3, 3]], rtol=tol, atol=tol)
    assert len(k.plan.kernels) == 2  # exp first, then the gather
    assert len(run(pn.gather_nd(x, i), a, ind)[0].plan.kernels) == 1


def test_precondition_3_a_gather_of_a_reduction_is_never_row_local(rng):
    a = rng.standard_normal((6, 32)).astype(np.float32)
    ids = np.array([5, 0, 0, 2, 1, 3], np.int64)
    x, i = pn.placeholder(a.shape, name="x"), pn.placeholder(ids.shape, "int64", name="ids")
    r = pn.sum(x, axis=1)
    y = x * pn.take(r, i).reshape(6, 1)  # row i reads the sum of row ids[i]: not row i's
    prog = lower(y, stop_after="program", target="emulator").program
    red, cons = prog.statements
    assert not row_local(cons, {red.result.uid: red})
    assert not prog.stitch_candidates
    k, got = run(y, a, ids)
    tol = 4 * 2**-23 * 32**0.5
    np.testing.assert_allclose(got, a * a.astype(np.float64).sum(1)[ids][:, None], rtol=tol, atol=tol)
    assert len(k.plan.kernels) == 2


def test_bad_arguments_name_the_op():
    x = pn.placeholder((4, 5), name="x")
    with pytest.raises(pn.AxisError, match="slice of 'x'.*repeat"):
        pn.slice(x, (0, 0), (1, 1), axes=(1, -1))
    with pytest.raises(pn.ShapeError, match="slice of 'x': step 0"):
        pn.slice(x, (0,), (1,), steps=(0,))
    with pytest.raises(pn.ShapeError, match="pad of 'x'"):
        pn.pad(x, ((1, 1),))
    with pytest.raises(pn.OptionError, match="mode 'mirror'"):
        pn.pad(x, ((1, 1), (0, 0)), "mirror")
    with pytest.raises(pn.ShapeError, match="concatenate along axis 0"):
        pn.concatenate([x, pn.placeholder((4, 6))], axis=0)
    with pytest.raises(pn.ShapeError, match="split of 'x'"):
        pn.split(x, [2, 2], axis=1)
    with pytest.raises(pn.AxisError, match="take of 'x'"):
        pn.take(x, pn.placeholder((2,), "int64"), axis=2)
    with pytest.raises(pn.DTypeError, match="must be integers"):
        pn.take(x, pn.placeholder((2,), "float32"))
