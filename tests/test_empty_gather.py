"""A gather from an axis of extent 0 (frontend/gather.py `refuse_empty_axis`): a non-empty index
is an EmptyAxisError (an IndexError, as numpy's and torch's) naming the op, tensor, axis and index,
when the gather is built where the extents are static and at every call where they are symbolic
(dynamic.py `bind_sizes`); an empty index is an empty result; no kernel loads from an empty axis
(codegen/thread_loop.py, codegen/cpu_param_kernel.py), and the CPU's one-hot rewrite leaves a sum
over no class alone (schedule/onehot.py precondition 7). torch.compile's forms (embedding, x[ids],
gather, nll_loss) raise as eager does before any of this: tests/test_torch_index_bounds.py."""

import numpy as np
import pytest

import panamera as pn
from panamera.errors import EmptyAxisError
from panamera.frontend.tensor import iota
from panamera.schedule import onehot

EMB = pn.placeholder((0, 8), name="emb")
IDS = pn.placeholder((3,), "int64", name="ids")


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda: pn.take(EMB, IDS), r"take of 'emb' \(0, 8\): axis 0 has extent 0, so index 'ids' of shape \(3,\)"),
        (lambda: EMB[IDS], r"take of 'emb' .* index 'ids'"),
        (
            lambda: pn.take_along_axis(pn.placeholder((3, 0), name="x"), pn.placeholder((3, 1), "int64", name="t"), 1),
            r"take_along_axis of 'x' \(3, 0\): axis 1 has extent 0, so index 't'",
        ),
        (
            lambda: pn.gather_nd(pn.placeholder((2, 0, 4), name="d"), pn.placeholder((2, 5, 1), "int64", name="i"), 1),
            r"gather_nd of 'd' \(2, 0, 4\): axis 1 has extent 0, so index 'i'",
        ),
    ],
    ids=["take", "getitem", "take_along_axis", "gather_nd"],
)
def test_a_static_gather_from_an_empty_axis_is_refused_when_built(build, words):
    with pytest.raises(EmptyAxisError, match=words) as e:
        build()
    assert isinstance(e.value, IndexError) and isinstance(e.value, pn.ShapeError)


@pytest.mark.parametrize("target", ["emulator", "cpu"])
def test_an_empty_index_into_an_empty_axis_is_an_empty_result(target):
    k = pn.compile(pn.take(EMB, pn.placeholder((0,), "int64", name="none")) * 2.0, target=target, cache=False)
    out = k(np.zeros((0, 8), np.float32), np.zeros((0,), np.int64))
    assert out.shape == (0, 8)


def test_a_symbolic_gather_from_an_empty_axis_is_refused_at_every_call():
    """Bound at call time: C = 0 under B = 3 targets is refused before any kernel runs (and again on
    the call that would take the fast path); B = 0 is an empty result; C = 5 then runs."""
    x, t = pn.placeholder(("B", "C"), name="x"), pn.placeholder(("B", 1), "int64", name="t")
    k = pn.compile(pn.take_along_axis(x, t, 1) + 1.0, target="cpu", cache=False)
    bad = (np.zeros((3, 0), np.float32), np.zeros((3, 1), np.int64))
    for _ in range(2):
        with pytest.raises(EmptyAxisError, match=r"take_along_axis of 'x' \(B, C\): axis 1 has extent 0 at .*'C': 0"):
            k(*bad)
    assert k(np.zeros((0, 0), np.float32), np.zeros((0, 1), np.int64)).shape == (0, 1)
    xs = np.arange(15, dtype=np.float32).reshape(3, 5)
    ts = np.array([[4], [0], [2]])
    np.testing.assert_array_equal(k(xs, ts), np.take_along_axis(xs, ts, 1) + 1.0)


def test_onehot_precondition_7_no_class_no_gather():
    """A sum over a static 0 classes stays a sum (0, numpy's), not a gather from the empty axis."""
    x, t = pn.placeholder((3, 0), name="x"), pn.placeholder((3, 1), "int64", name="t")
    picked = pn.sum(pn.where(pn.arange(0).reshape((1, 0)) == t, x, 0.0), axis=1)
    assert onehot.match(picked) is None
    got = pn.compile(picked, target="cpu", cache=False)(np.zeros((3, 0), np.float32), np.array([[0], [1], [-1]]))
    np.testing.assert_array_equal(got, np.zeros(3, np.float32))


def test_a_symbolic_onehot_gather_with_no_class_loads_nothing():
    """The symbolic rewrite's gather tests C > 0 before its load: C bound to 0 sums to 0, as numpy."""
    x, t = pn.placeholder(("B", "C"), name="x"), pn.placeholder(("B", 1), "int64", name="t")
    k = pn.compile(pn.sum(pn.where(iota(("B", "C"), 1) == t, x, 0.0), axis=1), target="cpu", cache=False)
    assert "gather" in {u.op for u in pn.frontend.tensor.topological(k.program.outputs)}
    got = k(np.zeros((3, 0), np.float32), np.array([[0], [1], [-1]]))
    np.testing.assert_array_equal(got, np.zeros(3, np.float32))
    assert "> 0LL ? pn_ld(" in k.source(B=3, C=0)
