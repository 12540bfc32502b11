"""The scalar expression a statement evaluates per iteration: its fused elementwise producers.

A statement body is a DAG of `Expr` nodes whose leaves are loads (through an access relation of
the statement) or constants. Producers inlined into a reduction this way are the paper's
"reduction propagation": they are evaluated in registers at the reduction's iteration points.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DType
from ..frontend.walk import postorder


@dataclass(frozen=True, eq=False)
class Expr:
    op: str  # "load", "const", or an elementwise op name of frontend/tensor.py, or "cast"
    args: tuple[Expr, ...]
    dtype: DType
    value: object = None  # the constant of a "const"
    read: int = -1  # index into the statement's reads for a "load"

    def walk(self):
        """Nodes in post order, each once (iterative: bodies of any depth)."""
        return postorder([self], lambda e: e.args)
