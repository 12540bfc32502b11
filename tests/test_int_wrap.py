"""Integer sums wrap as numpy's do (issue: signed int32 overflow was undefined behaviour in the
generated C++; the CPU target and the emulator now build with -fwrapv). Each sum overflows int32
on purpose and is compared exactly with numpy's wrapping result."""

from __future__ import annotations

import numpy as np
import pytest

import panamera as pn
from panamera.frontend.scatter import scatter_add_sorted
from panamera.runtime import cpu, emulator


def big(shape, rng):
    """int32 values near 2**30: a sum of three or more wraps."""
    sign = rng.choice(np.array([1, 1, 1, -1], np.int32), shape)
    return rng.integers(2**30 - 4096, 2**30, shape, dtype=np.int32) * sign


def test_both_builds_define_signed_overflow():
    assert "-fwrapv" in cpu.BASE_FLAGS and "-fwrapv" in emulator.FLAGS


@pytest.mark.parametrize("target", ["cpu", "emulator"])
def test_int32_sums_that_overflow_wrap_as_numpys(target, rng):
    x = pn.placeholder((6, 37), "int32", name="x")
    k = pn.compile([pn.sum(x, axis=1, dtype="int32"), pn.sum(x, axis=0, dtype="int32"), pn.sum(x, dtype="int32")],
                   target=target)  # fmt: skip
    a = big((6, 37), rng)
    assert np.abs(a.astype(np.int64).sum(1)).max() > 2**31  # the test overflows
    got = k(a)
    for g, want in zip(got, (a.sum(1, dtype=np.int32), a.sum(0, dtype=np.int32), a.sum(dtype=np.int32))):
        assert g.dtype == np.int32
        np.testing.assert_array_equal(g, want)


def test_an_int32_scatter_add_that_overflows_wraps_as_np_add_at(rng):
    ids = pn.placeholder((40,), "int64", name="ids")
    src = pn.placeholder((40, 3), "int32", name="src")
    k = pn.compile([scatter_add_sorted(ids, src, rows=4)], target="cpu")
    i, s = rng.integers(0, 4, 40), big((40, 3), rng)
    want = np.zeros((4, 3), np.int32)
    np.add.at(want, i, s)
    np.testing.assert_array_equal(k(i, s)[0], want)
