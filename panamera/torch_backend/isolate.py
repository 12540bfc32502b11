"""A deterministic embedding gradient too large for owner computes gets a partition of its own,
so that Panamera's sorted-segment scatter-add (frontend/scatter.py `scatter_add_sorted`, whose
index and source must be the compiled computation's inputs: segments.py precondition 2) takes
it instead of the whole partition falling back to eager PyTorch.

Preconditions of moving node n out of partition p (else p is left as it is, and compiles or
stays eager with its reason): (1) the compile is deterministic; (2) n is
`aten.embedding_dense_backward` without scale_grad_by_freq; (3) owner computes cannot take it
(rows x ids x row size over frontend/scatter.py's MAX_TERMS); (4) no node of p reads n (p less n
stays convex: p was, and n is a sink of it). What is left of p keeps only the nodes connected to
an anchor (`anchored`): an element-wise producer alone stays in eager PyTorch.
"""

from __future__ import annotations

import math

import torch
from torch.fx.passes.infra.partitioner import Partition

from ..frontend.scatter import MAX_TERMS
from .aten import meta

EMBEDDING_BACKWARD = torch.ops.aten.embedding_dense_backward.default


def movable(n: torch.fx.Node, members) -> bool:
    """Preconditions 2-4 for node n of a partition holding `members`."""
    if n.target is not EMBEDDING_BACKWARD or (len(n.args) > 4 and n.args[4]):
        return False
    g, ids, rows = meta(n.args[0]), meta(n.args[1]), int(n.args[2])
    width = g.shape[-1] if g.dim() else 1
    terms = rows * math.prod(ids.shape) * width
    return terms > MAX_TERMS and not any(u in members for u in n.users)


def isolate_sorted_scatters(parts: list, deterministic: bool, anchored) -> list:
    """`parts` with every movable embedding gradient (preconditions 1-4) in a partition of its
    own, the rest of its partition pruned to its anchored nodes (empty partitions dropped)."""
    if not deterministic:
        return parts
    out = []
    for p in parts:
        moved = [n for n in p.nodes if movable(n, p.nodes)]
        for n in moved:
            p.remove_node(n)
        keep = anchored(p.nodes)
        for n in [n for n in p.nodes if n not in keep]:
            p.remove_node(n)
        out += ([p] if p.nodes else []) + [Partition(nodes=[n]) for n in moved]
    for k, p in enumerate(out):
        p.id = k
    return out
