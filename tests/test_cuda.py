"""On a real GPU: the cuda backend against numpy. Skipped where no GPU is present.

Results are compared with numpy under tolerances derived from the dtype and the reduction
length, never bitwise with the emulator: CuPy compiles with -ftz=true and the GPU contracts
multiply-adds (runtime/cuda.py says what that means per dtype). `make gpu-check` runs this file.
"""

import threading

import ml_dtypes
import numpy as np
import pytest
from conftest import tolerance

import panamera as pn
from panamera.runtime import cuda

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no CUDA device (CuPy + GPU) present")

BF16 = np.dtype(ml_dtypes.bfloat16)


def _cp():
    import cupy

    return cupy


def host(a) -> np.ndarray:
    return a.get() if type(a).__module__.startswith("cupy") else np.asarray(a)


def close(out, ref, dtype: str, n: int, scale: float = 1.0) -> None:
    """Relative to the largest reference value (at least 1): within 10x the tolerance of a
    reduction of n values of dtype (tests/conftest.py)."""
    out, ref = host(out).astype(np.float64), np.asarray(ref, np.float64)
    assert out.shape == ref.shape
    err = np.abs(out - ref).max() / max(1.0, np.abs(ref).max())
    assert err <= 10 * scale * tolerance(dtype, n), f"error {err:.3g}"


def counters_are_zero(k) -> bool:
    """Every resident arrival counter (of every stream's resident set) is back at zero."""
    return all(
        int(_cp().count_nonzero(buf)) == 0
        for res in k.resident.values()
        for key, buf in res.items()
        if k.plan.buffers[key].role == "counter"
    )


@pytest.mark.parametrize("shape,axis", [((256, 802816 // 64), 1), ((8192, 256), 0), ((1 << 20,), None)])
def test_cuda_matches_numpy(shape, axis):
    a = np.random.default_rng(0).random(shape).astype(np.float32)
    k = pn.compile(pn.sum(pn.placeholder(shape, "float32", name="x"), axis=axis), target="cuda")
    np.testing.assert_allclose(k(a), a.astype(np.float64).sum(axis=axis), rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_misaligned_device_view(dtype):
    cp = _cp()
    k = pn.compile(pn.sum(pn.placeholder((4, 4096), dtype, name="x"), axis=1), target="cuda")
    assert k.plan.inputs[0].align > np.dtype(dtype).itemsize  # read with vector loads
    base = cp.asarray(np.random.default_rng(1).random(4 * 4096 + 8).astype(dtype))
    for offset in (1, 3):
        x = base[offset : offset + 4 * 4096].reshape(4, 4096)  # data pointer off by 2 or 6 bytes
        close(k(x), host(x).astype(np.float64).sum(1), dtype, 4096)
    cp.cuda.Device().synchronize()  # a misaligned load would be a sticky error here


def test_bf16_max_and_fp16_layer_norm():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((1024, 4096)).astype(BF16)
    k = pn.compile(pn.max(pn.placeholder(a.shape, "bfloat16", name="x"), axis=1), target="cuda")
    np.testing.assert_array_equal(host(k(a)).astype(np.float32), a.astype(np.float32).max(1))  # max is exact
    h = rng.standard_normal((1024, 4096)).astype(np.float16)
    g, b = rng.standard_normal(4096).astype(np.float16), rng.standard_normal(4096).astype(np.float16)
    x = pn.placeholder(h.shape, "float16", name="x")
    G, B = pn.placeholder((4096,), "float16", name="g"), pn.placeholder((4096,), "float16", name="b")
    out = pn.compile(pn.nn.layer_norm(x, G, B), target="cuda")(h, g, b)
    h64 = h.astype(np.float64)
    ref = (h64 - h64.mean(1, keepdims=True)) / np.sqrt(h64.var(1, keepdims=True) + 1e-5) * g + b.astype(np.float64)
    close(out, ref, "float16", 4096)


@pytest.mark.parametrize("op", ["sum", "max", "argmax", "var"])
def test_100_calls_of_a_split_reduction_leave_the_counters_at_zero(op):
    cp = _cp()
    a = np.random.default_rng(3).standard_normal((4, 1 << 18)).astype(np.float32)
    x = pn.placeholder(a.shape, "float32", name="x")
    y = {"sum": pn.sum, "max": pn.max, "argmax": pn.argmax, "var": pn.var}[op](x, axis=1)
    k = pn.compile(y, target="cuda", split=8)
    assert k.mappings[0].split > 1 and any(b.role == "counter" for b in k.plan.buffers.values())
    ref = getattr(a.astype(np.float64), op)(1)
    xd = cp.asarray(a)
    for _ in range(100):
        out = host(k(xd))
        if op == "argmax":
            np.testing.assert_array_equal(out, ref)
        else:
            close(out, ref, "float32", a.shape[1])
        assert counters_are_zero(k)


def test_two_streams_call_one_compiled():
    cp = _cp()
    a = np.random.default_rng(4).standard_normal((8, 1 << 18)).astype(np.float32)
    k = pn.compile(pn.sum(pn.placeholder(a.shape, "float32", name="x"), axis=1), target="cuda", split=16)
    ref = a.astype(np.float64).sum(1)
    xd = cp.asarray(a)
    cp.cuda.Device().synchronize()
    outs, errors = {0: [], 1: []}, []

    def work(t):
        try:
            stream = cp.cuda.Stream(non_blocking=True)
            with stream:
                for _ in range(50):
                    outs[t].append(k(xd))
            stream.synchronize()
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for out in outs[0] + outs[1]:
        close(out, ref, "float32", a.shape[1])
    assert len([key for key in k.resident if key.startswith("cuda:")]) == 2  # one resident set per stream
    assert counters_are_zero(k)


def test_an_elementwise_op_over_2_31_minus_3_floats():
    cp = _cp()
    n = 2**31 - 3
    if cp.cuda.Device().mem_info[0] < 24 * 2**30:
        pytest.skip("needs 24 GiB of free GPU memory")
    k = pn.compile(pn.placeholder((n,), "float32", name="x") * 2.0 + 1.0, target="cuda")
    assert "typedef long long pn_idx;" in k.source
    x = cp.arange(n, dtype=cp.float32)
    y = k(x)
    tail = 1 << 22  # the last 4 Mi elements: where 32-bit indices wrapped (about 6 % were unwritten)
    assert bool((y[-tail:] == x[-tail:] * 2 + 1).all())  # x * 2 is exact: one rounding either way
    step = 4099  # and a sample of the rest
    assert bool((y[::step] == x[::step] * 2 + 1).all())
    del x, y
    cp.get_default_memory_pool().free_all_blocks()


def test_denormal_inputs():
    # float32: flushed to zero (-ftz=true): within (elements) x 2**-126 of numpy, as documented.
    a = np.full((4, 4096), 1e-40, np.float32)
    a[:, ::7] = 3e-39
    for op in ("sum", "max"):
        k = pn.compile(getattr(pn, op)(pn.placeholder(a.shape, "float32", name="x"), axis=1), target="cuda")
        ref = getattr(a.astype(np.float64), op)(1)
        np.testing.assert_allclose(host(k(a)), ref, rtol=0, atol=a.shape[1] * 2.0**-126)
    # float16: every float16 denormal is a normal float32 register value: nothing is flushed.
    h = np.full((4, 4096), 6e-8, np.float16)
    k = pn.compile(pn.sum(pn.placeholder(h.shape, "float16", name="x"), axis=1), target="cuda")
    np.testing.assert_allclose(host(k(h)).astype(np.float64), h.astype(np.float64).sum(1), rtol=2**-9)


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _normalize(a, axes, eps):
    return (a - a.mean(axes, keepdims=True)) / np.sqrt(a.var(axes, keepdims=True) + eps)


@pytest.mark.parametrize(
    "name",
    ["softmax", "log_softmax", "logsumexp", "layer_norm", "rms_norm", "l2_normalize", "var", "std",
     "batch_norm", "instance_norm", "group_norm", "cross_entropy"],
)  # fmt: skip
def test_every_nn_op_at_a_real_size(name):
    rng = np.random.default_rng(5)
    rows = (2048, 4096)
    a = rng.standard_normal(rows).astype(np.float32)
    g, b = rng.standard_normal(rows[1]).astype(np.float32), rng.standard_normal(rows[1]).astype(np.float32)
    a64, g64, b64 = a.astype(np.float64), g.astype(np.float64), b.astype(np.float64)
    x = pn.placeholder(rows, "float32", name="x")
    G, B = pn.placeholder(g.shape, "float32", name="g"), pn.placeholder(b.shape, "float32", name="b")
    n = rows[1]
    if name in ("batch_norm", "instance_norm", "group_norm"):
        img = rng.standard_normal((32, 64, 28, 28)).astype(np.float32)
        c = rng.random(64).astype(np.float32)
        i64, c64 = img.astype(np.float64), c.astype(np.float64)[:, None, None]
        x = pn.placeholder(img.shape, "float32", name="x")
        C, D = pn.placeholder((64,), "float32", name="g"), pn.placeholder((64,), "float32", name="b")
        y, ref, n = {
            "batch_norm": (pn.nn.batch_norm(x, C, D)[0], _normalize(i64, (0, 2, 3), 1e-5) * c64 + c64, 32 * 28 * 28),
            "instance_norm": (pn.nn.instance_norm(x, C, D), _normalize(i64, (2, 3), 1e-5) * c64 + c64, 28 * 28),
            "group_norm": (
                pn.nn.group_norm(x, 8, C, D),
                _normalize(i64.reshape(32, 8, -1), -1, 1e-5).reshape(img.shape) * c64 + c64,
                8 * 28 * 28,
            ),
        }[name]
        close(pn.compile(y, target="cuda")(img, c, c), ref, "float32", n)
        return
    if name == "cross_entropy":
        t = rng.integers(0, n, rows[0]).astype(np.int32)
        y = pn.nn.cross_entropy(x, pn.placeholder((rows[0],), "int32", name="t"), reduction="none")
        lse = np.log(np.exp(a64 - a64.max(1, keepdims=True)).sum(1)) + a64.max(1)
        close(pn.compile(y, target="cuda")(a, t), lse - a64[np.arange(rows[0]), t], "float32", n, scale=4)
        return
    y, ins, ref = {
        "softmax": (pn.nn.softmax(x), [a], _softmax(a64)),
        "log_softmax": (pn.nn.log_softmax(x), [a], np.log(_softmax(a64))),
        "logsumexp": (pn.nn.logsumexp(x), [a], np.log(np.exp(a64).sum(-1))),
        "layer_norm": (pn.nn.layer_norm(x, G, B), [a, g, b], _normalize(a64, -1, 1e-5) * g64 + b64),
        "rms_norm": (pn.nn.rms_norm(x, G), [a, g], a64 / np.sqrt((a64**2).mean(-1, keepdims=True) + 1e-6) * g64),
        "l2_normalize": (pn.nn.l2_normalize(x), [a], a64 / np.sqrt((a64**2).sum(-1, keepdims=True))),
        "var": (pn.var(x, axis=1), [a], a64.var(1)),
        "std": (pn.std(x, axis=-1), [a], a64.std(-1)),
    }[name]
    close(pn.compile(y, target="cuda")(*ins), ref, "float32", n, scale=4 if "log" in name else 1)


def test_torch_cuda_tensors_on_torchs_current_stream():
    """torch CUDA tensors in (DLPack, zero-copy), torch CUDA tensors out, the work ordered on
    torch's current stream: the resident workspaces are that stream's."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA build here")
    k = pn.compile(pn.sum(pn.placeholder((2, 80000), "float32", name="x"), axis=1), target="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.rand(2, 80000, device="cuda")
        out = k(t)
        out2 = k(t)
    side.synchronize()
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.dtype == torch.float32
    close(out.cpu().numpy(), t.cpu().double().sum(1).numpy(), "float32", 80000)
    close(out2.cpu().numpy(), t.cpu().double().sum(1).numpy(), "float32", 80000)
    key = f"cuda:{torch.cuda.current_device()}:stream:{side.cuda_stream:#x}"
    assert key in k.resident and counters_are_zero(k)


@pytest.mark.parametrize("shape", [(1, 131072), (8, 128256)])
def test_split_stitched_rows_run_cooperatively(shape):
    """Few long rows: one cooperative launch whose blocks exchange partials (tests/
    test_stitched_split.py checks the protocol on the emulator); repeated calls leave the
    counters at zero."""
    a = (np.random.default_rng(0).standard_normal(shape) * 3).astype(np.float32)
    # planned for the A100, which has no clusters: on an sm_90 device the model's own plan is a
    # thread-block cluster (panamera/gpucheck_paths.py runs that one)
    k = pn.compile(pn.nn.softmax(pn.placeholder(shape, "float32", name="x")), target="cuda", gpu="a100")
    assert any(ln.cooperative for ln in k.plan.per_call), k.explain()
    e = np.exp(a.astype(np.float64) - a.max(1, keepdims=True))
    ref = e / e.sum(1, keepdims=True)
    for _ in range(5):
        out = host(k(a))
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * ref.max())
        assert counters_are_zero(k)


def wgmma_contraction(target: str, gpu, dtype: str = "float16"):
    """x @ w.T (M 20, N 40, K 100: tails on every axis) of fp16 (f32 accumulators) or int8 (the int32
    sum: s8 MMAs, s32 accumulators) with its contraction on the first warpgroup-MMA candidate for
    `gpu`, compiled for `target`: (kernel, X, W, reference: float64, or int64 for int8)."""
    import dataclasses

    from panamera.schedule.tc_tiling import candidates
    from panamera.schedule.tensor_core import analyse
    from panamera.schedule.warpgroup import MmaOp

    m, n, kk = 20, 40, 100
    x, w = pn.placeholder((m, kk), dtype, name="x"), pn.placeholder((n, kk), dtype, name="w")
    y = x @ w.T if dtype != "int8" else pn.matmul(x, w.T).inputs[0]
    kw = dict(target=target, gpu=gpu, use_database=False, cache=False)
    base = pn.compile(y, **kw)
    g = base.groups[0]
    d = next(d for d in candidates(g, analyse(g), gpu, None, False) if d.mma_op == MmaOp.WGMMA)
    k = pn.compile(y, schedule=dataclasses.replace(base.schedule, kernels=(d,)), **kw)
    assert "pn_wgmma<" in k.source and "mma_sync" not in k.source
    rng = np.random.default_rng(0)
    if dtype == "int8":
        X, W = rng.integers(-128, 128, (m, kk), dtype=np.int8), rng.integers(-128, 128, (n, kk), dtype=np.int8)
        return k, X, W, X.astype(np.int64) @ W.astype(np.int64).T
    X, W = rng.standard_normal((m, kk)).astype(np.float16), rng.standard_normal((n, kk)).astype(np.float16)
    return k, X, W, X.astype(np.float64) @ W.astype(np.float64).T


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_a_wgmma_contraction_on_sm90(dtype):
    """On an sm_90 device (H100, H200): warpgroup MMAs compiled for sm_90a (runtime/cuda.build)
    against numpy (int8 x int8 on s8 MMAs: exact); the emulator checks the same kernels everywhere
    else (tests/test_wgmma.py)."""
    from panamera.model import detect

    props = _cp().cuda.runtime.getDeviceProperties(0)
    if (props["major"], props["minor"]) != (9, 0):
        pytest.skip("warpgroup MMAs exist on sm_90 devices only")
    gpu = detect.detect()
    if gpu is None or not gpu.warpgroup_mma:
        pytest.fail("an sm_90 device whose NVRTC or driver cannot build sm_90a (detect.arch_specific_ok)")
    k, X, W, ref = wgmma_contraction("cuda", gpu, dtype)
    if dtype == "int8":
        assert np.array_equal(host(k(X, W)), ref)
    else:
        close(k(X, W), ref, "float16", X.shape[1])
