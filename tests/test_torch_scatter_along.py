"""A large deterministic scatter along an axis through `torch.compile(backend="panamera")`:
torch_backend/isolate.py writes `x.scatter_add(dim, idx, src)` / `scatter_reduce(..., "sum")` as a
sorted-segment scatter of one-element rows keyed by output position (owner computes cannot take
it; the atomic form is refused when deterministic). Results against numpy float64 `np.add.at`,
bit-identical on rerun; preconditions A1-A3, one negative case each."""

import numpy as np
import pytest
from conftest import tolerance

torch = pytest.importorskip("torch")

import panamera.torch_backend as tb  # noqa: E402
from panamera.errors import IndexRangeError  # noqa: E402
from panamera.frontend.scatter import MAX_TERMS  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

N, K, S = 2, 4096, 8200  # along dim 1: 8200 x 8192 owner-computes terms, over MAX_TERMS


def reference(x, dim, idx, src) -> np.ndarray:
    """x.scatter_add(dim, idx, src) in float64 by np.add.at on the flat output positions."""
    out = x.numpy().astype(np.float64).copy()
    coords = list(np.indices(idx.shape))
    coords[dim] = idx.numpy()
    np.add.at(out, tuple(coords), src.numpy().astype(np.float64))
    return out


def inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, S, generator=g).to(dtype)
    src = (torch.randn(N, K, generator=g) * 3 + 1).to(dtype)
    idx = torch.randint(0, 40, (N, K), generator=g)  # ~100 terms per named element
    idx[1, :7] = S - 1  # the last element of a line
    return x, idx, src


def along(x, idx, src):
    return x.scatter_add(1, idx, src) * 2


def along_reduce(x, idx, src):
    return x.scatter_reduce(1, idx, src, "sum") * 2


@pytest.mark.parametrize(("f", "dtype"), [(along, torch.float32), (along_reduce, torch.float64)])
def test_a_large_deterministic_axis_scatter_is_sorted_segments(f, dtype):
    assert S * N * K > MAX_TERMS
    x, idx, src = inputs(dtype)
    c = torch.compile(f, backend="panamera", options={"target": "emulator", "deterministic": True})
    got = c(x, idx, src)
    (r,) = tb.stats().reports
    assert r.eager == () and any(s.ops == ("aten.embedding_dense_backward.default",) for s in r.subgraphs), r.describe()
    want = 2 * reference(x, 1, idx, src)
    terms = int(np.bincount(idx.flatten().numpy()).max())  # the longest segment
    name = str(dtype).removeprefix("torch.")
    tol = tolerance(name, terms + 1)  # the segment, then x added
    scale = np.abs(want).max()
    assert np.abs(got.numpy().astype(np.float64) - want).max() <= tol * scale
    assert torch.equal(got, c(x, idx, src))  # the same bits on rerun


@pytest.mark.parametrize(("f", "op"), [(along, "scatter_add"), (along_reduce, "scatter_reduce")])
def test_an_id_outside_the_axis_is_an_index_range_error(f, op):
    x, idx, src = inputs(torch.float32)
    idx[0, 5] = S
    c = torch.compile(f, backend="panamera", options={"target": "emulator", "deterministic": True})
    with pytest.raises(IndexRangeError, match=rf"aten\.{op}.*holds {S} at position 5"):
        c(x, idx, src)


def test_rewrite_preconditions():
    """isolate.py `canonical_scatters` on axis scatters: A1 not deterministic, A2 (idx smaller than
    x off dim, int8 values, scatter_reduce of a max or without include_self), A3 (small: owner
    computes); each left as it is."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from panamera.torch_backend.isolate import canonical_scatters

    def f(x, idx, src, xs, xi):
        big = torch.ops.aten.scatter_add(x, 1, idx, src)
        short = torch.ops.aten.scatter_add(x, 1, idx[:1], src[:1])  # (A2) idx smaller off dim
        amax = torch.ops.aten.scatter_reduce(x, 1, idx, src, "amax")  # (A2) not a sum
        excl = torch.ops.aten.scatter_reduce(x, 1, idx, src, "sum", include_self=False)  # (A2)
        narrow = torch.ops.aten.scatter_add(xi, 1, idx, src.to(torch.int8))  # (A2) int8: not sortable
        tiny = torch.ops.aten.scatter_add(xs, 1, idx[:, :8] % 16, src[:, :8])  # (A3) owner computes takes it
        return big, short, amax, excl, narrow, tiny

    x, idx, src = inputs(torch.float32)
    gm = make_fx(f, tracing_mode="fake")(x, idx, src, torch.zeros(N, 16), torch.zeros(N, S, dtype=torch.int8))
    assert canonical_scatters(gm, False) == 0  # (A1) not deterministic
    assert canonical_scatters(gm, True) == 1
    left = [n for n in gm.graph.nodes if "scatter" in str(n.target)]
    assert len(left) == 5


class Gathered(torch.nn.Module):
    """A gather of rows along axis 1 by an index expanded across the last axis (the usual
    `gather(w, 1, ids[..., None].expand(-1, -1, D))`): its backward scatters along axis 1 with an
    index constant along the last axis, so the sorted scatter takes rows of D (C1-C2)."""

    B, S, K, D = 2, 4096, 512, 64

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(self.B, self.S, self.D))

    def forward(self, ids):
        h = torch.gather(self.w, 1, ids[:, :, None].expand(-1, -1, self.D))
        return (h * h.tanh()).sum()


@pytest.mark.parametrize(("target", "deterministic"), [("emulator", True), ("cpu", False)])  # the CPU: no atomics
def test_a_gather_backward_scatters_rows_of_its_expanded_axis(target, deterministic):
    torch.manual_seed(0)
    m = Gathered().double()
    ids = torch.randint(0, 100, (m.B, m.K))
    assert m.S * ids.numel() * m.D > MAX_TERMS
    m(ids).backward()
    want = m.w.grad.clone()
    m.w.grad = None
    f = torch.compile(m, backend="panamera", options={"target": target, "deterministic": deterministic})
    f(ids).backward()
    got = m.w.grad.clone()
    r = [r for r in tb.stats().reports if r.phase == tb.Phase.BACKWARD][-1]
    assert r.eager == () and any(s.ops == ("aten.embedding_dense_backward.default",) for s in r.subgraphs)
    tol = tolerance("float64", int(np.bincount(ids.flatten().numpy()).max()))
    assert ((got - want).abs().max() / want.abs().max()).item() <= tol
    m.w.grad = None
    f(ids).backward()
    assert torch.equal(got, m.w.grad)


def test_rows_when_the_index_is_an_expansion_else_single_elements():
    """isolate.py `constant_after`: rows of the axes after dim when idx expands a tensor of extent 1
    there; (C1) an expansion of a lower-rank tensor, or no expansion, and (C2) an expansion that is
    not constant after dim, scatter single elements (rows of 1)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from panamera.torch_backend.isolate import EMBEDDING_BACKWARD, canonical_scatters

    B, S, K, D = Gathered.B, Gathered.S, Gathered.K, Gathered.D

    def f(x, ids, src, flat_ids, full):
        rows = torch.ops.aten.scatter_add(x, 1, ids[:, :, None].expand(B, K, D), src)
        lower = torch.ops.aten.scatter_add(x, 1, flat_ids[:, None].expand(B, K, D), src)  # (C1) rank 2 expanded
        plain = torch.ops.aten.scatter_add(x, 1, full, src)  # (C1) no expansion
        varying = torch.ops.aten.scatter_add(x, 1, full[:1].expand(B, K, D), src)  # (C2) varies along D
        return rows, lower, plain, varying

    x, src = torch.randn(B, S, D), torch.randn(B, K, D)
    ids, full = torch.randint(0, S, (B, K)), torch.randint(0, S, (B, K, D))
    gm = make_fx(f, tracing_mode="fake")(x, ids, src, torch.randint(0, S, (K,)), full)
    assert canonical_scatters(gm, True) == 4
    widths = [meta_shape(n.args[0])[-1] for n in gm.graph.nodes if n.target is EMBEDDING_BACKWARD]
    assert widths == [D, 1, 1, 1]


def meta_shape(n) -> tuple[int, ...]:
    return tuple(n.meta["val"].shape)


def test_a_small_scatter_reduce_sum_is_translated_and_a_max_stays_eager():
    """backward.py `scatter_reduce`: a sum with include_self is scatter_add's (owner computes or
    atomics, the model's choice); an amax is left to eager PyTorch with its reason."""
    g = torch.Generator().manual_seed(1)
    x, src, idx = (
        torch.randn(3, 6, generator=g),
        torch.randn(3, 5, generator=g),
        torch.randint(0, 6, (3, 5), generator=g),
    )
    c = torch.compile(along_reduce, backend="panamera", options={"target": "emulator"})
    got = c(x, idx, src)
    (r,) = tb.stats().reports
    assert r.eager == () and r.subgraphs, r.describe()
    want = 2 * reference(x, 1, idx, src)
    assert np.abs(got.numpy() - want).max() <= tolerance("float32", 5) * np.abs(want).max()
    tb.reset_stats()
    torch.compile(lambda x, i, s: x.scatter_reduce(1, i, s, "amax"), backend="panamera")(x, idx, src)
    assert any("scatter_reduce 'amax'" in e.reason for e in tb.stats().reports[0].eager), tb.stats().reports[0].eager
