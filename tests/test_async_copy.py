"""Asynchronous copies (cuda_pipeline.h) on the emulator: lazy, so a missing wait is caught.

Issue 13, item 3 (ALCOP pipelining), its emulator part: `__pipeline_memcpy_async` reads its
source at the copy but writes shared memory only at the `__pipeline_wait_prior` that covers its
batch (runtime/cuda_emulation.h), so a kernel that reads a stage before waiting for it reads
stale data, as it may on a GPU. The kernel here is written by hand (the codegen does not emit a
pipeline yet): a block sums its row through an S-stage pipeline of 512-float tiles, each thread
copying 16 bytes per tile and reading another thread's (so the barrier matters too). Reference:
numpy float64, bound gamma_n sum |x| for n float32 additions (Higham 3.1).
"""

import ctypes
import re

import numpy as np
import pytest

from panamera.codegen.header import PRELUDE
from panamera.errors import BackendError
from panamera.runtime import emulator, nvcc

PIPE = r"""
#ifndef PANAMERA_EMULATOR
#include <cuda_pipeline.h>
#endif
template <int S, bool WAIT>
__device__ __forceinline__ void pipe_sum(const float* x, float* out, int tiles) {
  __shared__ __align__(16) float buf[S][512];
  const int t = threadIdx.x;
  const float* row = x + (long long)blockIdx.x * tiles * 512;
  float acc = 0.f;
  for (int s = 0; s < S - 1; ++s) {  // prologue: S - 1 tiles in flight
    if (s < tiles) __pipeline_memcpy_async(&buf[s][t * 4], &row[s * 512 + t * 4], 16);
    __pipeline_commit();
  }
  for (int k = 0; k < tiles; ++k) {
    const int next = k + S - 1;  // into the stage read one step ago (freed by its barrier)
    if (next < tiles) __pipeline_memcpy_async(&buf[next % S][t * 4], &row[next * 512 + t * 4], 16);
    __pipeline_commit();
    if (WAIT) __pipeline_wait_prior(S - 1);  // tile k has landed; S - 1 younger ones in flight
    __syncthreads();
    for (int v = 0; v < 4; ++v) acc += buf[k % S][((t + 1) % 128) * 4 + v];
    __syncthreads();
  }
  atomicAdd(&out[blockIdx.x], acc);
}
extern "C" __global__ void staged1(const float* x, float* out, int tiles) { pipe_sum<1, true>(x, out, tiles); }
extern "C" __global__ void staged2(const float* x, float* out, int tiles) { pipe_sum<2, true>(x, out, tiles); }
extern "C" __global__ void staged4(const float* x, float* out, int tiles) { pipe_sum<4, true>(x, out, tiles); }
extern "C" __global__ void nowait(const float* x, float* out, int tiles) { pipe_sum<2, false>(x, out, tiles); }
"""
SIGS = {k: ["const float*", "float*", "int"] for k in ("staged1", "staged2", "staged4", "nowait")}


def _run(kernel, X, order="forward"):
    lib = emulator.build(PRELUDE + PIPE, SIGS)
    out = np.zeros(X.shape[0], np.float32)
    args = [ctypes.c_void_p(X.ctypes.data), ctypes.c_void_p(out.ctypes.data), ctypes.c_int(X.shape[1] // 512)]
    emulator.launch(lib, kernel, (X.shape[0], 1, 1), (128, 1, 1), args, order)
    return out


def _rows(rng, blocks=3, tiles=7):
    return rng.standard_normal((blocks, tiles * 512)).astype(np.float32)


def _bound(X):
    n = X.shape[1]
    u = 2.0**-24
    return n * u / (1 - n * u) * np.abs(X.astype(np.float64)).sum(axis=1)


@pytest.mark.parametrize("stages", [1, 2, 4])
@pytest.mark.parametrize("order", ["forward", "shuffled"])
def test_pipelined_sum_matches_numpy(stages, order, rng):
    X = _rows(rng)
    out = _run(f"staged{stages}", X, order)
    assert (np.abs(out - X.astype(np.float64).sum(axis=1)) <= _bound(X)).all()


def test_a_missing_wait_is_a_wrong_result(rng):
    """Without __pipeline_wait_prior the tiles never land: the emulator reads stale shared memory."""
    X = _rows(rng) + 1.0  # every element counts
    out = _run("nowait", X)
    assert not (np.abs(out - X.astype(np.float64).sum(axis=1)) <= _bound(X)).any()


def test_the_sm90_sass_copies_global_to_shared_asynchronously():
    try:
        text = nvcc.sass(PRELUDE + PIPE, "staged2")
    except BackendError as e:
        pytest.skip(str(e))
    assert re.search(r"LDGSTS", text)  # the copy bypasses registers (sm_80+)
