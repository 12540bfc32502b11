"""The numpy call's object entry (runtime/cpu_call.py OBJECT_CALL): the arrays passed as one tuple,
their data pointers read in C. A warm call must not skip the checks of a later call with another
signature; out= is written in place unless it overlaps another buffer; the Python table path stays
the fallback. Results against numpy in float64 with conftest's tolerances."""

import numpy as np
import pytest
from conftest import concurrent_mismatches, random_array, tolerance

import panamera as pn
from panamera.runtime import cpu_call


def close(out, ref, n: int, scale: float):
    tol = tolerance("float32", n)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=tol, atol=tol * scale)


@pytest.fixture(scope="module")
def rows():
    """One kernel, no intermediate: each row's sum of -x/2 (the object entry without the lock)."""
    return pn.compile(pn.sum(-pn.placeholder((6, 40), "float32", name="x") * 0.5, axis=1), target="cpu")


def want(a):
    return (-a.astype(np.float64) * 0.5).sum(1)


def test_object_entry_in_use(rows):
    assert cpu_call.object_layout() is not None
    fast = rows.executor.fast()
    assert fast.objects is not None and not fast.scratch


def test_warm_call_then_another_signature_still_checked(rows, rng):
    a = random_array((6, 40), "float32", rng)
    close(rows(a, threads=1), want(a), 40, 20)  # warm
    with pytest.raises(pn.DTypeError, match="input 'x': expected dtype float32"):
        rows(a.astype(np.float64))
    with pytest.raises(pn.InputError, match=r"input 'x': expected shape \(6, 40\)"):
        rows(np.zeros((6, 41), np.float32))
    with pytest.raises(pn.OptionError, match="threads"):
        rows(a, threads=0)
    wide = random_array((6, 80), "float32", rng)
    close(rows(wide[:, ::2]), want(wide[:, ::2]), 40, 20)  # strided: the general path copies
    close(rows(np.asfortranarray(a)), want(a), 40, 20)
    with pytest.raises(pn.DTypeError, match="input 'x'"):
        rows(a.astype(">f4"))  # another byte order: refused as on the general path
    ro = a.copy()
    ro.setflags(write=False)
    close(rows(ro), want(a), 40, 20)  # read-only inputs are read in place


def test_results_fresh_and_out_in_place(rows, rng):
    a, b = random_array((6, 40), "float32", rng), random_array((6, 40), "float32", rng)
    ra, rb = rows(a), rows(b)
    assert ra is not rb
    close(ra, want(a), 40, 20)
    out = np.full(6, np.nan, np.float32)
    got = rows(b, out=out)
    assert got is out
    close(out, want(b), 40, 20)
    with pytest.raises(pn.InputError, match="out="):
        rows(b, out=np.empty(7, np.float32))


def test_out_overlapping_an_input_goes_through_a_copy(rng):
    k = pn.compile(pn.placeholder((64,), "float32", name="x") * 2.0 + 1.0, target="cpu")
    a = random_array((64,), "float32", rng)
    ref = a.astype(np.float64) * 2 + 1
    k(a, out=a)  # the same memory: the C side refuses it, the general path writes a copy
    close(a, ref, 1, 3)
    b = random_array((65,), "float32", rng)
    ref = b[:64].astype(np.float64) * 2 + 1
    k(b[:64], out=b[1:])  # overlapping by all but one element
    close(b[1:], ref, 1, 3)
    c = np.zeros(65, np.float32)
    assert k.executor.fast()._run_objects((c[:64],), [c[1:]], 1, True) == 1  # refused before running
    assert k.executor.fast()._run_objects((c[:64],), [np.empty(64, np.float32)], 1, True) == 0


def test_table_path_when_no_object_layout(monkeypatch, rng):
    """Where the object layout does not hold (another interpreter build), the Python table path runs."""
    monkeypatch.setattr(cpu_call, "object_entry", lambda: None)
    k = pn.compile(pn.sum(pn.placeholder((5, 7), "float32", name="y"), axis=0), target="cpu")
    fast = k.executor.fast()
    assert fast.objects is None
    a = random_array((5, 7), "float32", rng)
    close(k(a), a.astype(np.float64).sum(0), 5, 5)
    out = np.empty(7, np.float32)
    assert k(a, out=out) is out
    close(out, a.astype(np.float64).sum(0), 5, 5)


def test_concurrent_calls_without_the_lock(rows, rng):
    arrays = [random_array((6, 40), "float32", rng) for _ in range(4)]
    wants = [rows(a, threads=1) for a in arrays]
    assert not concurrent_mismatches(lambda a: rows(a, threads=1), arrays, wants, np.array_equal)


def test_torch_tensors_read_in_place(rows, rng):
    """A torch CPU tensor's own memory goes into the table (no copy) and the result is a torch tensor."""
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(random_array((6, 40), "float32", rng))
    got = rows(t, threads=1)
    assert isinstance(got, torch.Tensor)
    fast = rows.executor.fast()
    assert fast.ptrs[0] == t.data_ptr() and fast.ptrs[1] == got.data_ptr()  # written in place, no copy
    close(got.numpy(), want(t.numpy()), 40, 20)
