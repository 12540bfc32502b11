"""An id outside the range eager PyTorch accepts, through `torch.compile(backend="panamera")`: an
IndexRangeError (an IndexError too) naming the op, the index tensor, the id and its position, where the
kernels alone would clamp (a gather) or drop (a scatter-add) it and return a wrong answer
(torch_backend/bounds.py). Negative ids follow eager: x[idx] and index_put wrap them, the rest refuse."""

import pytest

torch = pytest.importorskip("torch")

from conftest import tolerance  # noqa: E402

import panamera.torch_backend as tb  # noqa: E402
from panamera.errors import IndexRangeError  # noqa: E402
from panamera.torch_backend.bounds import IndexBound, index_bounds  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
R, D = 6, 5
W = torch.randn(R, D, dtype=torch.float64)
TOL = tolerance("float64", D)  # a softmax over rows of D


def embedding(w, ids):
    return torch.nn.functional.embedding(ids, w).softmax(-1)


def index(w, ids):
    return w[ids].softmax(-1)


def index_select(w, ids):
    return w.index_select(0, ids).softmax(-1)


def gather(w, ids):
    return w.gather(0, ids.reshape(-1, 1).expand(-1, D)).softmax(-1)


def index_put(w, ids):
    return torch.ops.aten.index_put(w, [ids], torch.ones(ids.shape[0], D, dtype=w.dtype), True).sum(-1)


def index_add(w, ids):
    return w.index_add(0, ids, torch.ones(ids.shape[0], D, dtype=w.dtype)).sum(-1)


def scatter_add(w, ids):
    return w.scatter_add(0, ids.reshape(-1, 1).expand(-1, D), torch.ones(ids.shape[0], D, dtype=w.dtype)).sum(-1)


WRAPS = {index, index_put}  # eager counts a negative id from the end here, and refuses it elsewhere
OPS = [embedding, index, index_select, gather, index_put, index_add, scatter_add]


def compiled(f, target):
    return torch.compile(f, backend="panamera", options={"target": target}, dynamic=False)


def test_in_range_and_wrapped_ids_match_eager():
    for f in OPS:
        ids = torch.tensor([0, 5, 2, 5] + ([-1, -6] if f in WRAPS else []))
        torch._dynamo.reset()
        got = compiled(f, "cpu")(W, ids)
        torch.testing.assert_close(got, f(W, ids), rtol=1e-12, atol=1e-12)
        assert tb.stats().reports[-1].subgraphs, f.__name__  # the op ran compiled, not eager


@pytest.mark.parametrize("f", OPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad", [R, -R - 1, -1])
def test_an_id_eager_refuses_is_an_index_range_error(f, bad):
    if bad == -1 and f in WRAPS:
        pytest.skip("x[-1] is the last row: tested above")
    ids = torch.tensor([1, 2, bad, 0])
    with pytest.raises(Exception):  # noqa: B017, PT011 - eager's own error: IndexError or RuntimeError
        f(W, ids)
    with pytest.raises(IndexRangeError, match=rf"aten\.{f.__name__}: index '\w+' holds {bad} at position 2, outside"):
        compiled(f, "cpu")(W, ids)


def test_the_emulator_checks_too_and_the_error_is_an_index_error():
    ids = torch.tensor([0, 1, 9])
    with pytest.raises(IndexError, match=r"holds 9 at position 2, outside \[0, 6\)"):
        compiled(embedding, "emulator")(W, ids)


def test_the_bound_is_read_before_the_canonical_rewrite():
    """isolate.py's canonical_scatters writes a large deterministic index_put as an embedding gradient
    (which eager does not check): the ranges are recorded on the graph before, on the ids' node."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from panamera.torch_backend.isolate import canonical_scatters

    def f(w, v, ids):
        return torch.ops.aten.index_put(w, [ids.reshape(-1)], v, True)

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4096, 520), torch.randn(32, 520), torch.randint(0, 4096, (4, 8)))
    recorded = index_bounds(gm)
    assert canonical_scatters(gm, True) == 1
    ids = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.name.startswith("ids"))
    (b,) = recorded[ids.name]  # on the placeholder, through the reshape
    assert (b.op, b.extent, b.wraps, b.axis) == ("index_put", 4096, True, 0)


def test_an_empty_index_and_a_symbolic_extent():
    b = IndexBound(arg=0, tensor="ids", op="aten.gather", extent=None, data=1, axis=1)
    b.check((torch.tensor([], dtype=torch.int64), torch.zeros(2, 3)))
    b.check((torch.tensor([0, 2]), torch.zeros(2, 3)))
    with pytest.raises(IndexRangeError, match=r"outside \[0, 3\) \(dimension 1 of size 3\)"):
        b.check((torch.tensor([3]), torch.zeros(2, 3)))


def test_a_dynamic_graph_checks_its_ids():
    """A dynamic partition (symbolic lengths of the ids) is wrapped the same way."""
    f = torch.compile(embedding, backend="panamera", options={"target": "cpu"}, dynamic=True)
    for n in (3, 5):
        ids = torch.arange(n) % R
        torch.testing.assert_close(f(W, ids), embedding(W, ids), rtol=1e-12, atol=1e-12)
    with pytest.raises(IndexRangeError, match=r"holds 6 at position 3"):
        f(W, torch.tensor([0, 1, 2, 6]))
    with pytest.raises(IndexRangeError, match=r"holds -1 at position 0"):
        f(torch.randn(R + 1, D, dtype=torch.float64), torch.tensor([-1, 1, 2, 0, 1, 2]))


def test_cross_entropy_targets_outside_the_classes():
    """nll_loss's targets: [0, C) or ignore_index (-100); one outside picked no class and still
    counted in the mean: a wrong loss where eager raises."""

    def loss(x, t):
        return torch.nn.functional.cross_entropy(x, t)

    x = torch.randn(4, R, dtype=torch.float64)
    f = compiled(loss, "cpu")
    t = torch.tensor([0, -100, 5, 1])
    torch.testing.assert_close(f(x, t), loss(x, t), rtol=1e-12, atol=1e-12)
    assert tb.stats().reports[-1].subgraphs
    for bad in (R, -1):
        t = torch.tensor([0, -100, bad, 1])
        with pytest.raises(IndexError):
            loss(x, t)
        with pytest.raises(IndexRangeError, match=rf"aten\.nll_loss_forward: index '\w+' holds {bad} at position 2"):
            f(x, t)


@pytest.mark.parametrize(("given", "cast", "upstream"), [("int32", "int64", True), ("int64", "int32", False)])
def test_the_range_crosses_a_cast_only_where_it_keeps_every_id(given, cast, upstream):
    """A widening cast keeps every id: the range is the uncast ids' too. A narrowing one does not (an
    int64 id 2^32 + 1 is 1 once cast, which eager accepts): the range stays on the cast's result."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(w, ids):
        return torch.nn.functional.embedding(ids.to(getattr(torch, cast)), w)

    gm = make_fx(f, tracing_mode="fake")(W, torch.tensor([0, 1], dtype=getattr(torch, given)))
    recorded = index_bounds(gm)
    ids = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.name.startswith("ids"))
    to = next(n for n in gm.graph.nodes if n.target is torch.ops.aten._to_copy.default)
    assert [b.op for b in recorded[to.name]] == ["embedding"]
    assert (ids.name in recorded) == upstream


def test_an_index_after_a_none_is_checked_on_its_axis():
    """x[:, ids] is aten.index with [None, ids]: one index tensor, lowered (a gather on axis 1) and
    checked against axis 1's extent; eager wraps its negative ids as on axis 0."""
    f = compiled(lambda w, ids: w[:, ids].softmax(-1), "cpu")
    w = W.t().contiguous()  # [D, R]: axis 1 has R
    ids = torch.tensor([0, 5, -1, -R])
    torch.testing.assert_close(f(w, ids), w[:, ids].softmax(-1), rtol=TOL, atol=TOL)
    assert "aten.index.Tensor" in tb.stats().reports[-1].subgraphs[0].ops
    with pytest.raises(IndexError):
        w[:, torch.tensor([0, R])]
    with pytest.raises(
        IndexRangeError, match=rf"holds {R} at position 1, outside \[-{R}, {R}\) \(dimension 1 of size {R}\)"
    ):
        f(w, torch.tensor([0, R]))


def test_a_mask_is_not_read_as_ids():
    """A bool index tensor is a mask (index_put by a mask: eager, which checks the mask's shape);
    where the mask also enters a compiled partition it is not checked as ids: True is 1, which a
    range [-1, 1) would have refused."""

    def f(x, m):
        return torch.where(m[:, None], x, 0.0).softmax(-1), torch.ops.aten.index_put(
            x, [m], torch.ones(D, dtype=x.dtype)
        )

    x, m = torch.randn(1, D, dtype=torch.float64), torch.tensor([True])
    got, want = compiled(f, "cpu")(x, m), f(x, m)
    assert tb.stats().reports[-1].subgraphs
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_an_id_beside_ignore_index_is_refused_and_the_check_takes_no_masked_copy(dtype, monkeypatch):
    """nll_loss's range [0, C) with ignore_index -100: -100 passes, its neighbours -99 and -101 and C
    do not. The ids are read by two passes (aminmax of the ids, of ids ^ ~ignore), never copied with
    the ignored ids masked (torch.where)."""
    b = IndexBound(arg=0, tensor="t", op="aten.nll_loss_forward", extent=R, ignore=-100)

    def no_where(*a, **k):
        raise AssertionError("a masked copy of the ids")

    monkeypatch.setattr(torch, "where", no_where)
    b.check((torch.tensor([0, -100, 5, -100], dtype=dtype),))
    b.check((torch.tensor([-100, -100], dtype=dtype),))
    for bad in (-99, -101, -1, R, -(2**31)):
        with pytest.raises(IndexRangeError, match=rf"holds {bad} at position 2, outside \[0, {R}\)"):
            b.check((torch.tensor([-100, 1, bad, -100, 0], dtype=dtype),))


def test_ignore_index_anywhere_against_every_id():
    """Every id from -8 to 8 beside every ignore_index placement (below, inside, above the range; not
    an int32 value): refused iff outside [lo, n) and not the ignored id, at its first position."""
    for wraps, ignore, dtype in [(w, i, d) for w in (False, True) for i in (None, -100, -3, 0, 2, 4, 7, 2**40)
                                 for d in (torch.int64, torch.int32)]:  # fmt: skip
        b = IndexBound(arg=0, tensor="t", op="op", extent=4, wraps=wraps, ignore=ignore)
        lo = -4 if wraps else 0
        for v in range(-8, 9):
            ids = torch.tensor(
                [lo, v, 3, v] + ([ignore] if ignore is not None and abs(ignore) < 2**31 else []), dtype=dtype
            )
            if lo <= v < 4 or v == ignore:
                b.check((ids,))
            else:
                with pytest.raises(IndexRangeError, match=rf"holds {v} at position 1,"):
                    b.check((ids,))
