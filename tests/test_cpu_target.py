"""target="cpu": OpenMP + SIMD C++ (codegen/cpu_kernel.py) against numpy in float64.

Tolerances come from conftest.tolerance (dtype and reduction length; 16-bit floats accumulate
in float32). Several outputs are compiled into one program where possible: one g++ build
covers several kernel groups, which keeps the file fast.
"""

import numpy as np
import pytest
from conftest import random_array, tolerance

import panamera as pn
from panamera.codegen.cpu_kernel import CpuUnsupportedError


def close(out, ref, dtype: str, n: int, scale: float = 1.0):
    """`out` against the float64 reference within the derived tolerance (scaled by the largest
    magnitude summed, for sums of n values); exact for integers."""
    tol = tolerance(dtype, n)
    if not tol:
        np.testing.assert_array_equal(out, ref)
        return
    np.testing.assert_allclose(np.asarray(out, np.float64), np.asarray(ref, np.float64), rtol=tol, atol=tol * scale)


@pytest.fixture(scope="module")
def forms():
    """ROW, COLUMN, ALL and MAP groups, epilogues and an argmax, float32, in one program."""
    x = pn.placeholder((37, 301), "float32", name="x")
    outs = [
        pn.sum(x, axis=1),
        pn.sum(x, axis=0),
        pn.sum(x),
        pn.exp(x) + 1.0,
        pn.max(pn.exp(x) * 2.0, axis=1),
        pn.mean(x, axis=0) * 2.0 + 1.0,
        pn.argmax(x, axis=1),
    ]
    return pn.compile(outs, target="cpu")


def test_forms_float32(forms, rng):
    a = random_array((37, 301), "float32", rng)
    a64 = a.astype(np.float64)
    r = forms(a)
    assert {d.form for d in forms.decisions} >= {"ROW", "COLUMN", "ALL", "MAP"}
    close(r[0], a64.sum(1), "float32", 301, 1.3)
    close(r[1], a64.sum(0), "float32", 37, 1.3)
    close(r[2], a64.sum(), "float32", a.size, 1.3)
    close(r[3], np.exp(a64) + 1, "float32", 1)
    close(r[4], (np.exp(a64) * 2).max(1), "float32", 1)
    close(r[5], a64.mean(0) * 2 + 1, "float32", 37, 1.3)
    np.testing.assert_array_equal(r[6], a.argmax(1))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int32", "int64"])
def test_dtypes(dtype, rng):
    x = pn.placeholder((19, 257), dtype, name="x")
    k = pn.compile([pn.sum(x, axis=1), pn.sum(x, axis=0), pn.max(x)], target="cpu")
    a = random_array((19, 257), dtype, rng)
    ref = a.astype(np.float64) if dtype.endswith("16") else a
    r = k(a)
    assert r[0].dtype == np.sum(a, axis=1).dtype or dtype.endswith("16")
    close(r[0], ref.sum(1), dtype, 257, 1.3)
    close(r[1], ref.sum(0), dtype, 19, 1.3)
    close(r[2], ref.max(), dtype, 1)


@pytest.mark.parametrize("merge", ["last", "atomic"])
def test_split_merge_modes(merge, rng, monkeypatch):
    """Few outputs: the reduction is split in fixed chunks (forced here, so the plan does not
    depend on this machine), ROW, ALL and COLUMN forms, in each merge mode (forced through
    cpu_mapper.merge_mode, the one rule that picks it; shown by explain()). LAST combines the
    partials in chunk order: bit-identical on 1 and 2 threads; ATOMIC within the derived tolerance."""
    from panamera.schedule import cpu_mapper

    mode = cpu_mapper.CpuMerge(merge)
    monkeypatch.setattr(cpu_mapper, "merge_mode", lambda g, s, d, price: mode if s > 1 else cpu_mapper.CpuMerge.NONE)
    x = pn.placeholder((3, 40000), "float32", name="x")
    y = pn.placeholder((20000, 40), "float32", name="y")
    outs = [pn.sum(x, axis=1), pn.sum(x), pn.sum(y, axis=0) * 0.5, pn.max(x, axis=1)]
    k = pn.compile(outs, target="cpu", split=7, cache=False)
    assert all(d.split > 1 and d.merge == mode for d in k.decisions if d.form != "MAP"), k.explain()
    assert f"merge={merge}" in k.explain()
    a, b = random_array((3, 40000), "float32", rng), random_array((20000, 40), "float32", rng)
    one, two = k(a, b, threads=1), k(a, b, threads=2)
    if mode != cpu_mapper.CpuMerge.ATOMIC:
        for p, q in zip(one, two):
            np.testing.assert_array_equal(p, q)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for r in (one, two):
        close(r[0], a64.sum(1), "float32", 40000, 1.3)
        close(r[1], a64.sum(), "float32", a.size, 1.3)
        close(r[2], b64.sum(0) * 0.5, "float32", 20000, 1.3)
        close(r[3], a64.max(1), "float32", 1)


def test_merge_rule():
    """Split: the model's prices (model/cpu.py `merge_us`) choose LAST for scalar accumulators
    (argmax's is one packed int64) and struct ones (Welford's variance) alike, deterministic or
    not; not split, NONE."""
    from panamera.compiler import lower
    from panamera.schedule.cpu_mapper import CpuMachine, map_cpu

    x = pn.placeholder((2, 1 << 17), "float32", name="x")
    two = CpuMachine(cores=2, simd_bytes=32, name="test")
    modes = []
    for y in (pn.sum(x, axis=1), pn.var(x, axis=1), pn.argmax(x, axis=1)):
        g = lower(y, stop_after="groups", target="emulator").groups[0]
        modes.append([str(map_cpu(g, two, 4, deterministic=det).merge) for det in (True, False)])
    assert modes == [["last", "last"]] * 3, modes
    assert map_cpu(g, two, 1).merge == "none"


def test_merge_rule_follows_the_price(monkeypatch):
    """Where the model prices ATOMIC below LAST (here: free compare-and-swaps and barriers), the
    mapper chooses it, except under its preconditions (schedule/cpu_mapper.py `merge_mode`):
    1. deterministic: LAST; 2. a struct accumulator (Welford's variance): LAST."""
    import dataclasses

    from panamera.compiler import lower
    from panamera.model import cpu as cpu_model
    from panamera.model.cpu import CpuModel
    from panamera.schedule.cpu_mapper import CpuMachine, map_cpu

    monkeypatch.setattr(cpu_model, "ATOMIC_RMW_NS", 0.0)
    two = CpuMachine(cores=2, simd_bytes=32, name="test")
    m = CpuModel.nominal(2, 32)
    free = dataclasses.replace(m, rates=dataclasses.replace(m.rates, fork_us=(0.0, 0.0)))
    x = pn.placeholder((2, 1 << 17), "float32", name="x")
    groups = [
        lower(y, stop_after="groups", target="emulator").groups[0] for y in (pn.sum(x, axis=1), pn.var(x, axis=1))
    ]
    assert map_cpu(groups[0], two, 4, model=free).merge == "atomic"
    assert map_cpu(groups[0], two, 4, model=m).merge == "last"  # its barriers priced: LAST
    assert map_cpu(groups[0], two, 4, model=free, deterministic=True).merge == "last"  # 1
    assert map_cpu(groups[1], two, 4, model=free).merge == "last"  # 2


def test_mapper_splits_few_outputs():
    from panamera.compiler import lower
    from panamera.schedule.cpu_mapper import CpuMachine, map_cpu

    two = CpuMachine(cores=2, simd_bytes=32, name="test")
    g = lower(pn.sum(pn.placeholder((1, 1 << 18), "float32"), axis=1), stop_after="groups", target="emulator")
    d = map_cpu(g.groups[0], two)
    assert d.split > 1 and d.chunk % d.lanes == 0 and d.split * d.chunk >= d.N
    many = lower(pn.sum(pn.placeholder((4096, 512), "float32"), axis=1), stop_after="groups", target="emulator")
    assert map_cpu(many.groups[0], two).split == 1


def test_stitched_rows(rng):
    x = pn.placeholder((33, 200), "float32", name="x")
    w = pn.placeholder((200,), "float32", name="w")
    k = pn.compile([pn.nn.softmax(x, axis=1), pn.nn.layer_norm(x, w), x - pn.mean(x)], target="cpu")
    a, g = random_array((33, 200), "float32", rng), random_array((200,), "float32", rng)
    sm, ln, centered = k(a, g)
    assert "ALL" in {d.form for d in k.decisions}
    close(centered, a.astype(np.float64) - a.astype(np.float64).mean(), "float32", a.size, 1.3)  # stitched ALL
    a64 = a.astype(np.float64)
    e = np.exp(a64 - a64.max(1, keepdims=True))
    close(sm, e / e.sum(1, keepdims=True), "float32", 200)
    mu, var = a64.mean(1, keepdims=True), a64.var(1, keepdims=True)
    ref = (a64 - mu) / np.sqrt(var + 1e-5) * g
    close(ln, ref, "float32", 200, float(np.abs(ref).max()))


@pytest.mark.parametrize("split", [None, 5])
def test_welford_shifted_sums(split, rng):
    """Variance and layer_norm rows: Welford lowered to shifted sums per scan (cpu_kernel.py),
    chunks merged by Chan's combine when split; rows far from zero keep their precision."""
    x = pn.placeholder((3, 30000), "float32", name="x")
    k = pn.compile([pn.var(x, axis=1), pn.mean(x, axis=1)], target="cpu", split=split)
    a = (random_array((3, 30000), "float32", rng) + 100.0).astype(np.float32)
    v, m = k(a)
    a64 = a.astype(np.float64)
    # x - shift is exact (Sterbenz); the sums' rounding is amplified by m2's cancellation, at most
    # (mean - shift)^2 / var, shift being one of the row's values
    dev = (a64 - a64.mean(1, keepdims=True)) ** 2
    close(v, a64.var(1), "float32", 30000, float((a64.var(1) + dev.max(1)).max()))
    close(m, a64.mean(1), "float32", 30000, 101.0)


def test_torch_cpu_tensors(rng):
    torch = pytest.importorskip("torch")
    k = pn.compile(pn.sum(pn.placeholder((8, 64), "float32", name="x"), axis=1), target="cpu")
    t = torch.from_numpy(random_array((8, 64), "float32", rng))
    out = k(t)
    assert isinstance(out, torch.Tensor)
    close(out.numpy(), t.numpy().astype(np.float64).sum(1), "float32", 64, 1.3)


def test_contractions_generated(rng, monkeypatch):
    """Contractions as CPU kernels (a dot per output under `omp simd`): ROW (x @ w.T) and
    COLUMN (a @ b) forms, a fused producer and epilogue, a batched broadcast matmul, float16
    operands (float32 accumulation), and a K split with the LAST merge of few outputs. BLAS would
    take the float32 ones from 4096 flops (schedule/cpu_blas.py, precondition 4): the threshold is
    lifted here to test the generated templates."""
    from panamera.schedule import cpu_blas

    monkeypatch.setattr(cpu_blas, "BLAS_MIN_FLOPS", 1 << 62)
    a, b = pn.placeholder((16, 40), "float32", name="a"), pn.placeholder((40, 8), "float32", name="b")
    w = pn.placeholder((8, 40), "float32", name="w")
    p, q = pn.placeholder((3, 1, 4, 5), "float32", name="p"), pn.placeholder((2, 5, 6), "float32", name="q")
    h = pn.placeholder((6, 33), "float16", name="h")
    v = pn.placeholder((2, 50000), "float32", name="v")
    u = pn.placeholder((50000, 3), "float32", name="u")
    outs = [a @ b, pn.maximum((a * 2.0) @ w.T + 1.0, 0.0), pn.matmul(p, q), h @ pn.transpose(h), v @ u]
    k = pn.compile(outs, target="cpu", split=5, deterministic=True)
    assert not any(c.host for c in k.cpu_kernels), k.explain()
    A, B, W = (random_array(s, "float32", rng) for s in ((16, 40), (40, 8), (8, 40)))
    P, Q, H = (
        random_array((3, 1, 4, 5), "float32", rng),
        random_array((2, 5, 6), "float32", rng),
        random_array((6, 33), "float16", rng),
    )
    V, U = random_array((2, 50000), "float32", rng), random_array((50000, 3), "float32", rng)
    r = k(A, B, W, P, Q, H, V, U)
    f = lambda t: t.astype(np.float64)  # noqa: E731
    close(r[0], f(A) @ f(B), "float32", 40, 1.3)
    close(r[1], np.maximum(2 * f(A) @ f(W).T + 1, 0), "float32", 40, 2.6)
    close(r[2], np.matmul(f(P), f(Q)), "float32", 5, 1.3)
    close(r[3], f(H) @ f(H).T, "float16", 33, 1.3)
    close(r[4], f(V) @ f(U), "float32", 50000, 1.3)


def test_contraction_blas_routing(rng):
    """A large float32 contraction read straight from its operands goes to numpy's BLAS
    (schedule/cpu_blas.py); one with a fused producer, or a small one, stays generated; one
    negative case per precondition of blas_call."""
    from panamera.compiler import lower
    from panamera.schedule.cpu_blas import blas_call

    a, b = pn.placeholder((256, 128), "float32", name="a"), pn.placeholder((128, 512), "float32", name="b")
    w = pn.placeholder((512, 128), "float32", name="w")
    k = pn.compile([a @ b, pn.einsum("mk,nk->mn", a, w)], target="cpu")
    assert [c.host is not None for c in k.cpu_kernels] == [True, True] and "BLAS" in k.explain()
    A, B, W = (random_array(s, "float32", rng) for s in ((256, 128), (128, 512), (512, 128)))
    r = k(A, B, W)
    close(r[0], A.astype(np.float64) @ B.astype(np.float64), "float32", 128, 1.3)
    close(r[1], A.astype(np.float64) @ W.astype(np.float64).T, "float32", 128, 1.3)

    def routed(y):
        return blas_call(lower(y, stop_after="groups", target="emulator").groups[0]) is not None

    assert not routed(pn.maximum(a @ b, 0.0))  # 1: an epilogue fused after it
    assert not routed(a.astype("float16") @ b.astype("float16"))  # 2: 16-bit operands
    assert not routed((a * 2.0) @ b)  # 3: a producer fused into an operand
    assert not routed(pn.placeholder((2, 8), "float32") @ pn.placeholder((8, 16), "float32"))  # 4: too few flops


def test_empty_reductions(rng):
    """Reductions over an empty extent give numpy's values: the identity, NaN for a mean."""
    x = pn.placeholder((3, 0), "float32", name="x")
    k = pn.compile([pn.sum(x, axis=1), pn.mean(x, axis=1), pn.prod(x, axis=1), pn.max(x, axis=0)], target="cpu")
    s, m, p, e = k(np.zeros((3, 0), np.float32))
    np.testing.assert_array_equal(s, np.zeros(3, np.float32))
    assert np.isnan(m).all() and m.shape == (3,)
    np.testing.assert_array_equal(p, np.ones(3, np.float32))
    assert e.shape == (0,)


def test_attention_as_chain(rng):
    """No fused attention template on the CPU: the chain (q @ k.T, a softmax per query row, @ v)
    is chosen, its contractions and stitched rows as CPU kernels."""
    q, kk, v = (pn.placeholder((1, 2, n, 8), "float32", name=c) for c, n in (("q", 16), ("k", 24), ("v", 24)))
    k = pn.compile(pn.nn.attention(q, kk, v), target="cpu")
    assert "-> chain" in k.explain()
    Q, K, V = (random_array((1, 2, n, 8), "float32", rng).astype(np.float64) for n in (16, 24, 24))
    s = Q @ K.transpose(0, 1, 3, 2) / np.sqrt(8)
    e = np.exp(s - s.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True) @ V
    close(k(*(t.astype(np.float32) for t in (Q, K, V))), ref, "float32", 24, float(np.abs(V).max()))


def test_unsupported_refused():
    a = pn.placeholder((16, 32), "float32", name="a")
    assert issubclass(CpuUnsupportedError, pn.PanameraError)
    with pytest.raises(pn.OptionError, match="'cpu'"):
        pn.compile(pn.sum(a), target="cpus")


def test_out_and_emulator_keywords(rng):
    k = pn.compile(pn.sum(pn.placeholder((4, 50), "float32", name="x"), axis=1), target="cpu")
    a, buf = random_array((4, 50), "float32", rng), np.zeros(4, np.float32)
    assert k(x=a, out=buf, order="reverse", seed=3) is buf
    close(buf, a.astype(np.float64).sum(1), "float32", 50, 1.3)


def test_threads_checked(forms):
    a = np.zeros((37, 301), np.float32)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(pn.OptionError, match="threads"):
            forms(a, threads=bad)


def test_more_templates(rng):
    """prod, min / argmin over an outer axis, any / all, variance down columns (Welford
    COLUMN), logsumexp, int8 sums, a middle axis, a gather and NaN propagation through max, in
    one program (one build)."""
    x = pn.placeholder((6, 5, 40), "float32", name="x")
    b = pn.placeholder((6, 5, 40), "bool", name="b")
    i8 = pn.placeholder((6, 5, 40), "int8", name="i")
    idx = pn.placeholder((7,), "int64", name="idx")
    outs = [
        pn.prod(x, axis=2),
        pn.min(x, axis=0),
        pn.argmin(x, axis=1),
        pn.any(b, axis=2),
        pn.all(b, axis=0),
        pn.var(x, axis=0),
        pn.nn.logsumexp(x, axis=2),
        pn.sum(i8, axis=1),
        pn.sum(x, axis=1),
        pn.take(pn.reshape(x, (30, 40)), idx, axis=0).sum(axis=1),
        pn.max(x, axis=2),
    ]
    k = pn.compile(outs, target="cpu")
    a = random_array((6, 5, 40), "float32", rng, "prod")
    a[2, 3, 17] = np.nan
    bb, ii = rng.random((6, 5, 40)) > 0.3, rng.integers(-100, 100, (6, 5, 40)).astype(np.int8)
    ix = rng.integers(0, 30, 7)
    r = k(a, bb, ii, ix)
    a64 = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        close(r[0], a64.prod(2), "float32", 40, 1.1)
        close(r[1], a64.min(0), "float32", 1)
        np.testing.assert_array_equal(r[2], a.argmin(1))
        np.testing.assert_array_equal(r[3], bb.any(2))
        np.testing.assert_array_equal(r[4], bb.all(0))
        close(r[5], a64.var(0), "float32", 6, 1.1)
        m = a64.max(2, keepdims=True)
        close(r[6], (m + np.log(np.exp(a64 - m).sum(2, keepdims=True)))[..., 0], "float32", 40, 2.0)
        np.testing.assert_array_equal(r[7], ii.sum(1))
        close(r[8], a64.sum(1), "float32", 5, 1.1)
        close(r[9], a64.reshape(30, 40)[ix].sum(1), "float32", 40, 1.1)
        close(r[10], a64.max(2), "float32", 1)
    assert np.isnan(r[10][2, 3]) and np.isnan(r[0][2, 3])


def test_constant_inputs_and_the_compile_cache_on_the_cpu():
    """target='cpu' binds its call as every target does (a numpy where= mask is a constant input
    the kernel holds) and a program compiled before comes from the in-memory compile cache, its
    inputs named as in the new graph."""
    from panamera import cache

    mask = np.arange(50) % 3 == 0
    x = pn.placeholder((4, 50), "float32", name="x")
    k = pn.compile(pn.sum(x, axis=1, where=mask), target="cpu")
    a = np.random.default_rng(1).standard_normal((4, 50)).astype(np.float32)
    want = a.astype(np.float64).sum(1, where=mask)
    np.testing.assert_allclose(k(a), want, rtol=50 * 2**-23, atol=50 * 2**-23 * np.abs(a).max())
    before = cache.info().hits
    y = pn.placeholder((4, 50), "float32", name="y")
    k2 = pn.compile(pn.sum(y, axis=1, where=mask), target="cpu")
    assert cache.info().hits == before + 1 and [t.name for t in k2.inputs] == ["y"]
    np.testing.assert_array_equal(k2(y=a), k(a))


def test_long_sums_keep_float32_precision_and_welford_handles_inf():
    """A long row sums into fresh block accumulators every `decision.inner` iterations (a lane
    never adds 2^21 / 16 values in a row: float32 would drift by ~1e-4 at mean 1e4); Welford's
    shift is 0 for a non-finite first element, so inf rows give numpy's mean and a NaN variance."""
    rng = np.random.default_rng(4)
    a = (1e4 + rng.standard_normal(1 << 21)).astype(np.float32)
    x = pn.placeholder(a.shape, "float32", name="x")
    m, v = pn.compile([pn.mean(x), pn.var(x)], target="cpu", split=1)(a)
    a64 = a.astype(np.float64)
    assert abs(m - a64.mean()) / a64.mean() < 2e-6 and abs(v - a64.var()) / a64.var() < 1e-4
    b = np.array([[1, np.inf, 2], [np.inf, np.inf, np.inf], [-np.inf, 1, 1], [1, 2, np.nan]], np.float32)
    y = pn.placeholder(b.shape, "float32", name="y")
    mean, var = pn.compile([pn.mean(y, axis=1), pn.var(y, axis=1)], target="cpu")(b)
    np.testing.assert_array_equal(mean, [np.inf, np.inf, -np.inf, np.nan])
    assert np.isnan(var).all()
