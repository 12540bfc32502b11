"""Index ops the backend does not lower, through `torch.compile(backend="panamera")`: each stays in
eager PyTorch (the graph's report lists it), so an id in range gives eager's result and an id out of
range gives eager's own error, never a wrong answer (torch_backend/bounds.py checks the ops the
backend does lower: tests/test_torch_index_bounds.py).

What eager checks, in PyTorch's aten/src/ATen/native/ (read at github:pytorch/pytorch):
- nll_loss2d (cross_entropy of [N, C, H, W]): LossNLL2d.cpp, nll_loss2d_forward_out_frame,
  TORCH_CHECK_INDEX(cur_target >= 0 && cur_target < n_classes, "Target ", cur_target, " is out of bounds.")
  for every target that is not ignore_index;
- aten.index / index_put with several index tensors (broadcast together, None entries between):
  TensorAdvancedIndexing.cpp / cpu/IndexKernel.cpp, "index {i} is out of bounds for dimension {d} with size {n}";
- scatter (src and value forms): cpu/ScatterGatherKernel.cpp, the same message as a RuntimeError;
- index_copy: cpu/IndexKernel.cpp, TORCH_CHECK_INDEX "index_copy_(): index {i} is out of bounds ...";
- index_fill: cpu/IndexKernel.cpp, "index {i} is out of bounds for dimension {d} with size {n}";
- embedding_bag: EmbeddingBag.cpp, "embedding_bag: Expected idx >= 0 && idx < num_embeddings" for the
  ids and "offsets[-1] can not be greater than input's length" (offsets[0] must be 0) for the offsets;
- take: cpu/IndexKernel.cpp, "out of range: tried to access index {i} on a tensor of {n} elements.";
- scatter_reduce other than a sum (the backend takes "sum" with include_self only).
"""

import pytest

torch = pytest.importorskip("torch")

from conftest import tolerance  # noqa: E402

import panamera.torch_backend as tb  # noqa: E402
from panamera.errors import IndexRangeError  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
F = torch.nn.functional
R, D = 6, 5
W = torch.randn(R, D, dtype=torch.float64)
W3 = torch.randn(R, 3, D, dtype=torch.float64)
X4, TARGETS = (
    torch.randn(2, R, 3, 4, dtype=torch.float64),
    (torch.arange(24).reshape(2, 3, 4) % R).masked_fill_(
        torch.arange(24).reshape(2, 3, 4) == 5,
        -100,  # an ignored target
    ),
)


def rows(ids):
    return torch.ones(ids.shape[0], D, dtype=torch.float64)


def along(ids):
    return ids.reshape(-1, 1).expand(-1, D)


# name: (function, eager's op in the ATen graph, arguments in range, arguments with one id out of range)
CASES = {
    "nll_loss2d": (
        lambda x, t: F.cross_entropy(x, t),
        "aten.nll_loss2d_forward.default",
        (X4, TARGETS),
        (X4, TARGETS.masked_fill(torch.arange(24).reshape(2, 3, 4) == 17, R)),
    ),
    "index_two_tensors": (
        lambda w, a, b: (w[a, b] * 2).sum(),
        "aten.index.Tensor",
        (W, torch.tensor([0, 5, -1]), torch.tensor([1, 4, -5])),
        (W, torch.tensor([0, 5, 1]), torch.tensor([1, D, 4])),
    ),
    "index_broadcast_and_none": (  # w3[a[:, None], :, b[None, :]]: two tensors broadcast, a None between
        lambda w, a, b: w[a[:, None], :, b[None, :]].softmax(-1),
        "aten.index.Tensor",
        (W3, torch.tensor([0, 5, 2]), torch.tensor([1, 4])),
        (W3, torch.tensor([0, R, 2]), torch.tensor([1, 4])),
    ),
    "index_put_two_tensors": (
        lambda w, a, b: torch.ops.aten.index_put(w, [a, b], torch.ones(a.shape[0], dtype=w.dtype), True).sum(-1),
        "aten.index_put.default",
        (W, torch.tensor([0, 1, 5]), torch.tensor([1, 2, 4])),
        (W, torch.tensor([0, 1, 5]), torch.tensor([1, D, 4])),
    ),
    "index_put_no_accumulate": (
        lambda w, ids: torch.ops.aten.index_put(w, [ids], rows(ids)).softmax(-1),
        "aten.index_put.default",
        (W, torch.tensor([0, 5, -1])),
        (W, torch.tensor([0, R, 2])),
    ),
    "scatter_src": (
        lambda w, ids: w.scatter(0, along(ids), rows(ids)).softmax(-1),
        "aten.scatter.src",
        (W, torch.tensor([0, 5, 2])),
        (W, torch.tensor([0, R, 2])),
    ),
    "scatter_value": (
        lambda w, ids: w.scatter(0, along(ids), 2.0).softmax(-1),
        "aten.scatter.value",
        (W, torch.tensor([0, 5, 2])),
        (W, torch.tensor([0, -1, 2])),
    ),
    "scatter_reduce_amax": (
        lambda w, ids: w.scatter_reduce(0, along(ids), rows(ids), "amax").softmax(-1),
        "aten.scatter_reduce.two",
        (W, torch.tensor([0, 5, 2])),
        (W, torch.tensor([0, R, 2])),
    ),
    "index_copy": (
        lambda w, ids: w.index_copy(0, ids, rows(ids)).softmax(-1),
        "aten.index_copy.default",
        (W, torch.tensor([0, 5, 2])),
        (W, torch.tensor([0, R, 2])),
    ),
    "index_fill": (
        lambda w, ids: w.index_fill(0, ids, 2.0).softmax(-1),
        "aten.index_fill.int_Scalar",
        (W, torch.tensor([0, 5, -1])),
        (W, torch.tensor([0, R, 2])),
    ),
    "embedding_bag_ids": (
        lambda w, ids, off: F.embedding_bag(ids, w, off).softmax(-1),
        "aten._embedding_bag_forward_only.default",
        (W, torch.tensor([0, 5, 2, 1]), torch.tensor([0, 2])),
        (W, torch.tensor([0, 5, R, 1]), torch.tensor([0, 2])),
    ),
    "embedding_bag_offsets": (
        lambda w, ids, off: F.embedding_bag(ids, w, off).softmax(-1),
        "aten._embedding_bag_forward_only.default",
        (W, torch.tensor([0, 5, 2, 1]), torch.tensor([0, 4])),
        (W, torch.tensor([0, 5, 2, 1]), torch.tensor([0, 5])),
    ),
    "take": (
        lambda w, ids: torch.take(w, ids).sum(),
        "aten.take.default",
        (W, torch.tensor([0, R * D - 1, -1])),
        (W, torch.tensor([0, R * D, 2])),
    ),
}


def compiled(f):
    return torch.compile(f, backend="panamera", options={"target": "cpu"}, dynamic=False)


def _error(f, args):
    with pytest.raises((IndexError, RuntimeError)) as info:
        f(*args)
    return info


@pytest.mark.parametrize("name", list(CASES))
def test_an_index_op_the_backend_leaves_to_eager_gives_eager_results_and_errors(name):
    f, op, good, bad = CASES[name]
    tol = tolerance("float64", sum(a.numel() for a in good))  # every input value: a bound on any reduction's length
    torch.testing.assert_close(compiled(f)(*good), f(*good), rtol=tol, atol=tol)
    (report,) = tb.stats().reports
    assert report.subgraphs, name  # the rest of the graph compiled: the op stays eager beside it
    assert op in report.eager_ops, (name, report.eager_ops)
    want = _error(f, bad)
    got = _error(compiled(f), bad)
    assert not isinstance(got.value, IndexRangeError), name  # eager's own check raised, as without the backend
    assert (type(got.value), str(got.value)) == (type(want.value), str(want.value))


def test_embedding_bag_training_raises_in_eager_forward_before_the_compiled_backward():
    """EmbeddingBag's backward (_embedding_bag_backward) is a Panamera scatter-add that would drop an
    id out of range; its forward (_embedding_bag) stays eager and refuses the id first."""
    f = compiled(lambda w, ids, off: F.embedding_bag(ids, w, off, mode="mean").softmax(-1).square().sum())
    w = W.clone().requires_grad_()
    ids, off = torch.tensor([0, 5, 2, 1, 5]), torch.tensor([0, 2])
    f(w, ids, off).backward()
    ref = W.clone().requires_grad_()
    F.embedding_bag(ids, ref, off, mode="mean").softmax(-1).square().sum().backward()
    tol = tolerance("float64", w.numel())
    torch.testing.assert_close(w.grad, ref.grad, rtol=tol, atol=tol)
    assert any("aten._embedding_bag_backward.default" in s.ops for r in tb.stats().reports for s in r.subgraphs)
    for bad_ids, bad_off in ((torch.tensor([0, 5, R, 1, 5]), off), (ids, torch.tensor([0, 6]))):
        want = _error(F.embedding_bag, (bad_ids, ref, bad_off, None, 2, False, "mean"))
        got = _error(f, (w, bad_ids, bad_off))
        assert (type(got.value), str(got.value)) == (type(want.value), str(want.value))
