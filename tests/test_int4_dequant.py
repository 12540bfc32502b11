"""Packed int4 weights on tensor cores by the exponent trick (schedule/int4_dequant.py, issue 25):
against numpy in float64 on the emulator, and one negative test per precondition.

The trick's weights equal the element-wise expression rounded to the MMA's type bit for bit, so
the tolerance is the fp32 accumulator's alone (`bound`: gamma_K sum |a w| plus the output's
rounding) against the weights rounded to fp16 / bf16 in numpy, not the looser bound of a
dequantized weight (u_16 sum |a w| more). Shapes have row and column tails (M 5, N 24) and a
K (264) that is not a multiple of the K slab.
"""

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from test_contract import array, bound
from test_tensor_core import tc_compile

import panamera as pn
from panamera.compiler import lower
from panamera.errors import ScheduleError
from panamera.model import H100
from panamera.schedule.int4_dequant import Nibbles, nibbles
from panamera.schedule.mapping import map_group, replay
from panamera.schedule.tc_tiling import candidates
from panamera.schedule.tensor_core import analyse

NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def packed_weight(N, K, G, scale_dtype, rng, lo_at=0, zero=8):
    """Two nibbles per uint8 (the low one at k parity `lo_at`), minus `zero`, times a scale per
    group of G: the expression, its inputs and the float64 weights."""
    packed = pn.placeholder((N, K // 2), "uint8", name="packed")
    sc = pn.placeholder((N, K // G), scale_dtype, name="scale")
    lo = (packed & 0xF).astype("float32") - float(zero)
    hi = ((packed >> 4) & 0xF).astype("float32") - float(zero)
    nib = pn.where(pn.arange(2).reshape(1, 1, 2) == lo_at, lo.reshape(N, K // 2, 1), hi.reshape(N, K // 2, 1))
    wd = (nib.reshape(N, K // G, G) * sc.reshape(N, K // G, 1).astype("float32")).reshape(N, K)
    P = rng.integers(0, 256, (N, K // 2)).astype(np.uint8)
    S = (rng.random((N, K // G)) * 0.01 + 1e-3).astype(NP[scale_dtype])
    low, high = (P & 0xF).astype(np.float64) - zero, ((P >> 4) & 0xF).astype(np.float64) - zero
    q = np.stack([low, high] if lo_at == 0 else [high, low], axis=2).reshape(N, K)
    return wd, P, S, q * np.repeat(S.astype(np.float64), G, axis=1)


@pytest.mark.parametrize("act, lo_at, zero, tile", [("float16", 0, 8, (1, 2, 64)), ("bfloat16", 1, 0, (1, 1, 32))])
def test_packed_int4_matches_float64(act, lo_at, zero, tile, rng):
    """fp16 (low nibble at even k, zero point 8; 4 words per thread a slab) and bf16 (low nibble
    at odd k, zero point 0; 2 words, 9 slabs with a tail): the staging uses pn_i4x8, and the result
    is the fp32 sum of the weights rounded once."""
    Mi, Ni, Ki, G = 5, 24, 264, 24
    x = pn.placeholder((Mi, Ki), act, name="x")
    wd, P, S, Wd = packed_weight(Ni, Ki, G, act, rng, lo_at, zero)
    k = tc_compile(pn.einsum("mk,nk->mn", x, wd), tile)
    assert "pn_i4x8(pn_wv" in k.source and "mma_sync" in k.source
    # the slab's words are loaded first (all in flight), then the activations staged, then converted;
    # double-buffered: the first slab's before the loop, the next one's at the top of each step
    src, words = k.source, "pn_bnw[pn_u] = pn_vload"
    assert src.count(words) == 2 and src.index(words) < src.index("for (pn_idx pn_ks")
    assert src.rindex(words) < src.index("pn_vstore(&pn_sa[") < src.index("pn_i4x8(pn_wv")
    X = array((Mi, Ki), act, rng)
    out = np.asarray(k(X, P, S)).astype(np.float64)
    Wr = Wd.astype(NP[act]).astype(np.float64)  # each weight rounded once to the MMA's type
    assert (np.abs(out - X.astype(np.float64) @ Wr.T) <= bound(X, Wr.T, "mk,kn->mn", "float32", "float32")).all()


def test_fp16_scales_with_bf16_activations_stay_element_wise(rng):
    """Precondition 3 fails (the scale is not the MMA's type): the element-wise staging, still right."""
    Mi, Ni, Ki, G = 5, 24, 256, 128
    x = pn.placeholder((Mi, Ki), "bfloat16", name="x")
    wd, P, S, Wd = packed_weight(Ni, Ki, G, "float16", rng)
    k = tc_compile(pn.einsum("mk,nk->mn", x, wd), (1, 2, 64))
    assert "pn_i4x8(pn_wv" not in k.source
    X = array((Mi, Ki), "bfloat16", rng)
    out = np.asarray(k(X, P, S)).astype(np.float64)
    Wr = Wd.astype(ml_dtypes.bfloat16).astype(np.float64)
    assert (np.abs(out - X.astype(np.float64) @ Wr.T) <= bound(X, Wr.T, "mk,kn->mn", "float32", "float32")).all()


# -- preconditions (schedule/int4_dequant.py), one negative test each ------------------------------
def _why(wd, Ki=256, act="float16", vec=None):
    a = lower(pn.einsum("mk,nk->mn", pn.placeholder((4, Ki), act, name="x"), wd), stop_after="mappings",
              target="emulator")  # fmt: skip
    g, d = a.groups[0], a.mappings[0].decision
    ops = analyse(g)
    return nibbles(ops.b, g.statements[0], str(ops.kind), vec or d.vec, d.access[0])


def test_recognized(rng):
    assert _why(packed_weight(16, 256, 128, "float16", rng)[0]) == Nibbles(packed=2, scale=3, zero=8, flip=0)


def test_precondition_1_whole_words(rng):
    assert _why(packed_weight(16, 256, 128, "float16", rng)[0], vec=4).startswith("1:")


def test_precondition_2_one_zero_point(rng):
    packed = pn.placeholder((16, 128), "uint8", name="packed")
    sc = pn.placeholder((16, 2), "float16", name="scale")
    lo, hi = (packed & 0xF).astype("float32") - 8.0, ((packed >> 4) & 0xF).astype("float32") - 7.0
    nib = pn.where(pn.arange(2).reshape(1, 1, 2) == 0, lo.reshape(16, 128, 1), hi.reshape(16, 128, 1))
    wd = (nib.reshape(16, 2, 128) * sc.reshape(16, 2, 1).astype("float32")).reshape(16, 256)
    assert _why(wd).startswith("2:")


def test_precondition_3_scale_type(rng):
    assert _why(packed_weight(16, 256, 128, "float16", rng)[0], act="bfloat16").startswith("3:")


def test_precondition_4_aligned_words(rng):
    """Rows of 132 bytes: a 16-lane step's 8 bytes are not 8-byte aligned on odd rows."""
    assert _why(packed_weight(16, 264, 24, "float16", rng)[0], Ki=264, vec=16).startswith("4:")


def test_int4_tiles_hold_at_most_sixteen_registers_of_loads(rng):
    """Precondition of the loads-first staging (schedule/tensor_core.py `held_registers`): a tile
    whose two int4 slabs are 8 words and scales per thread each (one warp, K slab 128: 32
    registers) is no candidate, and replay refuses it."""
    x = pn.placeholder((5, 256), "float16", name="x")
    wd = packed_weight(32, 256, 128, "float16", rng)[0]
    y = pn.einsum("mk,nk->mn", x, wd)
    g = lower(y, stop_after="groups", target="emulator").groups[0]
    tiles = {d.mma_tile for d in candidates(g, analyse(g), H100, None, False)}
    assert (1, 1, 64) in tiles and (1, 1, 128) not in tiles and (1, 2, 128) not in tiles
    d = map_group(g, H100, mma=True).decision
    with pytest.raises(ScheduleError, match="registers of loads per thread"):
        replay(g, dataclasses.replace(d, tx=32, mma_tile=(1, 1, 128), mma_op="", grid=(2, d.grid[1])), H100, "k")


PAIRS = r"""
extern "C" __global__ void pairs(const unsigned* w, const __half* s, __half* o, const __nv_bfloat16* sb,
                                 __nv_bfloat16* ob) {
  const int t = threadIdx.x;
  __half h[8];
  __nv_bfloat16 b[8];
  pn_i4x8(w[t], pn_h2_bits(0x64086408u), __half2half2(s[t]), h);  // zero point 8
  pn_i4x8(w[t], pn_b2_bits(0x43034303u), __bfloat162bfloat162(sb[t]), b);  // zero point 3
  for (int k = 0; k < 8; ++k) { o[8 * t + k] = h[k]; ob[8 * t + k] = b[k]; }
}
"""


def test_pn_i4x8_is_exact_on_the_emulator(rng):
    """Every nibble, scales from subnormal to overflowing: pn_i4x8 equals (n - z) * s rounded
    once to fp16 / bf16 in numpy (float64, exact here), bit for bit (the emulator's paired ops)."""
    import ctypes

    from panamera.codegen.header import PRELUDE
    from panamera.runtime import emulator

    T = 64
    W = rng.integers(0, 2**32, T, dtype=np.uint64).astype(np.uint32)
    W[0], W[1] = 0x76543210, 0xFEDCBA98  # nibbles 0..15 in order
    S = np.concatenate([[1.0, -1.0, 6e-8, 6e4], rng.standard_normal(T - 4) * 10.0 ** rng.integers(-6, 4, T - 4)])
    Sh, Sb = S.astype(np.float16), S.astype(ml_dtypes.bfloat16)  # 6e4 * 8 overflows fp16: inf either way
    out, outb = np.zeros(8 * T, np.float16), np.zeros(8 * T, ml_dtypes.bfloat16)
    lib = emulator.build(PRELUDE + PAIRS, {"pairs": ["unsigned*", "__half*", "__half*", "__nv_bfloat16*",
                                                     "__nv_bfloat16*"]})  # fmt: skip
    args = [ctypes.c_void_p(a.ctypes.data) for a in (W, Sh, out, Sb, outb)]
    emulator.launch(lib, "pairs", (1, 1, 1), (T, 1, 1), args, "forward")
    n = (W[:, None].astype(np.int64) >> (4 * np.arange(8))) & 0xF  # nibble b of word t at [t, b]
    with np.errstate(over="ignore"):
        ref = ((n - 8) * Sh.astype(np.float64)[:, None]).astype(np.float16).ravel()
        refb = ((n - 3) * Sb.astype(np.float64)[:, None]).astype(ml_dtypes.bfloat16).ravel()
    assert (out.view(np.uint16) == ref.view(np.uint16)).all()
    assert (outb.view(np.uint16) == refb.view(np.uint16)).all()
