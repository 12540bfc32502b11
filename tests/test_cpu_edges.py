"""A new user's edge cases on the CPU target and the frontend they start from (robust9, 2026-11-25):
each a bug that was found, one case each. Values are checked exactly where the result is exact
(empty results, sums of ones)."""

import numpy as np
import pytest

import panamera as pn
from panamera.frontend.tensor import topological


def test_a_program_whose_results_are_all_empty_runs_no_kernel():
    """(0, 8) rows: every kernel's domain is empty, the program has no C entry; it returned numpy's
    empty results on the emulator and raised a bare IndexError on the CPU target (runtime/cpu_call.py)."""
    k = pn.compile(pn.nn.softmax(pn.placeholder((0, 8), name="x")), target="cpu", cache=False)
    x = np.zeros((0, 8), np.float32)
    assert k(x).shape == (0, 8) and k(x[::-1]).shape == (0, 8)  # the fast call and the general one


@pytest.mark.parametrize("shape", [(2,), ("B",)], ids=["static", "symbolic"])
def test_a_call_by_a_name_two_placeholders_share_is_refused_on_the_cpu(shape):
    """The CPU's fast call (static) and the symbolic call bound one array to both inputs (2a + a)."""
    a1, a2 = pn.placeholder(shape, name="a"), pn.placeholder(shape, name="a")
    k = pn.compile(a1 * 2.0 + a2, target="cpu", cache=False)
    one, zero = np.ones(2, np.float32), np.zeros(2, np.float32)
    np.testing.assert_array_equal(k(one, zero), 2 * one)
    with pytest.raises(pn.InputError, match=r"\['a'\] are shared by several placeholders.*positionally"):
        k(a=one)


def test_compile_of_a_non_tensor_names_what_it_got():
    with pytest.raises(pn.PanameraError, match="expected a Tensor or a non-empty list of Tensors, got int"):
        pn.compile(3)


def test_arange_takes_a_symbol_and_refuses_a_float():
    """pn.arange("C") was a bare ValueError of int(); arange(2.5) truncated to 2 elements (numpy's has 3)."""
    c = pn.arange("C")
    assert str(c.shape[0]) == "C" and pn.arange(-2).shape == (0,)
    with pytest.raises(pn.ShapeError, match=r"arange: n must be an integer or a symbol's name, got 2\.5"):
        pn.arange(2.5)
    x, t = pn.placeholder(("B", "C"), name="x"), pn.placeholder(("B", 1), "int64", name="t")
    picked = pn.sum(pn.where(c.reshape((1, "C")) == t, x, 0.0), axis=1)  # torch's nll_loss, symbolic
    k = pn.compile(picked, target="cpu", cache=False)
    assert "gather" in {u.op for u in topological(k.program.outputs)}  # schedule/onehot.py's rewrite
    xs = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(k(xs, np.array([[3], [0], [9]])), np.array([3.0, 4.0, 0.0], np.float32))


def test_reshape_takes_one_integer_and_refuses_floats():
    """numpy's reshape(x, 6) was a bare TypeError; (2.9, 3.9) was truncated to (2, 3) silently."""
    x = pn.placeholder((2, 3), name="x")
    assert pn.reshape(x, 6).shape == (6,)
    with pytest.raises(pn.ShapeError, match=r"reshape of 'x': \(2\.9, 3\.9\) is not a shape of integers"):
        pn.reshape(x, (2.9, 3.9))


def test_the_percent_operator_is_numpy_mod():
    """`x % 3` was Python's TypeError (no __mod__) where numpy's % is np.mod; pn.mod existed."""
    a = pn.placeholder((6,), "int32", name="a")
    k = pn.compile([a % 3, 7 % a], target="cpu", cache=False)
    x = np.array([-7, -3, 1, 3, 7, -8], np.int32)
    for got, want in zip(k(x), (x % 3, 7 % x)):
        np.testing.assert_array_equal(got, want)


def test_a_symbolic_program_names_the_sizes_it_misses():
    """modeled_us / source / specialize with a symbol left out were a bare KeyError; a negative size was modeled."""
    k = pn.compile(pn.sum(pn.placeholder(("B", "N"), name="x"), axis=1), target="cpu", cache=False)
    with pytest.raises(pn.SymbolBindingError, match=r"over \['B', 'N'\]: missing \['N'\]"):
        k.modeled_us(B=3)
    with pytest.raises(pn.SymbolBindingError, match=r"not a size \(an int >= 0\): \{'B': -3\}"):
        k.source(B=-3, N=5)
