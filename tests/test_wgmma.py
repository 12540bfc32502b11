"""Warpgroup MMAs (issue 25): wgmma tiles against numpy in float64 on the emulator
(runtime/wgmma_emulation.h), the emulator's checks of the async groups, the preconditions
(schedule/tc_tiling.py `wgmma_error`, one negative test each) and the model's choice.

Tolerances as tests/test_tensor_core.py's (`bound`, and `_dequant_bound` for weights rounded to
the MMA's 16-bit type). Shapes are small and not multiples of 16 (M 20, N 40, K 100): the tails.
"""

import dataclasses
import re

import numpy as np
import pytest
from conftest import need_nvcc
from test_contract import array, bound, dequant_reference, int4_weight
from test_tensor_core import _dequant_bound

import panamera as pn
from panamera.codegen import tc_kernel, wgmma_kernel
from panamera.compiler import lower
from panamera.errors import PanameraError, ScheduleError
from panamera.model import A100, H100
from panamera.model.kernel_cost import kernel_time
from panamera.runtime.nvcc import arch_for
from panamera.schedule.mapping import map_group, replay
from panamera.schedule.tc_tiling import candidates
from panamera.schedule.tensor_core import Mma, analyse
from panamera.schedule.warpgroup import MmaOp, registers, wgmma_error

M, N, K = 20, 40, 100


def wg_compile(y, n=None, split=None, deterministic=False, groups=1):
    """`y` compiled with its contraction on `groups` warpgroups of `n` columns (the first such
    candidate)."""
    kw = dict(target="emulator", use_database=False, cache=False, deterministic=deterministic)
    base = pn.compile(y, **kw)
    g = base.groups[0]
    d = next(
        d
        for d in candidates(g, analyse(g), H100, split, deterministic)
        if d.mma_op == MmaOp.WGMMA and (n is None or d.mma_tile[4] * 16 == n) and d.mma_tile[1] == groups
    )
    k = pn.compile(y, schedule=dataclasses.replace(base.schedule, kernels=(d,)), **kw)
    assert k.schedule.kernels[0].mma_op == MmaOp.WGMMA and "pn_wgmma<" in k.source and "mma_sync" not in k.source
    return k


@pytest.mark.parametrize(
    "dtype, groups, n, split, deterministic",
    [("float16", 1, 64, 1, False), ("bfloat16", 2, 32, 2, False), ("float16", 1, 32, 4, True)],
)
def test_wgmma_tiles_with_tails(dtype, groups, n, split, deterministic, rng):
    """fp16 / bf16 on one or two warpgroups of 64 x n, fp32 accumulators; split-K merged by partials
    landed in shared memory (a warpgroup tile, like a warp of several fragments, merges its split
    in registers never: `unlanded_fragments`)."""
    x, w = pn.placeholder((M, K), dtype, name="x"), pn.placeholder((N, K), dtype, name="w")
    k = wg_compile(x @ w.T, n, split, deterministic, groups)
    assert k.schedule.kernels[0].split == split
    assert ("__pipeline_memcpy_async(&pn_sp" in k.source) == (split > 1)
    X, W = array((M, K), dtype, rng), array((N, K), dtype, rng)
    out = np.asarray(k(X, W)).astype(np.float64)
    ref = X.astype(np.float64) @ W.astype(np.float64).T
    assert (np.abs(out - ref) <= bound(X, W.T, "mk,kn->mn", "float32", dtype)).all()


def test_wgmma_int8_weights_dequantized(rng):
    """fp16 x (int8 * per-channel fp16 scale): the weight dequantized in registers into the core
    matrices' layout, rounded to fp16, then the warpgroup MMAs."""
    x = pn.placeholder((M, K), "float16", name="x")
    w, sc = pn.placeholder((N, K), "int8", name="w"), pn.placeholder((N, 1), "float16", name="scale")
    k = wg_compile(x @ (w.astype("float32") * sc.astype("float32")).T, 64)
    X, Q = array((M, K), "float16", rng), array((N, K), "int8", rng)
    S = (rng.random((N, 1)) * 0.01).astype(np.float16)
    Wd = dequant_reference(Q, S[:, 0], 0)
    out = np.asarray(k(X, Q, S)).astype(np.float64)
    assert (np.abs(out - X.astype(np.float64) @ Wd.T) <= _dequant_bound(X, Wd, "float32")).all()


def test_wgmma_int4_weights_dequantized(rng):
    """fp16 x int4 (two per uint8, zero point 8, scales per group of 128), split over K with its
    partials landed: the packed words staged by the exponent trick into the core matrices."""
    Mi, Ni, Ki, G = 20, 40, 256, 128
    x = pn.placeholder((Mi, Ki), "float16", name="x")
    wd, P, S, Wd = int4_weight(Ni, Ki, G, rng)
    k = wg_compile(pn.einsum("mk,nk->mn", x, wd), 64, 2, deterministic=True)
    assert "pn_i4x8" in k.source
    X = array((Mi, Ki), "float16", rng)
    out = np.asarray(k(X, P, S)).astype(np.float64)
    assert (np.abs(out - X.astype(np.float64) @ Wd.T) <= _dequant_bound(X, Wd, "float32")).all()


@pytest.mark.parametrize(
    "k_len, groups, n, split, wrapped", [(100, 1, 64, 2, False), (256, 2, 32, 1, True)]
)  # fmt: skip
def test_wgmma_s8_exact(k_len, groups, n, split, wrapped, rng):
    """int8 x int8 on m64nNk32 MMAs with s32 accumulators: exact (wrapping, as numpy's int32 sum).
    The int32 sum split over K with its partials landed, and numpy's int8 result (the wrap stitched
    as an element-wise consumer) staged 16 lanes a step: a whole row of an s8 core matrix."""
    x, w = pn.placeholder((M, k_len), "int8", name="x"), pn.placeholder((N, k_len), "int8", name="w")
    y = pn.matmul(x, w.T) if wrapped else pn.matmul(x, w.T).inputs[0]
    k = wg_compile(y, n, split, deterministic=True, groups=groups)
    d = k.schedule.kernels[0]
    assert d.mma == Mma.S8 and d.split == split and (d.vec == 16) == wrapped
    assert f"m64n{n}k32.s32.s8.s8" in k.source and "pn_wgacc<" + str(n // 2) + ", int>" in k.source
    X, W = array((M, k_len), "int8", rng), array((N, k_len), "int8", rng)
    X[0], W[0] = -128, -128  # the largest products: 128 * 128 * K fits in int32, exactly
    ref = X.astype(np.int64) @ W.astype(np.int64).T
    out = np.asarray(k(X, W))
    assert out.dtype == (np.int8 if wrapped else np.int32)
    assert np.array_equal(out, ref.astype(np.int8) if wrapped else ref)


def test_wgmma_s8_sass_is_igmma():
    """The s8 tile's PTX is what ptxas takes for sm_90a: integer warpgroup MMAs (IGMMA 64 x N x 32)
    in its SASS, none in sm_80's (the kernel only traps there). Its 0 spills: the suite's nvcc check."""
    from panamera.runtime import nvcc

    need_nvcc()
    x, w = pn.placeholder((M, 64), "int8", name="x"), pn.placeholder((N, 64), "int8", name="w")
    k = wg_compile(pn.matmul(x, w.T).inputs[0], 64)
    name = re.search(r"__launch_bounds__\([^)]*\) (pn_k\w*)\(", k.source).group(1)  # the MMA kernel
    assert "IGMMA.64x64x32.S8.S8" in nvcc.sass(k.source, name, "sm_90")
    assert "GMMA" not in nvcc.sass(k.source, name, "sm_80")


# -- the emulator's checks of the asynchronous groups ------------------------------------------------
@pytest.mark.parametrize(
    "dropped, error",
    [
        ("    pn_wgmma_wait<0>();", "accumulators accessed before the wgmma.wait_group"),
        ("    pn_wgmma_fence();", "no wgmma.fence since the thread last accessed accumulator registers"),
    ],
)
def test_emulator_reports_a_missing_wait_or_fence(dropped, error, monkeypatch, rng):
    """Without wgmma.wait_group the accumulators are read while the MMAs writing them are in
    flight; without wgmma.fence the MMA follows accesses to its registers: both are launch errors,
    not wrong answers (a GPU's behaviour there is undefined)."""
    slab = wgmma_kernel.wgmma_slab
    monkeypatch.setattr(tc_kernel, "wgmma_slab", lambda *a: [ln for ln in slab(*a) if ln != dropped])
    x, w = pn.placeholder((M, K), "float16", name="x"), pn.placeholder((N, K), "float16", name="w")
    k = wg_compile(x @ w.T, 64)
    assert dropped not in k.source
    with pytest.raises(PanameraError, match=error):
        k(array((M, K), "float16", rng), array((N, K), "float16", rng))


def test_emulator_reports_a_store_to_an_operand_in_flight(monkeypatch, rng):
    """A store to the slab between an MMA and its wgmma.wait_group (here by thread 0, after a
    barrier) races with the MMA's asynchronous reads: a launch error, though the emulator read the
    operands at the issue and would otherwise give the right answer."""
    slab, wait = wgmma_kernel.wgmma_slab, "    pn_wgmma_wait<0>();"
    race = ["    __syncthreads();", "    if (tx == 0) ((unsigned char*)pn_sa)[0] ^= 1;", "    __syncthreads();", wait]
    monkeypatch.setattr(
        tc_kernel, "wgmma_slab", lambda *a: [x for ln in slab(*a) for x in (race if ln == wait else [ln])]
    )
    x, w = pn.placeholder((M, K), "float16", name="x"), pn.placeholder((N, K), "float16", name="w")
    k = wg_compile(x @ w.T, 64)
    assert "((unsigned char*)pn_sa)[0] ^= 1" in k.source
    with pytest.raises(PanameraError, match="shared memory an MMA reads was written before the wgmma.wait_group"):
        k(array((M, K), "float16", rng), array((N, K), "float16", rng))


# -- preconditions (schedule/warpgroup.py `wgmma_error`), one negative test each ---------------------------------
def _group(dtype="float16", k=K):
    x, w = pn.placeholder((M, k), dtype, name="x"), pn.placeholder((N, k), dtype, name="w")
    y = x @ w.T if dtype != "int8" else pn.matmul(x, w.T).inputs[0]
    return lower(y, stop_after="groups", target="emulator").groups[0]


def _wgmma_decision(g):
    return next(d for d in candidates(g, analyse(g), H100, 1, False) if d.mma_op == MmaOp.WGMMA)


def test_precondition_1_a_gpu_without_warpgroup_mmas():
    g = _group()
    d = _wgmma_decision(g)
    assert replay(g, d, H100, "k").mma_op == MmaOp.WGMMA
    with pytest.raises(ScheduleError, match=r"not a warpgroup-MMA tile \(1: A100"):
        replay(g, d, A100, "k")
    assert not any(e.mma_op for e in candidates(g, analyse(g), A100, None, False))


def test_precondition_2_operands_without_a_warpgroup_mma():
    """Every operand kind tensor cores take here has a warpgroup MMA (f16 / bf16 k16, s8 k32: s8 x s8
    tiles replay); another kind (here tf32, which Panamera does not stage) is refused."""
    g = _group("int8")
    d = _wgmma_decision(g)
    assert d.mma == Mma.S8 and replay(g, d, H100, "k").mma_op == MmaOp.WGMMA
    assert wgmma_error(H100, "tf32", d.mma_tile, d.vec).startswith("2:")


def test_precondition_3_a_tile_that_is_not_one_warpgroup():
    g = _group()
    d = _wgmma_decision(g)
    with pytest.raises(ScheduleError, match=r"not a warpgroup-MMA tile \(3:"):
        replay(g, dataclasses.replace(d, mma_tile=(4, 1, 32, 1, 3)), H100, "k")  # N 48
    with pytest.raises(ScheduleError, match=r"mma_op 'wmma'"):
        replay(g, dataclasses.replace(d, mma_op="wmma"), H100, "k")
    s8 = _group("int8")  # s8's MMAs step K by 32: a K slab of 16 (f16's step) is not one
    with pytest.raises(ScheduleError, match=r"not a warpgroup-MMA tile \(3: a K slab of 16 is not a multiple of s8's"):
        replay(s8, dataclasses.replace(_wgmma_decision(s8), mma_tile=(4, 1, 16, 1, 4)), H100, "k")


def test_precondition_4_staging_lanes_across_a_core_matrix_row():
    """16 lanes per step (only reachable by an operand of 1-byte loads: a 16-bit one's vectors
    stop at 8 lanes, the replay refuses them first) would cross a core matrix's row of 8 k."""
    d = _wgmma_decision(_group())
    assert wgmma_error(H100, Mma.F16, d.mma_tile, d.vec) is None
    assert wgmma_error(H100, Mma.F16, d.mma_tile, 16).startswith("4:")
    assert wgmma_error(H100, Mma.S8, d.mma_tile, 16) is None  # an s8 core matrix's row is 16 k


# -- the model's choice and the architecture ---------------------------------------------------------
def test_model_takes_warpgroup_mmas_where_issue_binds():
    """A 64-row int4 linear of 5376 x 12288 on H100: MMAs at mma.sync's rate bind it (issue 25);
    the model takes warpgroup tiles, at the full rate. A100 has none."""
    x = pn.placeholder((64, 5376), "float16", name="x")
    wd = int4_weight(12288, 5376, 128, np.random.default_rng(0))[0]
    g = lower(pn.einsum("mk,nk->mn", x, wd), stop_after="groups", target="emulator").groups[0]
    h = map_group(g, H100)
    assert h.mma_op == MmaOp.WGMMA and dict(h.cost.features).get("mma_async")
    assert map_group(g, A100).mma_op == ""
    # its registers (estimated, warpgroup.registers, at most what its launch bounds allow) are a cost
    # feature: they bound its blocks per SM
    from panamera.schedule.rtile import register_budget

    f = dict(h.cost.features)
    assert f["registers"] == min(register_budget(h), registers(h.mma_tile, h.split, loads_first=True))  # int4
    assert kernel_time(H100, **f).total_s == pytest.approx(h.cost.total_s)


def test_model_takes_s8_warpgroup_mmas_for_int8_x_int8():
    """int8 x int8 at 16 rows of 4096 x 4096 on H100: the model takes s8 warpgroup tiles (modeled
    faster than mma.sync's), never on A100."""
    x, w = pn.placeholder((16, 4096), "int8", name="x"), pn.placeholder((4096, 4096), "int8", name="w")
    g = lower(pn.matmul(x, w.T), stop_after="groups", target="emulator").groups[0]
    h = map_group(g, H100)
    assert h.mma == Mma.S8 and h.mma_op == MmaOp.WGMMA and dict(h.cost.features).get("mma_async")
    assert map_group(g, A100).mma_op == ""


def test_registers_bound_the_resident_blocks():
    """A 256-thread block at 101 registers: two per SM (65536 registers), not the four its 48 KiB of
    shared memory allow; the modeled time of a latency-bound kernel grows as its blocks per SM fall."""
    assert H100.resident_blocks(256, 48 * 1024) == 4 and H100.resident_blocks(256, 48 * 1024, 101) == 2
    kw = dict(dram_bytes=64e6, blocks=4 * H100.sms, threads=256, bytes_in_flight_per_thread=16, shared_bytes=48 * 1024)
    fast, slow = kernel_time(H100, **kw), kernel_time(H100, **kw, registers=101)
    assert slow.total_s > fast.total_s and dict(slow.features)["registers"] == 101


def test_warpgroup_sources_compile_for_sm_90a():
    """nvcc and NVRTC take sm_90a for a source with warpgroup MMAs (wgmma exists only there);
    sm_80 code and sources without them keep their architecture."""
    assert arch_for("pn_wgmma<64, __half>(pn_d, a, b);", "sm_90") == "sm_90a"
    assert arch_for("pn_wgmma<64, __half>(pn_d, a, b);", "sm_80") == "sm_80"
    assert arch_for("nvcuda::wmma::mma_sync(...);", "sm_90") == "sm_90"
