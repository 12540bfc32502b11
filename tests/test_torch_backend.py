"""`torch.compile(model, backend="panamera")` on the CPU emulator: small modules against eager
PyTorch, the partition shown by kernel counts, recompile counts on a new shape, the cache, options and
modes. Training (forward and backward graphs) is tested in tests/test_torch_training.py.

Tolerances: Panamera's result must be as close to a float64 reference (the same module in
float64) as eager PyTorch's own result in the module's dtype, plus the tolerance of one
reduction of `n` values of that dtype (tests/conftest.py), relative to the largest value.
"""

import importlib
import math
import warnings
from pathlib import Path

import pytest
from conftest import tolerance

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import panamera as pn  # noqa: E402  (after torch: `import panamera` registers the backend)
import panamera.torch_backend as tb  # noqa: E402

OPTIONS = {"target": "emulator"}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def compiled(module, **kw):
    return torch.compile(module, backend="panamera", options=OPTIONS, **kw)


def first(y):
    return y[0] if isinstance(y, tuple) else y


def check_close(module, x, dtype: str, n: int, out=None):
    """Panamera's result against eager PyTorch in `dtype` and in float64 (see the module doc)."""
    with torch.no_grad():
        got = first(out if out is not None else compiled(module)(x)).double()
        eager = first(module(x)).double()
        ref = first(module.double()(x.double()))
        module.to(DTYPES[dtype])
    scale = max(1.0, ref.abs().max().item())
    err, eager_err = (got - ref).abs().max().item() / scale, (eager - ref).abs().max().item() / scale
    assert err <= 2 * eager_err + tolerance(dtype, n), f"error {err:.3g} against eager's {eager_err:.3g}"


class MLP(nn.Module):
    def __init__(self, d=32, hidden=64, classes=10):
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(d, hidden), nn.LayerNorm(hidden), nn.Linear(hidden, classes)

    def forward(self, x):
        return self.down(F.gelu(self.norm(self.up(x))))


class Attention(nn.Module):
    """A causal self-attention block with a pre-LayerNorm and a residual."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads, self.norm = heads, nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = F.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        return x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


def gpt2_block(d=32, heads=4):
    """transformers' GPT2Block from a config with random weights, or the hand-written equivalent."""
    try:
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    except ImportError:
        return HandGPT2Block(d, heads)
    cfg = GPT2Config(n_embd=d, n_head=heads, n_layer=1, n_positions=16, attn_implementation="eager")
    return GPT2Block(cfg)


class HandGPT2Block(nn.Module):
    """GPT-2's block: x + attn(ln_1(x)), then + mlp(ln_2(x)) with GELU (tanh)."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.attn, self.ln_2 = Attention(d, heads), nn.LayerNorm(d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = self.attn(x)
        return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


def report():
    (r,) = tb.stats().reports
    return r


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_mlp_with_layer_norm(dtype):
    torch.manual_seed(0)
    m = MLP().eval().to(DTYPES[dtype])
    check_close(m, torch.randn(4, 32).to(DTYPES[dtype]), dtype, 64)
    r = report()
    assert [s.kernels for s in r.subgraphs] == [1], r.describe()  # layer norm + GELU: one stitched kernel
    assert r.eager_ops.count("aten.addmm.default") == 2 and r.subgraphs[0].ops == (
        "aten.native_layer_norm.default",
        "aten.gelu.default",
    )


def test_attention_block():
    torch.manual_seed(0)
    m = Attention().eval()
    check_close(m, torch.randn(2, 8, 32), "float32", 32)
    r = report()
    ops = [set(s.ops) for s in r.subgraphs if s.kernels]
    assert any("aten.native_layer_norm.default" in o for o in ops)
    assert any("aten._softmax.default" in o and "aten.masked_fill.Scalar" in o for o in ops)  # mask fused
    assert "aten.bmm.default" in r.eager_ops and r.kernels == 2, r.describe()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpt2_block(dtype):
    torch.manual_seed(0)
    m = gpt2_block().eval().to(DTYPES[dtype])
    check_close(m, torch.randn(2, 8, 32).to(DTYPES[dtype]), dtype, 32)
    r = report()
    compiled_ops = [set(s.ops) for s in r.subgraphs if s.kernels]
    assert sum("aten.native_layer_norm.default" in o for o in compiled_ops) == 2  # ln_1, ln_2 (+ residual)
    assert sum("aten._softmax.default" in o for o in compiled_ops) == 1
    assert len(compiled_ops) == 3 and 3 <= r.kernels <= 4, r.describe()
    assert "aten.addmm.default" in r.eager_ops and "aten.bmm.default" in r.eager_ops


class Reductions(nn.Module):
    """Every family once: norms in eval, softmax-family ops, reductions and a loss."""

    def __init__(self, c=8):
        super().__init__()
        self.bn, self.gn = nn.BatchNorm1d(c).eval(), nn.GroupNorm(2, c)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x, target):
        h = self.gn(self.bn(x))  # (N, C, L)
        flat = h.flatten(1)
        return (
            F.rms_norm(flat, (flat.shape[-1],)).amax(-1),
            F.log_softmax(flat, -1).amin(-1),
            torch.logsumexp(flat, -1),
            flat.var(-1) + flat.std(-1, correction=0),
            flat.argmax(-1),
            F.cross_entropy(flat, target),
            (flat > 0).any(-1),
            flat.prod(-1),
        )


def test_reductions_norms_and_losses():
    torch.manual_seed(0)
    m = Reductions().eval()
    x, target = torch.randn(4, 8, 6), torch.randint(0, 48, (4,))
    with torch.no_grad():
        got, want = compiled(m)(x, target), m(x, target)
    n = 48
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=tolerance("float32", n), atol=tolerance("float32", n))
        else:
            assert torch.equal(g, w)
    r = report()
    assert not r.eager_ops or set(r.eager_ops) <= {"aten.view.default"}, r.eager_ops
    assert r.kernels >= 1, r.describe()


def test_recompiles_on_a_new_shape_and_the_cache():
    torch.manual_seed(0)
    m = MLP().eval()
    f = compiled(m)
    with torch.no_grad():
        for rows in (4, 4, 6, 6, 7):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(f(x), m(x), rtol=1e-5, atol=1e-5)
    s = tb.stats()
    # 4, then dynamo's dynamic graph at 6 (one symbolic Panamera program, issue 22), which serves 7 too
    assert (s.graphs, s.recompiles) == (2, 1), [r.describe() for r in s.reports]
    assert [r.shapes[2] for r in s.reports] == [(4, 32), (6, 32)]
    assert (s.programs, s.symbolic_programs) == (2, 1)
    torch._dynamo.reset()
    before = pn.cache.info().hits
    with torch.no_grad():
        compiled(m)(torch.randn(4, 32))
    assert pn.cache.info().hits > before  # the same subgraph again: Panamera's compile cache
    static = compiled(m, dynamic=False)
    tb.reset_stats()
    torch._dynamo.reset()
    with torch.no_grad():
        static(torch.randn(4, 32))
        static(torch.randn(5, 32))
    assert (tb.stats().graphs, tb.stats().recompiles) == (2, 1)  # dynamo's own recompile


def test_the_backend_is_registered_and_has_an_entry_point():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("panamera") is tb.backend
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()  # (tomllib: Python 3.11+)
    group = text.split('[project.entry-points."torch_dynamo_backends"]\n', 1)[1].split("\n\n", 1)[0]
    assert group.strip() == 'panamera = "panamera.torch_backend:backend"'
    module, attr = group.split('"')[1].split(":")
    assert getattr(importlib.import_module(module), attr) is tb.backend


def test_unsupported_options_are_clear():
    with pytest.raises(Exception, match="unknown target 'tpu'"):
        with torch.no_grad():
            torch.compile(MLP().eval(), backend="panamera", options={"target": "tpu"})(torch.randn(2, 32))


def test_a_subgraph_panamera_cannot_express_stays_eager(monkeypatch):
    from panamera.torch_backend import aten

    def refuse(node, *args, **kwargs):
        raise pn.ShapeError("refused for the test")

    op = torch.ops.aten._softmax.default
    monkeypatch.setitem(aten.TABLE, op, aten.Entry(aten.OpKind.ANCHOR, refuse))
    f = torch.compile(lambda x: torch.softmax(x, -1) * 2, backend="panamera", options=OPTIONS)
    x = torch.randn(3, 16)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        torch.testing.assert_close(f(x), torch.softmax(x, -1) * 2)
    assert any("refused for the test" in str(w.message) for w in caught if w.category is pn.EagerFallbackWarning)
    (sub,) = report().subgraphs
    assert sub.kernels == 0 and "refused for the test" in sub.eager_reason
    assert "aten._softmax.default" in report().eager_ops


def test_inference_mode_and_reductions_of_a_function():
    f = torch.compile(lambda x: (x.sum(1), x.mean(0), x.amax(-1)), backend="panamera", options=OPTIONS)
    x = torch.randn(5, 40)
    with torch.inference_mode():
        for got, want in zip(f(x), (x.sum(1), x.mean(0), x.amax(-1))):
            torch.testing.assert_close(got, want, rtol=tolerance("float32", 40), atol=tolerance("float32", 40))
    assert report().kernels >= 1 and not report().eager_ops
