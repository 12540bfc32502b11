"""The polyhedral stage: statements, coalescing (with one negative test per precondition),
dependences and horizontal fusion."""

from dataclasses import replace

import islpy as isl
import pytest

import panamera as pn
from panamera.errors import LegalityError
from panamera.poly.coalesce import coalesce
from panamera.poly.program import build_program
from panamera.poly.statement import box, build_statement


def stmt(t):
    return build_statement(isl.Context(), "S0", t, {t})


@pytest.mark.parametrize(
    "shape,axis,form,M,N",
    [
        ((256, 256, 56, 56), (0, 2, 3), "ROW", 256, 802816),
        ((256, 56, 56, 256), (0, 1, 2), "COLUMN", 256, 802816),
        ((21128, 768), None, "ALL", 1, 16226304),
        ((40, 20, 10, 5), (0, 2, 3), "ROW", 20, 2000),  # the paper's Fig. 4
        ((5, 1, 7), (1,), "ROW", 35, 1),
        ((4, 1, 6), (0,), "COLUMN", 6, 4),
    ],
)
def test_canonical_forms(shape, axis, form, M, N):
    c = coalesce(stmt(pn.sum(pn.placeholder(shape, name="x"), axis=axis)))
    assert (c.form, c.M, c.N) == (form, M, N)


def test_fig4_subscripts_are_quasi_affine_div_mod():
    c = coalesce(stmt(pn.sum(pn.placeholder((40, 20, 10, 5), name="x"), axis=(0, 2, 3))))
    addr = c.reads[0].addr
    # element (h, w, x, y) = (j // 50, i, (j // 5) % 10, j % 5)
    for i, j in [(0, 0), (3, 1999), (19, 77)]:
        expected = ((j // 50) * 20 + i) * 50 + j % 50
        pt = isl.Set.universe(addr.domain().space).fix_val(isl.dim_type.set, 0, i).fix_val(isl.dim_type.set, 1, j)
        assert addr.intersect_domain(pt).max_val().to_python() == expected


def test_precondition_1_combiner_must_be_associative_commutative():
    s = stmt(pn.sum(pn.placeholder((4, 4), name="x"), axis=1))
    with pytest.raises(LegalityError, match="associative and commutative"):
        coalesce(replace(s, combiner=replace(s.combiner, name="concat", functor="pn_op_concat")))


def test_precondition_2_domain_must_be_a_box():
    s = stmt(pn.sum(pn.placeholder((4, 4), name="x"), axis=1))
    tri, v = box(s.domain.get_ctx(), s.dims, s.extents)
    tri = (tri & v["d1"].le_set(v["d0"])).set_tuple_name("S0")
    with pytest.raises(LegalityError, match="not the box"):
        coalesce(replace(s, domain=tri))


def test_dependences_come_from_isl_and_reduction_self_deps_are_relaxed():
    x = pn.placeholder((8, 6), name="x")
    m = pn.max(x, axis=1, keepdims=True)
    s = pn.sum(x - m, axis=1)
    p = build_program((s,))
    a, b = p.statements
    assert not p.deps.between(a, b).is_empty()  # the max feeds the sum
    assert not p.deps.relaxed.is_empty()
    assert p.deps.validity.intersect(p.deps.relaxed).is_empty()
    assert len(p.groups) == 2  # a reduction's final value ends its kernel


def test_independent_reductions_share_a_kernel():
    x = pn.placeholder((64, 32), name="x")
    p = build_program((pn.sum(x, axis=0), pn.max(x * 2.0, axis=0)))
    assert len(p.groups) == 1 and len(p.groups[0].statements) == 2


def test_isl_schedule_is_computed():
    x = pn.placeholder((8, 6), name="x")
    p = build_program((pn.sum(x, axis=1),))
    assert "S0" in str(p.schedule)


def test_task_mappings_compose_mixed_radix():
    from panamera.schedule.task import serial, spatial

    m = spatial("by", 4) * serial("k", 8) * spatial("tx", 256)
    assert m.extent == 4 * 8 * 256
    assert m.strides() == [("by", 2048), ("k", 256), ("tx", 1)]
    ks = pn.compile(pn.sum(pn.placeholder((3, 5000), name="x"), axis=1), target="emulator", split=4)
    g = ks.mappings[0].tasks["g"]
    # The reduction loop of a multi-block ROW kernel: blocks outermost, threads innermost.
    assert [f.index for f in g.factors] == ["by", "k", "tx"] and g.extent >= 5000 // ks.mappings[0].vec


def test_isl_fuses_producers_into_the_reduction_band():
    from panamera.poly.fusion import fuse_producers

    x, w = pn.placeholder((8, 6), name="x"), pn.placeholder((6,), name="w")
    p = build_program((pn.sum(pn.exp(x) * w + 1.0, axis=0),))
    f = fuse_producers(p.statements[0])
    assert f.producers == 3 and f.band_depth == 2
    assert "sequence" in str(f.schedule)  # producers ordered inside the shared band


def test_fusion_precondition_1_producers_must_be_elementwise():
    from panamera.poly.expr import Expr
    from panamera.poly.fusion import fuse_producers

    s = build_program((pn.sum(pn.placeholder((4, 4), name="x") * 2.0, axis=1),)).statements[0]
    bad = Expr("gather", (s.body,), s.body.dtype)
    with pytest.raises(LegalityError, match="not element-wise"):
        fuse_producers(replace(s, body=bad))


def test_fusion_precondition_2_schedule_must_fuse():
    from panamera.poly.fusion import fuse_producers

    s = build_program((pn.sum(pn.placeholder((4, 4), name="x") * 2.0, axis=1),)).statements[0]

    def unfused(sc):  # a schedule with no band shared by producer and reduction
        return isl.Schedule.from_domain(sc.get_domain())

    with pytest.raises(LegalityError, match="no common band"):
        fuse_producers(s, scheduler=unfused)


def test_single_iteration_needs_no_band():
    # Found by hypothesis: isl schedules a one-point domain without any band.
    k = pn.compile(pn.sum(pn.exp(pn.placeholder((1,), name="x"))), target="emulator")
    assert k.program.fusions[0].producers == 1


# --- stitching (poly/stitch.py): a legal case, one negative test per precondition, the planner ---
def _candidates(*outputs):
    return [[s.name for s in c] for c in build_program(outputs).stitch_candidates]


def test_stitch_softmax_is_one_group():
    x = pn.placeholder((8, 32), name="x")
    e = pn.exp(x - pn.max(x, axis=1, keepdims=True))
    assert _candidates(e / pn.sum(e, axis=1, keepdims=True)) == [["S0", "S1", "S2"]]


def test_stitch_precondition_1_one_row_space():
    x = pn.placeholder((8, 32), name="x")
    m = pn.max(x, axis=1, keepdims=True)  # rows of length 32
    s = pn.sum((x - m).reshape(16, 16), axis=1)  # rows of length 16: another row space
    assert _candidates(s) == []


def test_stitch_precondition_2_consumer_over_the_row_space():
    x = pn.placeholder((8, 32), name="x")
    y = (x - pn.max(x, axis=1, keepdims=True)).reshape(16, 16)  # iterates a reshaped domain
    assert _candidates(y) == []


def test_stitch_precondition_3_reads_are_row_local():
    x = pn.placeholder((8, 8), name="x")
    m = pn.max(x, axis=1)  # m[i], one per row
    y = x - m  # broadcasting along rows: element (i, j) reads m[j], another block's row
    assert _candidates(y) == []


def test_stitch_precondition_4_no_cycle_through_another_kernel():
    x = pn.placeholder((8, 32), name="x")
    m = pn.max(x, axis=1, keepdims=True)
    t = pn.sum(m)  # another kernel reads m ...
    y = x - m + t  # ... and y needs t: stitching y with m would need t inside the group
    assert _candidates(y) == []


def test_planner_keeps_unfused_kernels_when_the_model_says_so():
    """Two rows: a stitched kernel with whole rows per block has only 2 blocks, and the model
    prefers the unfused kernels to it; split across co-resident blocks, it beats both."""
    from panamera.compiler import lower
    from panamera.model.gpu import H100
    from panamera.schedule.planner import plan_groups

    x = pn.placeholder((2, 4_000_000), name="x")
    e = pn.exp(x - pn.max(x, axis=1, keepdims=True))
    y = e / pn.sum(e, axis=1, keepdims=True)
    (c,) = pn.compile(y, target="emulator").considered
    assert c.chosen and c.split > 1 and c.stitched_us < c.unfused_us < c.whole_rows_us
    prog = lower(y, stop_after="program", target="emulator").program
    groups, (c,) = plan_groups(prog, H100, stitch_split=False)
    assert not c.chosen and len([g for g in groups if g.M * g.N]) == 3 and "left unfused" in c.describe()


def test_stitch_precondition_3_only_reductions_are_read_from_registers():
    """Found in review: an output y = x - max(x) is materialized; sum(y * y) reads it in a later
    pass, where no register holds it, so that reduction must not join y's group."""
    import numpy as np

    a = np.random.default_rng(0).random((8, 64)).astype(np.float32)
    x = pn.placeholder(a.shape, "float32", name="x")
    y = x - pn.max(x, axis=1, keepdims=True)
    k = pn.compile([y, pn.sum(y * y, axis=1)], target="emulator")
    outs = k(a)
    ref = a - a.max(1, keepdims=True)
    np.testing.assert_allclose(outs[0], ref, rtol=1e-6)
    np.testing.assert_allclose(outs[1], (ref.astype(np.float64) ** 2).sum(1), rtol=1e-5)


def test_horizontal_fusion_takes_at_most_max_horizontal_statements():
    """Nine independent sums of one extent: eight share a kernel, the ninth has its own (each
    keeps an accumulator in registers: poly/stitch.py MAX_HORIZONTAL); the stitched combine of
    all nine, likewise."""
    from panamera.compiler import lower
    from panamera.poly.stitch import MAX_HORIZONTAL

    xs = [pn.placeholder((64,), "float32", name=f"x{k}") for k in range(MAX_HORIZONTAL + 1)]
    sums = [pn.sum(x) for x in xs]
    a = lower(sums, target="emulator", stop_after="groups")
    assert sorted(len(g.statements) for g in a.groups) == [1, MAX_HORIZONTAL]
    total = sums[0]
    for t in sums[1:]:
        total = total + t
    a = lower(total, target="emulator", stop_after="groups")
    assert max(sum(s.kind == "reduce" for s in g.statements) for g in a.groups) == MAX_HORIZONTAL
