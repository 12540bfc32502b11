"""A deterministic embedding gradient too large for owner computes, through
`torch.compile(backend="panamera")`: its node gets a partition of its own
(torch_backend/isolate.py) and Panamera's sorted-segment scatter-add computes it, bit-identical
run to run, under `deterministic=True` and under `torch.use_deterministic_algorithms(True)`;
gradients in float64 against eager PyTorch (tests/test_torch_training.py's tolerances)."""

import pytest
from conftest import tolerance

torch = pytest.importorskip("torch")
nn = torch.nn

import panamera.torch_backend as tb  # noqa: E402
from panamera.frontend.scatter import MAX_TERMS  # noqa: E402

ROWS, D = 4096, 520  # 4096 rows x 32 ids x 520 values: over MAX_TERMS, so owner computes is not offered
IDS = torch.tensor([[1, 1, 4, 8, 1, 4095, 3, 3], [0, 8, 8, 4, 3, 2, 2, 1], [7, 7, 7, 7, 5, 6, 1, 0], [9] * 8])


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(ROWS, D, padding_idx=4)

    def forward(self, ids):  # the gradient reaching the table is computed: the partition holds its producer
        return (self.table(ids) ** 2 * torch.arange(ids.shape[-1], dtype=self.table.weight.dtype)[:, None]).sum()


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def grad(m, compiled: bool, deterministic: bool):
    m.zero_grad(set_to_none=True)
    opts = {"target": "emulator", "deterministic": deterministic}
    f = torch.compile(m, backend="panamera", options=opts) if compiled else m
    f(IDS).backward()
    return m.table.weight.grad.detach().clone()


def backward_subgraphs():
    (r,) = [r for r in tb.stats().reports if r.phase == tb.Phase.BACKWARD]
    return r


@pytest.mark.parametrize("how", ["option", "torch_flag"])
def test_a_large_deterministic_embedding_gradient_is_sorted_segments(how):
    assert ROWS * IDS.numel() * D > MAX_TERMS
    torch.manual_seed(0)
    m = Embed().double()
    want = grad(m, False, False)
    flag = how == "torch_flag"
    if flag:
        torch.use_deterministic_algorithms(True)
    try:
        got = grad(m, True, not flag)
        r = backward_subgraphs()
        again = grad(m, True, not flag)
    finally:
        if flag:
            torch.use_deterministic_algorithms(False)
    alone = [s for s in r.subgraphs if s.ops == ("aten.embedding_dense_backward.default",)]
    assert len(alone) == 1 and alone[0].kernels, r.describe()  # its own partition, compiled
    tol = tolerance("float64", 4)  # the longest segment: row 7's four ids
    assert ((got - want).abs().max() / max(1.0, want.abs().max())).item() <= tol
    assert not got[4].any() and torch.equal(got, again)


def test_without_deterministic_the_embedding_gradient_stays_in_its_partition():
    torch.manual_seed(0)
    m = Embed().double()
    want = grad(m, False, False)
    got = grad(m, True, False)
    r = backward_subgraphs()
    assert not [s for s in r.subgraphs if s.ops == ("aten.embedding_dense_backward.default",)], r.describe()
    assert ((got - want).abs().max() / max(1.0, want.abs().max())).item() <= tolerance("float64", 4)


def test_isolation_preconditions():
    """torch_backend/isolate.py: one negative case per precondition, on a traced graph."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.infra.partitioner import Partition

    from panamera.torch_backend.isolate import isolate_sorted_scatters, movable
    from panamera.torch_backend.partition import anchored

    def f(g, ids, w, g_small, ids_small):
        big = torch.ops.aten.embedding_dense_backward(g, ids, ROWS, -1, False)
        freq = torch.ops.aten.embedding_dense_backward(g, ids, ROWS, -1, True)
        small = torch.ops.aten.embedding_dense_backward(g_small, ids_small, 64, -1, False)
        return big + w, freq, small

    args = (torch.randn(32, D), torch.randint(0, ROWS, (32,)), torch.randn(ROWS, D), torch.randn(8, 4))
    gm = make_fx(f, tracing_mode="fake")(*args, torch.randint(0, 64, (8,)))
    big, freq, small, add = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert movable(big)
    assert not movable(freq)  # (2) scale_grad_by_freq
    assert not movable(small)  # (3) owner computes takes it
    part = Partition(nodes=[big])
    assert isolate_sorted_scatters([part], False, anchored) == [part]  # (1) not deterministic
    pieces = isolate_sorted_scatters([Partition(nodes=[big, add])], True, anchored)  # read inside: cut after it
    assert [list(p.nodes) for p in pieces] == [[big], [add]]
