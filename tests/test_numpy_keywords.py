"""numpy's reduction interface: dtype=, out=, where=, initial=, keepdims= against numpy, over dtypes;
Tensor methods; unique placeholder names; torch.nn.functional's argument names in pn.nn.

Each dtype compiles all its keyword variants as one program (one g++ build), small sizes."""

import warnings

import numpy as np
import pytest
from conftest import np_dtype, random_array, tolerance

import panamera as pn
from panamera.schedule import database

SHAPE = (4, 37)
WIDER = {"float32": "float64", "float16": "float32", "bfloat16": "float32", "int32": "int32", "bool": "int32"}


def _variants(dt: str):
    """(label, panamera expression of x and mask m, numpy of a and mask am, reduced length)."""
    wide = WIDER[dt]
    nw = np.dtype(wide)
    v = [
        ("sum keepdims", lambda x, m: x.sum(axis=1, keepdims=True), lambda a, am: a.sum(1, keepdims=True), 37),
        ("sum dtype", lambda x, m: pn.sum(x, axis=1, dtype=wide), lambda a, am: np.sum(a, 1, dtype=nw), 37),
        ("sum initial", lambda x, m: pn.sum(x, axis=0, initial=3), lambda a, am: np.sum(a, 0, initial=3), 4),
        ("sum where", lambda x, m: pn.sum(x, axis=1, where=m), lambda a, am: np.sum(a, 1, where=am), 37),
        ("sum where row", lambda x, m: pn.sum(x, 0, where=m.any(0)), lambda a, am: np.sum(a, 0, where=am.any(0)), 4),
        ("prod where", lambda x, m: pn.prod(x, axis=1, where=m, initial=2), lambda a, am: np.prod(a, 1, where=am, initial=2), 37),
        ("max where", lambda x, m: x.max(axis=1, where=m, initial=-5), lambda a, am: np.max(a, 1, where=am, initial=-5), 37),
        ("min initial", lambda x, m: x.min(axis=0, initial=0), lambda a, am: np.min(a, 0, initial=0), 4),
        ("all where", lambda x, m: x.all(axis=1, where=m), lambda a, am: np.all(a, 1, where=am), 37),
        ("any where", lambda x, m: pn.any(x, axis=0, where=m, keepdims=True), lambda a, am: np.any(a, 0, where=am, keepdims=True), 4),
        ("mean where", lambda x, m: x.mean(axis=1, where=m), lambda a, am: np.mean(a, 1, where=am), 37),
        ("mean dtype", lambda x, m: pn.mean(x, axis=0, dtype=wide), lambda a, am: np.mean(a, 0, dtype=nw), 4),
    ]  # fmt: skip
    if dt != "bool":
        v += [
            ("var where", lambda x, m: x.var(axis=1, ddof=1, where=m), lambda a, am: np.var(a, 1, ddof=1, where=am), 37),
            ("std keepdims", lambda x, m: x.std(axis=0, keepdims=True), lambda a, am: np.std(a, 0, keepdims=True), 4),
        ]  # fmt: skip
    if dt in ("int32", "bool"):
        v += [
            ("sum bool dtype", lambda x, m: pn.sum(x, axis=1, dtype=bool), lambda a, am: np.sum(a, 1, dtype=bool), 37)
        ]
    return v


def _numpy(f, a, am, dt):
    """numpy's answer; 16-bit floats computed in float64, then rounded to the result dtype."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(f(a.astype(np.float64) if dt == "bfloat16" else a, am))


@pytest.mark.parametrize("dt", list(WIDER))
def test_keywords_against_numpy(dt, rng):
    x, m = pn.placeholder(SHAPE, dt, name="x"), pn.placeholder(SHAPE, "bool", name="m")
    variants = _variants(dt)
    k = pn.compile([pn_f(x, m) for _, pn_f, _, _ in variants], target="emulator")
    a, am = random_array(SHAPE, dt, rng), rng.random(SHAPE) > 0.3
    am[1] = False  # an all-masked row: nan means, identities and initials
    outs = k(a, am)
    for (label, _, np_f, n), out in zip(variants, outs):
        ref = _numpy(np_f, a, am, dt)
        bf16_result = dt == "bfloat16" and ref.dtype == np.float64 and "dtype" not in label  # numpy ran in float64
        assert out.dtype == (np_dtype(dt) if bf16_result else ref.dtype), label
        assert out.shape == ref.shape, label
        tol = tolerance(out.dtype.name if out.dtype.kind == "f" or out.dtype == np_dtype("bfloat16") else dt, n)
        if out.dtype.kind in "biu":
            np.testing.assert_array_equal(out, ref, err_msg=label)
        else:
            np.testing.assert_allclose(
                out.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol, err_msg=label
            )


def test_integer_promotion_follows_numpy():
    i32, b = pn.placeholder((3, 4), "int32"), pn.placeholder((3, 4), "bool")
    a32, ab = np.ones((3, 4), np.int32), np.ones((3, 4), bool)
    for t, a in ((i32, a32), (b, ab)):
        assert pn.sum(t).dtype.np == np.sum(a).dtype
        assert pn.prod(t, axis=0).dtype.np == np.prod(a, axis=0).dtype
        assert pn.mean(t).dtype.np == np.mean(a).dtype
        assert pn.sum(t, dtype="int32").dtype.np == np.sum(a, dtype=np.int32).dtype
        assert pn.max(t).dtype.np == np.max(a).dtype
    assert pn.sum(pn.placeholder((3,), "float16"), dtype="float32").dtype.name == "float32"


def test_max_of_nothing_with_initial():
    k = pn.compile(pn.max(pn.placeholder((3, 0), "int32", name="e"), axis=1, initial=7), target="emulator")
    np.testing.assert_array_equal(k(np.zeros((3, 0), np.int32)), np.max(np.zeros((3, 0), np.int32), 1, initial=7))


def test_where_needs_initial_for_max_like_numpy():
    x = pn.placeholder((3, 4), name="x")
    with pytest.raises(pn.OptionError, match="max of 'x'.*initial="):
        pn.max(x, axis=1, where=x > 0)
    with pytest.raises(ValueError, match="initial"):
        np.max(np.ones((3, 4)), axis=1, where=np.ones((3, 4), bool))


def test_where_must_be_a_bool_tensor_of_a_broadcastable_shape():
    x = pn.placeholder((3, 4), name="x")
    with pytest.raises(pn.OptionError, match="where= must be a bool Tensor, a bool array or a bool"):
        pn.sum(x, where=np.ones((3, 4), np.float32))  # a bool array is a constant mask (test_edge_cases.py)
    with pytest.raises(pn.OptionError, match="where= must be a bool Tensor, a bool array or a bool"):
        pn.sum(x, where="yes")
    with pytest.raises(pn.DTypeError, match="must be bool"):
        pn.sum(x, where=x)
    with pytest.raises(pn.ShapeError, match="do not broadcast"):
        pn.sum(x, where=pn.placeholder((2, 4), "bool"))
    assert pn.sum(x, where=False).shape == ()


def test_out_in_a_graph_is_refused_and_taken_by_the_call():
    x = pn.placeholder((2, 3), name="x")
    with pytest.raises(pn.OptionError, match="sum of 'x'.*out=.*compiled call"):
        pn.sum(x, axis=1, out=np.zeros(2, np.float32))
    k = pn.compile([pn.sum(x, axis=1), pn.max(x, axis=0)], target="emulator")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    s, m = np.zeros(2, np.float32), np.zeros(3, np.float32)
    assert k(a, out=(s, m)) == (s, m)
    np.testing.assert_array_equal(s, a.sum(1))
    np.testing.assert_array_equal(m, a.max(0))
    with pytest.raises(pn.DTypeError, match="out= output 0: expected dtype float32"):
        k(a, out=(np.zeros(2), m))
    with pytest.raises(pn.InputError, match="expected 2 array"):
        k(a, out=s)


def test_tensor_methods_are_the_functions():
    x = pn.placeholder((3, 4), "float32", name="x")
    sig = lambda t: database.signature((t,))  # noqa: E731
    pairs = [
        (x.sum(axis=1), pn.sum(x, axis=1)), (x.mean(0), pn.mean(x, 0)), (x.max(1), pn.max(x, 1)),
        (x.min(), pn.min(x)), (x.prod(1), pn.prod(x, 1)), (x.all(1), pn.all(x, 1)), (x.any(), pn.any(x)),
        (x.var(1, ddof=1), pn.var(x, 1, ddof=1)), (x.std(0), pn.std(x, 0)), (x.argmax(1), pn.argmax(x, 1)),
        (x.argmin(axis=0), pn.argmin(x, axis=0)), (x.astype("float16").sum(), pn.sum(x.astype("float16"))),
    ]  # fmt: skip
    for method, function in pairs:
        assert sig(method) == sig(function)
    assert x.reshape(4, 3).shape == x.reshape((4, 3)).shape == (4, 3)
    assert x.T.shape == (4, 3) and x.T.T is not None


def test_transpose_feeds_a_reduction(rng):
    x = pn.placeholder((3, 5, 4), name="x")
    a = rng.random((3, 5, 4)).astype(np.float32)
    k = pn.compile([x.T, pn.sum(x.transpose(1, 0, 2), axis=1), pn.exp(x.transpose((2, 0, 1))).max(axis=0)], "emulator")
    t, s, m = k(a)
    np.testing.assert_array_equal(t, a.T)
    np.testing.assert_allclose(s, a.transpose(1, 0, 2).sum(1), rtol=1e-6)
    np.testing.assert_allclose(m, np.exp(a.transpose(2, 0, 1)).max(0), rtol=1e-6)
    with pytest.raises(pn.AxisError, match="not a permutation"):
        x.transpose(0, 0, 1)


def test_unnamed_placeholders_get_unique_names():
    a, b = pn.placeholder((4,)), pn.placeholder((4,))
    assert a.name != b.name
    k = pn.compile(pn.sum(a - b), target="emulator")
    ones, zeros = np.ones(4, np.float32), np.zeros(4, np.float32)
    assert k(ones, zeros) == 4.0
    assert k(**{a.name: ones, b.name: zeros}) == 4.0


def test_ambiguous_named_call_is_an_error():
    a, b = pn.placeholder((4,), name="v"), pn.placeholder((4,), name="v")
    k = pn.compile(pn.sum(a - b), target="emulator")
    with pytest.raises(pn.InputError, match="'v'.*shared by several placeholders.*positionally"):
        k(v=np.ones(4, np.float32))
    assert k(np.ones(4, np.float32), np.zeros(4, np.float32)) == 4.0


def test_axis_may_be_a_numpy_integer():
    x = pn.placeholder((3, 4), name="x")
    assert pn.sum(x, axis=np.int64(1)).shape == (3,)
    assert pn.argmax(x, axis=np.int32(0)).shape == (4,)
    assert pn.sum(x, axis=(np.int64(0), 1)).shape == ()


def test_torch_argument_names_in_nn():
    x = pn.placeholder((2, 4, 8), name="x")
    w, b = pn.placeholder((8,), name="w"), pn.placeholder((8,), name="b")
    sig = lambda t: database.signature((t,))  # noqa: E731
    assert sig(pn.nn.softmax(x, dim=1, method="multipass")) == sig(pn.nn.softmax(x, axis=1, method="multipass"))
    assert sig(pn.nn.layer_norm(input=x, normalized_shape=(8,), weight=w, bias=b, eps=1e-5)) == sig(
        pn.nn.layer_norm(x, w, b, axis=-1)
    )
    assert sig(pn.nn.rms_norm(x, normalized_shape=[8], weight=w)) == sig(pn.nn.rms_norm(x, w))
    assert sig(pn.nn.logsumexp(x, dim=2, keepdim=True)) == sig(pn.nn.logsumexp(x, axis=2, keepdims=True))
    assert sig(pn.var(x, dim=1, correction=1)) == sig(pn.var(x, axis=1, ddof=1))
    c = pn.placeholder((2, 6, 5), name="c")
    g6 = pn.placeholder((6,), name="g6")
    assert sig(pn.nn.group_norm(c, num_groups=3, weight=g6)) == sig(pn.nn.group_norm(c, 3, g6))
    logits, t = pn.placeholder((4, 10), name="l"), pn.placeholder((4,), "int64", name="t")
    assert sig(pn.nn.cross_entropy(input=logits, target=t)) == sig(pn.nn.cross_entropy(logits, t))
    with pytest.raises(pn.OptionError, match="both dim= .*and axis="):
        pn.nn.softmax(x, dim=1, axis=1)
    with pytest.raises(pn.ShapeError, match="normalized_shape"):
        pn.nn.layer_norm(x, normalized_shape=(4,))
