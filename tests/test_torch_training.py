"""Training through `torch.compile(model, backend="panamera")` on the CPU emulator: the forward
and backward graphs AOTAutograd hands over are compiled by Panamera, and the loss and every
gradient match eager PyTorch.

Tolerances: in float64 a gradient must match eager float64 within `tolerance("float64", n)`
relative to the largest gradient (n: the longest reduction of the graph: the tokens of a bias
gradient, the features of a norm). In float32, float16 and bfloat16, the error against the float64
reference (the same rounded weights) may be twice eager PyTorch's own error in that dtype plus
`tolerance(dtype, n)`, as in tests/test_torch_backend.py.
"""

import dataclasses
import logging
import warnings

import pytest
from conftest import tolerance

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import panamera as pn  # noqa: E402  (after torch: `import panamera` registers the backend)
import panamera.torch_backend as tb  # noqa: E402
from panamera.model import detect  # noqa: E402
from panamera.model.gpu import H100  # noqa: E402
from panamera.torch_backend.partition import NO_ANCHOR  # noqa: E402

OPTIONS = {"target": "emulator"}
CONTRACTION = "a contraction"


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def step(module, inputs, compiled: bool, deterministic: bool = False):
    """One forward and backward: (loss, {name: gradient}) for the parameters and float inputs."""
    module.zero_grad(set_to_none=True)
    inputs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    f = torch.compile(module, backend="panamera", options={**OPTIONS, "deterministic": deterministic})
    loss = (f if compiled else module)(*inputs)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in module.named_parameters()}
    grads |= {f"input{k}": x.grad.detach().clone() for k, x in enumerate(inputs) if x.requires_grad}
    return loss.detach(), grads


def assert_grads_match(module, inputs, n: int, deterministic: bool = False):
    """Panamera's loss and gradients in float64 against eager float64 (see the module doc)."""
    module = module.double()
    inputs = [x.double() if x.is_floating_point() else x for x in inputs]
    got_loss, got = step(module, inputs, True, deterministic)
    ref_loss, ref = step(module, inputs, False)
    tol = tolerance("float64", n)
    torch.testing.assert_close(got_loss, ref_loss, rtol=tol, atol=tol)
    assert got.keys() == ref.keys()
    for name in ref:
        scale = max(1.0, ref[name].abs().max().item())
        err = (got[name] - ref[name]).abs().max().item() / scale
        assert err <= tol, f"{name}: error {err:.3g} over {tol:.3g}"
    return got


def phases():
    return [r.phase for r in tb.stats().reports]


def backward_report():
    (r,) = [r for r in tb.stats().reports if r.phase == tb.Phase.BACKWARD]
    return r


def compiled_ops(report) -> set:
    return {op for s in report.subgraphs if s.kernels for op in s.ops}


def eager_reasons() -> set:
    return {NO_ANCHOR if r == NO_ANCHOR else r.split(":")[0] for (_, r) in tb.stats().eager}


class MLP(nn.Module):
    """Linear with bias, GELU, Linear, and a mean-squared loss."""

    def __init__(self, d=16, hidden=32):
        super().__init__()
        self.up, self.down = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return (self.down(F.gelu(self.up(x))) ** 2).mean()


def test_mlp_with_bias_and_gelu_trains():
    torch.manual_seed(0)
    assert_grads_match(MLP(), [torch.randn(12, 16)], n=32)
    assert phases() == [tb.Phase.FORWARD, tb.Phase.BACKWARD]
    bw = backward_report()
    assert "aten.sum.dim_IntList" in compiled_ops(bw) and bw.kernels >= 1, bw.describe()  # the bias gradients
    # the up-projection's bias gradient, a column sum, in one subgraph with GELU's backward (erf, exp)
    assert any({"aten.sum.dim_IntList", "aten.erf.default"} <= set(s.ops) for s in bw.subgraphs), bw.subgraphs
    assert not any("autograd" in r for r in eager_reasons())
    assert eager_reasons() <= {NO_ANCHOR, CONTRACTION}, tb.stats().describe()


class Norms(nn.Module):
    def __init__(self, d=24):
        super().__init__()
        self.ln, self.rms = nn.LayerNorm(d), nn.RMSNorm(d)

    def forward(self, x):
        return (self.rms(self.ln(x)) * torch.linspace(-1, 1, x.shape[-1], dtype=x.dtype)).sum()


def test_layer_norm_and_rms_norm_backward(monkeypatch):
    # planned for an H100 whose every launch pays the floor: there one launch beats two already at
    # these tiny rows (on H100 a queued second launch costs 0.1 us and tiny rows take two)
    floored = dataclasses.replace(H100, queued_launch_s=-1.0)
    monkeypatch.setattr(detect, "default_gpu", lambda: (floored, "H100-SXM5 whose launches each pay the floor"))
    torch.manual_seed(0)
    m = Norms()
    with torch.no_grad():
        m.ln.weight.uniform_(0.5, 1.5), m.ln.bias.uniform_(-1, 1), m.rms.weight.uniform_(0.5, 1.5)
    assert_grads_match(m, [torch.randn(3, 5, 24) * 3 + 1], n=24)
    bw = backward_report()
    assert not bw.eager, tb.stats().describe()  # dx, dgamma, dbeta: all Panamera kernels
    # one launch: both norms' row sums over the same rows stitched, dx, and the three parameter
    # gradients as column partials of that row kernel
    assert bw.kernels == 1, bw.describe()


class Norm(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return (self.norm(x) * torch.linspace(-2, 2, x.shape[-1], dtype=x.dtype)).pow(2).sum()


@pytest.mark.parametrize("deterministic", [False, True])
def test_layer_norm_backward_is_one_launch(monkeypatch, deterministic):
    """dx (its two row sums and the map), dgamma and dbeta (column sums) in one launch: isl finds
    dgamma and dbeta legal in dx's row kernel as column partials (poly/row_columns.py), the model
    prefers that one launch (schedule/row_columns.py), merged by one atomic per block per column
    or, deterministic, by partials the last block sums in block order."""
    from panamera.poly.program import build_program

    seen, compile_ = [], pn.compile
    monkeypatch.setattr(pn, "compile", lambda outputs, **kw: seen.append(outputs) or compile_(outputs, **kw))
    torch.manual_seed(0)
    m = Norm()
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5), m.norm.bias.uniform_(-1, 1)
    assert_grads_match(m, [torch.randn(48, 64) * 2 + 3], n=64, deterministic=deterministic)
    bw = backward_report()
    (sub,) = [s for s in bw.subgraphs if s.kernels]
    assert sub.kernels == 1 and not bw.eager, bw.describe()
    joins = [c for outs in seen if isinstance(outs, list) for c in build_program(tuple(outs)).column_candidates]
    assert [len(c.columns) for c in joins] == [2], joins  # dgamma and dbeta in dx's kernel


class Classifier(nn.Module):
    """Softmax, log_softmax and cross-entropy (mean, with ignored targets) over logits."""

    def __init__(self, d=16, classes=7):
        super().__init__()
        self.head = nn.Linear(d, classes)

    def forward(self, x, target):
        logits = self.head(x)
        ce = F.cross_entropy(logits, target, ignore_index=2)
        return ce + (F.softmax(logits, -1) ** 2).sum() + F.log_softmax(logits * 0.5, -1).mean()


def test_softmax_and_cross_entropy_backward():
    torch.manual_seed(0)
    target = torch.tensor([0, 2, 6, 1, 2, 3, 5, 6, 4])
    assert_grads_match(Classifier(), [torch.randn(9, 16), target], n=9)
    ops = compiled_ops(backward_report())
    assert "aten.nll_loss_backward.default" in ops, backward_report().describe()
    assert not any(e.op.startswith("aten.nll_loss") or "softmax" in e.op for e in backward_report().eager)


class Activations(nn.Module):
    def forward(self, x):
        return (
            (torch.relu(x) + F.silu(x) * torch.tanh(x) + torch.sigmoid(x) * F.gelu(x, approximate="tanh")).sum(-1).max()
        )


def test_activation_backwards():
    torch.manual_seed(0)
    assert_grads_match(Activations(), [torch.randn(6, 10)], n=10)
    assert "aten.threshold_backward.default" not in backward_report().eager_ops  # decomposed, then compiled


class Embed(nn.Module):
    """An embedding lookup with a padding row, then a sum of squares."""

    def __init__(self, rows=9, d=6):
        super().__init__()
        self.table = nn.Embedding(rows, d, padding_idx=4)

    def forward(self, ids):
        return (self.table(ids) ** 2 * torch.arange(ids.shape[-1], dtype=self.table.weight.dtype)[:, None]).sum()


@pytest.mark.parametrize("deterministic", [False, True])
def test_embedding_backward_with_repeated_ids(deterministic):
    torch.manual_seed(0)
    ids = torch.tensor([[1, 1, 4, 8, 1], [0, 8, 8, 4, 3]])  # repeats collide on rows 1 and 8; 4 is padding
    m = Embed()
    got = assert_grads_match(m, [ids], n=ids.numel(), deterministic=deterministic)
    assert not got["table.weight"][4].any()
    ops = compiled_ops(backward_report())
    assert "aten.embedding_dense_backward.default" in ops, backward_report().describe()
    if deterministic:  # ordered partials: the same bits every run
        assert torch.equal(got["table.weight"], step(m, [ids], True, deterministic=True)[1]["table.weight"])


class Block(nn.Module):
    """A pre-LayerNorm MLP block with a residual, and cross-entropy over a head."""

    def __init__(self, d=32, classes=10):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.head = nn.Linear(d, classes)

    def forward(self, x, target):
        h = x + self.down(F.gelu(self.up(self.norm(x))))
        return F.cross_entropy(self.head(h), target)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_low_precision_gradients_within_derived_tolerances(dtype):
    torch.manual_seed(0)
    m, x, target = Block().to(getattr(torch, dtype)), torch.randn(16, 32), torch.randint(0, 10, (16,))
    x = x.to(getattr(torch, dtype))
    got_loss, got = step(m, [x, target], True)
    eager_loss, eager = step(m, [x, target], False)
    ref_loss, ref = step(m.double(), [x.double(), target], False)  # the same (rounded) weights in float64
    tol = tolerance(dtype, 64)  # the longest reduction: the hidden width
    for name in ref:
        scale = max(1.0, ref[name].abs().max().item())
        err = (got[name].double() - ref[name]).abs().max().item() / scale
        eager_err = (eager[name].double() - ref[name]).abs().max().item() / scale
        assert got[name].dtype == eager[name].dtype
        assert err <= 2 * eager_err + tol, f"{name}: {err:.3g} against eager's {eager_err:.3g}"
    loss_err, eager_loss_err = (abs(v.item() - ref_loss.item()) for v in (got_loss, eager_loss))
    assert loss_err <= 2 * eager_loss_err + tol * max(1.0, abs(ref_loss.item()))


def test_a_new_shape_recompiles_forward_and_backward():
    torch.manual_seed(0)
    m = Block().double()
    for rows in (4, 6):  # the second shape: dynamo's dynamic graph, compiled over its symbols (issue 22)
        x, target = torch.randn(rows, 32).double(), torch.randint(0, 10, (rows,))
        (got_loss, got), (ref_loss, ref) = step(m, [x, target], True), step(m, [x, target], False)
        torch.testing.assert_close(got_loss, ref_loss, rtol=tolerance("float64", 64), atol=tolerance("float64", 64))
        for name in ref:
            torch.testing.assert_close(
                got[name], ref[name], rtol=tolerance("float64", 64), atol=tolerance("float64", 64)
            )
    s = tb.stats()
    assert [r.phase for r in s.reports] == [tb.Phase.FORWARD, tb.Phase.BACKWARD] * 2 and s.recompiles == 1
    assert s.reports[2].compile_id == s.reports[3].compile_id == "0/1"  # dynamo's dynamic graph, compiled once
    modes = sorted((r.phase, sub.mode) for r in s.reports[2:] for sub in r.subgraphs)
    assert modes == sorted((p, m) for p in (tb.Phase.FORWARD, tb.Phase.BACKWARD) for m in ("per-shape", "symbolic"))
    assert [name for name, _, why in s.specializations if "iota" in why] == ["panamera_0", "panamera_1"]  # nll_loss
    assert s.programs == s.symbolic_programs + len(s.specializations) + sum(
        1 for r in s.reports[:2] for sub in r.subgraphs if sub.kernels
    )


def test_a_backward_op_panamera_refuses_runs_eagerly_with_its_reason(monkeypatch):
    from panamera.torch_backend import aten

    def refuse(node, *args, **kwargs):
        raise pn.ShapeError("refused for the test")

    op = torch.ops.aten.nll_loss_backward.default
    monkeypatch.setitem(aten.TABLE, op, aten.Entry(aten.OpKind.ANCHOR, refuse))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pn.EagerFallbackWarning)
        assert_grads_match(Classifier(), [torch.randn(5, 16), torch.tensor([0, 1, 2, 3, 4])], n=5)
    bw = backward_report()
    refused = [e for e in bw.eager if e.op == str(op)]
    assert refused and all("refused for the test" in e.reason for e in refused), bw.eager
    assert any("refused for the test" in reason for (_, reason) in tb.stats().eager)


def test_every_op_left_to_eager_has_its_reason():
    torch.manual_seed(0)
    step(MLP().double(), [torch.randn(4, 16).double()], True)
    listed = tb.stats().eager
    assert listed and all(reason for (_, reason) in listed)
    assert any(op == "aten.addmm.default" and reason.startswith(CONTRACTION) for (op, reason) in listed)
    assert "eager: aten.addmm.default" in tb.stats().describe()


def test_compiles_are_logged(caplog):
    with caplog.at_level(logging.DEBUG, logger="panamera.torch"):
        step(MLP().double(), [torch.randn(4, 16).double()], True)
    messages = [r.getMessage() for r in caplog.records if r.name == "panamera.torch"]
    assert any(m.startswith("forward graph") for m in messages) and any(
        m.startswith("backward graph") for m in messages
    )
    assert any("in eager PyTorch: a contraction" in m for m in messages)


def test_modes_are_accepted_with_their_meaning_and_unknown_ones_refused():
    f = torch.compile(lambda x: torch.softmax(x, -1).sum(), backend="panamera", mode="reduce-overhead")
    with pytest.warns(pn.PanameraWarning, match="reduce-overhead.*resident workspace"), torch.no_grad():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pn.EmulatorWarning)
            f(torch.randn(3, 8))
    g = torch.compile(lambda x: x.sum(), backend="panamera", mode="fastest")
    with pytest.raises(Exception, match="unknown mode 'fastest'; use one of 'default', 'reduce-overhead'"):
        g(torch.randn(3))


# -- one training step of small models, built from configs with random weights ---------------------
class TinyResNet(nn.Module):
    """A stem and one residual block: convolutions (eager), BatchNorm in training mode and ReLU
    (Panamera: batch statistics forward, per-channel sums backward), global pooling, a head."""

    def __init__(self, c=8, classes=5):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c)
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, classes)

    def forward(self, x, y):
        h = F.relu(self.bn(self.stem(x)))
        h = F.relu(h + self.b2(self.c2(F.relu(self.b1(self.c1(h))))))
        return F.cross_entropy(self.fc(h.mean((2, 3))), y)


class MobileNet(nn.Module):
    """A MobileNet-v3-like net: an inverted residual block (1x1 expand, depthwise 3x3, squeeze-excite
    with hard-sigmoid, 1x1 project), BatchNorm in training mode, hard-swish, pooling, a head."""

    def __init__(self, c=8, e=16, classes=5):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.expand, self.b1 = nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e)
        self.dw, self.b2 = nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False), nn.BatchNorm2d(e)
        self.se1, self.se2 = nn.Conv2d(e, 4, 1), nn.Conv2d(4, e, 1)
        self.project, self.b3 = nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, classes)

    def forward(self, x, y):
        x = F.hardswish(self.bn(self.stem(x)))
        h = F.hardswish(self.b2(self.dw(F.hardswish(self.b1(self.expand(x))))))
        h = h * F.hardsigmoid(self.se2(F.relu(self.se1(h.mean((2, 3), keepdim=True)))))
        return F.cross_entropy(self.fc((x + self.b3(self.project(h))).mean((2, 3))), y)


class WideDeep(nn.Module):
    """A Wide&Deep-like recommender: a wide part (one weight per id, summed) and a deep part
    (embeddings of each field concatenated with dense features, an MLP), logistic loss."""

    def __init__(self, vocab=20, fields=3, d=8, dense=5):
        super().__init__()
        self.emb, self.wide = nn.Embedding(vocab, d), nn.Embedding(vocab, 1)
        self.deep = nn.Sequential(nn.Linear(fields * d + dense, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, ids, dense, y):
        deep = self.deep(torch.cat([self.emb(ids).flatten(1), dense], 1)).squeeze(1)
        return F.binary_cross_entropy_with_logits(deep + self.wide(ids).sum((1, 2)), y)


class HF(nn.Module):
    """A transformers model as a loss function of its inputs (labels included)."""

    def __init__(self, model, *keys):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *args):
        return self.model(**dict(zip(self.keys, args))).loss


def gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=1, n_positions=16, vocab_size=50,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")  # fmt: skip
    ids = torch.randint(0, 50, (2, 8))
    return HF(transformers.GPT2LMHeadModel(cfg), "input_ids", "labels"), [ids, ids]


def bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64,
                                  vocab_size=50, max_position_embeddings=16, num_labels=3, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, attn_implementation="eager")  # fmt: skip
    return HF(transformers.BertForSequenceClassification(cfg), "input_ids", "labels"), [
        torch.randint(0, 50, (2, 8)),
        torch.tensor([0, 2]),
    ]


MODELS = {
    "mlp": lambda: (Block(), [torch.randn(8, 32), torch.randint(0, 10, (8,))]),
    "resnet": lambda: (TinyResNet(), [torch.randn(2, 3, 6, 6), torch.randint(0, 5, (2,))]),
    "mobilenet": lambda: (MobileNet(), [torch.randn(2, 3, 6, 6), torch.randint(0, 5, (2,))]),
    "widedeep": lambda: (WideDeep(), [torch.randint(0, 20, (6, 3)), torch.randn(6, 5), torch.rand(6).round()]),
    "gpt2": gpt2,
    "bert": bert,
}
# GPT-2's loss upcasts the logits to float32 (transformers' ForCausalLMLoss): its loss and every
# gradient carry float32 rounding of a softmax over the vocabulary, in eager PyTorch as here.
# Eager PyTorch's CPU hardsigmoid_backward scales by 1/6 rounded to float32 even in float64 (a
# relative error near 1e-8 that Panamera, through torch's decomposition, does not make).
DTYPE_OF_LOSS = {"gpt2": ("float32", 50), "mobilenet": ("float32", 1)}


@pytest.mark.parametrize("name", list(MODELS))
def test_one_training_step_of_a_small_model(name):
    torch.manual_seed(0)
    module, inputs = MODELS[name]()
    dtype, n = DTYPE_OF_LOSS.get(name, ("float64", 64))
    module = module.double()
    inputs = [x.double() if x.is_floating_point() else x for x in inputs]
    before = {k: v.clone() for k, v in module.state_dict().items()}
    got_loss, got = step(module, inputs, True)
    got_buffers = {k: v.clone() for k, v in module.state_dict().items()}
    module.load_state_dict(before)
    ref_loss, ref = step(module, inputs, False)
    tol = tolerance(dtype, n)
    torch.testing.assert_close(got_loss, ref_loss, rtol=tol, atol=tol)
    for key in ref:
        scale = max(1.0, ref[key].abs().max().item())
        assert (got[key] - ref[key]).abs().max().item() <= tol * scale, key
    for key, value in module.state_dict().items():  # BatchNorm's running statistics
        torch.testing.assert_close(got_buffers[key], value, rtol=tol, atol=tol)
    reports = tb.stats().reports
    assert {r.phase for r in reports} == {tb.Phase.FORWARD, tb.Phase.BACKWARD}
    assert sum(r.kernels for r in reports if r.phase == tb.Phase.BACKWARD) >= 2, tb.stats().describe()
    assert all(reason for (_, reason) in tb.stats().eager)
    assert not any("stays eager" in reason for (_, reason) in tb.stats().eager), tb.stats().describe()


def _graph(fn):
    gm = torch.fx.symbolic_trace(fn)
    return gm, {n.name: n for n in gm.graph.nodes}


def test_grow_refuses_a_node_that_would_make_a_cycle():  # precondition 2
    from panamera.torch_backend.partition import convex_with

    def f(x, w):
        a = torch.relu(x)
        return ((a @ w) * a).sum()

    gm, n = _graph(f)
    part = {n["mul"], n["sum_1"]}
    assert convex_with(part, n["relu"]) is False  # relu -> matmul (eager) -> mul: out of the set and back
    assert convex_with({n["sum_1"]}, n["mul"]) is True


def test_grow_takes_a_view_only_as_a_producer(monkeypatch):  # precondition 3 (and 1: only free nodes move)
    from torch.fx.passes.infra.partitioner import Partition

    from panamera.torch_backend import partition as P

    def f(x):
        s = x.sum(0)
        return s.t(), s * 2

    gm, n = _graph(f)
    monkeypatch.setattr(P, "why_unsupported", lambda node: None if node.op == "call_function" else "not a call")
    monkeypatch.setattr(P, "kind_of", lambda node: P.OpKind.VIEW if node.name == "t" else P.OpKind.ELEMENTWISE)
    part = Partition(0, [n["sum_1"]])
    P.grow(gm, [part])
    assert n["mul"] in part.nodes and n["t"] not in part.nodes
    assert n["x"] not in part.nodes and n["output"] not in part.nodes


def test_torch_logs_shows_the_backend():
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import torch, panamera\n"
        "f = torch.compile(lambda x: torch.softmax(x, -1).sum(), backend='panamera', options={'target': 'emulator'})\n"
        "f(torch.randn(3, 8, requires_grad=True)).backward()\n"
    )
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "TORCH_LOGS": "+panamera", "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "forward graph" in run.stderr and "backward graph" in run.stderr, run.stderr[-2000:]


class Indexing(nn.Module):
    """Tensor indexing (negative ids included), index_select and gather: gathers forward,
    scatter-adds backward (index_put with accumulate, index_add, scatter_add)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        idx = torch.tensor([0, 2, 2, -1, 0, 5])
        picked = torch.gather(x, 1, torch.tensor([[0], [3], [3], [1], [0], [2]]))
        return ((x[idx] * self.w) ** 2).sum() + x.index_select(0, idx.abs()).exp().sum() + (picked**3).sum()


def test_indexing_backward_scatter_adds():
    torch.manual_seed(0)
    assert_grads_match(Indexing(), [torch.randn(6, 4)], n=6)
    bw = backward_report()
    ops = compiled_ops(bw)
    assert {"aten.index_put.default", "aten.index_add.default", "aten.scatter_add.default"} <= ops, bw.describe()
    assert not bw.eager, bw.describe()


class Lookup(nn.Module):
    def __init__(self, rows, d):
        super().__init__()
        self.table = nn.Embedding(rows, d)

    def forward(self, ids):
        return (self.table(ids) ** 2).sum()


@pytest.mark.parametrize("deterministic", [False, True])
def test_a_large_embedding_backward_is_an_atomic_scatter_or_sorted_segments_when_deterministic(deterministic):
    """5000 x 512 x 64 is over the owner-computes terms: the atomic indirect write (or sorted
    segments, the model's choice) computes it; a deterministic compile refuses atomics in any
    order and takes sorted segments, the node in a partition of its own (torch_backend/isolate.py)."""
    torch.manual_seed(0)
    m, ids = Lookup(5000, 64), torch.randint(0, 5000, (512,))
    got = step(m, [ids], True, deterministic)[1]["table.weight"]
    ref = step(m, [ids], False)[1]["table.weight"]
    tol = tolerance("float32", 512)
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol * ref.abs().max().item())
    bw = backward_report()
    assert "aten.embedding_dense_backward.default" in compiled_ops(bw), bw.describe()
    if deterministic:
        assert torch.equal(got, step(m, [ids], True, deterministic)[1]["table.weight"])


_TARGET = torch.tensor([1, 0, 3, 19, 5, 2])
_BITS = (torch.arange(120).reshape(6, 20) % 3 == 0).double()
LOSSES = {  # loss functions of x (6, 20): each reduction family's backward, in several layouts
    "group_norm": lambda x: (F.group_norm(x.reshape(2, 6, 10), 2) ** 2).sum(),
    "layer_norm 2d": lambda x: (F.layer_norm(x.reshape(6, 4, 5), (4, 5)) ** 3).sum(),
    "softmax dim 0": lambda x: (F.softmax(x, 0) * torch.arange(20.0, dtype=x.dtype)).sum(),
    "log_softmax middle dim": lambda x: (F.log_softmax(x.reshape(3, 2, 20), 1) ** 2).sum(),
    "var, std, var_mean": lambda x: x.var(1).sum() + x.std(0).sum() + torch.var_mean(x, 1)[1].sum(),
    "amax, max.dim, logsumexp": lambda x: x.amax(1).sum() + x.max(0).values.sum() + x.logsumexp(1).sum(),
    "kl_div, binary_cross_entropy": lambda x: (
        F.kl_div(F.log_softmax(x, 1), F.softmax(x.flip(1), 1), reduction="batchmean")
        + F.binary_cross_entropy(torch.sigmoid(x), _BITS)
    ),
    "cross_entropy, label smoothing": lambda x: F.cross_entropy(x, _TARGET, label_smoothing=0.1),
    "prod, norm, where": lambda x: (
        (x * 0.1 + 1).prod(1).sum() + x.norm(dim=1).sum() + torch.where(x > 0, x, 2 * x).sum()
    ),
}


class Loss(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("name", list(LOSSES))
def test_reduction_family_backwards(name):
    torch.manual_seed(0)
    assert_grads_match(Loss(LOSSES[name]), [torch.randn(6, 20)], n=20)
    assert tb.stats().kernels >= 1
    assert not any("stays eager" in reason for (_, reason) in tb.stats().eager), tb.stats().describe()
