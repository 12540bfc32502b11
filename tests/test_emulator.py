"""The emulator: every intrinsic the codegen may emit, 16-bit conversions, barrier checking."""

import ctypes

import ml_dtypes
import numpy as np
import pytest

from panamera.codegen.header import INTRINSICS, PRELUDE
from panamera.errors import BackendError
from panamera.runtime import emulator, nvcc

PROBE = r"""
extern "C" __global__ void probe(float* f, double* d, int* i, long long* l, unsigned* u, unsigned long long* q) {
  __shared__ float s[64];
  const int t = threadIdx.x;
  s[t] = (float)t;
  __syncthreads();
  float v = s[63 - t];
  v = __shfl_down_sync(0xffffffffu, v, 1);
  v += 0.0f * __shfl_xor_sync(0xffffffffu, v, 1);
  v += 0.0f * __shfl_sync(0xffffffffu, v, 0);
  __threadfence();
  atomicAdd(&f[0], 1.0f); atomicAdd(&d[0], 1.0); atomicAdd(&i[0], 1); atomicAdd(&q[0], 1ull);
  atomicMax(&i[1], t); atomicMin(&i[2], t); atomicAnd(&i[3], ~(1 << (t % 31))); atomicOr(&i[4], 1 << (t % 31));
  atomicMax(&l[0], (long long)t); atomicMin(&l[1], (long long)t);
  atomicCAS(&u[0], 0u, 7u);
  __nanosleep(8);
  pn_grid_wait(&u[0], 0u);  // reached already: returns at once (a launch that is not cooperative)
  if (t == 0) {
    f[1] = __half2float(__float2half_rn(1.0009765625f)) + __bfloat162float(__float2bfloat16_rn(3.0f));
    f[2] = __half2float(__ushort_as_half((unsigned short)0x3c00)) + __bfloat162float(__ushort_as_bfloat16((unsigned short)0x4000));
    f[3] = __uint_as_float(__float_as_uint(2.5f)) + __int_as_float(__float_as_int(0.f)) + (float)__longlong_as_double(__double_as_longlong(1.0));
    f[4] = expf(0.f) + logf(1.f) + sqrtf(4.f) + rsqrtf(4.f) + fabsf(-1.f);
    d[1] = exp(0.0) + log(1.0) + sqrt(4.0) + rsqrt(4.0) + fabs(-1.0);
    f[7] = tanhf(0.f) + erff(0.f) + floorf(1.5f) + ceilf(0.5f) + powf(2.f, 3.f);
    d[2] = tanh(0.0) + erf(0.0) + floor(1.5) + ceil(0.5) + pow(2.0, 3.0);
    f[8] = sinf(0.f) + cosf(0.f) + fmodf(-5.f, 3.f);
    d[3] = sin(0.0) + cos(0.0) + fmod(-5.0, 3.0);
    {  // the int4 dequantization's paired ops: (1029, 1024) - 1025 = (4, -1), * 0.5; (143, 128) - 136 = (7, -8), * 2
      const __half2 a = __hmul2(__hsub2(__halves2half2(__ushort_as_half((unsigned short)0x6405), __ushort_as_half((unsigned short)0x6400)), __half2half2(__ushort_as_half((unsigned short)0x6401))), __half2half2(__float2half_rn(0.5f)));
      const __nv_bfloat162 b = __hmul2(__hsub2(__halves2bfloat162(__ushort_as_bfloat16((unsigned short)0x430f), __ushort_as_bfloat16((unsigned short)0x4300)), __bfloat162bfloat162(__ushort_as_bfloat16((unsigned short)0x4308))), __bfloat162bfloat162(__float2bfloat16_rn(2.0f)));
      f[9] = __half2float(__low2half(a)) + __half2float(__high2half(a)) + __bfloat162float(__low2bfloat16(b)) + __bfloat162float(__high2bfloat16(b));
    }
    f[5] = __ldcg(&f[1]);
    f[6] = v;
  }
}
"""


def test_every_intrinsic_runs_on_the_emulator_and_compiles_with_nvcc():
    for name in INTRINSICS:
        assert name in PROBE, f"intrinsic {name} is not exercised by the probe kernel"
    src = PRELUDE + PROBE
    lib = emulator.build(
        src, {"probe": ["float*", "double*", "int*", "long long*", "unsigned*", "unsigned long long*"]}
    )
    f, d = np.zeros(10, np.float32), np.zeros(4)
    i = np.array([0, -1, 99, -1, 0], np.int32)
    ll, u, q = np.array([-5, 99], np.int64), np.zeros(1, np.uint32), np.zeros(1, np.uint64)
    args = [ctypes.c_void_p(a.ctypes.data) for a in (f, d, i, ll, u, q)]
    emulator.launch(lib, "probe", (2, 1, 1), (64, 1, 1), args, "reverse")
    assert f[0] == 128 and d[0] == 128 and i[0] == 128 and q[0] == 128
    assert i[1] == 63 and i[2] == 0 and i[3] == -(2**31) and i[4] == 0x7FFFFFFF
    assert ll[0] == 63 and ll[1] == 0 and u[0] == 7
    assert f[1] == 1.0009765625 + 3.0 and f[2] == 3.0 and f[3] == 3.5
    assert f[4] == 1 + 0 + 2 + 0.5 + 1 and d[1] == 4.5 and f[5] == f[1]
    assert f[6] == 62.0  # thread 0 reads lane 1's value s[63 - 1]
    assert f[7] == 10.0 and d[2] == 10.0
    assert f[9] == 2.0 - 0.5 + 14.0 - 16.0
    assert f[8] == -1.0 and d[3] == -1.0  # sin 0 + cos 0 + fmod(-5, 3) (the dividend's sign)
    try:
        nvcc.find_nvcc()
    except BackendError:
        return
    nvcc.compile_cuda(src)


def test_half_and_bfloat16_rounding_match_numpy():
    vals = np.array(
        [0.0, -0.0, 1.0, 1.0 + 2**-11, 65504.0, 65519.0, 1e-7, 6e-8, 3e-5, -2.5, np.inf, np.nan], np.float32
    )
    src = (
        PRELUDE
        + r"""
extern "C" __global__ void conv(const float* x, float* h, float* b, int n) {
  for (int k = threadIdx.x; k < n; k += blockDim.x) {
    h[k] = __half2float(__float2half_rn(x[k]));
    b[k] = __bfloat162float(__float2bfloat16_rn(x[k]));
  }
}"""
    )
    lib = emulator.build(src, {"conv": ["const float*", "float*", "float*", "int"]})
    h, b = np.zeros_like(vals), np.zeros_like(vals)
    emulator.launch(
        lib,
        "conv",
        (1, 1, 1),
        (32, 1, 1),
        [
            ctypes.c_void_p(vals.ctypes.data),
            ctypes.c_void_p(h.ctypes.data),
            ctypes.c_void_p(b.ctypes.data),
            ctypes.c_int(len(vals)),
        ],
    )
    np.testing.assert_array_equal(h, vals.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(b, vals.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_divergent_warp_collective_is_reported_not_hung():
    # Half the lanes of a warp shuffle with a full mask: undefined on a GPU, a deadlock here.
    src = (
        PRELUDE
        + r"""
extern "C" __global__ void bad(int* p) { if (threadIdx.x < 16) p[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1); }
"""
    )
    lib = emulator.build(src, {"bad": ["int*"]})
    a = np.zeros(32, np.int32)
    with pytest.raises(BackendError, match="deadlock"):
        emulator.launch(lib, "bad", (1, 1, 1), (32, 1, 1), [ctypes.c_void_p(a.ctypes.data)])


def test_missing_barrier_shows_up_under_another_thread_order():
    src = (
        PRELUDE
        + r"""
extern "C" __global__ void racy(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = threadIdx.x;
  /* no __syncthreads() here */
  out[threadIdx.x] = s[63 - threadIdx.x];
}"""
    )
    lib = emulator.build(src, {"racy": ["int*"]})
    results = []
    for order in ("forward", "reverse"):
        a = np.full(64, -1, np.int32)
        emulator.launch(lib, "racy", (1, 1, 1), (64, 1, 1), [ctypes.c_void_p(a.ctypes.data)], order)
        results.append(a.copy())
    assert not np.array_equal(results[0], results[1])
