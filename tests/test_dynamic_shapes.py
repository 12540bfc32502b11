"""Dynamic shapes (issue 22): symbolic extents in the frontend, size classes, call-time binding."""

from __future__ import annotations

import pytest

import panamera as pn
from panamera.errors import SymbolicShapeError
from panamera.frontend.symbolic import Dim, sym


# -- the frontend -------------------------------------------------------------------------------
def test_symbols_in_shapes_broadcast_reduce_and_reshape():
    x = pn.placeholder(("B", "S", 8), name="x")
    b = pn.placeholder((8,), name="b")
    y = pn.sum(x * 2.0 + b, axis=-1, keepdims=True)
    assert y.shape == (sym("B"), sym("S"), 1) and y.symbolic
    assert pn.mean(x, axis=(0, 1)).shape == (8,) and not pn.mean(x, axis=(0, 1)).symbolic
    assert (x - y).shape == x.shape
    assert x.reshape(-1, 8).shape == (sym("B") * sym("S"), 8)
    assert x.size == Dim(8, ("B", "S"))
    assert pn.nn.softmax(x).shape == x.shape and pn.nn.layer_norm(x, b, b).shape == x.shape


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda x: x[1:3], ["getitem", "B"]),  # a slice bound against a symbol: not provable
        (lambda x: x.reshape(-1, 3), ["reshape", "multiple of 3"]),
        (lambda x: x + pn.placeholder(("T", 1, 8)), ["B and T", "not provably equal"]),
        (lambda x: x + pn.placeholder((3, 1, 8)), ["3 and B"]),
        (lambda x: pn.concatenate([x, x]), ["concatenate", "B"]),
        (lambda x: x.reshape(("B", 4)), ["cannot prove"]),
    ],
)
def test_unprovable_symbolic_ops_raise_at_build_time(build, words):
    x = pn.placeholder(("B", "S", 8), name="x")
    with pytest.raises(SymbolicShapeError) as e:
        build(x)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_symbol_names_are_identifiers():
    with pytest.raises(SymbolicShapeError, match="identifier"):
        pn.placeholder(("B x", 4))
