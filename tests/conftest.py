import threading

import ml_dtypes
import numpy as np
import pytest

import panamera as pn

NP = {"bfloat16": np.dtype(ml_dtypes.bfloat16)}


def np_dtype(name: str) -> np.dtype:
    return NP.get(name, np.dtype(name) if name != "bool" else np.dtype(np.bool_))


def random_array(shape, dtype: str, rng, op: str = "sum") -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) > (0.002 if op == "all" else 0.5)
    if dtype.startswith("int"):
        if op == "prod":
            return np.where(rng.random(shape) < 0.01, -1, 1).astype(dtype)
        return rng.integers(-50, 50, shape).astype(dtype)
    if op == "prod":
        return (1.0 + 0.01 * (rng.random(shape) - 0.5)).astype(np_dtype(dtype))
    return (rng.random(shape) * 2 - 0.7).astype(np_dtype(dtype))


def reference(op: str, a: np.ndarray, axis, keepdims=False):
    """numpy in float64 for float inputs (the exact semantics for the others)."""
    if a.dtype.kind == "f" or a.dtype == np_dtype("bfloat16"):
        return getattr(np, op)(a.astype(np.float64), axis=axis, keepdims=keepdims)
    return getattr(np, op)(a, axis=axis, keepdims=keepdims)


def tolerance(dtype: str, n: int) -> float:
    """Relative/absolute tolerance for a reduction of n values of dtype (accumulated in fp32 for
    16-bit floats; the result itself is rounded to the dtype)."""
    eps = {"float16": 2**-10, "bfloat16": 2**-7, "float32": 2**-23, "float64": 2**-52}.get(dtype, 0.0)
    acc = 2**-23 if dtype in ("float16", "bfloat16") else eps
    return 2 * eps + acc * max(n, 1) ** 0.5 * 8


def softmax_bound(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 reference, per-element bound) of a float32 softmax over the last axis of `a` (u = 2^-24):
    exp within 1.5 ulp of x - m, the row's sum of n terms, the reciprocal and the product, each error
    relative to the result; plus float32's least normal for the results that underflow."""
    u = 2.0**-24
    x = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(-1, keepdims=True))
        ref = e / e.sum(-1, keepdims=True)
        d = np.where(np.isfinite(x), x.max(-1, keepdims=True) - x, 0.0)
    n = a.shape[-1]
    return ref, ((d + 4) * u + (n - 1 + d.max(-1, keepdims=True) + 2) * u + u) * ref + 1.7e-38


def check(k, arrays, ref, dtype, n, orders=("forward", "reverse")):
    outs = []
    for order in orders:
        out = k(*arrays, order=order, seed=7)
        assert out.shape == np.shape(ref)
        tol = tolerance(dtype, n)
        if tol:
            np.testing.assert_allclose(out.astype(np.float64), np.asarray(ref, np.float64), rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(out, ref)
        outs.append(out)
    return outs


def need_nvcc() -> None:
    """Skip the calling test, with the reason, where no nvcc is found (the wheel or a toolkit)."""
    from panamera.errors import BackendError
    from panamera.runtime import nvcc

    try:
        nvcc.find_nvcc()
    except BackendError as e:
        pytest.skip(str(e))


def concurrent_mismatches(call, arrays, wants, equal, repeats: int = 50) -> list[str]:
    """One thread per array calling `call(a)` `repeats` times; "mixed results" for each result
    `equal(got, want)` refuses (a call reading another thread's buffers)."""
    errors = []

    def work(a, want):
        for _ in range(repeats):
            if not equal(call(a), want):
                errors.append("mixed results")

    ts = [threading.Thread(target=work, args=(a, w)) for a, w in zip(arrays, wants)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors


@pytest.fixture
def launches_pay_the_floor(monkeypatch):
    """Plan for an H100 on which every launch pays the per-kernel floor (no queued-launch gap,
    model/kernel_cost.sequence_s). On the real H100 a second kernel queued behind the first costs 0.1 us,
    so the tiny shapes the emulator runs quickly take two launches; tests of a one-launch kernel
    (column partials, column stitches) use this GPU to check that kernel at those shapes."""
    import dataclasses

    from panamera.model import detect
    from panamera.model.gpu import H100

    floored = dataclasses.replace(H100, queued_launch_s=-1.0)
    monkeypatch.setattr(detect, "default_gpu", lambda: (floored, "H100-SXM5 whose every launch pays the floor"))
    return floored


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


__all__ = ["pn"]


# --- Every kernel the suite generates is also compiled by nvcc (sm_80, sm_90), without spills. ---
# Each rendered kernel is recorded (workers inherit the log directory through the environment); at
# the end of the session the unique kernels are compiled in batches, since nvcc spends ~2 s per
# call parsing the CUDA headers. A failure or a spill fails the run. A kernel that compiled without
# spills is remembered under $PANAMERA_CACHE/nvcc-check/, keyed by its text, the prelude and the nvcc
# release (about 0.2 s of CPU a kernel for the two arches; a rerun compiles only the kernels that changed);
# so are the answers of the tests' own nvcc.compile_cuda and nvcc.sass calls, keyed by their arguments.
import functools  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

import panamera.options as _options  # noqa: E402
import panamera.stages as _stages  # noqa: E402  (the kernels stage renders: its lookups are recorded)

_LOG = "PANAMERA_TEST_KERNEL_LOG"
_render, _render_empty = _stages.render_kernel, _stages.render_empty


def _record(kname: str, src: str) -> None:
    log = os.environ.get(_LOG)
    if log:
        body = src.replace(f" {kname}(", " PN_KERNEL_NAME(", 1)
        digest = hashlib.sha1(body.encode()).hexdigest()[:16]
        Path(log, f"{digest}.cu").write_text(body)


def _recording_render(name, *args, **kw):
    rk = _render(name, *args, **kw)
    _record(name, rk.source)
    if rk.init:
        _record(rk.init.name, rk.init.source)
    return rk


def _recording_render_empty(name, *args, **kw):
    init = _render_empty(name, *args, **kw)
    _record(name, init.source)
    return init


_stages.render_kernel = _recording_render
_stages.render_empty = _recording_render_empty


import panamera.dynamic as _dynamic  # noqa: E402  (issue 22: the kernels of symbolic programs, one per size class)

_render_param = _dynamic.render_group


def _recording_render_param(*args, **kw):
    pk = _render_param(*args, **kw)
    _record(pk.name, pk.source)
    return pk


_dynamic.render_group = _recording_render_param

import panamera.dynamic_attention as _dynamic_attention  # noqa: E402  (the symbolic fused attention's kernels)

_render_dyn_attention = _dynamic_attention.render_attention


def _recording_render_dyn_attention(*args, **kw):
    rk = _render_dyn_attention(*args, **kw)
    # the merge kernel, where there is one, is in the same source: both renamed from the main kernel's name
    _record("PN_KERNEL_NAME", rk.source.replace(rk.main, "PN_KERNEL_NAME"))
    return rk


_dynamic_attention.render_attention = _recording_render_dyn_attention

import panamera.segments as _segments  # noqa: E402  (the sorted-segment scatter-add's kernels, one source)

_render_segments = _segments.render_segments


def _recording_render_segments(name, *args, **kw):
    src = _render_segments(name, *args, **kw)
    _record("PN_KERNEL_NAME", src.replace(name, "PN_KERNEL_NAME"))  # pn_k_<digest>_zero, _tile, ...
    return src


_segments.render_segments = _recording_render_segments


@pytest.fixture(autouse=True)
def _auto_is_the_emulator(request, monkeypatch):
    """The default target on host arrays is pinned to the emulator in the suite: without a GPU,
    `target="auto"` (and torch.compile on CPU tensors) means the CPU target (options.host_target),
    but the tests that leave the target to the default check the CUDA source on the emulator, so
    every CUDA kernel stays covered. A test marked `auto_default` sees the real default
    (subprocesses always do)."""
    if request.node.get_closest_marker("auto_default") is None:
        monkeypatch.setattr(_options, "host_target", lambda: _options.Target.EMULATOR)


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A private kernel/probe cache directory ($PANAMERA_CACHE) with the CPU and BLAS probes' in-process
    memos cleared before and after: a test's probe never reads or writes the shared one."""
    from panamera.runtime import cpu_probe, gemm_probe

    monkeypatch.setenv("PANAMERA_CACHE", str(tmp_path / "cache"))
    cpu_probe.rates.cache_clear()
    gemm_probe.rates.cache_clear()
    yield tmp_path / "cache"
    cpu_probe.rates.cache_clear()
    gemm_probe.rates.cache_clear()


@pytest.fixture
def fresh_dynamo():
    """A torch test's clean slate: dynamo's compiled frames and the Panamera backend's stats reset
    before and after (`pytestmark = pytest.mark.usefixtures("fresh_dynamo")` in the torch test files)."""
    import torch

    import panamera.torch_backend as tb

    torch._dynamo.reset()
    tb.reset_stats()
    yield
    torch._dynamo.reset()


def pytest_configure(config):
    config.addinivalue_line("markers", "auto_default: the default target keeps its real meaning (cpu without a GPU)")
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ[_LOG] = tempfile.mkdtemp(prefix="panamera-kernels-")


@functools.cache
def _nvcc_release(path: str) -> str:
    return subprocess.run([path, "--version"], capture_output=True, text=True).stdout


def _nvcc_store() -> Path | None:
    """Where nvcc's answers about unchanged sources are kept: $PANAMERA_CACHE/nvcc-check (None: off)."""
    from panamera.runtime import diskcache

    base = diskcache.location()
    return None if base is None else base / "nvcc-check"


def _keep(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


import panamera.runtime.nvcc as _nvcc  # noqa: E402  (the tests' own nvcc and SASS checks: answers kept)

_compile_cuda, _sass = _nvcc.compile_cuda, _nvcc.sass


def _remembered(call, *args, **kw):
    """`call(*args, **kw)` (nvcc.compile_cuda or nvcc.sass) answered from the store when this nvcc release
    answered the same arguments before; a source nvcc rejects is never kept (it raises every time)."""
    release = _nvcc_release(_nvcc.find_nvcc())  # raises BackendError where there is no nvcc, as the call would
    key = json.dumps([call.__name__, release, _nvcc.ARCHS, args, kw], sort_keys=True)
    store = _nvcc_store()
    path = store / f"{call.__name__}-{hashlib.sha256(key.encode()).hexdigest()[:32]}.json" if store else None
    if path and path.exists():
        data = json.loads(path.read_text())
    else:
        data = call(*args, **kw)
        data = data if isinstance(data, str) else [vars(r) for r in data]
        if path:
            _keep(path, data)
    return data if isinstance(data, str) else [_nvcc.Resources(**r) for r in data]


_nvcc.compile_cuda = functools.partial(_remembered, _compile_cuda)
_nvcc.sass = functools.partial(_remembered, _sass)


_STEM = re.compile(r"(pn_k_[0-9a-f]{16})(_[a-z]+[0-9]*)?$")  # a kernel file may hold several kernels


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("PYTEST_XDIST_WORKER") or not os.environ.get(_LOG):
        return
    from panamera.codegen import islast
    from panamera.codegen.header import PRELUDE
    from panamera.errors import BackendError, PanameraError
    from panamera.runtime import nvcc

    files = sorted(Path(os.environ[_LOG]).glob("*.cu"))
    try:
        nvcc_path = nvcc.find_nvcc()
    except BackendError as e:
        session.config._panamera_nvcc = f"nvcc check skipped: {e}"
        return
    head = "\n".join([PRELUDE, islast.HELPERS])
    store = _nvcc_store()
    salt = hashlib.sha256("\0".join([_nvcc_release(nvcc_path), *nvcc.ARCHS, head]).encode()).hexdigest()
    kernels = {f"pn_k_{f.stem}": f.read_text().replace("PN_KERNEL_NAME", f"pn_k_{f.stem}") for f in files}
    keys = {stem: hashlib.sha256((salt + src).encode()).hexdigest()[:32] for stem, src in kernels.items()}
    results, todo = [], []
    for stem, src in kernels.items():
        known = store / f"{keys[stem]}.json" if store else None
        if known and known.exists():
            results += [nvcc.Resources(**r) for r in json.loads(known.read_text())]
        else:
            todo.append(src)
    batches = [todo[k : k + 150] for k in range(0, len(todo), 150)]

    def compile_batch(batch):
        return _compile_cuda("\n".join([head, *batch]))  # not kept whole: each clean kernel is, below

    def remember(batch_results):
        by_stem = {}
        for r in batch_results:
            m = _STEM.match(r.kernel)
            by_stem.setdefault(m.group(1) if m else None, []).append(r)
        for stem, rs in by_stem.items():
            if store and stem in keys and not any(r.spill_stores or r.spill_loads for r in rs):
                _keep(store / f"{keys[stem]}.json", [vars(r) for r in rs])

    problems = []
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(compile_batch, b) for b in batches]
        for fut in futures:
            try:
                got = fut.result()
            except PanameraError as e:
                problems.append(str(e)[:3000])
                continue
            results += got
            remember(got)
    spills = [r for r in results if r.spill_stores or r.spill_loads]
    problems += [f"spills: {r}" for r in spills]
    names = {m.group(1) for m in map(_STEM.match, (r.kernel for r in results)) if m}
    if not problems and len(names) != len(kernels):
        problems.append(f"nvcc reported {len(names)} of {len(kernels)} kernels")
    fresh, known = len(todo), len(kernels) - len(todo)
    msg = (f"nvcc: {len(kernels)} unique generated kernels compiled for sm_80 and sm_90 ({fresh} now, {known} "
           f"unchanged since they compiled clean), {len(spills)} with spills")  # fmt: skip
    session.config._panamera_nvcc = msg + ("" if not problems else "\nFAILED:\n" + "\n".join(problems))
    if problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    msg = getattr(config, "_panamera_nvcc", None)
    if msg:
        terminalreporter.write_line(msg)
