"""The BLAS numpy links, called from the CPU target's C: no return to Python for a contraction.

numpy's wheels bundle OpenBLAS (`scipy-openblas`: symbols prefixed `scipy_` and, in the 64-bit
integer build, suffixed `64_`); other builds link a system OpenBLAS (`cblas_sgemm`). `blas()`
finds the library numpy has loaded (threadpoolctl lists it: runtime/blas_threads.py) and its CBLAS `sgemm` /
`dgemm`, with their integer width; the C helpers below (`GEMM_SOURCE`, in a program's source
where a kernel is a gemm: codegen/cpu_host_kernels.py's `host_blas`) call them through pointers that
`bind` writes once per loaded library. Where none is found (another BLAS, no /proc), `blas()` is
None and contractions stay numpy calls between the C entries (runtime/cpu_call.py's HostStep).

Thread count: the gemm runs on the BLAS's own pool, sized as numpy's (OPENBLAS_NUM_THREADS);
`threads=` sets the generated kernels' OpenMP threads only.

>>> b = blas()
>>> b is None or (b.sgemm != 0 and b.dgemm != 0)
True
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache

import numpy as np  # noqa: F401  (loads the BLAS this module looks for)

from .blas_threads import loaded_blas

# (single, double, 64-bit integers): the CBLAS gemm symbols, best first.
SYMBOLS = (
    ("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", True),
    ("cblas_sgemm64_", "cblas_dgemm64_", True),
    ("scipy_cblas_sgemm", "scipy_cblas_dgemm", False),
    ("cblas_sgemm", "cblas_dgemm", False),
)

# The C side: function pointers set by `bind`, and `pn_gemm<T>(...)` = a `Gemm`'s calls
# (schedule/cpu_gemm.py; `t`: (A, B, C offset, beta) per call) in row-major CBLAS
# (101 = CblasRowMajor, 111 / 112 = No / Trans).
GEMM_SOURCE = """
static void* pn_gemm_fn[2] = {nullptr, nullptr};
static int pn_gemm_ilp64 = 0;
extern "C" void pn_set_gemm(void* s, void* d, int ilp64) { pn_gemm_fn[0] = s; pn_gemm_fn[1] = d; pn_gemm_ilp64 = ilp64; }
template <class T, class I> static inline void pn_gemm_as(int ta, int tb, long long m, long long n, long long k,
    const T* a, long long lda, const T* b, long long ldb, T* c, long long ldc, int count, const long long* t) {
  typedef void (*F)(int, int, int, I, I, I, T, const T*, I, const T*, I, T, T*, I);
  F f = (F)pn_gemm_fn[sizeof(T) == 8];
  for (int i = 0; i < count; ++i, t += 4)
    f(101, ta ? 112 : 111, tb ? 112 : 111, (I)m, (I)n, (I)k, (T)1, a + t[0], (I)lda, b + t[1], (I)ldb, (T)t[3],
      c + t[2], (I)ldc);
}
template <class T> static inline void pn_gemm(int ta, int tb, long long m, long long n, long long k, const T* a,
    long long lda, const T* b, long long ldb, T* c, long long ldc, int count, const long long* t) {
  if (pn_gemm_ilp64) pn_gemm_as<T, long long>(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, count, t);
  else pn_gemm_as<T, int>(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, count, t);
}
"""
SETTER = "pn_set_gemm"


@dataclass(frozen=True)
class Blas:
    """The loaded BLAS: its path and the addresses of its CBLAS sgemm and dgemm."""

    path: str
    sgemm: int
    dgemm: int
    ilp64: bool


def _int64_build(lib: ctypes.CDLL) -> bool:
    """Whether an OpenBLAS says it was built with 64-bit integers (its unsuffixed CBLAS symbols then
    take 64-bit sizes, which the 32-bit calls would misread)."""
    for name in ("openblas_get_config", "scipy_openblas_get_config", "scipy_openblas_get_config64_"):
        f = getattr(lib, name, None)
        if f is not None:
            f.restype = ctypes.c_char_p
            return b"USE64BITINT" in (f() or b"")
    return False


@cache
def blas() -> Blas | None:
    """The CBLAS gemm functions of the BLAS numpy loaded, or None where none is found."""
    for path in dict.fromkeys(lib.filepath for lib in loaded_blas()):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for s, d, ilp64 in SYMBOLS:
            fs, fd = getattr(lib, s, None), getattr(lib, d, None)
            if fs is not None and fd is not None and (ilp64 or not _int64_build(lib)):
                addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
                return Blas(path, addr(fs), addr(fd), ilp64)
    return None


def bind(lib: ctypes.CDLL) -> None:
    """Point a loaded program library's gemm helpers at the BLAS (where its source has them)."""
    setter = getattr(lib, SETTER, None)
    b = blas()
    if setter is not None and b is not None:
        setter.argtypes, setter.restype = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int), None
        setter(b.sgemm, b.dgemm, int(b.ilp64))
