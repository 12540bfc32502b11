"""schedule/cpu_exp_range.py: exp(x - max(x)) of a stitched CPU row printed as the exp of a
non-positive argument (runtime/cpu.py EXP_LE0); one negative test per precondition, and the
results of the marked kernels against float64 numpy (special rows included)."""

from __future__ import annotations

import numpy as np
from conftest import softmax_bound

import panamera as pn
from panamera.compiler import lower
from panamera.schedule.cpu_exp_range import nonpositive_exps


def _group(*outs):
    (g,) = lower(list(outs), stop_after="groups", target="cpu").groups
    return g


def _x(shape=(4, 1000), dtype="float32"):
    return pn.placeholder(shape, dtype, name="x")


def _kernels(k) -> str:
    """The compiled program's kernels' own source (the math prelude, which defines pn_exp_le0f, left out)."""
    return "".join(kern.source for kern in k.cpu_kernels)


def _softmax_of(x, m):
    e = pn.exp(x - m)
    return e / pn.sum(e, axis=1, keepdims=True)


def test_softmax_and_log_softmax_exps_are_marked():
    g = _group(pn.nn.softmax(_x(), axis=1, method="multipass"))
    assert [(k, key[0]) for k, key in nonpositive_exps(g)] == [(1, "exp"), (2, "exp")]
    g = _group(pn.nn.log_softmax(_x(), axis=1, method="multipass"))
    assert [key[0] for _, key in nonpositive_exps(g)] == ["exp"]
    x = _x()
    assert nonpositive_exps(_group(_softmax_of(x, pn.max(x, axis=1, keepdims=True))))


def test_1_not_a_stitched_row():
    x = _x()
    assert nonpositive_exps(_group(pn.exp(x - 3.0))) == ()  # a map: no row max


def test_2_not_float_compute():
    g = _group(pn.nn.softmax(_x(dtype="float64"), axis=1, method="multipass"))
    assert nonpositive_exps(g) == ()


def test_3_argument_not_x_minus_a_row_value():
    x = _x()
    m = pn.max(x, axis=1, keepdims=True)
    e = pn.exp(m - x)  # m - x >= 0: the general exp
    assert nonpositive_exps(_group(e / pn.sum(e, axis=1, keepdims=True))) == ()


def test_4_not_the_max_of_the_same_row_values():
    x = _x()
    assert nonpositive_exps(_group(_softmax_of(x, pn.min(x, axis=1, keepdims=True)))) == ()  # x - min >= 0
    assert nonpositive_exps(_group(_softmax_of(x, pn.mean(x, axis=1, keepdims=True)))) == ()
    assert nonpositive_exps(_group(_softmax_of(x, pn.max(x * 0.5, axis=1, keepdims=True)))) == ()


def test_marked_softmax_special_rows(rng):
    """The marked kernel (its source prints pn_exp_le0f) on rows with NaN, +inf, -inf, masked -inf
    entries, exps below the flush and large magnitudes, within softmax_bound; log_softmax too."""
    a = (rng.standard_normal((12, 1000)) * 8).astype(np.float32)
    a[1, 7], a[2, 9], a[3, :] = np.nan, np.inf, -np.inf
    a[3, 5] = 1.0
    a[4, ::3] = -np.inf
    a[5, :500] -= 200.0
    a[6] *= 1e30
    k = pn.compile(pn.nn.softmax(pn.placeholder(a.shape, "float32"), axis=-1), target="cpu")
    assert "pn_exp_le0f(" in _kernels(k)
    got = k(a).astype(np.float64)
    ref, bound = softmax_bound(a)
    assert np.isnan(got[1:3]).all() and np.isnan(ref[1:3]).all()
    assert got[3, 5] == 1.0 and (got[3, np.arange(1000) != 5] == 0).all() and (got[4, ::3] == 0).all()
    ok = np.isfinite(ref)
    assert (np.abs(got - ref)[ok] <= bound[ok]).all()
    k = pn.compile(pn.nn.log_softmax(pn.placeholder(a.shape, "float32"), axis=-1), target="cpu")
    assert "pn_exp_le0f(" in _kernels(k)
    x = a[7:].astype(np.float64)
    z = x - x.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1, keepdims=True))
    want = z - lse
    # x - m (|z| u), exp and log (1.5 ulp each, through log: absolute), the sum of n terms ((n - 1) u,
    # absolute through log), the subtraction and the store (|y| u each)
    bound = (np.abs(z) + 3 * np.abs(lse) + 3 + 999 + 3 + 2 * np.abs(want)) * 2.0**-24
    assert (np.abs(k(a)[7:] - want) <= bound).all()


def test_producer_expression_softmax_is_marked():
    """The max of an expression (a masked softmax's where(mask, x, -inf)) marks exp(expr - max)."""
    x, m = _x(), pn.placeholder((4, 1000), "bool", name="m")
    assert nonpositive_exps(_group(pn.nn.softmax(pn.where(m, x * 0.5, -np.inf), axis=1, method="multipass")))
    y = pn.where(m, x * 0.5, -np.inf)  # the max of another expression: not x * 0.5 + 1 - max(...)
    assert nonpositive_exps(_group(_softmax_of(y + 1.0, pn.max(y, axis=1, keepdims=True)))) == ()


def test_same_bits_as_the_general_exp_on_nonpositive_arguments(rng):
    """pn_exp_le0f gives EXP_FLUSH's bits on [-104, 0] (rows whose max is 0, so x - m is x), -inf
    and below -104 (0), and NaN for a row with a NaN."""
    a = np.concatenate([rng.uniform(-110, 0, 4000), rng.uniform(-0.4, 0, 2000), [-np.inf, -104.0, -86.99, -0.0]])
    a = np.concatenate([a, [0.0] * (6144 - a.size)]).astype(np.float32).reshape(6, 1024)
    a[:, 0] = 0.0
    x = pn.placeholder(a.shape, "float32")
    k = pn.compile(pn.exp(x - pn.max(x, axis=1, keepdims=True)), target="cpu")
    assert "pn_exp_le0f(" in _kernels(k)
    general = pn.compile(pn.exp(pn.placeholder(a.shape, "float32")), target="cpu")
    assert "pn_exp_le0f(" not in _kernels(general) and "expf(" in _kernels(general)
    assert np.array_equal(k(a), general(a))
    a[2, 5] = np.nan
    assert np.isnan(k(a)[2]).all() and not np.isnan(k(a)[[0, 1, 3, 4, 5]]).any()
