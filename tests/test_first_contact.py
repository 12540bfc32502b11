"""The first-contact GPU faults of issue 10, each caught without a GPU (tests/test_cuda.py checks
them again on one)."""

import ctypes
import re
import sys
import threading
import types

import ml_dtypes
import numpy as np
import pytest

import panamera as pn
from panamera.codegen import header
from panamera.compiler import lower
from panamera.errors import BackendError, CompileError
from panamera.runtime import cuda, emulator, executor, nvcc


def _row_sum(dtype: str, shape=(4, 1024)):
    return pn.compile(pn.sum(pn.placeholder(shape, dtype, name="x"), axis=1), target="emulator")


# -- 1. misaligned inputs --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_offset_views_give_correct_results(dtype, rng):
    np_dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    k = _row_sum(dtype)
    assert k.mappings[0].vec > 1 and k.plan.inputs[0].align == k.mappings[0].vec * np_dt.itemsize
    base = rng.random(4 * 1024 + 16).astype(np_dt)
    for offset in (1, 3, 8):  # x[1:]-style views: the data pointer is off by a few elements
        x = base[offset : offset + 4 * 1024].reshape(4, 1024)
        ref = x.astype(np.float64).sum(1)
        np.testing.assert_allclose(k(x).astype(np.float64), ref, rtol=2e-2 if np_dt.itemsize == 2 else 1e-5)


def test_inputs_are_copied_only_when_a_vector_load_needs_it():
    raw = executor.aligned_empty(64, np.float32)  # 64-byte aligned
    raw[:] = np.arange(64)
    assert executor._host_input(raw[4:], 16).ctypes.data == raw[4:].ctypes.data  # 16-byte aligned: no copy
    copied = executor._host_input(raw[1:], 16)
    assert copied.ctypes.data % 16 == 0 and np.array_equal(copied, raw[1:])
    assert executor._host_input(raw[1:], 4).ctypes.data == raw[1:].ctypes.data  # scalar reads: no copy


def test_a_misaligned_pointer_fails_the_emulated_launch():
    k = _row_sum("float32")
    (ln,) = k.plan.kernels
    lib = emulator.build(k.source, k.signatures)
    x = executor.aligned_empty(4 * 1024 + 4, np.float32)
    x[:] = 1.0
    out = np.zeros(4, np.float32)

    def launch(address):
        args = [ctypes.c_void_p(address), ctypes.c_void_p(out.ctypes.data)]
        emulator.launch(lib, ln.kernel, ln.grid, ln.block, args)

    launch(x.ctypes.data)
    assert out.tolist() == [1024.0] * 4
    with pytest.raises(BackendError, match="misaligned address: a 16-byte vector load"):
        launch(x.ctypes.data + 4)  # straight to the kernel, past the executor's checks
    launch(x.ctypes.data)  # the error does not stick to the library
    assert out.tolist() == [1024.0] * 4


# -- 2. NVRTC headers and errors -------------------------------------------------------------
def test_16bit_headers_only_in_kernels_with_a_16bit_type():
    f32 = _row_sum("float32").source
    assert "cuda_fp16.h" not in f32 and "cuda_bf16.h" not in f32 and "__half" not in f32
    for dt in ("float16", "bfloat16"):
        assert "#include <cuda_fp16.h>" in _row_sum(dt).source
    mixed = lower(pn.sum(pn.placeholder((4, 64), "float32"), axis=1).astype("float16"), target="emulator").source
    assert "#include <cuda_bf16.h>" in mixed  # a float32 input with a float16 result
    try:
        nvcc.find_nvcc()
    except BackendError:
        return
    nvcc.compile_cuda(f32)  # the base prelude stands alone


def test_an_nvrtc_failure_is_a_compile_error_naming_the_line():
    source = 'int a;\nextern "C" __global__ void k(int* p) { p[0] = nope; }\n'
    log = (
        '/tmp/tmpx1y2/kern.cu(2): error: identifier "nope" is undefined\n\n'
        '1 error detected in the compilation of "/tmp/tmpx1y2/kern.cu".'
    )
    err = cuda.compile_error(log, source)
    assert isinstance(err, CompileError)
    assert 'line 2: identifier "nope" is undefined' in str(err) and "p[0] = nope;" in str(err)


def test_cuda_module_raises_compile_error(monkeypatch):
    class FakeCompileException(Exception):
        pass

    class FakeRawModule:
        def __init__(self, code, options):
            self.options = options

        def compile(self):
            raise FakeCompileException('kern.cu(1): error: expected a ";"')

    fake = types.SimpleNamespace(
        RawModule=FakeRawModule,
        cuda=types.SimpleNamespace(
            compiler=types.SimpleNamespace(CompileException=FakeCompileException),
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 1),
            Device=lambda: types.SimpleNamespace(compute_capability="80"),  # the build's target (cuda.build)
        ),
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(CompileError, match='NVRTC .* line 1: expected a ";"'):
        cuda.module("int a\n")


# -- 3. residents per (device, stream) -------------------------------------------------------
def _fake_cupy(stream: int):
    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            Device=lambda: types.SimpleNamespace(id=0),
            get_current_stream=lambda: types.SimpleNamespace(ptr=stream),
        )
    )


def test_two_streams_get_distinct_resident_sets(rng):
    k = pn.compile(pn.sum(pn.placeholder((2, 80000), "float32", name="x"), axis=1), target="emulator")
    assert any(b.role.resident for b in k.plan.buffers.values())
    a = rng.standard_normal((2, 80000)).astype(np.float32)
    k(a)
    assert list(k.resident) == [executor.EMULATOR]  # the emulator path: one resident set
    keys = [executor.current_cuda_key(_fake_cupy(s)) for s in (0x10, 0x20, 0x10)]
    assert keys[0] != keys[1] and keys[0] == keys[2]
    sets = []
    for key in keys:
        bufs, fresh = k.executor._buffers(executor.aligned_empty, [a], key)
        sets.append((fresh, {n: b for n, b in bufs.items() if k.plan.buffers[n].role.resident}))
    assert sets[0][0] and sets[1][0] and not sets[2][0]  # each stream initialises its own once
    for n, b in sets[0][1].items():
        assert b is not sets[1][1][n] and b is sets[2][1][n]


# -- 4. index width from the mapping ---------------------------------------------------------
def test_an_elementwise_op_just_below_2_31_uses_64_bit_indices():
    n = 2**31 - 3
    a = lower(pn.placeholder((n,), "float32", name="x") * 2.0, target="emulator")
    kernel = a.source[a.source.index("pn_k0") :]
    assert "typedef long long pn_idx;" in kernel
    # every literal isl put in the kernel (e.g. 2146467840 + 256*bx + tx) is within the bound
    bound = pn.codegen.kernel.index_bound(a.groups[0], a.mappings[0])
    assert max(int(v) for v in re.findall(r"\b(\d{6,})(?:LL)?\b", kernel)) < bound


def test_a_small_kernel_keeps_int_indices():
    assert "typedef int pn_idx;" in _row_sum("float32").source


# -- 5. two threads, one emulator library ----------------------------------------------------
def test_two_compiled_objects_of_one_source_on_two_threads(rng):
    def build():
        return pn.compile(pn.sum(pn.placeholder((2, 40000), "float32", name="x"), axis=1), target="emulator")

    k1, k2 = build(), build()
    assert k1.source == k2.source and k1.executor is not k2.executor
    a = rng.standard_normal((2, 40000)).astype(np.float32)
    ref = a.astype(np.float64).sum(1)
    errors = []

    def work(k):
        try:
            for _ in range(25):
                np.testing.assert_allclose(k(a), ref, rtol=1e-5, atol=1e-3)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in (k1, k2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# -- 7. compare-and-swap merges seed from a cache-global read --------------------------------
def test_cas_merges_seed_from_ldcg(rng):
    cas = header.PRELUDE[header.PRELUDE.index("pn_atomic_cas(float*") :]
    cas = cas[: cas.index("pn_atomic(OP, T* p")]
    assert "old = *" not in cas and cas.count("old = __ldcg(") == 4
    # every overload merges 256 values from 4 blocks, in a shuffled block and thread order
    src = header.PRELUDE + (
        'extern "C" __global__ void merge(const float* x, float* p, double* d, int* i, long long* l) {\n'
        "  const int t = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "  pn_atomic_cas<pn_op_prod>(p, x[t]); pn_atomic_cas<pn_op_max>(d, (double)x[t]);\n"
        "  pn_atomic_cas<pn_op_max>(i, t); pn_atomic_cas<pn_op_min>(l, -(long long)t);\n}\n"
    )
    lib = emulator.build(src, {"merge": ["const float*", "float*", "double*", "int*", "long long*"]})
    x = (1.0 + 0.01 * rng.standard_normal(256)).astype(np.float32)
    p, d, i, ll = np.ones(1, np.float32), np.full(1, -np.inf), np.full(1, -1, np.int32), np.zeros(1, np.int64)
    args = [ctypes.c_void_p(v.ctypes.data) for v in (x, p, d, i, ll)]
    emulator.launch(lib, "merge", (4, 1, 1), (64, 1, 1), args, order="shuffled", seed=5)
    np.testing.assert_allclose(p[0], x.astype(np.float64).prod(), rtol=1e-5)
    assert d[0] == x.max() and i[0] == 255 and ll[0] == -255


def test_ldcg_of_the_cas_types_runs_on_the_emulator_and_compiles_with_nvcc():
    src = header.PRELUDE + (
        'extern "C" __global__ void probe(unsigned* u, int* i, unsigned long long* q) {\n'
        "  u[1] = __ldcg(u); i[1] = __ldcg(i); q[1] = __ldcg(q);\n}\n"
    )
    lib = emulator.build(src, {"probe": ["unsigned*", "int*", "unsigned long long*"]})
    u, i, q = np.array([7, 0], np.uint32), np.array([-3, 0], np.int32), np.array([2**40, 0], np.uint64)
    emulator.launch(lib, "probe", (1, 1, 1), (1, 1, 1), [ctypes.c_void_p(v.ctypes.data) for v in (u, i, q)])
    assert u[1] == 7 and i[1] == -3 and q[1] == 2**40
    try:
        nvcc.find_nvcc()
    except BackendError:
        return
    nvcc.compile_cuda(src)
