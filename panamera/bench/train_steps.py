"""One training step (forward, backward, SGD update) of small BERT, GPT-2 and ResNet configs through
`torch.compile(model, backend="panamera")` on the emulator: issue 23 item 4's table, the paper's
Table 3 in spirit, modeled. Per model: the loss and the largest gradient error against eager
PyTorch, Panamera's kernels per step (forward + backward graphs), the ATen ops left to eager (matmuls,
convolutions, views...), and the modeled memory-bound time per step of the subgraphs Panamera
compiles, against the same subgraphs run as eager PyTorch runs them: one kernel per ATen op, each
reading its tensor arguments and writing its outputs once (`partition.op_traffic`), modeled by the
same model (model/) as one call per subgraph. The ops left to eager are in neither time.

`panamera bench --suite steps` prints the table (about a minute on two CPU cores; random weights
from configs; needs torch, and transformers for BERT and GPT-2).

>>> sorted(MODELS)
['bert', 'gpt2', 'resnet']
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ..model.estimate import estimate
from ..model.gpu import H100, GPUSpec
from .eager_peer import aten_elementwise


def _resnet():
    import torch
    from torch import nn
    from torch.nn import functional as F

    class ResNet(nn.Module):
        """A stem and two residual blocks (convolutions, BatchNorm in training mode, ReLU), pooling, a head."""

        def __init__(self, c=16, classes=10):
            super().__init__()
            self.stem, self.bn = nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.blocks = nn.ModuleList(
                nn.ModuleList(
                    [
                        nn.Conv2d(c, c, 3, padding=1, bias=False),
                        nn.BatchNorm2d(c),
                        nn.Conv2d(c, c, 3, padding=1, bias=False),
                        nn.BatchNorm2d(c),
                    ]
                )  # fmt: skip
                for _ in range(2)
            )
            self.fc = nn.Linear(c, classes)

        def forward(self, x, y):
            h = F.relu(self.bn(self.stem(x)))
            for c1, b1, c2, b2 in self.blocks:
                h = F.relu(h + b2(c2(F.relu(b1(c1(h))))))
            return F.cross_entropy(self.fc(h.mean((2, 3))), y)

    return ResNet(), [torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))]


class _HF:
    """A transformers model as a loss function of its inputs (labels included)."""

    @staticmethod
    def wrap(model, *keys):
        from torch import nn

        class Loss(nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                return self.model(**dict(zip(keys, args))).loss

        return Loss()


def _gpt2():
    import torch
    import transformers

    cfg = transformers.GPT2Config(n_embd=64, n_head=4, n_layer=2, n_positions=32, vocab_size=256, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager", bos_token_id=0,
                                  eos_token_id=0)  # fmt: skip
    ids = torch.randint(0, 256, (2, 32))
    return _HF.wrap(transformers.GPT2LMHeadModel(cfg), "input_ids", "labels"), [ids, ids]


def _bert():
    import torch
    import transformers

    cfg = transformers.BertConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=256,
                                  vocab_size=256, max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, attn_implementation="eager")  # fmt: skip
    return _HF.wrap(transformers.BertForSequenceClassification(cfg), "input_ids", "labels"), [
        torch.randint(0, 256, (2, 32)),
        torch.tensor([0, 2]),
    ]


MODELS: dict[str, Callable] = {"bert": _bert, "gpt2": _gpt2, "resnet": _resnet}


@dataclass(frozen=True)
class StepRow:
    """One model's training step, as the table prints it."""

    model: str
    kernels: int  # Panamera kernels per step (forward + backward)
    subgraphs: int
    eager_ops: int  # ATen ops left to eager PyTorch
    panamera_us: float  # modeled, the compiled subgraphs
    eager_us: float  # modeled, the same subgraphs one kernel per ATen op
    eager_kernels: int
    loss_error: float
    grad_error: float  # the largest gradient error over max(1, its tensor's largest value), as the tests scale it
    note: str = ""

    @property
    def speedup(self) -> float:
        return self.eager_us / self.panamera_us if self.panamera_us else float("nan")


def eager_us(traffic, gpu: GPUSpec) -> tuple[float, int]:
    """Modeled µs and kernels of one subgraph run as eager PyTorch runs it: a vectorized kernel per
    ATen op that moves bytes (aten_elementwise's launch rule), one call."""
    launches = [aten_elementwise(op, max(r, w) // 4 or 1, r, w, 4) for op, r, w in traffic if r or w]
    return (estimate(launches, gpu).total_us if launches else 0.0), len(launches)


def _step(module, inputs, compiled: bool):
    import torch

    module.zero_grad(set_to_none=True)
    f = torch.compile(module, backend="panamera", options={"target": "emulator"}) if compiled else module
    loss = f(*inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
    with torch.no_grad():  # the optimizer step (SGD) stays in eager PyTorch: no graph is captured for it
        for p in module.parameters():
            if p.grad is not None:
                p -= 1e-3 * p.grad
    return loss.detach(), grads


def run_model(name: str, gpu: GPUSpec = H100) -> StepRow:
    """One training step of MODELS[name] through the backend, checked against eager PyTorch."""
    import torch

    import panamera.torch_backend as tb

    torch.manual_seed(0)
    module, inputs = MODELS[name]()
    state = {k: v.clone() for k, v in module.state_dict().items()}
    torch._dynamo.reset()
    tb.reset_stats()
    loss, grads = _step(module, inputs, True)
    reports = list(tb.stats().reports)
    module.load_state_dict(state)
    ref_loss, ref = _step(module, inputs, False)
    torch._dynamo.reset()
    err = max(((grads[k] - ref[k]).abs().max() / ref[k].abs().max().clamp_min(1.0)).item() for k in ref)
    subs = [s for r in reports for s in r.subgraphs if s.kernels]
    modeled = [eager_us(s.traffic, gpu) for s in subs]
    return StepRow(
        name, sum(s.kernels for s in subs), len(subs), sum(len(r.eager) for r in reports),
        sum(s.modeled_us for s in subs), sum(us for us, _ in modeled), sum(k for _, k in modeled),
        abs(loss - ref_loss).item(), err,
    )  # fmt: skip


def table(rows: list[StepRow], gpu: GPUSpec = H100) -> str:
    """The markdown table of `rows`."""
    lines = [
        f"## Training steps (issue 23 item 4; modeled on {gpu.name}, run on the emulator)",
        "",
        'Forward and backward graphs through `torch.compile(backend="panamera")`; **times are modeled**, of the',
        "subgraphs Panamera compiles (ops left to eager are in neither column); eager = the same subgraphs one kernel",
        "per ATen op. Errors: float32 step against eager PyTorch.",
        "",
        "| model | Panamera kernels/step | subgraphs | ops left to eager | Panamera us | eager (1 kernel/op) us "
        "| eager kernels | speedup | loss err | max grad err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.note:
            lines.append(f"| {r.model} | - | - | - | - | - | - | - | - | {r.note} |")
            continue
        lines.append(
            f"| {r.model} | {r.kernels} | {r.subgraphs} | {r.eager_ops} | {r.panamera_us:.1f} | {r.eager_us:.1f} | "
            f"{r.eager_kernels} | {r.speedup:.2f}x | {r.loss_error:.1e} | {r.grad_error:.1e} |"
        )
    return "\n".join(lines) + "\n"


def run_steps(names=None, gpu: GPUSpec = H100) -> tuple[list[StepRow], str]:
    """Every model's row (a model whose library is missing gets a note) and the table."""
    rows = []
    quiet = logging.getLogger("panamera.torch")  # one INFO line per compiled graph: the table says it all
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        for name in names or MODELS:
            try:
                rows.append(run_model(name, gpu))
            except ImportError as e:
                rows.append(StepRow(name, 0, 0, 0, 0.0, 0.0, 0, 0.0, 0.0, note=f"not run: {e}"))
    finally:
        quiet.setLevel(level)
    return rows, table(rows, gpu)
