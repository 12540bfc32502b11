"""numpy's basic indexing on tensors (`x[key]`, frontend/movement.py `index`), run on the emulator
against numpy's own indexing of the same array: data movement is exact, so results are equal."""

from __future__ import annotations

import numpy as np
import pytest

import panamera as pn

SHAPE = (4, 6, 8)
KEYS = [
    1,
    -1,
    (1, 2),
    (slice(None), 3),
    (Ellipsis, 2),
    (Ellipsis, slice(2, 5)),
    (slice(None, None, -1),),
    (slice(None), slice(None, None, -2)),
    (1, slice(None, None, -2), None),
    (None, slice(1, 3), Ellipsis, None),
    (slice(-3, None), slice(None, -2), slice(1, 7, 3)),
    (slice(5, 0, -2),),
    (np.int64(2), slice(None)),
]


@pytest.mark.parametrize("key", KEYS, ids=[repr(k) for k in KEYS])
def test_basic_indexing_matches_numpy(key):
    a = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    x = pn.placeholder(SHAPE, "float32", name="x")
    y = x[key] * 1.0  # a statement reads through the access relation
    want = a[key]
    assert y.shape == want.shape
    got = pn.compile(y, target="emulator")(a)
    np.testing.assert_array_equal(got, want)


def test_an_integer_tensor_index_is_take():
    a = np.arange(48, dtype=np.float32).reshape(6, 8)
    ids = np.array([[5, 0], [-1, 2]], np.int64)
    x, i = pn.placeholder((6, 8), name="x"), pn.placeholder((2, 2), "int64", name="ids")
    got = pn.compile(pn.sum(x[i], axis=-1), target="emulator")(x=a, ids=ids)
    np.testing.assert_allclose(got, a[ids].sum(-1), rtol=0)
    k = pn.compile(x[:, 2:5][i] * 2.0, target="emulator")
    np.testing.assert_array_equal(k(x=a, ids=ids), a[:, 2:5][ids] * 2)


def test_a_scale_column_reads_as_numpy_does():
    s, w = pn.placeholder((4,), name="s"), pn.placeholder((4, 3), name="w")
    a, b = np.arange(4, dtype=np.float32), np.ones((4, 3), np.float32)
    np.testing.assert_array_equal(pn.compile(w * s[:, None], target="emulator")(s=a, w=b), b * a[:, None])


@pytest.mark.parametrize(
    "key, error, words",
    [
        ((0, 0, 0, 0), pn.AxisError, "too many indices"),
        ((Ellipsis, Ellipsis), pn.AxisError, "single ellipsis"),
        (9, pn.AxisError, "out of bounds for axis 0 with size 4"),
        ((slice(None), -7), pn.AxisError, "out of bounds for axis 1 with size 6"),
        (1.5, pn.DTypeError, "is not an index"),
        (True, pn.DTypeError, "is not an index"),
        ([0, 1], pn.DTypeError, "is not an index"),
    ],
)
def test_bad_indices_name_the_tensor(key, error, words):
    x = pn.placeholder(SHAPE, name="v")
    with pytest.raises(error, match=words) as e:
        x[key]
    assert "'v'" in str(e.value)


def test_tensor_indices_that_numpy_would_broadcast_are_refused_clearly():
    x, i = pn.placeholder(SHAPE, name="v"), pn.placeholder((2,), "int32", name="i")
    with pytest.raises(pn.AxisError, match="one integer Tensor"):
        x[i, i]
    with pytest.raises(pn.AxisError, match="one integer Tensor"):
        x[0, i]
    with pytest.raises(pn.DTypeError, match="must hold integers"):
        x[pn.placeholder((2,), "float32", name="f")]


def test_a_tensor_is_not_iterable():
    with pytest.raises(TypeError):
        iter(pn.placeholder((3,), name="v"))
