"""float16 <-> float32 conversions of cuda_emulation.h (pn_emu_h2f, pn_emu_f2h), shared by the CPU
target and the emulator: loads give numpy's astype for all 65536 float16 bit patterns (zeros of
both signs, every subnormal, normals, infinities, NaN), stores round as numpy's astype."""

import numpy as np
import pytest

import panamera as pn


@pytest.mark.parametrize("target", ["cpu", "emulator"])
def test_every_half_loads_as_numpy(target):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    if target == "emulator":
        h = np.concatenate([h[:2048], h[0x7800:0x8800], h[-2048:], h[::97]])  # a thread per element: a sample
    x = pn.placeholder(h.shape, "float16", name="x")
    k = pn.compile(x.astype("float32") * 1.0, target=target)
    got = np.asarray(k(h), np.float32)
    ref = h.astype(np.float32)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    assert np.array_equal(np.signbit(got), np.signbit(ref))  # the sign of zeros and of NaN


@pytest.mark.parametrize("target", ["cpu", "emulator"])
def test_half_stores_round_as_numpy(target, rng):
    """float32 -> float16 stores (pn_emu_f2h: the rounding in float arithmetic, then the bits) give numpy's astype bits: every half value, the midpoints and their neighbours,
    subnormals, the overflow threshold, infinities, zeros and NaN, random bit patterns."""
    from test_cpu_round_half import _hard_floats

    a = _hard_floats(rng)
    if target == "emulator":
        a = a[:: max(1, a.size // 20000)]
    x = pn.placeholder(a.shape, "float32", name="x")
    k = pn.compile((x * 1.0).astype("float16"), target=target)
    got = np.asarray(k(a))
    with np.errstate(all="ignore"):
        ref = a.astype(np.float16)
    assert got.dtype == np.float16
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint16), ref[~nan].view(np.uint16))
    assert np.array_equal(np.signbit(got), np.signbit(ref))
