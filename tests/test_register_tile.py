"""Register tiles of skinny contractions (issue 13, item 2): a thread computes the rows i,
i + N, ..., i + (R - 1) N of `x @ W.T` (same weight row n, different m), loads the weights once
per tile (isl: the read is uniform along the tile) and keeps R accumulators in registers.

Results against numpy in float64 on the emulator, with the derived bound of tests/test_contract.py
(gamma_K sum |a b| + one rounding of the result); the tile is forced through a replayed schedule
(`map_group(..., rtile=R)`), so each R is exercised whatever the model prefers at test sizes.
"""

import dataclasses

import numpy as np
import pytest
from test_contract import array, bound, dequant_reference, int4_weight

import panamera as pn
from panamera.compiler import lower
from panamera.errors import ScheduleError
from panamera.model.gpu import H100
from panamera.schedule.mapping import map_group
from panamera.schedule.saved import Schedule


def tiled(y, R, split=None, deterministic=False, C=1):
    """The program of `y` compiled with a register tile of R x C rows (and the given split)."""
    base = pn.compile(y, target="emulator", use_database=False, cache=False, deterministic=deterministic)
    d = map_group(base.groups[0], H100, split=split, deterministic=deterministic, rtile=R, ctile=C).decision
    k = pn.compile(y, target="emulator", schedule=dataclasses.replace(base.schedule, kernels=(d,)),
                   deterministic=deterministic)  # fmt: skip
    assert (k.mappings[0].rtile, k.mappings[0].ctile) == (R, C)
    return k


def check(out, X, Wd):
    ref = X.astype(np.float64) @ Wd.T.astype(np.float64)
    assert (np.abs(out - ref) <= bound(X, Wd.T, "mk,kn->mn", "float32", "float32")).all()


@pytest.mark.parametrize("M,R,C", [(4, 2, 1), (5, 2, 2), (5, 4, 1), (17, 16, 1), (6, 4, 4)])
def test_tile_rows_share_the_weight_load(M, R, C, rng):
    """M not a multiple of R: the tile's missing rows are guarded. The weights are loaded once
    per column c of the tile, the activations once per row r."""
    N, K = 48, 256
    x, w = pn.placeholder((M, K), "float32", name="x"), pn.placeholder((N, K), "float32", name="w")
    k = tiled(x @ w.T, R, C=C)
    m = k.mappings[0]
    assert m.rstride == N and m.rshared == ((False, True),) and m.cshared == (((True, False),) if C > 1 else ())
    src = k.source
    assert src.count("pn_ldv(&in1[") == 1 and src.count("pn_ldv(&in0[") == 1 and f"pn_r < {R}" in src
    X, W = array((M, K), "float32", rng), array((N, K), "float32", rng)
    check(k(X, W), X, W)


@pytest.mark.parametrize("deterministic", [False, True])
def test_tile_with_split_k(deterministic, rng):
    """K split across blocks: every row of the tile merges by one atomic per block, or writes
    its partial for the last block (bit-identical in any thread order)."""
    M, N, K = 6, 8, 8192
    x, w = pn.placeholder((M, K), "float32", name="x"), pn.placeholder((N, K), "float32", name="w")
    k = tiled(x @ w.T, 4, split=8, deterministic=deterministic, C=2)
    assert k.mappings[0].split >= 2
    X, W = array((M, K), "float32", rng), array((N, K), "float32", rng)
    outs = [k(X, W, order=o) for o in ("forward", "shuffled")]
    for out in outs:
        check(out, X, W)
    assert all(m == ("partials" if deterministic else "atomic_ws") for m in k.plan.kernels[0].modes)
    if deterministic:
        assert outs[0].tobytes() == outs[1].tobytes()


def test_tile_with_int8_weights_and_scales(rng):
    """The dequantized weight (int8 x per-channel fp16 scale) is loaded and scaled once per tile."""
    M, N, K = 5, 32, 256
    x = pn.placeholder((M, K), "float16", name="x")
    w, sc = pn.placeholder((N, K), "int8", name="w"), pn.placeholder((N,), "float16", name="scale")
    k = tiled(x @ (w.astype("float32") * sc.reshape(N, 1)).T, 4, C=2)
    assert sum(map(sum, k.mappings[0].rshared)) == 2  # the weights and the scales
    X, Q = array((M, K), "float16", rng), array((N, K), "int8", rng)
    S = (rng.random(N) * 0.01).astype(np.float16)
    check(k(X, Q, S), X, dequant_reference(Q, S, 0))


def test_tile_with_int4_nibbles(rng):
    M, N, K, G = 3, 16, 256, 128
    x = pn.placeholder((M, K), "float16", name="x")
    wd, P, S, Wd = int4_weight(N, K, G, rng)
    k = tiled(pn.einsum("mk,nk->mn", x, wd), 2)
    X = array((M, K), "float16", rng)
    check(k(X, P, S), X, Wd)


@pytest.mark.parametrize("M,N,K", [(4, 4096, 4096), (16, 4096, 4096), (16, 14336, 4096)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
def test_full_size_plans_tile_the_rows(M, N, K, dtype):
    """Planned, not run: LLM decoding's skinny linears take a register tile whose rows share the
    weight row (stride N), unsplit, or from 16 rows on, tensor cores where the model finds them
    clearly faster (schedule/tc_tiling.py; below 16 rows only warpgroup MMAs); fp16/bf16 stream the weights within 1.2x of the
    limit, and int8 with per-channel scales at M = 4 too (modeled; docs/WORKLOADS.md C)."""
    from panamera.bench.suites import _linear
    from panamera.model import estimate

    k = pn.compile(_linear(M, N, K, dtype, "bfloat16" if dtype == "bfloat16" else "float16")(),
                   target="emulator", use_database=False, cache=False)  # fmt: skip
    m = k.mappings[0]
    # below 16 rows tensor cores only as warpgroup MMAs (full rate on H100: schedule/warpgroup.py)
    assert (m.mma and (M >= 16 or m.mma_op)) or (m.rtile >= 2 and m.rstride == N and m.split == 1)
    if dtype != "int8" or M == 4:
        assert estimate(k.plan, H100).ratio_to_limit <= 1.2  # the limit: the best streams ever measured


# -- replay: one negative test per rule 9 precondition (schedule/mapping.py `replay`) ----------
def _decision(M=4):
    x, w = pn.placeholder((M, 256), "float32", name="x"), pn.placeholder((32, 256), "float32", name="w")
    a = lower(x @ w.T, stop_after="groups", target="emulator")
    return a.groups[0], map_group(a.groups[0], H100, rtile=2).decision


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(rtile=3), "not a power of two"),
        (dict(ctile=3), "not a power of two"),
        (dict(rstride=16), "not one of the group's row strides"),
        (dict(rshared=((True, True),)), "not what isl finds"),
        (dict(ctile=2), "not what isl finds"),  # cshared left empty
    ],
)
def test_replay_refuses_a_bad_tile(change, message):
    from panamera.schedule.mapping import replay

    g, d = _decision()
    with pytest.raises(ScheduleError, match=message):
        replay(g, dataclasses.replace(d, **change), H100, "k")


def test_replay_refuses_a_tile_in_a_column_group():
    from panamera.schedule.mapping import replay

    x, w = pn.placeholder((4, 256), "float32", name="x"), pn.placeholder((256, 32), "float32", name="w")
    g = lower(x @ w, stop_after="groups", target="emulator").groups[0]
    d = map_group(g, H100).decision
    with pytest.raises(ScheduleError, match="only ROW/ALL"):
        replay(g, dataclasses.replace(d, rtile=2, rstride=32), H100, "k")


def test_schedules_before_register_tiles_still_load():
    """A format-2 schedule (no tile fields) loads with no tile; the new format round-trips one."""
    g, d = _decision()
    s = Schedule("H100-SXM5", (), (d,))
    assert Schedule.from_json(s.to_json()) == s
    old = s.to_json().replace("panamera-schedule/3", "panamera-schedule/2")
    old = old.replace(', "rtile": 2, "rstride": 32, "rshared": [[0, 1]], "ctile": 1, "cshared": []', "")
    assert Schedule.from_json(old).kernels[0].rtile == 1
    with pytest.raises(ScheduleError, match="not one of"):
        Schedule.from_json(s.to_json().replace("panamera-schedule/3", "panamera-schedule/9"))


@pytest.mark.parametrize("R,C", [(2, 1), (4, 2)])
def test_tile_with_a_stitched_epilogue(R, C, rng):
    """relu(x @ W.T + bias) + residual stitched to the contraction (one kernel): each row of the
    tile is all-reduced and finished by its own row epilogue."""
    M, N, K = 5, 64, 256
    x, w = pn.placeholder((M, K), "float32", name="x"), pn.placeholder((N, K), "float32", name="w")
    bias, res = pn.placeholder((N,), "float32", name="bias"), pn.placeholder((M, N), "float32", name="res")
    z = pn.maximum(x @ w.T + bias, 0.0) + res
    k = tiled(z, R, C=C)
    assert len(k.plan.kernels) == 1 and k.mappings[0].stitched
    X, W, B, Rs = (array(s, "float32", rng) for s in [(M, K), (N, K), (N,), (M, N)])
    mm = X.astype(np.float64) @ W.T.astype(np.float64)
    tol = bound(X, W.T, "mk,kn->mn", "float32", "float32") + 3 * 2.0**-24 * (np.abs(mm) + np.abs(B) + np.abs(Rs))
    assert (np.abs(k(X, W, B, Rs) - (np.maximum(mm + B, 0) + Rs)) <= tol).all()


@pytest.mark.parametrize("C", [1, 2])
def test_tile_stitched_softmax_reads_row_results_from_registers(C, rng):
    """A stitched softmax of x + bias (bias shared by every row: a register tile fits) reads the
    row max and sum from the registers its passes left them in, not from memory (issue 20: the
    BLOOM attention's ALiBi softmax failed at codegen with a KeyError)."""
    M, N = 16, 8
    x, b = pn.placeholder((M, N), "float32", name="x"), pn.placeholder((N,), "float32", name="b")
    k = tiled(pn.nn.softmax(x + b, axis=-1), 2, C=C)
    assert len(k.plan.kernels) == 1 and k.mappings[0].stitched
    X, B = array((M, N), "float32", rng), array((N,), "float32", rng)
    s = X.astype(np.float64) + B
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    ref = e / e.sum(axis=-1, keepdims=True)
    # a few roundings per element (add, sub, exp, sum over N, divide), relative to values <= 1
    assert (np.abs(k(X, B) - ref) <= (N + 8) * 2.0**-24 * np.maximum(ref, 2.0**-24) + 2.0**-24).all()
