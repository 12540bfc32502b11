"""Node inputs the ONNX converters need as constants (axes, pads, shapes, scales).

>>> from panamera.subgraph.model import Node
>>> int_tuple(Node(0, "r", "Reshape", "", (), (), {}, 18), __import__("numpy").array([2, 3]), "shape")
(2, 3)
"""

from __future__ import annotations

import numpy as np

from ..errors import Unsupported
from ..frontend.tensor import Tensor
from .model import Node


def const_input(node: Node, v, what: str) -> np.ndarray | None:
    """`v` as an array, None for an absent input; Unsupported when it is computed at run time."""
    if v is None:
        return None
    if isinstance(v, Tensor):
        raise Unsupported(
            f"{node.op_type} {node.label!r}: {what} must be a constant, it is computed at run time "
            "(a graph input? pass its value to specialize on it: --inputs, or load_model(specialize=))"
        )
    return np.asarray(v)


def int_tuple(node: Node, v, what: str) -> tuple[int, ...] | None:
    a = const_input(node, v, what)
    return None if a is None else tuple(int(x) for x in a.reshape(-1))
