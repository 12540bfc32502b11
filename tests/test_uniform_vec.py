"""The vector width and reads UNIFORM along the vector (poly/access.py `loads_fit`): a row's fp32
mean / rstd / target beside its 16-bit values is one scalar per row, not a vector, so it does not
cap the row's loads at 8 bytes; the mapper (`choose_vec`) and replay (rule 3) apply the one rule.
The kernels at 16-byte loads of bf16 (8 lanes), the uniform values read as scalars, against numpy
float64."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from conftest import np_dtype, tolerance
from test_row_columns import FLOORED, _inputs, _layer_norm64

import panamera as pn
from panamera.bench.train_suite import cross_entropy_backward, layer_norm_backward
from panamera.errors import ScheduleError
from panamera.poly.access import choose_vec, loads_fit
from panamera.poly.program import build_program
from panamera.schedule.decision import MergeMode


def _statements(outputs):
    return tuple(s for g in build_program(tuple(outputs)).groups for s in g.statements)


def test_a_uniform_fp32_read_leaves_bf16_rows_at_16_bytes():
    x, mean = pn.placeholder((8, 64), "bfloat16", name="x"), pn.placeholder((8, 1), name="mean")
    sts = _statements([pn.sum(x.astype("float32") - mean, axis=1)])
    assert loads_fit(sts, "j", 8) and choose_vec(sts, "j", 64) == 8  # 16 bytes of x, mean one scalar


def test_a_contiguous_fp32_read_still_caps_the_vector():
    x, y = pn.placeholder((8, 64), "bfloat16", name="x"), pn.placeholder((8, 64), name="y")
    sts = _statements([pn.sum(x.astype("float32") * y, axis=1)])
    assert not loads_fit(sts, "j", 8) and choose_vec(sts, "j", 64) == 4  # 8 floats of y would be 32 bytes


@pytest.mark.parametrize("deterministic", [False, True])
def test_layer_norm_backward_bf16_at_16_byte_loads(deterministic, rng):
    """dx, dgamma, dbeta in one launch at 8 bf16 lanes per load, mean and rstd read as scalars;
    M = 48 leaves a partial row tile."""
    M, N = 48, 64
    a, d, g, mean, rstd = _inputs(rng, M, N, "bfloat16")
    k = pn.compile(layer_norm_backward(M, N, "bfloat16"), target="emulator", deterministic=deterministic, gpu=FLOORED)
    (m,) = k.mappings
    assert m.vec == 8 and len(k.plan.per_call) == 1 and m.persistent, k.explain()
    assert re.search(r"float pn_v\d+_\d+\[8\];", k.source)  # a register of 8 lanes per 16-byte load
    want = MergeMode.PARTIALS if deterministic else MergeMode.ATOMIC_WS
    assert [x for x in m.merges if x != MergeMode.STORE] == [want, want]
    refs, scales = _layer_norm64(*(v.astype(np.float64) for v in (a, d, g, mean, rstd)))
    for order in ("forward", "reverse"):
        for out, ref, scale, n in zip(k(a, d, g, mean, rstd, order=order), refs, scales, [N, M, M]):
            assert out.dtype == np_dtype("bfloat16")
            np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0, atol=tolerance("bfloat16", n) * scale.max())


def test_cross_entropy_backward_bf16_at_16_byte_loads(rng):
    """The int64 target and the fp32 dloss are uniform along the row: 8 bf16 lanes per load."""
    M, N = 24, 64
    logp = np.log(rng.dirichlet(np.ones(N), M)).astype(np_dtype("bfloat16"))
    t = rng.integers(0, N, (M, 1)).astype(np.int64)
    dloss = np.array([[1.5]], np.float32)
    k = pn.compile(cross_entropy_backward(M, N, "bfloat16"), target="emulator")
    assert [m.vec for m in k.mappings] == [8], k.explain()
    p64 = np.exp(logp.astype(np.float64))
    g64 = np.where(np.arange(N)[None, :] == t, -1.5 / M, 0.0)
    ref = g64 - p64 * g64.sum(1, keepdims=True)
    scale = np.abs(g64) + p64 * np.abs(g64).sum(1, keepdims=True)
    (out,) = k(logp, t, dloss)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0, atol=tolerance("bfloat16", N) * scale.max())


def test_replay_refuses_16_bytes_beyond_a_contiguous_input():
    """Rule 3: a saved vector of 8 lanes over a contiguous fp32 input loads 32 bytes of it."""
    x, y = pn.placeholder((8, 64), "bfloat16", name="x"), pn.placeholder((8, 64), name="y")
    out = pn.sum(x.astype("float32") * y, axis=1)
    k = pn.compile(out, target="emulator")
    assert k.mappings[0].vec == 4
    s = k.schedule
    wide = dataclasses.replace(s, kernels=(dataclasses.replace(s.kernels[0], vec=8),))
    with pytest.raises(ScheduleError, match="16 bytes of input 'y'"):
        pn.compile(out, target="emulator", schedule=wide)
