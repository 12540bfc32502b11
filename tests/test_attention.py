"""Decode attention (issue 13, item 4): `pn.nn.attention`, fused and split over the keys.

Every result is checked against numpy in float64 on the emulator with a tolerance derived from
the dtype, the head dim and the key length (`tolerance`); the full-size plans are checked for
their split, their DRAM bytes and their modeled time against the limit without running them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from conftest import need_nvcc

import panamera as pn
from panamera.algebra import ONLINE_SOFTMAX_VEC
from panamera.compiler import STAGES, Options, lower
from panamera.errors import BackendError, DTypeError, EmptyReductionError, OptionError, ShapeError
from panamera.model.estimate import estimate
from panamera.model.gpu import H100
from panamera.runtime import nvcc
from panamera.runtime.executor import Executor
from panamera.schedule.attention import plan_attention

NP = {"float16": np.float16, "float32": np.float32, "float64": np.float64, "bfloat16": pn.dtypes.bfloat16.np}
EPS = {"float16": 2**-10, "bfloat16": 2**-7, "float32": 2**-23, "float64": 2**-52}


def reference(q, k, v, scale, mask=None):
    """torch's scaled_dot_product_attention in float64 (grouped-query heads repeated); a fully
    masked row gives 0, as torch 2.13 does (test_a_fully_masked_row_is_zero_as_in_torch)."""
    g = q.shape[1] // k.shape[1]
    k64, v64 = (np.repeat(t.astype(np.float64), g, axis=1) for t in (k, v))
    s = np.einsum("bhqd,bhld->bhql", q.astype(np.float64), k64) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask.astype(np.float64)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(m == -np.inf, 0.0, m))
    p /= np.maximum(p.sum(-1, keepdims=True), np.finfo(np.float64).tiny)
    return np.einsum("bhql,bhld->bhqd", p, v64)


def tolerance(dtype: str, q, k, v, scale) -> float:
    """Absolute error bound of one output element: each score x = scale * q.k accumulates D
    products in the accumulator's precision (error ~ eps_acc sqrt(D) |q||k| scale, a factor 8
    of headroom), which perturbs p relatively by as much; s and o accumulate Lk terms
    (eps_acc sqrt(Lk)); the exps cost a few ulps; the result is rounded to the dtype (2 ulps of
    max |v|, which bounds |out|)."""
    acc = 2**-52 if dtype == "float64" else 2**-23
    d, lk = q.shape[-1], k.shape[-2]
    qk = float(np.abs(q.astype(np.float64)).max() * np.abs(k.astype(np.float64)).max()) * abs(scale)
    vmax = float(np.abs(v.astype(np.float64)).max())
    return vmax * (acc * 8 * (math.sqrt(d) * qk + math.sqrt(lk) + 16) + 2 * EPS[dtype])


def inputs(rng, dtype, b, hq, hkv, lq, lk, d):
    shapes = ((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, d))
    return [rng.standard_normal(s).astype(NP[dtype]) for s in shapes]


def holders(dtype, b, hq, hkv, lq, lk, d):
    return (
        pn.placeholder((b, hq, lq, d), dtype, name="q"),
        pn.placeholder((b, hkv, lk, d), dtype, name="k"),
        pn.placeholder((b, hkv, lk, d), dtype, name="v"),
    )


def check(run, arrays, ref, dtype, orders=("forward", "reverse")):
    q, k, v = arrays[:3]
    tol = tolerance(dtype, q, k, v, 1.0 / math.sqrt(q.shape[-1]))
    for order in orders:
        out = run(*arrays, order=order, seed=3)
        assert out.dtype == q.dtype and out.shape == ref.shape
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0, atol=tol)


def forced(out, split: int, launches: int):
    """The fused plan with its split and merge given (a test's override of the model's choice);
    the remaining stages as the compiler runs them."""
    a = lower(out, stop_after="mappings", target="emulator")
    assert a.fused is not None
    a = dataclasses.replace(a, attention=plan_attention(a.fused, H100, split=split, launches=launches))
    for stage in STAGES[4:]:
        a = stage.run(a, Options())
    ex = Executor(a.plan, a.source, a.signatures, "emulator")
    return a, lambda *arrays, order="forward", seed=0: ex(ex.bind(arrays, {}), order, seed)[0]


@pytest.fixture
def rng():
    return np.random.default_rng(2026)


# -- correctness --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype,b,hq,hkv,lq,lk,d",
    [
        ("float32", 2, 4, 4, 1, 37, 16),  # Hq / Hkv = 1
        ("float16", 1, 8, 2, 1, 300, 64),  # GQA 4, split over the keys
        ("bfloat16", 2, 8, 2, 1, 200, 32),
        ("float32", 1, 4, 1, 3, 150, 24),  # Lq > 1, rows of several query heads and positions
        ("float64", 1, 2, 2, 2, 50, 8),
        ("float16", 1, 2, 1, 5, 70, 40),  # 8-byte loads (40 % 8 == 0, 16-byte rows of 5 lanes)
        ("float32", 1, 2, 2, 1, 33, 7),  # an odd head dim: scalar loads
    ],
)
def test_fused_attention_matches_numpy(rng, dtype, b, hq, hkv, lq, lk, d):
    arrays = inputs(rng, dtype, b, hq, hkv, lq, lk, d)
    k = pn.compile(pn.nn.attention(*holders(dtype, b, hq, hkv, lq, lk, d)), target="emulator")
    assert k.stages.fused is not None and k.formulations[-1].chosen == "fused"
    check(k, arrays, reference(*arrays, 1 / math.sqrt(d)), dtype)


@pytest.mark.parametrize("kind", ["additive", "boolean"])
def test_masks(rng, kind):
    b, hq, hkv, lq, lk, d = 2, 4, 2, 2, 120, 16
    arrays = inputs(rng, "float32", b, hq, hkv, lq, lk, d)
    if kind == "boolean":
        mask = rng.random((b, 1, 1, lk)) > 0.3  # per batch (padding), broadcast over heads and queries
        mask[..., 0] = True  # no fully masked row here
        m = pn.placeholder(mask.shape, "bool", name="m")
    else:
        mask = rng.standard_normal((lq, lk)).astype(np.float32)
        m = pn.placeholder(mask.shape, "float32", name="m")
    k = pn.compile(pn.nn.attention(*holders("float32", b, hq, hkv, lq, lk, d), scale=0.3, mask=m), target="emulator")
    assert k.stages.fused is not None and k.stages.fused.mask_kind == kind
    q, kk, v = arrays
    tol = tolerance("float32", q, kk, v, 0.3)
    out = k(q=q, k=kk, v=v, m=mask)  # by name: the mask was created first
    np.testing.assert_allclose(out, reference(q, kk, v, 0.3, mask), rtol=0, atol=tol)


@pytest.mark.parametrize("launches", [1, 2])
def test_long_keys_split_across_blocks_merge_in_one_or_two_launches(rng, launches):
    dtype, b, hq, hkv, lq, lk, d = "float16", 1, 8, 2, 1, 1000, 32
    arrays = inputs(rng, dtype, b, hq, hkv, lq, lk, d)
    a, run = forced(pn.nn.attention(*holders(dtype, b, hq, hkv, lq, lk, d)), split=8, launches=launches)
    assert a.attention.split == 8 and len(a.plan.per_call) == launches
    check(run, arrays, reference(*arrays, 1 / math.sqrt(d)), dtype, orders=("forward", "reverse", "shuffled"))
    check(run, arrays, reference(*arrays, 1 / math.sqrt(d)), dtype)  # the counter was reset: call again


@pytest.mark.parametrize("launches", [1, 2])
def test_a_fully_masked_chunk_contributes_nothing_and_a_fully_masked_row_is_zero(rng, launches):
    b, hq, hkv, lq, lk, d = 1, 2, 1, 2, 256, 16
    q, kk, v = inputs(rng, "float32", b, hq, hkv, lq, lk, d)
    mask = np.ones((b, hq, lq, lk), bool)
    mask[:, :, 0, :64] = False  # the first block's whole chunk (split 4: 64 keys each) for row 0
    mask[:, 1, 1, :] = False  # every key of one row: torch gives 0
    m = pn.placeholder(mask.shape, "bool", name="m")
    a, run = forced(pn.nn.attention(*holders("float32", b, hq, hkv, lq, lk, d), mask=m), split=4, launches=launches)
    assert a.attention.chunk == 64
    out, ref = run(mask, q, kk, v), reference(q, kk, v, 1 / math.sqrt(d), mask)  # placeholder order
    assert (out[:, 1, 1] == 0).all() and (ref[:, 1, 1] == 0).all()
    np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance("float32", q, kk, v, 0.25))


@pytest.mark.parametrize("plan", ["fused", "chain"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_a_fully_masked_row_is_zero_as_in_torch(rng, plan, kind):
    """torch 2.13's scaled_dot_product_attention (CPU) gives 0 for a query row whose every key is
    masked, by a bool mask or by -inf: the fused plan (finish of ONLINE_SOFTMAX_VEC) and the
    chain of reductions (attention_chain) both do, and so does the numpy reference."""
    b, hq, hkv, lq, lk, d = 1, 2, 1, 3, 40, 8
    q, kk, v = inputs(rng, "float32", b, hq, hkv, lq, lk, d)
    keep = np.ones((b, hq, lq, lk), bool)
    keep[0, 1, 2, :] = False
    keep[0, 0, 0, :30] = False
    mask = keep if kind == "bool" else np.where(keep, 0.0, -np.inf).astype(np.float32)
    m = pn.placeholder(mask.shape, kind if kind == "bool" else "float32", name="m")
    out = pn.nn.attention(*holders("float32", b, hq, hkv, lq, lk, d), mask=m)
    k = pn.compile(out if plan == "fused" else out + 0.0, target="emulator")
    assert (k.stages.fused is not None) == (plan == "fused")
    got, ref = k(mask, q, kk, v), reference(q, kk, v, 1 / math.sqrt(d), mask)
    assert (got[0, 1, 2] == 0).all() and not np.isnan(got).any()
    np.testing.assert_allclose(got, ref, rtol=0, atol=tolerance("float32", q, kk, v, 1 / math.sqrt(d)))
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(t.astype(np.float64)) for t in (q, kk, v)),
        attn_mask=torch.from_numpy(mask if kind == "bool" else mask.astype(np.float64)),
    ).numpy()
    np.testing.assert_allclose(ref, want, rtol=0, atol=1e-12)  # the reference is torch's


def test_vector_accumulator_merges_chunks_in_any_grouping(rng):
    """The numpy definition: lifting every key and merging chunk partials in any grouping gives
    the reference, and a fully masked chunk (-inf scores) is the identity."""
    x, v = rng.standard_normal(12), rng.standard_normal((12, 3))
    x[4:8] = -np.inf
    c = ONLINE_SOFTMAX_VEC

    def fold(lo, hi):
        acc = tuple(np.asarray(t) for t in c.identity(3))
        for j in range(lo, hi):
            acc = c.combine(acc, c.lift(x[j], v[j]))
        return acc

    left = c.combine(c.combine(fold(0, 4), fold(4, 8)), fold(8, 12))
    right = c.combine(fold(0, 4), c.combine(fold(8, 12), fold(4, 8)))
    ref = c.reference(x, v)
    for _, s, o in (left, right):
        np.testing.assert_allclose(c.finish(o, s), ref, rtol=1e-12)
    assert all(np.array_equal(a, b) for a, b in zip(fold(4, 8), c.identity(3)))
    _, s, o = fold(4, 8)  # only masked keys: finished as 0, the reference's fully masked row
    assert np.array_equal(c.finish(o, s), c.reference(x[4:8], v[4:8])) and not c.finish(o, s).any()


# -- legality: one negative test per precondition of poly/attention.py -------------------------
def _chain_ok(out, arrays, ref, tol):
    k = pn.compile(out, target="emulator")
    assert k.stages.fused is None and len(k.plan.kernels) >= 2  # the chain of reductions
    np.testing.assert_allclose(k(*arrays).astype(np.float64), ref, rtol=0, atol=tol)


def test_precondition_1_a_consumer_of_the_result_keeps_the_chain(rng):
    q, kk, v = inputs(rng, "float32", 1, 2, 1, 1, 20, 8)
    ref = reference(q, kk, v, 1 / math.sqrt(8)) + 1.0
    _chain_ok(pn.nn.attention(*holders("float32", 1, 2, 1, 1, 20, 8)) + 1.0, (q, kk, v), ref, 1e-5)


def test_precondition_2_a_computed_operand_keeps_the_chain(rng):
    q, kk, v = inputs(rng, "float32", 1, 2, 1, 1, 20, 8)
    hq, hk, hv = holders("float32", 1, 2, 1, 1, 20, 8)
    _chain_ok(pn.nn.attention(hq * 2.0, hk, hv), (q, kk, v), reference(q * 2, kk, v, 1 / math.sqrt(8)), 1e-5)


def test_precondition_3_a_head_dim_beyond_the_on_chip_accumulator_keeps_the_chain(rng):
    q, kk, v = inputs(rng, "float32", 1, 1, 1, 1, 4, 300)
    _chain_ok(
        pn.nn.attention(*holders("float32", 1, 1, 1, 1, 4, 300)), (q, kk, v), reference(q, kk, v, 300**-0.5), 1e-5
    )


# -- the full-size plans (not run) --------------------------------------------------------------
@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize("keys", [4096, 32768, 131072])
def test_full_size_decode_plans_read_the_kv_cache_once_near_the_limit(batch, keys):
    q = pn.placeholder((batch, 32, 1, 128), "float16", name="q")
    k = pn.placeholder((batch, 8, keys, 128), "float16", name="k")
    v = pn.placeholder((batch, 8, keys, 128), "float16", name="v")
    a = lower(pn.nn.attention(q, k, v), target="emulator")
    p, e = a.attention, estimate(a.plan, H100)
    assert p is not None and p.rows_per_tile == 4  # the 4 query heads of a kv head: one block
    kv = 2 * batch * 8 * keys * 128 * 2
    assert e.dram_bytes == e.compulsory_bytes == kv + 2 * batch * 32 * 128 * 2  # q + K + V + out, once
    assert sum(dict(ln.cost_features)["dram_bytes"] for ln in a.plan.per_call) == e.compulsory_bytes
    assert p.split > 1 if batch * 8 < H100.sms else True  # too few (batch, kv head) blocks: split
    assert p.grid[0] * p.grid[1] <= H100.sms * 4  # one wave of register-bound resident blocks
    assert e.ratio_to_limit <= 1.2, (e.total_us, e.limit_us)  # the limit: the best streams ever measured
    assert a.formulations[-1].chosen == "fused"


# -- nvcc and explain ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype,d,mask",
    [("float16", 128, "bool"), ("bfloat16", 128, "float16"), ("float32", 7, None), ("float64", 64, "float64")],
)
def test_nvcc_compiles_both_merges_for_sm80_and_sm90_without_spills(dtype, d, mask):
    need_nvcc()
    q = pn.placeholder((1, 32, 1, d), dtype, name="q")
    kv = pn.placeholder((1, 8, 4096, d), dtype, name="k")
    m = pn.placeholder((1, 1, 1, 4096), mask, name="m") if mask else None
    for launches in (1, 2):
        a, _ = forced(pn.nn.attention(q, kv, kv, mask=m), split=16, launches=launches)
        res = nvcc.compile_cuda(a.source)
        assert {r.arch for r in res} == {"sm_80", "sm_90"}
        assert all(r.spill_stores == r.spill_loads == 0 for r in res), res
        assert all(r.registers <= 128 for r in res)
    if dtype != "float16":
        return
    try:
        text = nvcc.sass(a.source, a.plan.per_call[0].kernel)
    except BackendError as e:
        pytest.skip(str(e))
    ops = [ln.split("*/")[1].split() for ln in text.splitlines() if "*/" in ln and ";" in ln]
    ops = [w[1] if w[0].startswith("@") else w[0] for w in ops if w]
    assert not any(o.startswith(("LDL", "STL")) for o in ops)  # every per-thread array in registers
    assert ops.count("LDG.E.128.CONSTANT") >= 4  # 16-byte loads: q, and k and v two keys at a time


def test_explain_shows_the_fused_plan_and_the_models_choice():
    k = pn.compile(pn.nn.attention(*holders("float16", 1, 8, 2, 1, 512, 64)), target="emulator")
    text = k.explain()
    assert "fused attention (poly/attention.py): ATTENTION" in text and "Flash-Decoding" in text
    assert "attention: fused" in text and "-> fused" in text
    assert "pn_ldv(k + kbase" in k.source  # vector loads of the kv cache


# -- clear errors -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make,error,words",
    [
        (lambda q, k, v: pn.nn.attention(q.reshape((8, 1, 16)), k, v), ShapeError, "q"),
        (lambda q, k, v: pn.nn.attention(q, k, pn.placeholder((1, 2, 9, 16))), ShapeError, "v"),
        (lambda q, k, v: pn.nn.attention(pn.placeholder((1, 3, 1, 16)), k, v), ShapeError, "multiple"),
        (lambda q, k, v: pn.nn.attention(q, pn.placeholder((1, 2, 8, 8)), pn.placeholder((1, 2, 8, 8))), ShapeError,
         "head dim"),
        (lambda q, k, v: pn.nn.attention(q, k.astype("float16"), v), DTypeError, "share a dtype"),
        (lambda q, k, v: pn.nn.attention(q.astype("int32"), k, v), DTypeError, "floating point"),
        (lambda q, k, v: pn.nn.attention(q, k, v, mask=pn.placeholder((3, 8))), ShapeError, "mask"),
        (lambda q, k, v: pn.nn.attention(q, k, v, mask=pn.placeholder((1, 8), "int32")), DTypeError, "mask"),
        (lambda q, k, v: pn.nn.attention(q, k, v, scale="x"), OptionError, "scale"),
        (lambda q, k, v: pn.nn.attention(q, pn.placeholder((1, 2, 0, 16)), pn.placeholder((1, 2, 0, 16))),
         EmptyReductionError, "no keys"),
        (lambda q, k, v: pn.nn.attention(q, k, np.zeros((1, 2, 8, 16))), DTypeError, "v must be a Tensor"),
    ],
)  # fmt: skip
def test_bad_operands_are_named(make, error, words):
    q, k, v = pn.placeholder((1, 8, 1, 16)), pn.placeholder((1, 2, 8, 16)), pn.placeholder((1, 2, 8, 16))
    with pytest.raises(error, match=words):
        make(q, k, v)


def test_launches_override_is_checked():
    a = lower(pn.nn.attention(*holders("float32", 1, 2, 1, 1, 8, 8)), stop_after="mappings", target="emulator")
    with pytest.raises(OptionError, match="launches"):
        plan_attention(a.fused, H100, launches=3)
