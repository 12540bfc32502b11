"""The backward pass's ATen ops: what torch's decomposition tables lower, and the ops Panamera
builds itself.

AOTAutograd traces the joint forward-backward graph with `DECOMPOSITIONS` (from torch's own
`torch._decomp` tables), so the backward of GELU, SiLU, tanh, sigmoid, ReLU (`threshold_backward`),
softmax, log_softmax, LayerNorm, GroupNorm and BatchNorm (and BatchNorm's training forward)
arrive as element-wise ops and `sum.dim_IntList` reductions, which aten.TABLE already holds:
each bias gradient, each dgamma/dbeta, each softmax row sum is a Panamera reduction fused with
its element-wise producers. Two ops are built here instead, because their decompositions write
through an index tensor (`scatter`, `index_put(accumulate=True)`):

- `nll_loss_backward`: the one-hot gradient `where(class == target, -g / total_weight, 0)`, an
  element-wise op of the class iota (no scatter);
- `embedding_dense_backward` (and EmbeddingBag's `_embedding_bag_backward`): the rows of the
  gradient added by token id, repeated ids included, through frontend/scatter.py: owner computes
  (a column reduction over tokens; one atomic per block, or ordered partials when deterministic)
  or the atomic indirect write (one atomic add per element, any table size), the cost model's
  choice; a deterministic compile never takes the atomic one (and a table too large for owner
  computes then stays in eager PyTorch, with that reason).

Indexing is built here too: `index` (one index tensor), `index_select` and `gather` as gathers
(pn.take, pn.take_along_axis), and their backwards `index_put(accumulate=True)` and `index_add`
as the same scatter-adds of rows, `scatter_add` as the same two forms along an axis; each check
refuses, with its reason, a call outside what the builder computes (several index tensors, a bool
mask, an index smaller than the input). The kernels clamp (gathers) or drop (scatter-adds) an id
outside the range; eager torch raises there, and so do compiled partitions: torch_backend/bounds.py
checks each index argument against the range eager enforces before the partition runs.

>>> import torch  # doctest: +SKIP
>>> torch.ops.aten.gelu_backward.default in DECOMPOSITIONS  # doctest: +SKIP
True
"""

from __future__ import annotations

import torch
from torch._decomp import get_decompositions

import panamera as pn

from ..frontend.scatter import scatter_add_along, scatter_add_rows
from .aten import meta, out_dtype

aten = torch.ops.aten

# Backward ops (and BatchNorm's training forward) lowered by torch's decompositions into
# element-wise ops and sum reductions, all in aten.TABLE.
DECOMPOSED = (
    aten.gelu_backward,
    aten.silu_backward,
    aten.tanh_backward,
    aten.sigmoid_backward,
    aten.threshold_backward,
    aten.leaky_relu_backward,
    aten.elu_backward,
    aten.hardsigmoid_backward,
    aten.hardswish_backward,
    aten.softplus_backward,
    aten._softmax_backward_data,
    aten._log_softmax_backward_data,
    aten.native_layer_norm_backward,
    aten.native_group_norm_backward,
    aten.native_batch_norm_backward,
    aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit,
    aten.native_batch_norm,
)
DECOMPOSITIONS = get_decompositions(list(DECOMPOSED))


def nll_loss_backward(node, g, x, target, weight, reduction, ignore_index, total_weight):
    """d loss / d log-probabilities of (N, C) `x`: -g (over the total weight for a mean) at each
    row's target class, 0 elsewhere and on rows whose target is ignore_index."""
    n, c = x.shape
    d = out_dtype(node)
    valid = (target != ignore_index).reshape((n, 1))
    hit = (pn.arange(c).reshape((1, c)) == target.reshape((n, 1))) & valid
    scale = -(g.astype(d))
    if reduction == 1:
        scale = scale / total_weight.astype(d)
    return pn.where(hit, scale.reshape((n, 1)) if reduction == 0 else scale, 0.0)


def nll_loss_backward_check(node) -> str | None:
    x, weight = meta(node.args[1]), node.args[3]
    if weight is not None:
        return "nll_loss_backward with class weights"
    return None if x.ndim == 2 else f"nll_loss_backward of a rank-{x.ndim} input"


def embedding_dense_backward(node, g, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The embedding table's gradient: row r is the sum of g's rows whose token id is r."""
    return scatter_add_rows(indices, g, int(num_weights), skip=padding_idx if padding_idx >= 0 else None)


def embedding_dense_backward_check(node) -> str | None:
    by_freq = node.args[4]
    return "embedding backward with scale_grad_by_freq" if by_freq else None


def embedding_bag_backward(
    node, g, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode, *rest
):
    """EmbeddingBag's table gradient (sum and mean bags): row r adds, for every id t equal to r,
    the gradient of t's bag b(t) (over the bag's size for a mean, times t's per-sample weight).

    b(t) comes from `offsets` alone, as a row reduction: the number of bag starts at or before t,
    minus one (empty bags are starts that repeat). offset2bag is not read: eager PyTorch's CPU
    forward leaves it empty for sum bags. With include_last_offset (B + 1 offsets for B bags)
    the last offset is not read: as in eager PyTorch's CPU forward, the last bag runs to the end
    of `indices`. The mean's bag sizes are the forward's own (they leave out padding ids). Then
    an owner-computes scatter-add, as embedding's."""
    sparse, per_sample_weights = (rest + (False, None))[:2]
    padding_idx = rest[2] if len(rest) > 2 else -1
    bags, t = g.shape[0], indices.shape[0]
    pos = pn.arange(t).astype(offsets.dtype.name).reshape((t, 1))
    starts = offsets[:bags].reshape((1, bags))
    bag = pn.sum((starts <= pos).astype(offsets.dtype.name), axis=1) - 1
    rows = pn.take(g, bag, axis=0)
    if mode == 1:
        size = pn.take(bag_size, bag, axis=0).astype(rows.dtype.name)
        rows = rows / pn.maximum(size, 1.0).reshape((t, 1))
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(rows.dtype.name).reshape((t, 1))
    skip = padding_idx if padding_idx >= 0 else None
    return scatter_add_rows(indices, rows.astype(out_dtype(node)), int(num_weights), skip=skip)


def embedding_bag_backward_check(node) -> str | None:
    indices, by_freq, mode = meta(node.args[1]), node.args[7], node.args[8]
    if by_freq:
        return "EmbeddingBag backward with scale_grad_by_freq"
    if mode not in (0, 1):
        return "EmbeddingBag backward of max bags (their argmax indices, not a sum)"
    return f"EmbeddingBag backward of rank-{indices.ndim} indices" if indices.ndim != 1 else None


def embedding(node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """The forward lookup: a gather of the table's rows (a non-affine read, fused into its reader)."""
    return pn.take(weight, indices, axis=0)


# -- indexing: gathers forward, scatter-adds backward ------------------------------------------------
def _single_index(indices) -> tuple[int, object] | None:
    """(axis, index) of aten.index's indices when exactly one is a tensor (the rest None)."""
    given = [(k, i) for k, i in enumerate(indices) if i is not None]
    return given[0] if len(given) == 1 else None


def index_check(node) -> str | None:
    one = _single_index(node.args[1])
    if one is None:
        return "advanced indexing with several index tensors"
    return None if meta(one[1]).dtype in (torch.int64, torch.int32) else "indexing by a bool mask"


def index(node, x, indices):
    """x[..., idx, ...] with one integer index tensor: a gather (pn.take)."""
    axis, idx = _single_index(indices)
    return pn.take(x, idx, axis=axis)


def index_select(node, x, dim, idx):
    return pn.take(x, idx, axis=dim % x.ndim)


def gather(node, x, dim, idx, sparse_grad=False):
    return pn.take_along_axis(x, idx, axis=dim % x.ndim)


def gather_check(node) -> str | None:
    x, idx, dim = meta(node.args[0]), meta(node.args[2]), node.args[1] % max(meta(node.args[0]).ndim, 1)
    same = all(i == n for k, (i, n) in enumerate(zip(idx.shape, x.shape)) if k != dim)
    return None if idx.ndim == x.ndim and same else "gather with an index smaller than the input off its axis"


def index_put(node, x, indices, values, accumulate=False):
    """x with values added at x[idx] (accumulate=True, one index tensor on axis 0): the backward
    of x[idx], an owner-computes scatter-add of rows."""
    _, idx = _single_index(indices)
    idx = pn.where(idx < 0, idx + x.shape[0], idx)  # x[-1] is the last row, as in the forward's gather
    vals = pn.broadcast_to(values.astype(x.dtype.name), idx.shape + x.shape[1:])
    return x + scatter_add_rows(idx, vals, x.shape[0])


def index_put_check(node) -> str | None:
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    if not accumulate:
        return "index_put without accumulate (a plain scatter: the last write wins)"
    one = _single_index(node.args[1])
    if one is None or one[0] != 0:
        return "index_put with an index tensor off axis 0 or several index tensors"
    return "index_put by a bool mask" if meta(one[1]).dtype not in (torch.int64, torch.int32) else None


def index_add(node, x, dim, idx, source, alpha=1):
    """x.index_add(0, idx, source, alpha): the backward of index_select along axis 0."""
    return x + scatter_add_rows(idx, source.astype(x.dtype.name), x.shape[0]) * alpha


def index_add_check(node) -> str | None:
    x, dim = meta(node.args[0]), node.args[1]
    return "index_add off axis 0" if dim % x.ndim != 0 else None


def scatter_add(node, x, dim, idx, src):
    """x.scatter_add(dim, idx, src) with idx and src of x's shape off `dim`: the backward of gather."""
    return x + scatter_add_along(idx, src.astype(x.dtype.name), dim % x.ndim, x.shape[dim % x.ndim])


def scatter_add_check(node) -> str | None:
    x, dim, idx, src = (
        meta(node.args[0]),
        node.args[1] % meta(node.args[0]).ndim,
        meta(node.args[2]),
        meta(node.args[3]),
    )
    if idx.shape != src.shape or any(i != n for k, (i, n) in enumerate(zip(idx.shape, x.shape)) if k != dim):
        return "scatter_add with index or src smaller than the input"
    return None


def scatter_reduce(node, x, dim, idx, src, reduce, include_self=True):
    """x.scatter_reduce(dim, idx, src, "sum", include_self=True): scatter_add's sum."""
    return scatter_add(node, x, dim, idx, src)


def scatter_reduce_check(node) -> str | None:
    reduce, include_self = node.args[4], node.kwargs.get("include_self", node.args[5] if len(node.args) > 5 else True)
    if reduce != "sum" or not include_self:
        return f"scatter_reduce {reduce!r}" + ("" if include_self else " without include_self") + " (only a sum)"
    return scatter_add_check(node)


def arange(node, end, **kw):
    """arange(end) of torch's integer dtype (isolate.py's flat output positions of a scatter along an axis)."""
    return pn.arange(int(end)).astype(out_dtype(node))


POSITIONS = "scatter positions"  # node.meta["panamera"] of the aranges isolate.py writes


def arange_check(node) -> str | None:
    if node.meta.get("panamera") != POSITIONS:  # a model's own arange: left as before (opening it moves partitions)
        return "arange outside a scatter's output positions (torch_backend/isolate.py)"
    if not isinstance(node.args[0], int):
        return "arange of a symbolic length"
    return None if meta(node).dtype in (torch.int64, torch.int32) else "arange of a floating dtype"


def zeros(node, *args, **kw):
    """zeros / new_zeros: a constant of torch's shape and dtype."""
    return pn.full(tuple(meta(node).shape), 0, out_dtype(node))
