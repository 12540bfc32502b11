"""float32 -> float16 -> float32 inside a CPU (and emulator) kernel: pn_round_half in float arithmetic
(cuda_emulation.h's pn_emu_round_half) gives numpy's astype bits: every float16 value and the floats
around every rounding midpoint (ties to even, both sides), the subnormal range, the overflow
threshold 65520, infinities, zeros and NaN, and random bit patterns."""

import numpy as np
import pytest

import panamera as pn


def _hard_floats(rng) -> np.ndarray:
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[np.isfinite(h)].astype(np.float32)
    with np.errstate(over="ignore"):
        nxt = np.nextafter(h.astype(np.float16), np.float16(np.inf)).astype(np.float32)
    mids = (h + (nxt - h) / 2)[np.isfinite(nxt)]  # exact in float32: the midpoints between fp16 values
    near = [np.nextafter(v, t) for v in (h, mids) for t in (np.float32(-np.inf), np.float32(np.inf))]
    special = np.array([65504, 65519.996, 65520, 65536, 1e30, np.inf, -np.inf, np.nan, 0.0, -0.0, 2**-25, 2**-26,
                        1.5 * 2**-24, 2**-149, 3e-39], np.float32)  # fmt: skip
    rand = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([h, mids, *near, special, -special, rand]).astype(np.float32)


@pytest.mark.parametrize("target", ["cpu", "emulator"])
def test_round_half_matches_numpy(target, rng):
    a = _hard_floats(rng)
    if target == "emulator":
        a = a[:: max(1, a.size // 20000)]  # the emulator runs a thread per element: a sample
    x = pn.placeholder(a.shape, "float32", name="x")
    k = pn.compile(x.astype("float16").astype("float32") * 1.0, target=target)
    assert "pn_round_half" in (k.cpu_source if target == "cpu" else k.source)
    got = np.asarray(k(a), np.float32)
    with np.errstate(all="ignore"):
        ref = a.astype(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))
