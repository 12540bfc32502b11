"""Modeled plans of groups of ONNX nodes, each distinct program planned once per optimize.

The router (route.py) plans every contraction with its element-wise neighbours, and the
neighbours alone; the report's per-node baseline (optimizer.unfused_baseline) plans every node
alone. Repeated blocks (a MobileNet's stages, a transformer's layers) make the same programs
again and again, under other value names and with other weights, which the compile cache
(panamera/cache.py) keys apart: it names kernels after the tensors. `Plans` keys a program by
its structure only — ops, shapes, dtypes, attributes, edges and the placeholders' order, with
the names of values and the weights left out — and keeps the figures the router and the
report read (`PlanFigures`). One `Plans` lives on the `Partition`, so the report reuses the
router's figures; a program Panamera cannot plan is remembered with its error.

>>> from onnx import helper, TensorProto
>>> from panamera.model import H100
>>> from panamera.subgraph.model import load_model
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> g = helper.make_graph([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Exp", ["e"], ["y"])], "g",
...     [v("x", [4, 8])], [v("y", [4, 8])])
>>> m = load_model(helper.make_model(g).SerializeToString())
>>> plans = Plans(H100)
>>> a, b = (plans.figures(m, (n,)) for n in m.nodes)  # the same program under two names
>>> a == b, a.launches, plans.asked, plans.planned
(True, 1, 2, 1)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from .. import compile as pn_compile
from ..cache import graph_key
from ..errors import PanameraError
from ..frontend.tensor import Tensor
from ..model.gpu import GPUSpec
from .build import build_subgraph_tensors
from .model import Node, OnnxModel


@dataclass(frozen=True)
class PlanFigures:
    """What the router and the report read of a modeled plan."""

    modeled_us: float
    launches: int
    split: int  # the most blocks per reduction of any launch (split-K)


def structural_key(outputs: Sequence[Tensor]) -> str:
    """The compile cache's graph key (panamera/cache.py) without the names of computed tensors:
    two programs that differ only in value names (and weights, which are placeholders) match."""
    nodes, roots, order = json.loads(graph_key(tuple(outputs)))
    return json.dumps([[n[:5] for n in nodes], roots, order], separators=(",", ":"))


class Plans:
    """A memo of modeled plans on one GPU, for one optimize (it grows with the distinct programs
    asked for). `asked` counts the questions, `planned` the plans actually made."""

    def __init__(self, gpu: GPUSpec):
        self.gpu = gpu
        self._memo: dict[str, PlanFigures | PanameraError] = {}
        self.asked = self.planned = 0

    def figures(self, model: OnnxModel, nodes: Sequence[Node], outputs: tuple[str, ...] | None = None) -> PlanFigures:
        """The modeled plan of `nodes` as one Panamera program with `outputs` (by default, what
        the rest of the model reads); raises the PanameraError that planning it raised."""
        self.asked += 1
        _, tensors, _, _ = build_subgraph_tensors(model, nodes, outputs)
        key = structural_key(tensors)
        got = self._memo.get(key)
        if got is None:
            self.planned += 1
            try:
                plan = pn_compile(tensors, target="emulator", gpu=self.gpu).plan
                split = max((ln.blocks_per_reduction for ln in plan.per_call), default=1)
                got = PlanFigures(plan.modeled_us, len(plan.per_call), split)
            except PanameraError as e:
                got = e
            self._memo[key] = got
        if isinstance(got, PanameraError):
            raise got
        return got
