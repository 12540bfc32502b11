"""Contractions on tensor cores (issue 25, item 3): wmma tiles against numpy in float64 on the
emulator (runtime/wmma_emulation.h), the model's choice, the preconditions and replay's rules.

Tolerances are derived as in tests/test_contract.py (`bound`: gamma_K in the fp32 accumulator
times sum |a b|, plus the output's rounding). 16-bit operands multiply exactly in fp32, so a
tensor-core tile of fp16 / bf16 operands obeys the same bound; a dequantized weight is rounded
once to the MMA's 16-bit type before the MMA (schedule/tensor_core.py, precondition 3), which
adds u_16 * sum |a w| (the rounding of each w, relative). int8 x int8 is exact in int32.
Shapes are small and not multiples of 16 (M 20, N 40, K 100): the tails of every tile.
"""

import dataclasses
import json

import ml_dtypes
import numpy as np
import pytest
from test_contract import U, array, bound, dequant_reference, int4_weight

import panamera as pn
from panamera.compiler import lower
from panamera.errors import ScheduleError
from panamera.model import H100
from panamera.schedule import tc_tiling
from panamera.schedule.decision import Decision
from panamera.schedule.mapping import MergeMode, map_group, replay
from panamera.schedule.tc_tiling import candidates
from panamera.schedule.tensor_core import Mma, analyse

M, N, K = 20, 40, 100


def tc_compile(y, tile=None, split=None, deterministic=False):
    """`y` compiled with its contraction forced onto tensor cores: the first candidate of the
    given tile (warps along rows, along columns, K slab) and split."""
    kw = dict(target="emulator", use_database=False, cache=False, deterministic=deterministic)
    base = pn.compile(y, **kw)
    g = base.groups[0]
    ops = analyse(g)
    assert not isinstance(ops, str), ops
    d = next(d for d in candidates(g, ops, H100, split, deterministic) if tile is None or d.mma_tile == tile)
    k = pn.compile(y, schedule=dataclasses.replace(base.schedule, kernels=(d,)), **kw)
    assert k.schedule.kernels[0].mma == d.mma and len(k.plan.kernels) == 1
    return k


@pytest.mark.parametrize(
    "dtype, tile, split",
    [("float16", (1, 1, 32), 1), ("bfloat16", (2, 2, 32), 1), ("float16", (2, 1, 64), 2)],
)
def test_16bit_tiles_with_tails(dtype, tile, split, rng):
    """fp16 / bf16 operands, fp32 accumulators, one warp and 2 x 2 warps, split-K merged by atomics."""
    x, w = pn.placeholder((M, K), dtype, name="x"), pn.placeholder((N, K), dtype, name="w")
    k = tc_compile(x @ w.T, tile, split)
    assert "mma_sync" in k.source and ".x[" not in k.source and "num_elements" not in k.source  # API only
    X, W = array((M, K), dtype, rng), array((N, K), dtype, rng)
    out = np.asarray(k(X, W)).astype(np.float64)
    ref = X.astype(np.float64) @ W.astype(np.float64).T
    assert (np.abs(out - ref) <= bound(X, W.T, "mk,kn->mn", "float32", dtype)).all()


@pytest.mark.parametrize(
    "dtype, tile, split",
    [("float16", (2, 1, 32, 1, 2), 1), ("bfloat16", (1, 2, 32, 2, 1), 2), ("int8", (1, 1, 64, 2, 1), 4)],
)
def test_warp_fragment_tiles(dtype, tile, split, rng):
    """A warp of FM x FN fragments (`frags`): each A fragment feeds FN MMAs and each B fragment FM;
    fp16, bf16 and int8 x int8, with the tails of M 20 / N 40 / K 100, split-K merged by partials."""
    x, w = pn.placeholder((M, K), dtype, name="x"), pn.placeholder((N, K), dtype, name="w")
    y = x @ w.T if dtype != "int8" else pn.matmul(x, w.T).inputs[0]
    k = tc_compile(y, tile, split, deterministic=True)
    d = k.schedule.kernels[0]
    assert d.mma_tile == tile and f"pn_acc[{tile[3]}][{tile[4]}]" in k.source
    assert Decision.from_dict(json.loads(json.dumps(d.to_dict()))) == d  # a saved schedule keeps the fragments
    assert bool(d.mma_land) == (split > 1)  # and the landing of its partials, decided once by `candidates`
    X, W = array((M, K), dtype, rng), array((N, K), dtype, rng)
    out = np.asarray(k(X, W))
    if dtype == "int8":
        assert np.array_equal(out, X.astype(np.int64) @ W.astype(np.int64).T)
        return
    ref = X.astype(np.float64) @ W.astype(np.float64).T
    assert (np.abs(out.astype(np.float64) - ref) <= bound(X, W.T, "mk,kn->mn", "float32", dtype)).all()


def test_split_k_partials_are_deterministic(rng, monkeypatch):
    """deterministic=True: the split's partials combined by the last block in block order, landed
    in shared memory by cp.async (they fit: `landing`), half landed and half held in registers
    (shared memory capped at the K slabs' and accumulators' own), or, where no copy is allowed,
    loaded in register batches: the same fold order, so the same bits, within the bound."""
    x, w = pn.placeholder((M, K), "float16", name="x"), pn.placeholder((N, K), "float16", name="w")
    X, W = array((M, K), "float16", rng), array((N, K), "float16", rng)
    ref = X.astype(np.float64) @ W.astype(np.float64).T
    outs = []
    for cap, copies, source in ((None, None, "landed"), (0, None, "held"), (None, 0, "batches")):
        if cap is not None:
            monkeypatch.setattr(tc_tiling, "LANDING_PER_SM", cap)
        if copies is not None:
            monkeypatch.setattr(tc_tiling, "MAX_LANDED_COPIES", copies)
        k = tc_compile(x @ w.T, (1, 2, 32), 4, deterministic=True)
        assert [str(m) for m in k.schedule.kernels[0].merges] == ["partials"]
        src = k.source
        assert ("__pipeline_memcpy_async(&pn_sp" in src) == (source != "batches") and ("pn_b0" in src) == (
            source == "batches"
        )
        assert ("2 blocks' partials of each output; 2 in registers" in src) == (source == "held")
        outs.append(np.asarray(k(X, W)))
        assert (np.abs(outs[-1].astype(np.float64) - ref) <= bound(X, W.T, "mk,kn->mn", "float32", "float16")).all()
        assert np.array_equal(np.asarray(k(X, W)), outs[-1])
        monkeypatch.undo()
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


@pytest.mark.parametrize("wrapped", [False, True])
def test_int8_tiles_exact(wrapped, rng):
    """int8 x int8 on s8 MMAs, int32 accumulators: exact. The int32 sum itself (the matmul's
    reduce node), split over K, and numpy's int8 result (the wrap is an element-wise consumer
    stitched to the contraction, applied where each output is final)."""
    x, w = pn.placeholder((M, K), "int8", name="x"), pn.placeholder((N, K), "int8", name="w")
    y = pn.matmul(x, w.T)
    if not wrapped:
        y = y.inputs[0]
        assert y.op == "reduce" and y.dtype.name == "int32"
    k = tc_compile(y, (2, 1, 32), None if wrapped else 2)
    assert k.schedule.kernels[0].mma == Mma.S8
    X, W = array((M, K), "int8", rng), array((N, K), "int8", rng)
    ref = X.astype(np.int64) @ W.astype(np.int64).T
    assert np.array_equal(np.asarray(k(X, W)), ref.astype(np.int8) if wrapped else ref)


def _dequant_bound(X, Wd, out: str):
    mag = np.abs(X.astype(np.float64)) @ np.abs(Wd).T
    return bound(X, Wd.T, "mk,kn->mn", "float32", out) + U["float16"] * mag


@pytest.mark.parametrize("tile, split", [((1, 2, 32), 2), ((1, 1, 32, 2, 1), 4)])
def test_int8_weights_dequantized_to_fp16(tile, split, rng):
    """fp16 x (int8 * per-channel fp16 scale): the weight dequantized in registers, rounded to
    fp16, then the MMA; split over K (atomics; partials landed for a warp of 2 x 1 fragments).
    The weights' vectors and scales of a slab are loaded first, double-buffered (tensor_core.py
    `words_first`): before the loop, then the next slab's each step."""
    x = pn.placeholder((M, K), "float16", name="x")
    w, sc = pn.placeholder((N, K), "int8", name="w"), pn.placeholder((N, 1), "float16", name="scale")
    y = x @ (w.astype("float32") * sc.astype("float32")).T
    k = tc_compile(y, tile, split, deterministic=len(tile) == 5)
    assert k.schedule.kernels[0].mma == Mma.F16
    held = "pn_bnc1[pn_u] = pn_vload"
    assert k.source.count(held) == 2 and k.source.index(held) < k.source.index("for (pn_idx pn_ks")
    X, Q = array((M, K), "float16", rng), array((N, K), "int8", rng)
    S = (rng.random((N, 1)) * 0.01).astype(np.float16)
    Wd = dequant_reference(Q, S[:, 0], 0)
    out = np.asarray(k(X, Q, S)).astype(np.float64)
    assert (np.abs(out - X.astype(np.float64) @ Wd.T) <= _dequant_bound(X, Wd, "float32")).all()


def test_int4_weights_dequantized_to_fp16(rng):
    """fp16 x int4 (two per uint8, zero point 8, fp16 scales per group of 128) on tensor cores;
    N and M not multiples of 16."""
    Mi, Ni, Ki, G = 5, 24, 256, 128
    x = pn.placeholder((Mi, Ki), "float16", name="x")
    wd, P, S, Wd = int4_weight(Ni, Ki, G, rng)
    k = tc_compile(pn.einsum("mk,nk->mn", x, wd), (1, 2, 64))
    X = array((Mi, Ki), "float16", rng)
    out = np.asarray(k(X, P, S)).astype(np.float64)
    assert (np.abs(out - X.astype(np.float64) @ Wd.T) <= _dequant_bound(X, Wd, "float32")).all()


@pytest.mark.parametrize("tile, split", [((1, 1, 64, 2, 1), 2), ((1, 2, 32, 2, 1), 4)])
def test_int4_warp_fragment_tiles(tile, split, rng, monkeypatch):
    """int4 weights (packed, loaded first) on warps of 2 x 1 fragments, the tails of M 20 and N 40,
    split-K partials (shared memory capped at the tiles' own): all landed in shared memory, or 3
    landed and 1 held in registers."""
    Mi, Ni, Ki, G = 20, 40, 256, 128
    monkeypatch.setattr(tc_tiling, "LANDING_PER_SM", 0)
    x = pn.placeholder((Mi, Ki), "float16", name="x")
    wd, P, S, Wd = int4_weight(Ni, Ki, G, rng)
    k = tc_compile(pn.einsum("mk,nk->mn", x, wd), tile, split, deterministic=True)
    assert k.schedule.kernels[0].split == split and "__pipeline_memcpy_async(&pn_sp" in k.source
    assert ("partials of each output; 1 in registers" in k.source) == (split == 4)
    X = array((Mi, Ki), "float16", rng)
    out = np.asarray(k(X, P, S)).astype(np.float64)
    assert (np.abs(out - X.astype(np.float64) @ Wd.T) <= _dequant_bound(X, Wd, "float32")).all()


def test_epilogue_on_tensor_cores(rng):
    """bias + relu stitched to the contraction (its element-wise consumers), applied after the tile."""
    x, w = pn.placeholder((M, K), "bfloat16", name="x"), pn.placeholder((N, K), "bfloat16", name="w")
    b = pn.placeholder((N,), "float32", name="b")
    y = pn.maximum(x @ w.T + b, 0.0)
    k = tc_compile(y, (2, 2, 32))
    X, W = array((M, K), "bfloat16", rng), array((N, K), "bfloat16", rng)
    B = rng.standard_normal(N).astype(np.float32)
    mm = X.astype(np.float64) @ W.astype(np.float64).T
    out = np.asarray(k(X, W, B)).astype(np.float64)
    tol = bound(X, W.T, "mk,kn->mn", "float32", "bfloat16") + 3 * U["bfloat16"] * (np.abs(mm) + np.abs(B))
    assert (np.abs(out - np.maximum(mm + B, 0.0)) <= tol).all()


@pytest.mark.parametrize("deterministic", [False, True])
def test_epilogue_group_split_on_tensor_cores(deterministic, rng):
    """An epilogue group (poly/epilogue.py, replayed) split over K: the last block applies bias +
    relu after the atomic workspace's read-back or the partials' combine."""
    x, w = pn.placeholder((M, K), "bfloat16", name="x"), pn.placeholder((N, K), "bfloat16", name="w")
    b = pn.placeholder((N,), "float32", name="b")
    y = pn.maximum(x @ w.T + b, 0.0)
    kw = dict(target="emulator", use_database=False, cache=False, deterministic=deterministic)
    base = pn.compile(y, **kw)
    s0 = dataclasses.replace(base.schedule, stitched=(), epilogues=(tuple(base.groups[0].names),), kernels=())
    g = lower(y, stop_after="groups", schedule=s0, target="emulator", deterministic=deterministic).groups[0]
    assert g.epilogue
    d = next(candidates(g, analyse(g), H100, 2, deterministic))
    assert d.split == 2
    k = pn.compile(y, schedule=dataclasses.replace(s0, kernels=(d,)), **kw)
    X, W = array((M, K), "bfloat16", rng), array((N, K), "bfloat16", rng)
    B = rng.standard_normal(N).astype(np.float32)
    mm = X.astype(np.float64) @ W.astype(np.float64).T
    out = np.asarray(k(X, W, B)).astype(np.float64)
    tol = bound(X, W.T, "mk,kn->mn", "float32", "bfloat16") + 3 * U["bfloat16"] * (np.abs(mm) + np.abs(B))
    assert (np.abs(out - np.maximum(mm + B, 0.0)) <= tol).all()


# -- the model's choice, one sharp case each way ----------------------------------------------------
def _mapping(M_, N_, K_, weights):
    from panamera.bench.suites import _linear

    a = lower(_linear(M_, N_, K_, weights)(), stop_after="mappings", target="emulator")
    return a.mappings[0]


def test_model_sends_int4_at_16_rows_to_tensor_cores():
    """int4 weights at M = 16: dequantization per (row, weight) binds CUDA-core issue (modeled
    3.2x the limit before); on tensor cores each weight is dequantized once per row tile."""
    m = _mapping(16, 4096, 4096, "int4")
    assert m.mma == Mma.F16
    assert m.cost.total_s < map_group(lower(_g(16), stop_after="groups", target="emulator").groups[0], H100,
                                      mma=False).cost.total_s  # fmt: skip


def _g(M_):
    from panamera.bench.suites import _linear

    return _linear(M_, 4096, 4096, "int4")()


def test_model_keeps_a_gemv_on_cuda_cores():
    """fp16 at M = 1: a 16-row MMA tile wastes 15/16 of its work and the stream binds anyway."""
    assert _mapping(1, 4096, 4096, "float16").mma == ""


@pytest.mark.parametrize("weights", ["bfloat16", "int8", "int4"])
def test_full_size_kernels_take_tensor_cores(weights):
    """Planned and rendered, not run (conftest compiles every rendered kernel with nvcc for sm_80
    and sm_90(a) and fails on a spill): issue 25's M = 64 linears on tensor cores, within 1.15x of
    the limit (modeled; int4, bound by mma.sync's rate, takes warpgroup MMAs: tests/test_wgmma.py)."""
    from panamera.bench.suites import _linear
    from panamera.model import estimate

    outs = _linear(64, 12288, 5376, weights, "bfloat16" if weights == "bfloat16" else "float16")()
    k = pn.compile(outs, target="emulator", use_database=False, cache=False)
    m = k.mappings[0]
    assert m.mma and ("pn_wgmma<" if m.mma_op else "nvcuda::wmma::mma_sync") in k.source
    assert estimate(k.plan, H100).ratio_to_limit <= 1.15


# -- preconditions (schedule/tensor_core.py), one negative test each -------------------------------
def _why(y) -> str:
    return analyse(lower(y, stop_after="groups", target="emulator").groups[0])


def test_precondition_1_a_plain_reduction():
    assert _why(pn.sum(pn.placeholder((32, 64), "float16"), axis=1)).startswith("1:")


def test_precondition_2_batch_axis_in_both_operands():
    a, b = pn.placeholder((2, 16, 32), "float16"), pn.placeholder((2, 16, 32), "float16")
    assert _why(pn.einsum("bmk,bnk->bmn", a, b)).startswith("2:")


def test_precondition_3_float32_operands():
    assert _why(pn.placeholder((16, 32)) @ pn.placeholder((16, 32)).T).startswith("3:")


def test_mma_true_falls_back_where_illegal():
    g = lower(pn.placeholder((16, 32)) @ pn.placeholder((16, 32)).T, stop_after="groups", target="emulator").groups[0]
    assert map_group(g, H100, mma=True).mma == ""


def test_replay_refuses_a_bad_tile():
    x, w = pn.placeholder((M, K), "float16", name="x"), pn.placeholder((N, K), "float16", name="w")
    g = lower(x @ w.T, stop_after="groups", target="emulator").groups[0]
    d = map_group(g, H100, mma=True).decision
    with pytest.raises(ScheduleError, match="tensor-core tile"):
        replay(g, dataclasses.replace(d, mma_tile=(1, 1, 24), mma_op=""), H100, "k")
    with pytest.raises(ScheduleError, match="MMA type"):
        replay(g, dataclasses.replace(d, mma="bf16"), H100, "k")
    f32 = lower(pn.placeholder((M, K)) @ pn.placeholder((N, K)).T, stop_after="groups", target="emulator").groups[0]
    with pytest.raises(ScheduleError, match="not legal"):
        replay(f32, dataclasses.replace(d, statements=f32.names), H100, "k")


def test_replay_refuses_unlanded_warp_fragments(monkeypatch):
    """A warp of 2 x 1 fragments whose split's partials would be held in registers (no landing
    carried) is refused by replay (`unlanded_fragments`), and not a candidate where none lands."""
    x, w = pn.placeholder((M, K), "float16", name="x"), pn.placeholder((N, K), "float16", name="w")
    g = lower(x @ w.T, stop_after="groups", target="emulator").groups[0]
    ops = analyse(g)
    d = next(d for d in candidates(g, ops, H100, 4, True) if d.mma_tile == (1, 2, 32, 2, 1))
    assert d.mma_land and replay(g, d, H100, "k").mma_land == d.mma_land
    with pytest.raises(ScheduleError, match="merges its split in registers"):
        replay(g, dataclasses.replace(d, mma_land=()), H100, "k")
    monkeypatch.setattr(tc_tiling, "MAX_LANDED_COPIES", 0)
    assert all(e.mma_tile != d.mma_tile for e in candidates(g, ops, H100, 4, True))


def _landed_decision():
    x, w = pn.placeholder((M, K), "float16", name="x"), pn.placeholder((N, K), "float16", name="w")
    g = lower(x @ w.T, stop_after="groups", target="emulator").groups[0]
    d = next(d for d in candidates(g, analyse(g), H100, 4, True) if d.mma_tile == (1, 2, 32) and d.mma_land)
    return g, d


@pytest.mark.parametrize(
    "change, why",
    [
        (dict(mma_land=(4, 0, 8192)), "1:"),  # not four numbers
        (dict(merges=(MergeMode.ATOMIC_WS,)), "1:"),  # atomics land nothing
        ("blocks", "2:"),  # landed + held is not the split
        ("bytes", "3:"),  # the buffer is smaller than the partials it lands
        ("held", "4:"),  # more partials held in registers than PARTIAL_REGISTERS
        ("copy", "5:"),  # a 12-byte copy
        ("copies", "5:"),  # more copies than the emulator's MAX_ASYNC_COPIES
    ],
)
def test_replay_refuses_a_landing_that_breaks_a_precondition(change, why, monkeypatch):
    """One negative test per precondition of a carried landing (tc_tiling.py `landing_error`):
    the decision's own landing replays; each broken one is a ScheduleError naming its number."""
    g, d = _landed_decision()
    assert replay(g, d, H100, "k").mma_land == d.mma_land
    blocks, held, size, copy = d.mma_land
    if change == "blocks":
        change = dict(mma_land=(blocks + 1, held, size, copy))
    elif change == "bytes":
        change = dict(mma_land=(blocks, held, 16, copy))
    elif change == "held":
        change = dict(mma_land=(1, blocks + held - 1, size, copy))
    elif change == "copy":
        change = dict(mma_land=(blocks, held, size, 12))
    elif change == "copies":
        monkeypatch.setattr(tc_tiling, "MAX_LANDED_COPIES", 0)
        change = {}
    with pytest.raises(ScheduleError, match=f"mma_land .* is not a landing of this tile's partials \\({why}"):
        replay(g, dataclasses.replace(d, **change), H100, "k")


def test_the_landed_copies_bound_is_the_emulators():
    """MAX_LANDED_COPIES is read from cuda_emulation.h's PN_MAX_ASYNC, the bound its
    __pipeline_memcpy_async enforces: one number, in the header."""
    from panamera.runtime.emulator import HEADER

    assert tc_tiling.MAX_LANDED_COPIES == int(
        next(ln.split()[2] for ln in HEADER.read_text().splitlines() if ln.startswith("#define PN_MAX_ASYNC "))
    )
    assert "kMaxAsync = PN_MAX_ASYNC;" in HEADER.read_text()


def test_replay_refuses_tensor_cores_in_a_cluster():
    """A split contraction on tensor cores replayed as a thread-block cluster: refused (the
    tensor-core kernel does not exchange partials through a cluster; each block would store its own)."""
    x, w = pn.placeholder((M, K), "float16", name="x"), pn.placeholder((N, K), "float16", name="w")
    g = lower(x @ w.T, stop_after="groups", target="emulator", gpu=H100).groups[0]
    d = map_group(g, H100, mma=True, split=2).decision
    bad = dataclasses.replace(d, cluster=2, merges=tuple(MergeMode.STORE for _ in d.merges))
    with pytest.raises(ScheduleError, match="neither a thread-block cluster"):
        replay(g, bad, H100, "k")


def test_decision_round_trips():
    x, w = pn.placeholder((M, K), "float16", name="x"), pn.placeholder((N, K), "float16", name="w")
    d = map_group(lower(x @ w.T, stop_after="groups", target="emulator").groups[0], H100, mma=True).decision
    assert d.mma and type(d).from_dict(d.to_dict()) == d


def test_emulated_fragments_have_no_elements():
    """Generated code must not index fragment elements (their lane layout is unspecified): the
    emulator's fragments have no `x` / `num_elements`, so such code would not compile here."""
    from panamera.runtime.emulator import HERE

    text = (HERE / "wmma_emulation.h").read_text()
    assert " x[" not in text and "num_elements" not in text.split("#pragma once")[1]


_ = ml_dtypes  # bf16 arrays come from test_contract.array


def test_a_tensor_core_kernel_indexes_in_int_where_its_addresses_fit():
    """64 x 14336 x 4096 bf16: 3.8e9 canonical points but no address past 5.9e7 (a quotient by a
    constant bounds its products: 4096 * (i / 14336)); 64-bit indices spilled its staging on sm_80."""
    from panamera.bench.suites import _linear
    from panamera.codegen.kernel import index_type
    from panamera.compiler import lower

    a = lower(_linear(64, 14336, 4096, "bfloat16", "bfloat16")(), stop_after="mappings", target="emulator")
    assert a.mappings[0].mma and index_type(a.groups[0], a.mappings[0]) == "int"
