"""Formulation choices resolved before a symbolic compile (issue 22; a workaround, see below)."""

from __future__ import annotations

from .tensor import Tensor, topological


def resolve_choices(outputs: tuple) -> tuple:
    """The graph with each formulation choice (`choose`, e.g. softmax's online or multipass)
    replaced by the option the symbolic path compiles with the fewest reductions, the rule of
    poly/params.py's own `_choose`. A workaround: there, a choice whose result feeds another op
    (softmax then max, softmax then expand) still reaches the lowering and is refused, since
    `ins != t.inputs` compares Tensors with their numpy-style `==` (a Tensor, truthy) and so never
    rebuilds the consumer; resolving choices here first, by identity, lets the symbolic path take
    those graphs (reported to helper dyn).

    >>> import panamera as pn
    >>> x = pn.placeholder(("T",), name="x")
    >>> [t.op for t in resolve_choices((pn.max(pn.nn.softmax(x)),))]
    ['reduce']
    """
    from ..poly.params import _supported  # the symbolic path's own test of an option

    memo: dict = {}
    for t in topological(outputs):
        ins = tuple(memo[a.uid] for a in t.inputs)
        if t.op == "choose":
            costs = [(not _supported(o), sum(1 for u in topological((o,)) if u.op == "reduce")) for o in ins]
            memo[t.uid] = ins[costs.index(min(costs))]
        elif any(a is not b for a, b in zip(ins, t.inputs)):  # by identity: Tensor's == is numpy's, a Tensor
            memo[t.uid] = Tensor(t.op, ins, t.shape, t.dtype, t.attrs, t.name)
        else:
            memo[t.uid] = t
    return tuple(memo[t.uid] for t in outputs)
