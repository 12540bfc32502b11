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


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    tb.reset_stats()
    yield
    torch._dynamo.reset()


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
