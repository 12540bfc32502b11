"""A large deterministic scatter-add inside a bigger backward graph, through
`torch.compile(backend="panamera")`: torch_backend/isolate.py cuts its partition at the scatter
(before it, it alone, its readers) and writes index_put(accumulate) / index_add as
`x + embedding_dense_backward`, so the backward has no eager op (it fell back whole before);
gradients in float64 against eager PyTorch, bit-identical on rerun, on the emulator and the CPU."""

import pytest
from conftest import tolerance

torch = pytest.importorskip("torch")
nn = torch.nn

import panamera.torch_backend as tb  # noqa: E402
from panamera.frontend.scatter import MAX_TERMS  # noqa: E402

ROWS, D = 4096, 520  # 4096 rows x 32 ids x 520 values: over MAX_TERMS, so owner computes is not offered
IDS = torch.tensor([[1, 1, 4, 8, 1, 4095, 3, 3], [0, 8, 8, 4, 3, 2, 2, 1], [7, 7, 7, 7, 5, 6, 1, -1], [9] * 8])


class Decayed(nn.Module):
    """An embedding whose table is read again (a weight-decay term): its gradient is the
    embedding gradient plus 2w, an add that reads the scatter inside the partition."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(ROWS, D)

    def forward(self, ids):
        h = self.table(ids.clamp(min=0))
        return (h.softmax(-1) * h).sum() + 1e-2 * (self.table.weight**2).sum()


class Gathered(nn.Module):
    """`w[ids]` (backward: index_put accumulate, negative ids wrapped) and `index_select`
    (backward: index_add) of one large parameter."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(ROWS, D))

    def forward(self, ids):
        h = self.w[ids] + self.w.index_select(0, ids.flatten().clamp(min=0)).reshape(ids.shape + (D,))
        return (h.softmax(-1) * h).sum() + (self.w**2).sum()


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def grads(m, target: str | None, deterministic: bool = True):
    m.zero_grad(set_to_none=True)
    opts = {"target": target, "deterministic": deterministic}
    f = torch.compile(m, backend="panamera", options=opts) if target else m
    f(IDS).backward()
    return [p.grad.detach().clone() for p in m.parameters()]


@pytest.mark.parametrize(
    ("model", "target", "deterministic"),
    [(Decayed, "emulator", True), (Gathered, "emulator", True), (Gathered, "cpu", False)],  # the CPU: no atomics
)
def test_the_backward_has_no_eager_op(model, target, deterministic):
    assert ROWS * IDS.numel() * D > MAX_TERMS
    torch.manual_seed(0)
    m = model().double()
    want = grads(m, None)
    got = grads(m, target, deterministic)
    (r,) = [r for r in tb.stats().reports if r.phase == tb.Phase.BACKWARD]
    assert r.eager == () and r.subgraphs, r.describe()
    alone = [s for s in r.subgraphs if s.ops == ("aten.embedding_dense_backward.default",)]
    scatters = 2 if model is Gathered else 1  # index_put and index_add: each alone, between its producers and readers
    assert len(alone) == scatters and all(s.kernels for s in alone) and len(r.subgraphs) >= 1 + 2 * scatters
    tol = tolerance("float64", 8)  # the longest segment: row 1's ids (and index_select's)
    for g, w in zip(got, want):
        assert ((g - w).abs().max() / max(1.0, w.abs().max())).item() <= tol
    assert all(torch.equal(a, b) for a, b in zip(got, grads(m, target, deterministic)))


def test_rewrite_preconditions():
    """torch_backend/isolate.py `canonical_scatters`: one negative case per precondition R1-R3, on
    a traced graph (each left an index_put / index_add)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from panamera.torch_backend.isolate import canonical_scatters

    def f(w, v, w_small, v_small, w_int, ids, small):
        big = torch.ops.aten.index_put(w, [ids], v, True)
        broadcast = torch.ops.aten.index_put(w, [ids], v[:1], True)  # (R2) values broadcast
        off_axis = torch.ops.aten.index_add(w, 1, ids[:8] % D, w[:, :8])  # (R2) not axis 0
        tiny = torch.ops.aten.index_add(w_small, 0, small, v_small)  # (R3) owner computes takes it
        narrow = torch.ops.aten.index_put(w_int, [ids], v.to(torch.int8), True)  # (R2) int8: not sortable
        return big, broadcast, off_axis, tiny, narrow

    args = (torch.randn(ROWS, D), torch.randn(32, D), torch.randn(64, 4), torch.randn(8, 4))
    ints = (torch.zeros(ROWS, D, dtype=torch.int8), torch.randint(0, ROWS, (32,)), torch.randint(0, 64, (8,)))
    gm = make_fx(f, tracing_mode="fake")(*args, *ints)
    assert canonical_scatters(gm, False) == 0  # (R1) not deterministic
    assert canonical_scatters(gm, True) == 1
    left = [str(n.target) for n in gm.graph.nodes if "index_put" in str(n.target) or "index_add" in str(n.target)]
    assert len(left) == 4 and "aten.embedding_dense_backward.default" in {str(n.target) for n in gm.graph.nodes}


def test_only_index_put_wraps_negative_ids():
    """index_put counts a negative id from the end (x[-1]); index_add does not (eager torch refuses
    one): its rewrite passes the ids as they are, as backward.py's index_add translation reads them."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from panamera.torch_backend.isolate import canonical_scatters

    def wraps(f) -> bool:
        gm = make_fx(f, tracing_mode="fake")(torch.randn(ROWS, D), torch.randn(32, D), torch.randint(0, ROWS, (32,)))
        assert canonical_scatters(gm, True) == 1
        return any(n.target is torch.ops.aten.where.self for n in gm.graph.nodes)

    assert wraps(lambda w, v, ids: torch.ops.aten.index_put(w, [ids], v, True))
    assert not wraps(lambda w, v, ids: torch.ops.aten.index_add(w, 0, ids, v))
