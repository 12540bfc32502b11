"""softmax and log_softmax on target="cpu": exp evaluated once per element (schedule/cpu_reuse.py),
the row's division by its sum a product with the reciprocal, against numpy in float64.

Tolerances are derived per element, in units of the compute dtype's unit roundoff u (float32 for
16-bit inputs) and the output dtype's u_o:
- x - m rounds by u relative, so exp(x - m) is off by |x - m| u relative; glibc's libmvec exp and
  log are within EXP_ULP ulp (<= 2 u each: 2 * EXP_ULP u);
- the row sum of n positive terms is off by (n - 1) u relative (plus its terms' own errors, at
  most (D + 2 * EXP_ULP) u, D the row's largest x - m);
- softmax: the reciprocal and the product add 2 u; the store rounds by u_o (and by half the
  smallest subnormal of the output dtype, absolute: float16's results below 6e-5);
- log_softmax: x - m - log(s) is off by |x - m| u + 2 * EXP_ULP u |log s| + the sum's relative
  error (absolute, through log) + u |y| for the subtraction, and u_o |y| for the store.
"""

import re

import ml_dtypes
import numpy as np
import pytest
from conftest import tolerance

import panamera as pn
from panamera.compiler import lower
from panamera.model.cpu import CpuModel, Rates
from panamera.schedule.cpu_reuse import candidates, choose

# glibc libmvec's bound for logf/exp/log (runtime/cpu.py SIMD_MATH); float exp is inline, < 1.5 ulp (EXP_FLUSH)
EXP_ULP = 4
U = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
SHAPES = ((1, 1), (3, 1), (5, 97), (4, 128), (2, 1031))  # rows of one element, prime lengths


def _bounds(a: np.ndarray, dtype: str):
    """The float64 references and per-element error bounds of softmax and log_softmax of `a`."""
    u = U["float64" if dtype == "float64" else "float32"]
    uo = U[dtype]
    x = a.astype(np.float64)
    m = x.max(-1, keepdims=True)
    d = np.where(np.isfinite(x), m - x, 0.0)
    n = x.shape[-1]
    s = np.exp(x - m).sum(-1, keepdims=True)
    sm, lsm = np.exp(x - m) / s, x - m - np.log(s)
    row = d.max(-1, keepdims=True)
    sum_err = (n - 1 + row + 2 * EXP_ULP) * u  # relative error of the row's sum
    tiny = float(ml_dtypes.finfo(pn.dtypes.as_dtype(dtype).np).smallest_subnormal) / 2  # a subnormal output's rounding
    sm_tol = ((d + 2 * EXP_ULP + 2) * u + sum_err + uo) * sm + tiny
    lsm_fin = np.where(np.isfinite(lsm), lsm, 0.0)
    lsm_tol = (d + 2 * EXP_ULP * np.abs(np.log(s)) + np.abs(lsm_fin)) * u + sum_err + uo * np.abs(lsm_fin)
    return sm, sm_tol, lsm, lsm_tol


def _inputs(dtype: str, rng) -> list[np.ndarray]:
    out = []
    for shape in SHAPES:
        a = rng.standard_normal(shape) * 4
        out.append(a.astype(pn.dtypes.as_dtype(dtype).np))
    return out


def _within(out, ref, tol, what):
    out = np.asarray(out, np.float64)
    assert np.array_equal(np.isneginf(out), np.isneginf(ref)), what
    fin = np.isfinite(ref)
    err = np.abs(out[fin] - ref[fin])
    assert (err <= tol[fin]).all(), f"{what}: worst error {err.max():.3g} over a bound of {tol[fin][err.argmax()]:.3g}"


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_softmax_log_softmax_against_float64(dtype, rng):
    xs = [pn.placeholder(s, dtype, name=f"x{k}") for k, s in enumerate(SHAPES)]
    outs = [f(x, axis=-1) for x in xs for f in (pn.nn.softmax, pn.nn.log_softmax)]
    k = pn.compile(outs, target="cpu")
    arrays = _inputs(dtype, rng)
    got = k(*arrays)
    for n, a in enumerate(arrays):
        sm, sm_tol, lsm, lsm_tol = _bounds(a, dtype)
        assert got[2 * n].dtype == a.dtype
        _within(got[2 * n], sm, sm_tol, f"softmax {dtype} {a.shape}")
        _within(got[2 * n + 1], lsm, lsm_tol, f"log_softmax {dtype} {a.shape}")
    assert all(np.asarray(got[2 * n], np.float64).ravel().tolist() == [1.0] for n in (0,))  # a row of one: exactly 1


def test_masked_rows(rng):
    """-inf entries (masked scores) give exactly 0 (softmax) and -inf (log_softmax)."""
    a = (rng.standard_normal((6, 37)) * 3).astype(np.float32)
    a[:, ::5] = -np.inf
    x = pn.placeholder(a.shape, "float32", name="x")
    sm, lsm = pn.compile([pn.nn.softmax(x, axis=-1), pn.nn.log_softmax(x, axis=-1)], target="cpu")(a)
    ref_sm, sm_tol, ref_lsm, lsm_tol = _bounds(a, "float32")
    assert (sm[:, ::5] == 0).all() and np.isneginf(lsm[:, ::5]).all()
    _within(sm, ref_sm, sm_tol, "masked softmax")
    _within(lsm, ref_lsm, lsm_tol, "masked log_softmax")


def test_exp_evaluated_once():
    """The sum pass stores exp(x - m); the last pass reads it back and multiplies by 1 / s."""
    k = pn.compile(pn.nn.softmax(pn.placeholder((16, 1000), "float32"), axis=-1, method="multipass"), target="cpu")
    (kern,) = k.cpu_kernels
    assert [r.ops for r in kern.decision.reuse] == ["exp(sub)"]
    assert "reuse=exp(sub)" in kern.describe()
    # the sum pass evaluates it in its W-lane loop and in its tail (cpu_lanes.py; each element in one of
    # them), as the exp of a non-positive argument (schedule/cpu_exp_range.py); the last pass, after
    # the reciprocal, only reads pn_cse0 back
    assert kern.source.count("pn_exp_le0f(") == 2 and "expf(" not in kern.source and "pn_cse0[j]" in kern.source
    assert "pn_exp_le0f(" not in kern.source.split("pn_rcp", 1)[1]
    lsm = pn.compile(
        pn.nn.log_softmax(pn.placeholder((16, 1000), "float32"), axis=-1, method="multipass"), target="cpu"
    )
    # only x - m is shared: kept in the output row where the probe's one-thread L2 store and load cost
    # less than the subtraction (74/88 GB/s since the probe reads one core's L2 half; log_softmax
    # [64x30522] ran 12 % faster so, 1 thread, 2026-11-25), else recomputed
    assert [(r.ops, r.into is not None) for r in lsm.cpu_kernels[0].decision.reuse] in ([], [("sub", True)])


def _group(t):
    return lower(t, stop_after="groups", target="emulator").groups[0]


MODEL = CpuModel.nominal(cores=2, simd_bytes=64)


def test_reuse_positive():
    g = _group(pn.nn.softmax(pn.placeholder((4, 1000), "float32"), axis=1, method="multipass"))
    (r,) = choose(g, MODEL)
    assert (r.producer, r.consumers, r.ops, r.ctype) == (1, (2,), "exp(sub)", "float") and r.saved_ns > 0


def test_reuse_precondition_1_stitched_rows_only():
    assert candidates(_group(pn.sum(pn.exp(pn.placeholder((4, 1000), "float32")), axis=1))) == []


def test_reuse_precondition_2_varying_only():
    """exp(m) is shared by two passes but is a row invariant: nothing to keep."""
    x = pn.placeholder((4, 1000), "float32")
    m = pn.max(x, axis=1, keepdims=True)
    s = pn.sum(x * pn.exp(m), axis=1, keepdims=True)
    g = _group(x * pn.exp(m) / s)
    assert g.stitched
    assert all(e.op != "exp" for _, _, e in candidates(g))


def test_reuse_precondition_3_row_passes_only():
    """logsumexp's log(s) + m runs once per row (an epilogue): no later pass over the elements."""
    g = _group(pn.nn.logsumexp(pn.placeholder((4, 1000), "float32"), axis=1))
    assert candidates(g) == []


def test_reuse_precondition_4_model_decides():
    lsm = _group(pn.nn.log_softmax(pn.placeholder((4, 1000), "float32"), axis=1, method="multipass"))
    assert [e.op for _, _, e in candidates(lsm)] == ["sub"] and choose(lsm, MODEL) == ()
    sm = _group(pn.nn.softmax(pn.placeholder((4, 1000), "float32"), axis=1, method="multipass"))
    slow = Rates(1, ((1.0, 1.0),) * 3, ((1.0, 1.0),) * 3, 0.05, 0.2, 0.2, (1.0, 1.0))  # 1 GB/s everywhere
    assert candidates(sm) and choose(sm, CpuModel(2, 64, "slow memory", rates=slow)) == ()
    # 4 MiB a row, beyond L2: a float16 output cannot be the scratch row (float values), and a
    # scratch row of its own is not allocated
    long = _group(pn.nn.softmax(pn.placeholder((2, 1 << 20), "float16"), axis=1, method="multipass"))
    assert candidates(long) and choose(long, MODEL) == ()


def test_reuse_beyond_l2_into_the_output_row():
    """A row beyond L2 keeps exp(x - m) in the float32 output row (no row allocated) where the
    model prices the store, the read back and a second write-back of the row at the L3 rates below
    the exp (this machine's probe: L3 written at ~30 GB/s, 0.27 ns a value, exp 0.49 ns); at the
    nominal model's 15 GB/s (0.53 ns against 0.35) it recomputes. log_softmax's x - m (one
    subtraction) is recomputed either way."""
    fast_l3 = Rates(2, ((60.0, 120.0), (30.0, 60.0), (12.0, 24.0)), ((30.0, 60.0), (30.0, 60.0), (8.0, 16.0)),
                    0.08, 0.35, 0.2, (1.0, 1.0))  # fmt: skip
    l3 = CpuModel(2, 64, "L3 written at 30 GB/s", rates=fast_l3)
    long = _group(pn.nn.softmax(pn.placeholder((2, 1 << 20), "float32"), axis=1, method="multipass"))
    assert [(x.ops, x.into) for x in choose(long, l3)] == [("exp(sub)", 2)] and choose(long, MODEL) == ()
    lsm = _group(pn.nn.log_softmax(pn.placeholder((2, 1 << 20), "float32"), axis=1, method="multipass"))
    assert candidates(lsm) and choose(lsm, l3) == ()


def _edge_floats(rng) -> np.ndarray:
    """float32 values around every float16 range: subnormals, normals, the overflow threshold
    65520, ties, inf, NaN and signed zeros."""
    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    scaled = [rng.standard_normal(20000).astype(np.float32) * s for s in (1e-8, 3e-8, 1e-6, 1e-4, 1.0, 1e3, 6e4)]
    ties = (halves[np.isfinite(halves)][:-1] + np.diff(halves[np.isfinite(halves)]) / 2).astype(np.float32)
    special = np.array([np.inf, -np.inf, np.nan, 65519.99, 65520.0, -65520.0, 2**-25, 3 * 2**-25, 2**-26, -0.0, 1e-40])
    return np.concatenate([halves, ties, *scaled, special.astype(np.float32)])


@pytest.mark.parametrize("target", ["cpu", "emulator"])
def test_16bit_conversions_exact(target, rng):
    """The branch-free conversions of runtime/cuda_emulation.h (vectorized on the CPU) round as numpy:
    every float16 to float32, and float32 values around every float16 range to float16 and bfloat16."""
    f = _edge_floats(rng)
    if target == "emulator":
        f = f[rng.choice(f.size, 3000, replace=False)]
    with np.errstate(over="ignore"):
        h = np.arange(65536, dtype=np.uint16).view(np.float16) if target == "cpu" else f.astype(np.float16)
    x16, x32 = pn.placeholder(h.shape, "float16"), pn.placeholder(f.shape, "float32")
    k = pn.compile([x16.astype("float32"), x32.astype("float16"), x32.astype("bfloat16")], target=target)
    up, down, bf = k(h, f)
    with np.errstate(all="ignore"):
        refs = (h.astype(np.float32), f.astype(np.float16), f.astype(ml_dtypes.bfloat16))
    for got, ref in zip((up, down, bf), refs):
        bits = {2: np.uint16, 4: np.uint32}[ref.dtype.itemsize]
        nan = np.isnan(ref.astype(np.float32))
        assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
        np.testing.assert_array_equal(got[~nan].view(bits), ref[~nan].view(bits))


SMALL = {  # the new norm recipes of the CPU bench at small shapes
    "cross_entropy [64x30522]": ((6, 37), (6,)),
    "batch_norm train [32x64x56x56]": ((3, 4, 5, 5), (4,), (4,)),
    "group_norm 8g [4x64x16x16]": ((2, 16, 3, 3), (16,), (16,)),
    "softmax [6144x128] float16": ((5, 33),),
    "rms_norm [1024x512] bfloat16": ((4, 24), (24,)),
}


@pytest.mark.parametrize("name", list(SMALL))
def test_bench_recipes_agree(name, rng):
    """Each new recipe of panamera/bench/cpu_recipes.py gives the float64 reference's values in Panamera
    (target cpu), torch eager and onnxruntime (their ONNX graphs: BatchNormalization in training
    mode, GroupNormalization, LogSoftmax + GatherElements)."""
    import dataclasses

    import onnxruntime as ort
    import torch

    from panamera.bench import cpu_measure as cm
    from panamera.bench import cpu_recipes as cr

    w = next(w for w in cr.cpu_workloads() if w.name == name)
    w = dataclasses.replace(w, shapes=SMALL[name], reduced=max(SMALL[name][0][-1], 2))
    arrays = cm._inputs(w, rng)
    ref = w.recipe(cr.NumpyBackend(ref=True), *[a.astype(np.float64) for a in arrays])
    holders = [pn.placeholder(s, d) for s, d in zip(w.shapes, w.input_dtypes)]
    got = {"panamera": pn.compile(w.recipe(cr.PanameraBackend(), *holders), target="cpu")(*arrays)}
    with torch.no_grad():
        got["torch"] = w.recipe(cr.TorchBackend(), *[cm._tensor(torch, a) for a in arrays]).float().numpy()
    if w.input_dtypes[0] != "bfloat16":  # onnxruntime's CPU provider has no bfloat16 RMSNormalization
        sess = ort.InferenceSession(cr.OnnxBackend().model(w), providers=["CPUExecutionProvider"])
        got["onnxruntime"] = sess.run(None, {f"x{k}": a for k, a in enumerate(arrays)})[0]
    out_dtype = np.dtype(w.input_dtypes[0])
    for who, g in got.items():
        err, tol, ok = cm.check(np.asarray(g).astype(out_dtype), ref, w.reduced)
        assert ok, f"{name}: {who} off by {err:.3g} (tolerance {tol:.3g})"


def test_fused_rows_evaluate_each_value_once(rng):
    """Softmaxes of producer expressions in one stitched group: each exp (and the shared producers
    later passes need) evaluated once per element, a value kept by one pass and read back by the
    next reused again by the pass that stores another; results within the derived bounds of
    their float32 inputs."""
    x = pn.placeholder((7, 301), "float32", name="x")
    m = pn.placeholder((7, 301), "bool", name="m")
    masked = pn.where(m, x * 0.5 + 1.0, -np.inf)
    k = pn.compile([pn.nn.softmax(masked, axis=-1), pn.nn.log_softmax(x * 3.0, axis=-1)], target="cpu")
    src = "".join(kern.source for kern in k.cpu_kernels)
    # two exps, each printed once per copy of the one pass that evaluates it (the lanes' scan and the
    # tail's: codegen/cpu_lanes.py); no later pass evaluates one again
    exps = [ln.strip() for ln in src.splitlines() if re.search(r"\b(expf|pn_exp_le0f)\(", ln)]
    assert len(set(exps)) == 2 and len(exps) == 4, exps
    a = (rng.standard_normal((7, 301)) * 3).astype(np.float32)
    mm = rng.random((7, 301)) > 0.3
    sm, lsm = k(a, mm)
    ref_sm, sm_tol, _, _ = _bounds(
        np.where(mm, a * np.float32(0.5) + np.float32(1.0), -np.inf).astype(np.float32), "float32"
    )
    _, _, ref_lsm, lsm_tol = _bounds(a * np.float32(3.0), "float32")
    _within(sm, ref_sm, sm_tol, "masked softmax of a producer")
    _within(lsm, ref_lsm, lsm_tol, "log_softmax of a producer")


@pytest.mark.parametrize("scale", [1e-41, 3e36])
def test_row_reciprocal_keeps_subnormal_and_huge_rows_finite(scale, rng):
    """x / rowsum(x) prints x * (1/s) only where s and 1/s are both normal: a row of subnormals
    (1/s = inf) or of huge values (1/s subnormal) divides as numpy does."""
    x = pn.placeholder((4, 100), "float32", name="x")
    k = pn.compile(x / pn.sum(x, axis=1, keepdims=True), target="cpu")
    assert "pn_rcp" in k.source
    a = (rng.random((4, 100)) * scale).astype(np.float32)
    ref = a.astype(np.float64) / a.astype(np.float64).sum(1, keepdims=True)
    got = k(a)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=tolerance("float32", 100), atol=0)


def test_row_division_pass_unswitched_on_the_reciprocal_flag(rng):
    """The pass dividing by a row invariant is printed twice under `if (flag)`, the flag folded to
    true (the product) and to false (the division) in each: no select on a loop-invariant bool is
    left in a SIMD loop (g++ 12 on AVX2 left that loop scalar). Rows of both kinds in one call."""
    x = pn.placeholder((4, 100), "float32", name="x")
    k = pn.compile(x / pn.sum(x, axis=1, keepdims=True), target="cpu", cache=False)
    (flag,) = set(re.findall(r"\bpn_rcp\w+_ok\b", k.source))
    assert f"if ({flag}) {{" in k.source and k.source.count(flag) == 3  # declared, set, tested
    assert "(true ? " in k.source and "(false ? " in k.source
    a = rng.random((4, 100)).astype(np.float32)
    a[1] *= np.float32(1e-41)  # subnormal: 1/s is inf, the row divides
    a[2] *= np.float32(3e36)  # 1/s subnormal: the row divides
    ref = a.astype(np.float64) / a.astype(np.float64).sum(1, keepdims=True)
    for t in (1, 2):
        got = k(a, threads=t)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, rtol=tolerance("float32", 100), atol=0)


def test_a_divisor_that_varies_along_the_row_is_not_hoisted(rng):
    """An index read (iota) varies along j though nothing is loaded: the division stays in the row
    loop (hoisting it printed code over an undeclared j)."""
    from panamera.frontend.tensor import iota

    x = pn.placeholder((4, 100), "float32", name="x")
    y = (x - pn.max(x, axis=1, keepdims=True)) / (iota((4, 100), axis=1) + 1).astype("float32")
    k = pn.compile(y, target="cpu")
    a = rng.standard_normal((4, 100)).astype(np.float32)
    ref = (a.astype(np.float64) - a.max(1, keepdims=True)) / np.arange(1, 101)
    np.testing.assert_allclose(k(a), ref, rtol=0, atol=tolerance("float32", 1) * np.abs(ref).max() * 4)
