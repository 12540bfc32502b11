"""Training ops through `torch.compile(backend="panamera")` beyond the ones of
tests/test_torch_training.py (issue 23): BatchNorm backward in NCHW and NHWC with its kernel
counts, gradient clipping, EmbeddingBag's backward. Gradients match eager PyTorch float64 within
`tolerance("float64", n)` of the largest gradient (n: the longest reduction), as there.
"""

import warnings

import pytest
from conftest import tolerance

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import panamera as pn  # noqa: E402, F401  (after torch: `import panamera` registers the backend)
import panamera.torch_backend as tb  # noqa: E402

OPTIONS = {"target": "emulator"}


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def grads(module, inputs, compiled: bool, deterministic: bool = False):
    """(loss, {name: gradient}) of one forward and backward, parameters and float inputs."""
    module.zero_grad(set_to_none=True)
    inputs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    f = torch.compile(module, backend="panamera", options={**OPTIONS, "deterministic": deterministic})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = (f if compiled else module)(*inputs)
        loss.backward()
    out = {name: p.grad.detach().clone() for name, p in module.named_parameters() if p.grad is not None}
    out |= {f"input{k}": x.grad.detach().clone() for k, x in enumerate(inputs) if x.requires_grad}
    return loss.detach(), out


def assert_match(got, ref, n: int):
    tol = tolerance("float64", n)
    assert got.keys() == ref.keys()
    for name in ref:
        scale = max(1.0, ref[name].abs().max().item())
        err = (got[name] - ref[name]).abs().max().item() / scale
        assert err <= tol, f"{name}: error {err:.3g} over {tol:.3g}"


def report(phase):
    (r,) = [r for r in tb.stats().reports if r.phase == phase]
    return r


# -- BatchNorm backward ------------------------------------------------------------------------
class BatchNorm(nn.Module):
    """BatchNorm2d in training mode on an NCHW input, or on an NHWC one (permuted in and out, so
    Panamera reads the NHWC tensor itself: the views fuse into the kernels)."""

    def __init__(self, c: int, nhwc: bool, shape):
        super().__init__()
        self.bn, self.nhwc = nn.BatchNorm2d(c), nhwc
        self.register_buffer("w", torch.randn(shape))  # the loss weights every output differently

    def forward(self, x):
        y = self.bn(x.permute(0, 3, 1, 2) if self.nhwc else x)
        return ((y.permute(0, 2, 3, 1) if self.nhwc else y) * self.w).sum()


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_batch_norm_backward_nchw_and_nhwc_with_their_kernels(layout):
    """NCHW: the per-channel sums (a strided ROW) and dx in one stitched kernel. NHWC: the sums
    as one COLUMN kernel, then dx (tests/test_batch_norm_backward.py says why)."""
    torch.manual_seed(0)
    shape = (4, 3, 5, 6) if layout == "nchw" else (4, 5, 6, 3)
    m = BatchNorm(3, layout == "nhwc", shape).double()
    inputs = [torch.randn(shape, dtype=torch.float64) * 2 + 1]
    _, got = grads(m, inputs, True)
    _, ref = grads(m, inputs, False)
    assert_match(got, ref, 4 * 5 * 6)
    bw = report(tb.Phase.BACKWARD)
    assert bw.kernels == (1 if layout == "nchw" else 2) and not bw.eager, tb.stats().describe()


# -- gradient clipping -------------------------------------------------------------------------
def clip_model():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(12, 20), nn.LayerNorm(20), nn.GELU(), nn.Linear(20, 3)).double()
    m(torch.randn(5, 12, dtype=torch.float64)).square().sum().backward()
    return m


@pytest.mark.parametrize("order", [2.0, float("inf")])
def test_clip_grad_norm_reduces_every_gradient_in_one_launch(order):
    """clip_grad_norm_ compiled (torch.compile(step) captures it; inside the model's own graph
    there are no gradients yet): the total norm of 6 gradients of 4 shapes is one reduction
    launch; the scaling stays eager, as eager's own in-place `_foreach_mul_` (torch_backend/mutations.py:
    no copy back into the gradients). The model prefers the multi-tensor kernel
    (torch_backend/multitensor.py) to the Panamera formulations here, and the clip coefficient
    is its epilogue: ONE launch for both orders (the formulations took 2 for the 2-norm: an
    epilogue reading the sqrt epilogue does not join, poly/stitch.py precondition 3)."""
    m = clip_model()
    ref = [p.grad.clone() for p in m.parameters()]
    n = sum(g.numel() for g in ref)
    eager_total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, order) for g in ref]), order)
    clipped = [g * torch.clamp(0.05 / (eager_total + 1e-6), max=1.0) for g in ref]

    f = torch.compile(lambda: torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05, order), backend="panamera",
                      options=OPTIONS)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        total = f()
    tol = tolerance("float64", n)
    torch.testing.assert_close(total, eager_total, rtol=tol, atol=0)
    for p, want in zip(m.parameters(), clipped):
        torch.testing.assert_close(p.grad, want, rtol=tol, atol=tol * want.abs().max().item())
    (r,) = tb.stats().reports
    (sub,) = [s for s in r.subgraphs if s.kernels]
    assert sub.ops[0] == "panamera.total_norm.default" and sub.kernels == 1
    assert sub.name.startswith("multitensor_") and "aten.clamp.default" in sub.ops  # the coefficient
    assert [e.op for e in r.eager] == ["aten._foreach_mul_.Tensor"]  # in place: no copy_ left


@pytest.mark.parametrize("dtype, deterministic", [("float32", False), ("float32", True), ("bfloat16", False)])
def test_total_norm_is_one_reduction_split_across_blocks(dtype, deterministic):
    """The builder itself: 3 tensors, 3 shapes, 40,000 elements in one launch of the ALL form,
    split by the model, merged by one atomic per block (or ordered partials). bfloat16 gradients
    are squared and summed in float32 (as torch's foreach norm does), the norm rounded once to
    bfloat16: within tolerance("bfloat16", n) of the float64 norm of the same rounded values."""
    from types import SimpleNamespace

    import numpy as np
    from conftest import np_dtype

    from panamera.torch_backend import foreach

    rng = np.random.default_rng(0)
    shapes = [(100, 300), (9999,), (1, 1)]
    arrays = [rng.normal(size=s).astype(np_dtype(dtype)) for s in shapes]
    ts = [pn.placeholder(s, dtype, name=f"g{k}") for k, s in enumerate(shapes)]
    node = SimpleNamespace(meta={"val": torch.empty((), dtype=getattr(torch, dtype))})
    both = foreach.total_norm(node, ts, 2.0)  # the concatenated and the per-tensor formulations
    out = both.inputs[0].astype(dtype)  # the concatenation, cast as `fit` casts it in the backend
    k = pn.compile(out, target="emulator", deterministic=deterministic)
    (launch,) = k.plan.kernels
    assert launch.form == "ALL" and launch.blocks_per_reduction > 1
    assert set(launch.modes) <= ({"partials", "store"} if deterministic else {"atomic_ws", "store"})
    want = np.sqrt(sum((a.astype(np.float64) ** 2).sum() for a in arrays))
    n = sum(a.size for a in arrays)
    assert abs(float(k(*arrays, order="reverse").astype(np.float64)) - want) <= tolerance(dtype, n) * want


@pytest.mark.parametrize("order", [2.0, float("inf")])
def test_many_gradients_take_the_per_tensor_formulation(order):
    """40 gradients of 4 sizes: over MAX_PIECES for the concatenation (it would load every piece
    at each element), so one reduction per tensor, up to 8 tensors of a size sharing a kernel:
    8 launches for 40 tensors (4 sizes × ⌈10 / 8⌉; the combine joins a kernel of 2 sums, stitched).
    float64 against numpy."""
    from types import SimpleNamespace

    import numpy as np

    from panamera.compiler import lower
    from panamera.torch_backend import foreach

    rng = np.random.default_rng(5)
    shapes = [(64, 48), (48,), (48, 3), (7,)] * 10
    arrays = [rng.normal(size=s) for s in shapes]
    ts = [pn.placeholder(s, "float64", name=f"g{k}") for k, s in enumerate(shapes)]
    node = SimpleNamespace(meta={"val": torch.empty((), dtype=torch.float64)})
    out = foreach.total_norm(node, ts, order)
    a = lower(out, target="emulator")
    assert a.formulations == () and len(a.plan.kernels) == 8
    assert max(len(g.statements) for g in a.groups) <= 8 + 1  # 8 sums (and the combine beside them)
    k = pn.compile(out, target="emulator")
    flat = np.concatenate([x.ravel() for x in arrays])
    want = np.abs(flat).max() if order == float("inf") else np.sqrt((flat**2).sum())
    assert abs(float(k(*arrays)) - want) <= tolerance("float64", flat.size) * want


def _traced(fn, *tensors):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*tensors)


def _ops(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_total_norm_rewrite_takes_foreach_and_single_norms():
    from panamera.torch_backend.foreach import fuse_total_norms

    def total(a, b, c):
        ns = torch._foreach_norm([a, b], 2.0)
        return torch.linalg.vector_norm(torch.stack([*ns, torch.linalg.vector_norm(c, 2.0)]), 2.0)

    ts = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2, 2)]
    gm = _traced(total, *ts)
    assert fuse_total_norms(gm) == 1 and _ops(gm) == ["panamera.total_norm.default"]
    torch.testing.assert_close(gm(*ts), total(*ts))


def _dim(a, b):  # 1. the outer norm reduces along a dim
    ns = torch._foreach_norm([a, b], 2.0)
    return torch.linalg.vector_norm(torch.stack(ns), 2.0, dim=0)


def _orders(a, b):  # 2. an inner norm of another order
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(a, 1.0), torch.linalg.vector_norm(b)]))


def _read_elsewhere(a, b):  # 3. a per-tensor norm is also returned
    ns = torch._foreach_norm([a, b], 2.0)
    return torch.linalg.vector_norm(torch.stack(ns), 2.0), ns[0]


def _dtypes(a, b):  # 4. the stack promotes float32 and float64 norms
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(a), torch.linalg.vector_norm(b.double())]))


@pytest.mark.parametrize("fn", [_dim, _orders, _read_elsewhere, _dtypes], ids=lambda f: f.__name__)
def test_total_norm_rewrite_refuses_off_its_preconditions(fn):
    from panamera.torch_backend.foreach import fuse_total_norms

    ts = [torch.randn(3, 4), torch.randn(5)]
    gm = _traced(fn, *ts)
    before = _ops(gm)
    assert fuse_total_norms(gm) == 0 and _ops(gm) == before


# -- EmbeddingBag backward, and a Wide&Deep-like recommender built on it -------------------------
class Bags(nn.Module):
    def __init__(self, mode: str, padding_idx=None, last=False):
        super().__init__()
        self.bag = nn.EmbeddingBag(20, 4, mode=mode, padding_idx=padding_idx, include_last_offset=last)
        self.register_buffer("w", torch.randn(4))

    def forward(self, ids, offsets, weights=None):
        return (self.bag(ids, offsets, per_sample_weights=weights) * self.w).square().sum()


IDS = torch.tensor([3, 5, 3, 7, 3, 0, 19, 5, 5, 2])  # repeated ids, an empty bag (offsets 3, 3)
BAGS = {
    "sum": ("sum", None, False, [0, 3, 3, 7], False),
    "mean_padding": ("mean", 3, False, [0, 3, 3, 7], False),
    "sum_last_offset": ("sum", 5, True, [0, 3, 3, 7, 10], False),
    "per_sample_weights": ("sum", None, False, [0, 3, 3, 7], True),
}


@pytest.mark.parametrize("case", list(BAGS))
def test_embedding_bag_backward_with_repeated_ids(case):
    mode, padding, last, offsets, weighted = BAGS[case]
    torch.manual_seed(2)
    m = Bags(mode, padding, last).double()
    inputs = [IDS, torch.tensor(offsets)] + ([torch.randn(len(IDS), dtype=torch.float64)] if weighted else [])
    _, got = grads(m, inputs, True)
    _, ref = grads(m, inputs, False)
    assert_match(got, ref, len(IDS))
    ops = {op for s in report(tb.Phase.BACKWARD).subgraphs if s.kernels for op in s.ops}
    assert "aten._embedding_bag_backward.default" in ops


def test_embedding_bag_max_backward_stays_eager_with_its_reason():
    torch.manual_seed(2)
    m = Bags("max").double()
    inputs = [IDS, torch.tensor([0, 3, 4, 7])]
    _, got = grads(m, inputs, True)
    _, ref = grads(m, inputs, False)
    assert_match(got, ref, len(IDS))
    reasons = {r for (op, r) in tb.stats().eager if op == "aten._embedding_bag_backward.default"}
    assert reasons == {"EmbeddingBag backward of max bags (their argmax indices, not a sum)"}


class WideDeepBags(nn.Module):
    """A Wide&Deep-like recommender on EmbeddingBag: each sparse field is a multi-hot bag (a
    user's recent items), the wide part one weight per id summed over the bag, the deep part the
    bags' mean embeddings with dense features through an MLP; logistic loss."""

    def __init__(self, vocab=30, d=6, dense=4):
        super().__init__()
        self.items, self.wide = nn.EmbeddingBag(vocab, d, mode="mean"), nn.EmbeddingBag(vocab, 1, mode="sum")
        self.deep = nn.Sequential(nn.Linear(d + dense, 12), nn.ReLU(), nn.Linear(12, 1))

    def forward(self, ids, offsets, dense, y):
        deep = self.deep(torch.cat([self.items(ids, offsets), dense], 1)).squeeze(1)
        return F.binary_cross_entropy_with_logits(deep + self.wide(ids, offsets).squeeze(1), y)


def test_wide_and_deep_on_embedding_bags_one_training_step():
    """Forward, backward and an AdamW step: the loss, every gradient and every updated weight
    match eager PyTorch float64; both tables' gradients are Panamera kernels."""
    torch.manual_seed(3)
    ids, offsets = torch.randint(0, 30, (14,)), torch.tensor([0, 2, 2, 5, 9, 10])
    dense, y = torch.randn(6, 4, dtype=torch.float64), torch.rand(6, dtype=torch.float64).round()
    results = []
    for compiled in (True, False):
        torch.manual_seed(4)
        m = WideDeepBags().double()
        opt = torch.optim.AdamW(m.parameters(), lr=0.01)
        loss, g = grads(m, [ids, offsets, dense, y], compiled)
        opt.step()
        results.append((loss, g, {k: v.detach().clone() for k, v in m.state_dict().items()}))
    (got_loss, got, got_w), (ref_loss, ref, ref_w) = results
    tol = tolerance("float64", 14)
    torch.testing.assert_close(got_loss, ref_loss, rtol=tol, atol=tol)
    assert_match(got, ref, 14)
    assert_match(got_w, ref_w, 14)
    bw = report(tb.Phase.BACKWARD)
    compiled = [op for s in bw.subgraphs if s.kernels for op in s.ops]
    assert compiled.count("aten._embedding_bag_backward.default") == 2, tb.stats().describe()
