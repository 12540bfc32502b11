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
- `embedding_dense_backward`: the rows of the gradient added by token id, repeated ids included,
  through frontend/scatter.py (owner computes: a column reduction over tokens; one atomic per
  block, or ordered partials when deterministic).

>>> import torch  # doctest: +SKIP
>>> torch.ops.aten.gelu_backward.default in DECOMPOSITIONS  # doctest: +SKIP
True
"""

from __future__ import annotations

import math

import torch
from torch._decomp import get_decompositions

import panamera as pn

from ..frontend.scatter import MAX_TERMS, scatter_add_rows
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
    g, indices = meta(node.args[0]), meta(node.args[1])
    rows, by_freq = node.args[2], node.args[4]
    if by_freq:
        return "embedding backward with scale_grad_by_freq"
    terms = rows * math.prod(indices.shape) * g.shape[-1]
    if terms > MAX_TERMS:
        return (
            f"embedding backward of {rows} rows × {math.prod(indices.shape)} ids: {terms} owner-computes terms, over "
            f"frontend/scatter.py's {MAX_TERMS} (the atomic indirect-write statement is not built yet)"
        )
    return None


def embedding(node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """The forward lookup: a gather of the table's rows (a non-affine read, fused into its reader)."""
    return pn.take(weight, indices, axis=0)
