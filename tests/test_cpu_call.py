"""target="cpu"'s call path (runtime/cpu_call.py): one C entry per program, its pointer table and
intermediates bound once; plain numpy calls checked by a tuple compare, anything else through the
general path and its errors. Results against numpy in float64 with conftest's tolerances."""

import numpy as np
import pytest
from conftest import concurrent_mismatches, random_array, tolerance

import panamera as pn


def close(out, ref, n: int, scale: float):
    tol = tolerance("float32", n)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=tol, atol=tol * scale)


@pytest.fixture(scope="module")
def chain():
    """Three kernels, one intermediate between them (the row sums, a resident buffer): the sum of
    squared row sums and a column max."""
    x = pn.placeholder((6, 40), "float32", name="x")
    r = pn.sum(x, axis=1)
    return pn.compile([pn.sum(r * r), pn.max(x, axis=0)], target="cpu")


def refs(a):
    a64 = a.astype(np.float64)
    return (a64.sum(1) ** 2).sum(), a64.max(0)


def test_many_calls_reuse_the_intermediate_and_out(chain, rng):
    assert chain.executor.fast() is not None and len(chain.executor.kernels) == 3
    bufs = (np.empty((), np.float32), np.empty(40, np.float32))
    for step in range(40):
        a = random_array((6, 40), "float32", rng)
        want = refs(a)
        scale = float(np.abs(a).sum(1).max()) ** 2 * 6
        if step % 2:
            got = chain(a, out=bufs)
            assert got[0] is bufs[0] and got[1] is bufs[1]
        else:
            got = chain(a, threads=1 + step % 3)
            assert not np.shares_memory(got[1], bufs[1])
        close(got[0], want[0], 6 * 40, scale)
        np.testing.assert_array_equal(got[1], want[1])


def test_results_are_fresh_arrays(chain, rng):
    a = random_array((6, 40), "float32", rng)
    first, second = chain(a), chain(a)
    assert not np.shares_memory(first[1], second[1])
    np.testing.assert_array_equal(first[1], second[1])


def test_general_path_inputs(chain, rng):
    """Views, read-only arrays, names, torch tensors and a strided `out=`: the general path, same
    results."""
    a = random_array((6, 40), "float32", rng)
    want = refs(a)
    big = np.zeros((6, 80), np.float32)
    big[:, ::2] = a
    ro = a.copy()
    ro.flags.writeable = False
    for arg in (big[:, ::2], ro):
        np.testing.assert_array_equal(chain(arg)[1], want[1])
    np.testing.assert_array_equal(chain(x=a)[1], want[1])
    strided = np.zeros(80, np.float32)[::2]  # an out= view that is not contiguous
    chain(a, out=(np.empty((), np.float32), strided))
    np.testing.assert_array_equal(strided, want[1])
    torch = pytest.importorskip("torch")
    got = chain(torch.from_numpy(a))
    assert isinstance(got[1], torch.Tensor)
    np.testing.assert_array_equal(got[1].numpy(), want[1])


def test_out_that_overlaps_an_input_is_not_written_in_place(rng):
    k = pn.compile(pn.sum(pn.placeholder((8, 8), "float32", name="x"), axis=1) * 2.0, target="cpu")
    a = random_array((8, 8), "float32", rng)
    want = a.astype(np.float64).sum(1) * 2
    flat = a.reshape(-1)
    k(a, out=flat[-8:], threads=1)  # in place, row 0's result would overwrite row 7 before it is read
    close(flat[-8:], want, 8, 2.5)


@pytest.mark.parametrize(
    "arg, error, match",
    [
        (np.zeros((6, 41), np.float32), pn.InputError, r"input 'x': expected shape \(6, 40\)"),
        (np.zeros((6, 40), np.float64), pn.DTypeError, "input 'x': expected dtype float32"),
        ([[1.0]], pn.InputError, "input 'x'"),
    ],
)
def test_bad_inputs_still_named(chain, arg, error, match):
    with pytest.raises(error, match=match):
        chain(arg)


def test_bad_out_and_counts(chain):
    a = np.zeros((6, 40), np.float32)
    with pytest.raises(pn.InputError, match="out="):
        chain(a, out=(np.empty((), np.float32), np.empty(41, np.float32)))
    with pytest.raises(pn.InputError, match="expected 1 input"):
        chain(a, a)


def test_concurrent_calls(chain, rng):
    """Python threads calling one program at once: the pointer table and the intermediate are
    shared, so calls are serialized, and every result is its own input's."""
    arrays = [random_array((6, 40), "float32", rng) for _ in range(4)]
    wants = [chain(a, threads=1) for a in arrays]  # one thread: bit-stable, so equal is exact

    def equal(got, want):  # both results: [0] goes through the shared intermediate
        return all(np.array_equal(g, w) for g, w in zip(got, want))

    assert not concurrent_mismatches(lambda a: chain(a, threads=1), arrays, wants, equal)


def test_torch_cpu_tensors_in_place(rng):
    """Contiguous torch CPU tensors are read in place and give torch tensors (bfloat16 too); a
    transposed view, a tensor requiring grad and numpy mixed in behave as on the general path."""
    torch = pytest.importorskip("torch")
    x = pn.placeholder((6, 40), "float32", name="x")
    b = pn.placeholder((6, 40), "bfloat16", name="b")
    k = pn.compile([pn.max(x, axis=0), pn.sum(b, axis=1)], target="cpu")
    a = random_array((6, 40), "float32", rng)
    tb = torch.from_numpy(random_array((6, 40), "float32", rng)).to(torch.bfloat16)
    want_b = tb.double().sum(1).numpy()
    for first in (torch.from_numpy(a), a, torch.from_numpy(a.T.copy()).T):  # last: a transposed view
        got = k(first, tb, threads=1)
        assert all(isinstance(g, torch.Tensor) for g in got) and got[1].dtype == torch.bfloat16
        np.testing.assert_array_equal(got[0].numpy(), a.max(0))
        np.testing.assert_allclose(got[1].double().numpy(), want_b, rtol=2**-7, atol=2**-7 * 40)
    grad = torch.from_numpy(a).requires_grad_()
    with pytest.raises(pn.InputError, match="requires grad"):
        k(grad, tb)
    with torch.no_grad():
        np.testing.assert_array_equal(k(grad, tb)[0].numpy(), a.max(0))
    with pytest.raises(pn.DTypeError, match="input 'b'"):
        k(a, tb.float())
