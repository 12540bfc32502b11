"""pn.nn and pn.var/std against numpy (float64 references), with the kernel count of each plan."""

import ml_dtypes
import numpy as np
import pytest

import panamera as pn
from panamera import errors

DT = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
TOL = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def softmax(a, axis=-1):
    e = np.exp(a - a.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def normalize(a, axes, eps):
    return (a - a.mean(axes, keepdims=True)) / np.sqrt(a.var(axes, keepdims=True) + eps)


def run(y, *arrays, **kw):
    k = pn.compile(y, target="emulator", **kw)
    return k, k(*arrays, order="reverse")


def check(out, ref, dtype, scale=1.0):
    err = np.abs(np.asarray(out, np.float64) - ref).max() / max(1.0, np.abs(ref).max())
    assert err < TOL[dtype] * scale * 10, err


ROWS = (48, 200)


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize(
    "name", ["softmax", "log_softmax", "logsumexp", "layer_norm", "rms_norm", "l2_normalize", "var", "std"]
)
def test_row_ops_match_numpy_in_one_kernel(name, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(ROWS).astype(DT[dtype])
    g, b = rng.standard_normal(ROWS[1]).astype(DT[dtype]), rng.standard_normal(ROWS[1]).astype(DT[dtype])
    a64, g64, b64 = (v.astype(np.float64) for v in (a, g, b))
    x = pn.placeholder(ROWS, dtype, name="x")
    G, B = pn.placeholder(g.shape, dtype, name="gamma"), pn.placeholder(b.shape, dtype, name="beta")
    y, ins, ref = {
        "softmax": (pn.nn.softmax(x), [a], softmax(a64)),
        "log_softmax": (pn.nn.log_softmax(x), [a], np.log(softmax(a64))),
        "logsumexp": (pn.nn.logsumexp(x), [a], np.log(np.exp(a64).sum(-1))),
        "layer_norm": (pn.nn.layer_norm(x, G, B), [a, g, b], normalize(a64, -1, 1e-5) * g64 + b64),
        "rms_norm": (pn.nn.rms_norm(x, G), [a, g], a64 / np.sqrt((a64**2).mean(-1, keepdims=True) + 1e-6) * g64),
        "l2_normalize": (pn.nn.l2_normalize(x), [a], a64 / np.sqrt((a64**2).sum(-1, keepdims=True))),
        "var": (pn.var(x, axis=1, ddof=1), [a], a64.var(1, ddof=1)),
        "std": (pn.std(x, axis=-1), [a], a64.std(-1)),
    }[name]
    k, out = run(y, *ins)
    assert out.dtype == np.dtype(DT[dtype])
    check(out, ref, dtype, scale=4 if name in ("log_softmax", "logsumexp") else 1)
    assert len(k.plan.kernels) == 1, k.explain()
    if name != "var":  # a single Welford reduction: nothing to stitch
        assert any(c.chosen for c in k.considered)


@pytest.mark.parametrize("dtype", list(DT))
def test_batch_norm_training_and_inference(dtype):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 16, 7, 7)).astype(DT[dtype])
    g, b = rng.random(16).astype(DT[dtype]), rng.random(16).astype(DT[dtype])
    x = pn.placeholder(a.shape, dtype, name="x")
    G, B = pn.placeholder((16,), dtype, name="g"), pn.placeholder((16,), dtype, name="b")
    y, mean, v = run(list(pn.nn.batch_norm(x, G, B, eps=1e-5)), a, g, b)[1]
    a64 = a.astype(np.float64)
    gb = g.astype(np.float64)[:, None, None], b.astype(np.float64)[:, None, None]
    check(y, normalize(a64, (0, 2, 3), 1e-5) * gb[0] + gb[1], dtype)
    check(mean, a64.mean((0, 2, 3)), dtype)
    check(v, a64.var((0, 2, 3)), dtype)
    rm, rv = pn.placeholder((16,), dtype, name="rm"), pn.placeholder((16,), dtype, name="rv")
    inf = pn.nn.batch_norm(x, G, B, rm, rv, training=False)
    out = run(inf, a, g, b, np.asarray(mean), np.asarray(v))[1]
    check(out, normalize(a64, (0, 2, 3), 1e-5) * gb[0] + gb[1], dtype, scale=4)


@pytest.mark.parametrize("dtype", list(DT))
def test_group_and_instance_norm(dtype):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((4, 64, 8, 8)).astype(DT[dtype])
    g, b = rng.random(64).astype(DT[dtype]), rng.random(64).astype(DT[dtype])
    x = pn.placeholder(a.shape, dtype, name="x")
    G, B = pn.placeholder((64,), dtype, name="g"), pn.placeholder((64,), dtype, name="b")
    a64, g64, b64 = a.astype(np.float64), g.astype(np.float64)[:, None, None], b.astype(np.float64)[:, None, None]
    ref = normalize(a64.reshape(4, 8, -1), -1, 1e-5).reshape(a.shape) * g64 + b64
    check(run(pn.nn.group_norm(x, 8, G, B), a, g, b)[1], ref, dtype)
    ref = normalize(a64, (2, 3), 1e-5) * g64 + b64
    k, out = run(pn.nn.instance_norm(x, G, B), a, g, b)
    check(out, ref, dtype)
    assert len(k.plan.kernels) == 1


# WORKLOADS.md B at emulator sizes (the row counts scaled down, row lengths kept where cheap).
@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize(
    "name,shape",
    [("softmax", (96, 128)), ("softmax", (4, 30522)), ("layer_norm", (64, 768)), ("rms_norm", (16, 512)),
     ("l2_normalize", (256, 1000)), ("log_softmax", (4, 30522))],
)  # fmt: skip
def test_workloads_b_reduced(name, shape, dtype):
    rng = np.random.default_rng(3)
    a = (rng.standard_normal(shape) * 3).astype(DT[dtype])
    x = pn.placeholder(shape, dtype, name="x")
    y = getattr(pn.nn, name)(x)
    k, out = run(y, a)
    a64 = a.astype(np.float64)
    ref = {
        "softmax": lambda: softmax(a64),
        "log_softmax": lambda: np.log(softmax(a64)),
        "layer_norm": lambda: normalize(a64, -1, 1e-5),
        "rms_norm": lambda: a64 / np.sqrt((a64**2).mean(-1, keepdims=True) + 1e-6),
        "l2_normalize": lambda: a64 / np.sqrt((a64**2).sum(-1, keepdims=True)),
    }[name]()
    check(out, ref, dtype, scale=8)


def test_softmax_with_minus_inf_and_huge_inputs():
    a = np.array([[0.0, -np.inf, 1.0, 2.0], [1e4, 1e4 + 1, -1e4, 3e38], [-np.inf] * 4], np.float32)
    out = run(pn.nn.softmax(pn.placeholder(a.shape, "float32", name="x")), a)[1]
    with np.errstate(invalid="ignore"):
        ref = softmax(a.astype(np.float64))
    np.testing.assert_allclose(out[:2], ref[:2], rtol=1e-6, atol=1e-30)
    assert np.isnan(out[2]).all() and np.isnan(ref[2]).all()
    lse = run(pn.nn.logsumexp(pn.placeholder(a.shape, "float32", name="x")), a)[1]
    assert lse[2] == -np.inf and np.isfinite(lse[:2]).all()


def test_variance_of_large_mean_data_is_stable():
    """1e7 values of mean 1e4, std 1: one-pass Welford (float64 accumulators, merged pairwise
    across threads, warps and blocks) keeps float32 precision."""
    rng = np.random.default_rng(4)
    a = (1e4 + rng.standard_normal(10_000_000)).astype(np.float32)
    k, (m, v) = run([pn.mean(pn.placeholder(a.shape, "float32", name="x")), pn.var(pn.placeholder(a.shape))], a, a)
    a64 = a.astype(np.float64)
    assert abs(m - a64.mean()) / a64.mean() < 1e-6
    assert abs(v - a64.var()) / a64.var() < 1e-6
    assert any(ln.blocks_per_reduction > 1 for ln in k.plan.kernels)  # partials merged across blocks


def test_bad_inputs():
    with pytest.raises(errors.EmptyReductionError, match="'x'.*zero-size"):
        pn.nn.layer_norm(pn.placeholder((4, 0), "float32", name="x"))
    with pytest.raises(errors.ShapeError, match="gamma 'g' has shape \\(5,\\), expected \\(8,\\)"):
        pn.nn.layer_norm(pn.placeholder((4, 8), name="x"), pn.placeholder((5,), name="g"))
    with pytest.raises(errors.DTypeError, match="softmax of tensor 'x': needs a floating-point"):
        pn.nn.softmax(pn.placeholder((4, 8), "int32", name="x"))
    with pytest.raises(errors.ShapeError, match="do not split into 5 groups"):
        pn.nn.group_norm(pn.placeholder((2, 8, 4, 4), name="x"), 5)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "bool"])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin_first_occurrence_across_blocks(op, dtype, deterministic):
    rng = np.random.default_rng(6)
    for shape, axis, keepdims in [((5, 3000), 1, False), ((3000, 6), 0, True), ((7, 9, 11), None, False)]:
        a = rng.integers(-4, 4, shape)  # many ties: the first index must win
        a = (a > 0) if dtype == "bool" else a.astype(DT.get(dtype, dtype))
        y = getattr(pn, op)(pn.placeholder(shape, dtype, name="x"), axis=axis, keepdims=keepdims)
        for split in (None, 4):
            k = pn.compile(y, target="emulator", deterministic=deterministic, split=split)
            out = k(a, order="shuffled", seed=2)
            np.testing.assert_array_equal(out, getattr(np, op)(a, axis=axis, keepdims=keepdims))
            assert out.dtype == np.int64


def test_argmax_nan_wins_and_negative_zero_ties_with_zero():
    a = np.array([[1.0, np.nan, 5.0, np.nan], [-0.0, 0.0, -1.0, -0.0], [-np.inf, -np.inf, -5.0, 2.0]], np.float32)
    x = pn.placeholder(a.shape, "float32", name="x")
    for op in ("argmax", "argmin"):
        out = pn.compile(getattr(pn, op)(x, axis=1), target="emulator")(a)
        np.testing.assert_array_equal(out, getattr(np, op)(a, axis=1))


def test_argmax_bad_inputs():
    with pytest.raises(errors.EmptyReductionError, match="empty sequence"):
        pn.argmax(pn.placeholder((3, 0), name="x"), axis=1)
    with pytest.raises(errors.DTypeError, match="float64 values are not supported"):
        pn.argmax(pn.placeholder((3, 4), "float64", name="x"))
    with pytest.raises(errors.AxisError, match="axis must be None or an int"):
        pn.argmin(pn.placeholder((3, 4), name="x"), axis=(0, 1))


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy(reduction, dtype):
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((16, 3001)) * 4).astype(DT[dtype])
    t = rng.integers(0, 3001, 16).astype(np.int32)
    x, T = pn.placeholder(a.shape, dtype, name="logits"), pn.placeholder((16,), "int32", name="targets")
    k, out = run(pn.nn.cross_entropy(x, T, reduction=reduction), a, t)
    a64 = a.astype(np.float64)
    m = a64.max(1)
    loss = np.log(np.exp(a64 - m[:, None]).sum(1)) + m - a64[np.arange(16), t]
    ref = {"none": loss, "mean": loss.mean(), "sum": loss.sum()}[reduction]
    check(out, ref, dtype, scale=4)
    assert len(k.plan.kernels) == (1 if reduction == "none" else 2)
    with pytest.raises(errors.DTypeError, match="targets must be an int32 or int64"):
        pn.nn.cross_entropy(x, pn.placeholder((16,), "float32"))


def test_arange_broadcasts_like_numpy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = pn.placeholder(a.shape, "float32", name="x")
    out = pn.compile(pn.sum(x * pn.arange(4), axis=1), target="emulator")(a)
    np.testing.assert_allclose(out, (a * np.arange(4)).sum(1))


def test_layer_norm_reads_each_row_twice():
    """Mean and variance come from one Welford pass; the second pass normalizes."""
    x = pn.placeholder((64, 768), "float16", name="x")
    g, b = pn.placeholder((768,), "float16", name="g"), pn.placeholder((768,), "float16", name="b")
    k = pn.compile(pn.nn.layer_norm(x, g, b), target="emulator")
    assert len(k.plan.kernels) == 1
    assert "// pass 1" in k.source and "// pass 2" not in k.source
    assert k.source.count("pn_op_welford, ") == 1  # one accumulator for both, all-reduced in pass 0


@pytest.mark.parametrize("method", ["online", "multipass"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_formulations_match_numpy(op, method):
    rng = np.random.default_rng(8)
    a = (rng.standard_normal((24, 3000)) * 8).astype(np.float32)
    a[3, :] = -np.inf
    a[4, ::2] = -np.inf
    a[5, 7] = 80.0  # exp overflows float32 without the max shift
    x = pn.placeholder(a.shape, "float32", name="x")
    k, out = run(getattr(pn.nn, op)(x, method=method), a)
    with np.errstate(invalid="ignore", divide="ignore"):
        ref = softmax(a.astype(np.float64))
        ref = np.log(ref) if op == "log_softmax" else ref
    assert np.isnan(out[3]).all() and np.isnan(ref[3]).all()
    rows = [r for r in range(24) if r != 3]
    np.testing.assert_allclose(out[rows], ref[rows], rtol=1e-5, atol=1e-6)
    assert len(k.plan.kernels) == 1
    assert k.source.count("// pass") == (2 if method == "online" else 3)


def test_online_statistics_merge_across_blocks():
    from panamera.frontend.ops import online_softmax_stats

    a = (np.random.default_rng(9).standard_normal((3, 5000)) * 10).astype(np.float32)
    x = pn.placeholder(a.shape, "float32", name="x")
    k = pn.compile(list(online_softmax_stats(x, -1, keepdims=False)), target="emulator", split=4)
    m, s = k(a, order="shuffled", seed=4)
    assert all(mode == "partials" for mode in k.plan.kernels[0].modes)
    np.testing.assert_array_equal(m, a.max(1))
    np.testing.assert_allclose(s, np.exp(a.astype(np.float64) - a.max(1, keepdims=True)).sum(1), rtol=1e-5)


def test_the_model_chooses_the_softmax_formulation():
    """Rows that stay in L2: the third pass re-reads L2, the online form pays extra exps, and the
    two are close. Rows too long for L2: one pass fewer over DRAM clearly wins. Rows split across
    blocks: the passes no longer overlap and each costs a grid-wide exchange, so the online form,
    one exchange fewer, wins."""
    import re

    def figures(text):
        return map(float, re.search(r"online ([\d.]+) us vs multipass ([\d.]+) us", text).groups())

    short = pn.compile(pn.nn.softmax(pn.placeholder((256, 8192), name="x")), target="emulator", use_database=False)
    short = short.explain()
    online, multi = figures(short)
    assert abs(online - multi) < 0.05 * min(online, multi)
    assert f"-> {'online' if online < multi else 'multipass'}" in short
    # an A100 has no thread-block clusters: the split rows exchange through grid-wide waits
    x = pn.placeholder((32, 30522), name="x")
    split = pn.compile(pn.nn.softmax(x), target="emulator", use_database=False, gpu="a100")
    online, multi = figures(split.explain())
    assert split.mappings[0].cooperative and "-> online" in split.explain() and online < 0.95 * multi
    long_rows = pn.compile(pn.nn.softmax(pn.placeholder((16, 1_000_000), name="x")), target="emulator").explain()
    online, multi = map(float, re.search(r"online ([\d.]+) us vs multipass ([\d.]+) us", long_rows).groups())
    assert "-> online" in long_rows and online < 0.8 * multi
    with pytest.raises(errors.OptionError, match="unknown method"):
        pn.nn.softmax(pn.placeholder((4, 4), name="x"), method="fast")


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "cross_entropy"])
def test_method_is_an_enum_that_takes_its_strings(op):
    """`method=` is a SoftmaxMethod; its strings build the same graph; anything else is an
    OptionError naming the op, the option and the choices."""
    x = pn.placeholder((4, 64), name="x")
    args = (x, pn.placeholder((4,), "int32", name="t")) if op == "cross_entropy" else (x,)
    f = getattr(pn.nn, op)
    for m in pn.nn.SoftmaxMethod:
        by_enum, by_str = f(*args, method=m), f(*args, method=m.value)
        assert by_enum.op == by_str.op and by_enum.shape == by_str.shape
    for bad in ("fast", 3, None):
        with pytest.raises(
            errors.OptionError, match=rf"{op}: unknown method .* \(method= takes auto, online, multipass"
        ):
            f(*args, method=bad)


def test_group_norm_is_one_kernel_and_its_reshape_a_view(rng):
    x = pn.placeholder((4, 64, 16, 16), "float32", name="x")
    g, b = pn.placeholder((64,), "float32", name="g"), pn.placeholder((64,), "float32", name="b")
    k = pn.compile(pn.nn.group_norm(x, 8, g, b), target="emulator")
    assert len(k.plan.per_call) == 1 and k.plan.kernels[0].role == "reduce"
    a = (rng.standard_normal((4, 64, 16, 16)) * 3 + 1).astype(np.float32)
    ga, ba = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    a64 = a.astype(np.float64).reshape(4, 8, -1)
    ref = ((a64 - a64.mean(-1, keepdims=True)) / np.sqrt(a64.var(-1, keepdims=True) + 1e-5)).reshape(a.shape)
    ref = ref * ga[None, :, None, None] + ba[None, :, None, None]
    np.testing.assert_allclose(k(a, ga, ba), ref, rtol=1e-4, atol=1e-4)


def test_an_output_reshape_is_a_view_not_a_kernel(rng):
    x = pn.placeholder((4, 8), "float32", name="x")
    e = pn.exp(x)
    k = pn.compile([e.reshape((8, 4)), e, x.reshape((32,))], target="emulator")
    assert len(k.plan.per_call) == 1  # the exp; both reshapes are views
    a = rng.standard_normal((4, 8)).astype(np.float32)
    r0, r1, r2 = k(a)
    np.testing.assert_allclose(r0, np.exp(a).reshape(8, 4), rtol=1e-6)
    np.testing.assert_allclose(r1, np.exp(a), rtol=1e-6)
    np.testing.assert_array_equal(r2, a.reshape(32))
    assert not np.shares_memory(r0, r1)  # two outputs never share memory


def test_mean_and_variance_share_one_welford_accumulator(rng):
    """LayerNorm's mean and variance fold the same values with the same combiner: one
    accumulator, one block reduction, two finishes (KernelGroup.accumulator_of)."""
    x = pn.placeholder((64, 1024), "float32", name="x")
    k = pn.compile(pn.nn.layer_norm(x), target="emulator", use_database=False)
    assert k.source.count("pn_allreduce_x<pn_op_welford") == 1
    a = rng.standard_normal((64, 1024)).astype(np.float32) * 3 + 100
    a64 = a.astype(np.float64)
    want = (a64 - a64.mean(1, keepdims=True)) / np.sqrt(a64.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(k(a), want, rtol=0, atol=64 * np.finfo(np.float32).eps * np.abs(want).max())


@pytest.mark.parametrize("deterministic", [False, True])
def test_a_split_sum_and_mean_of_the_same_values_merge_once(rng, deterministic):
    x = pn.placeholder((1 << 18,), "float32", name="x")
    k = pn.compile([pn.sum(x), pn.mean(x)], target="emulator", deterministic=deterministic, use_database=False)
    assert k.mappings[0].split > 1
    ws = [b for b in k.mappings[0].buffers if str(b.role) in ("workspace", "partials")]
    assert len(ws) == 1  # one merge for both outputs
    a = rng.standard_normal(1 << 18).astype(np.float32)
    for _ in range(3):  # the resident workspace is reset for the next call
        s, m = k(a)
        tol = 4 * np.finfo(np.float32).eps * np.sqrt(a.size) * np.abs(a).max()
        np.testing.assert_allclose(s, a.astype(np.float64).sum(), rtol=0, atol=tol)
        np.testing.assert_allclose(m, a.astype(np.float64).mean(), rtol=0, atol=tol / a.size)
