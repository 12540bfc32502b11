"""The CPU backend: C++ with OpenMP + SIMD (codegen/cpu_kernel.py), built by the system g++
with `-O3 -march=native -fopenmp`, cached on disk beside the emulator's libraries (the same
cache directory, `cpu_<hash>.so`), loaded with ctypes.

Arrays cross without copies: a C-contiguous numpy array (or a torch CPU tensor, viewed through
runtime/arrays.py) is passed by pointer; outputs are fresh numpy arrays returned as the caller's
kind. Without OpenMP support in the compiler the kernels are built without `-fopenmp` (one
thread, a warning says so).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
import warnings
from functools import cache
from pathlib import Path

import numpy as np

from ..errors import OptionError, PanameraWarning
from . import arrays as arrays_mod
from . import cpu_gemm, diskcache, emulator
from .blas_threads import blas_threads
from .cpu_call import FastCall, HostStep, buffer_order, entry_name, segments, simple
from .executor import Executor, _alloc
from .plan import LaunchPlan

log = logging.getLogger("panamera.cpu")
# -fno-trapping-math: no kernel reads the floating-point exception flags, so g++ may if-convert
# selects over float operations (the 16-bit conversions of cuda_emulation.h vectorize).
# -fwrapv: signed integer overflow wraps, as numpy's int32 sums and np.add.at do (without it an
# overflowing int32 sum is undefined behaviour in C++, which g++ may assume never happens). No cost
# measured: 6 kernels (softmax, sums of int32 and float rows and columns, NCHW mean, sorted
# scatter, take), 1 thread, interleaved, medians of 41 rounds within 2% (2026-11-25, load 4).
BASE_FLAGS = (
    "-std=c++20", "-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fwrapv", "-shared", "-fPIC",
    "-DPANAMERA_EMULATOR", "-DPN_CPU_TARGET", "-w",
)  # fmt: skip
_loaded: dict[str, ctypes.CDLL] = {}
_guard = threading.Lock()


def _compiler() -> str:
    return emulator.compiler("target='cpu'")


@cache
def openmp_flags() -> tuple[str, ...]:
    """`("-fopenmp",)` when the compiler builds an OpenMP library, else () with a warning."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "omp.cpp"
        src.write_text('#include <omp.h>\nextern "C" int pn_threads() { return omp_get_max_threads(); }\n')
        r = subprocess.run(
            [_compiler(), "-fopenmp", "-shared", "-fPIC", str(src), "-o", str(Path(tmp) / "omp.so")],
            capture_output=True,
            text=True,
        )
    if r.returncode:
        warnings.warn(
            f"target='cpu': the compiler does not support OpenMP ({r.stderr.strip()[:200]}); kernels run on one thread",
            PanameraWarning,
            stacklevel=3,
        )
        return ()
    return ("-fopenmp",)


# glibc's vector math (libmvec, <= 4 ulp, special values handled as the scalar functions do; float
# exp is EXP_FLUSH's instead):
# declaring the functions `simd` lets `#pragma omp simd` loops call their vector variants
# (glibc's own headers declare them only under -ffast-math, which would also drop NaN semantics).
SIMD_FUNCTIONS = ("exp", "log", "sin", "cos", "tanh", "erf", "pow")
# float exp is inline (vectorizes in any `omp simd` loop: no call, no spills): x = n ln2 + r with
# n = round(x / ln2) (the 1.5 * 2^23 rounding constant, whose low bits are then n) and |r| <= ln2 / 2
# (ln2 split in two, so n ln2 is exact); 2 e^r by a degree-6 polynomial (a least-squares fit of the
# relative error on Chebyshev nodes, 1.7e-8; doubled coefficients, so the scaling is exact), evaluated
# by Estrin's scheme (r^2 and three independent pairs: 4 dependent steps instead of Horner's 6, one
# product more; at most 1.42 ulp over every 7th float of [-86.9, 88.7], where Horner's was 1.04). The loops that
# evaluate it are bound by its chain of dependent operations, not by their count (the core's
# scheduler holds too few iterations of a 45-cycle chain to fill the FMA units): softmax [6144x128],
# 1 thread, kernel alone, CPU time, min of 31 interleaved rounds (AMD EPYC AVX2, 2026-11-25 13:34,
# load 10.6): 685 -> 617 us (Horner's -> Estrin's); times
# 2^(n-1) built in the exponent bits, n + 126 clamped at 0 in integers. Below -125.5 ln2 (x < -86.99,
# results < 1.42 FLT_MIN) n = -126 or less makes 2^(n-1) exactly 0: the result is 0, never subnormal
# (absolute error < 1.7e-38); n = 128 (x up to 88.75) overflows to inf in the last product as expf
# does. One select, at the end (off the chain of dependent operations): |x| > 88.75, where n leaves
# its range and inf - inf would make r NaN, gives inf for a positive x and 0 for a negative one
# (from the sign bit); a NaN fails the compare and propagates through the arithmetic. No subnormal:
# a subnormal result sent libmvec's vector expf to its scalar path, and every later product or sum
# with it takes a microcode assist (~100 cycles); a softmax over masked scores (-100: swin's shifted
# windows) then ran 25x slower in the product after it (128x16 @ 16x32: 59 -> 1470 us). Below 1.5 ulp
# elsewhere (tests/test_cpu_exp_flush.py). Why not libmvec's expf: its call spills every live vector
# register; and each compare-and-select on the chain costs (softmax [6144x128], 1 thread, CPU time,
# interleaved: libmvec 480 us, a two-sided float clamp first 418, one clamp first 398, this ~380).
EXP_FLUSH = (
    "static inline __attribute__((always_inline)) float pn_expf_inline(float x) {\n"
    "  const float t = __builtin_fmaf(x, 1.44269504088896341f, 12582912.0f);  // 1.5 * 2^23 + n\n"
    "  const float n = t - 12582912.0f;\n"
    "  float r = __builtin_fmaf(n, -0.693145751953125f, x);  // ln2's high part: n ln2_hi exact\n"
    "  r = __builtin_fmaf(n, -1.428606765330187e-06f, r);\n"
    "  const float r2 = r * r;  // 2 e^r = (2 + 2r) + r^2 ((c2 + c3 r) + r^2 ((c4 + c5 r) + c6 r^2)): Estrin\n"
    "  const float a = __builtin_fmaf(r, 2.0f, 2.0f);\n"
    "  const float q23 = __builtin_fmaf(3.333284258842468e-01f, r, 9.999998807907104e-01f);\n"
    "  const float q45 = __builtin_fmaf(1.6749527305364609e-02f, r, 8.333545178174973e-02f);\n"
    "  const float p = __builtin_fmaf(__builtin_fmaf(__builtin_fmaf(2.771858125925064e-03f, r2, q45), r2, q23), r2, a);\n"
    "  int k = (int)(__builtin_bit_cast(unsigned, t) - (0x4b400000u - 126u));  // n + 126, in range\n"
    "  k = k < 0 ? 0 : k;\n"
    "  const float e = p * __builtin_bit_cast(float, (unsigned)k << 23);  // 2^(n-1); n <= -126: +0\n"
    "  const unsigned b = __builtin_bit_cast(unsigned, x);\n"
    "  const float big = __builtin_bit_cast(float, ~(unsigned)((int)b >> 31) & 0x7f800000u);  // inf or 0\n"
    "  return __builtin_fabsf(x) > 88.75f ? big : e;\n"
    "}\n"
    "#define expf(x) pn_expf_inline(x)\n"
)
# The exp of an argument known to be <= 0 or NaN (x - max(x): schedule/cpu_exp_range.py decides
# where): EXP_FLUSH's polynomial and scaling, the argument clamped at -104 first (a NaN fails the
# compare and passes; every result below -86.99 is 0 as EXP_FLUSH's), no select at the end: the
# same bits as EXP_FLUSH's on [-104, 0], NaN and -inf. Undefined above 88.75 (never reached there).
EXP_LE0 = (
    "static inline __attribute__((always_inline)) float pn_exp_le0f(float x) {\n"
    "  x = x < -104.0f ? -104.0f : x;\n"
    "  const float t = __builtin_fmaf(x, 1.44269504088896341f, 12582912.0f);\n"
    "  const float n = t - 12582912.0f;\n"
    "  float r = __builtin_fmaf(n, -0.693145751953125f, x);\n"
    "  r = __builtin_fmaf(n, -1.428606765330187e-06f, r);\n"
    "  const float r2 = r * r;\n"
    "  const float a = __builtin_fmaf(r, 2.0f, 2.0f);\n"
    "  const float q23 = __builtin_fmaf(3.333284258842468e-01f, r, 9.999998807907104e-01f);\n"
    "  const float q45 = __builtin_fmaf(1.6749527305364609e-02f, r, 8.333545178174973e-02f);\n"
    "  const float p = __builtin_fmaf(__builtin_fmaf(__builtin_fmaf(2.771858125925064e-03f, r2, q45), r2, q23), r2, a);\n"
    "  int k = (int)(__builtin_bit_cast(unsigned, t) - (0x4b400000u - 126u));\n"
    "  k = k < 0 ? 0 : k;\n"
    "  return p * __builtin_bit_cast(float, (unsigned)k << 23);\n"
    "}\n"
)
# float erf and log inline too, for the same reason (libmvec's calls spill every live vector
# register; GELU-erf epilogues, log_softmax, cross-entropy). Branch-free: both sides computed, one select.
# Polynomials are this project's own least-squares fits (numpy, Chebyshev nodes); bounds measured on
# every positive float against double libm (tests/test_cpu_math_inline.py states them). tanh stays
# libmvec's: an inline 1 - 2 / (e^2|x| + 1) pays a divide and a full exp beside the polynomial side, and a
# GELU-tanh map [512x3072] ran 1.20x slower with it (1 thread, idle, 2026-11-25), where GELU-erf ran 0.84x.
# erf: |x| < 0.875: x + x P(x^2) (degree 6, coefficients fitted one at a time after rounding); else 1 - e^L(|x|), L a degree-8 fit of log erfc on
# [0.875, 4] (|x| clamped at 4, where erf rounds to 1; NaN passes the clamp), sign copied.
# log: x = 2^k m, m in [sqrt(1/2), sqrt(2)) by integer subtraction of sqrt(1/2)'s bits (subnormals
# scaled by 2^23 first), f = m - 1 exact, log1p(f) = f + f^2 Q(f) (degree 8, 6e-9 relative),
# plus k ln2 (ln2 split: k ln2_hi exact). +-0 -> -inf, x < 0 -> NaN, +inf -> inf, NaN -> NaN.
MATH_INLINE = (
    "static inline __attribute__((always_inline)) float pn_erff_inline(float x) {\n"
    "  const float a = __builtin_fabsf(x), x2 = x * x;\n"
    "  float p = 8.43565e-05f;  // erf(a) / a - 1\n"
    "  p = __builtin_fmaf(p, x2, -8.1525696e-04f);\n"
    "  p = __builtin_fmaf(p, x2, 5.201296e-03f);\n"
    "  p = __builtin_fmaf(p, x2, -2.6859183e-02f);\n"
    "  p = __builtin_fmaf(p, x2, 1.1283683e-01f);\n"
    "  p = __builtin_fmaf(p, x2, -3.7612632e-01f);\n"
    "  p = __builtin_fmaf(p, x2, 1.2837917e-01f);\n"
    "  const float small = __builtin_fmaf(a, p, a);  // a + a p: the leading 1 exact\n"
    "  const float c = a > 4.0f ? 4.0f : a;  // NaN > 4 is false: NaN flows on\n"
    "  float l = 1.6054321e-06f;  // log erfc(c)\n"
    "  l = __builtin_fmaf(l, c, -4.5415043e-05f);\n"
    "  l = __builtin_fmaf(l, c, 5.9124536e-04f);\n"
    "  l = __builtin_fmaf(l, c, -4.7328663e-03f);\n"
    "  l = __builtin_fmaf(l, c, 2.634318e-02f);\n"
    "  l = __builtin_fmaf(l, c, -1.0993917e-01f);\n"
    "  l = __builtin_fmaf(l, c, -6.319799e-01f);\n"
    "  l = __builtin_fmaf(l, c, -1.1301409e+00f);\n"
    "  l = __builtin_fmaf(l, c, 2.9666504e-04f);\n"
    "  const float big = 1.0f - pn_expf_inline(l);\n"
    "  return __builtin_copysignf(a < 0.875f ? small : big, x);\n"
    "}\n"
    "static inline __attribute__((always_inline)) float pn_logf_inline(float x) {\n"
    "  const unsigned b0 = __builtin_bit_cast(unsigned, x);\n"
    "  const bool sub = b0 < 0x00800000u;  // +0 and positive subnormals: scaled by 2^23\n"
    "  const unsigned b = __builtin_bit_cast(unsigned, sub ? x * 8388608.0f : x);\n"
    "  const int k = (int)(b - 0x3f3504f3u) >> 23;  // m = x / 2^k in [sqrt(1/2), sqrt(2))\n"
    "  const float f = __builtin_bit_cast(float, b - ((unsigned)k << 23)) - 1.0f;  // exact\n"
    "  const float kf = (float)k - (sub ? 23.0f : 0.0f);\n"
    "  float q = -7.473211e-02f;\n"
    "  q = __builtin_fmaf(q, f, 1.2819512e-01f);\n"
    "  q = __builtin_fmaf(q, f, -1.3261995e-01f);\n"
    "  q = __builtin_fmaf(q, f, 1.4196686e-01f);\n"
    "  q = __builtin_fmaf(q, f, -1.6608596e-01f);\n"
    "  q = __builtin_fmaf(q, f, 2.0001175e-01f);\n"
    "  q = __builtin_fmaf(q, f, -2.5001577e-01f);\n"
    "  q = __builtin_fmaf(q, f, 3.3333337e-01f);\n"
    "  q = __builtin_fmaf(q, f, -4.9999988e-01f);\n"
    "  float r = __builtin_fmaf(kf, 1.428606765330187e-06f, f * f * q);  // ln2's low part\n"
    "  r = __builtin_fmaf(kf, 0.693145751953125f, r + f);  // ln2's high part: k ln2_hi exact\n"
    "  // +-0: -inf; x < 0: NaN; +inf, NaN: x + x. Masks, not selects: three selects on a loop-invariant\n"
    "  // x (log_softmax's log of the row sum) left g++'s `omp simd` loop unvectorized (2.7x slower)\n"
    "  const unsigned sm = 0u - (unsigned)(b0 - 1u >= 0x7f7fffffu);  // +-0, negative, +inf, NaN\n"
    "  const unsigned zm = 0u - (unsigned)(x == 0.0f), nm = 0u - (unsigned)(x < 0.0f);\n"
    "  const unsigned s = (zm & 0xff800000u) | (~zm & ((nm & 0x7fc00000u) | (~nm & __builtin_bit_cast(unsigned, x + x))));\n"
    "  return __builtin_bit_cast(float, (sm & s) | (~sm & __builtin_bit_cast(unsigned, r)));\n"
    "}\n"
    "#define erff(x) pn_erff_inline(x)\n"
    "#define logf(x) pn_logf_inline(x)\n"
)
SIMD_MATH = (
    "#include <cmath>\n#ifdef PN_LIBMVEC\n"
    + "".join(
        f'extern "C" {t} {f}{s}({", ".join([t] * (2 if f == "pow" else 1))}) noexcept __attribute__((__simd__("notinbranch")));\n'
        for f in SIMD_FUNCTIONS
        for t, s in (("double", ""), ("float", "f"))
    )
    + "#endif\n"
    + EXP_FLUSH
    + EXP_LE0
    + MATH_INLINE
)


@cache
def libmvec() -> bool:
    """Whether glibc's libmvec links here."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "mvec.cpp"
        src.write_text('#include <cmath>\nextern "C" float pn_f(float x) { return expf(x); }\n')
        r = subprocess.run(
            [_compiler(), "-shared", "-fPIC", str(src), "-lmvec", "-o", str(Path(tmp) / "m.so")],
            capture_output=True,
            text=True,
        )
    if r.returncode:
        log.info("libmvec not found: transcendental functions stay scalar in SIMD loops")
    return not r.returncode


def flags() -> tuple[str, ...]:
    """The compile flags, then the libraries to link."""
    return BASE_FLAGS + openmp_flags() + (("-DPN_LIBMVEC", "-lmvec") if libmvec() else ())


def _libs(fl: tuple[str, ...]) -> list[str]:
    return [f for f in fl if f.startswith("-l")]  # after the source, where the linker needs them


@cache
def machine_key() -> str:
    """What `-march=native` depends on: the CPU's model and feature flags (a cache directory
    shared between machines never hands one a library built for another's instruction set)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return os.uname().machine
    wanted = ("model name", "flags")
    return "|".join(dict.fromkeys(ln for ln in lines if ln.split(":")[0].strip() in wanted))


def library_path(source: str) -> Path:
    """Where the shared library of `source` lives in the disk cache: one per content, flags, compiler
    (emulator.compiler_identity) and machine."""
    text = source + emulator.headers_text() + " ".join(flags()) + emulator.compiler_identity("target='cpu'")
    text += machine_key()  # every header g++ reads, above
    return emulator.cache_dir() / f"cpu_{hashlib.sha256(text.encode()).hexdigest()[:24]}.so"


def build(source: str) -> ctypes.CDLL:
    """The shared library of `source`, built once per content, flags and machine (kept on disk)."""
    lib = library_path(source)
    with _guard:
        if lib.name in _loaded:
            return _loaded[lib.name]
        _loaded[lib.name] = diskcache.load(lib, lambda: _compile(source, flags()), "target='cpu'")
        cpu_gemm.bind(_loaded[lib.name])  # its gemm kernels call numpy's BLAS (runtime/cpu_gemm.py)
        return _loaded[lib.name]


def _compile(source: str, fl: tuple[str, ...]) -> bytes:
    """The shared library g++ builds from `source` with flags `fl`, as bytes (emulator._compile)."""
    log.info("building a CPU library with %s", " ".join(fl))
    compile_flags = tuple(f for f in fl if not f.startswith("-l"))
    return emulator._compile(source, compile_flags, "cpu", tuple(_libs(fl)))


class CpuExecutor(Executor):
    """Runs the CPU kernels of one program: `kernels` is ((name, parameter buffer keys, host),
    ...) in order, `host` None for a compiled kernel, else the numpy BLAS call that computes it
    (schedule/cpu_blas.py: its operands' keys, then its output's); `threads` the default thread
    count of a call (compiled kernels; numpy's BLAS keeps its own thread pool); `bound` the
    arrays of the inputs the program supplies itself (constant masks, by input position); `blas`:
    some kernel is a gemm on numpy's BLAS (from C or through numpy), run on the call's thread count
    too (runtime/blas_threads.py).

    A program of compiled kernels only runs through its one C entry (runtime/cpu_call.py)."""

    def __init__(
        self, plan: LaunchPlan, source: str, kernels: tuple, threads: int, bound: dict | None = None, blas: bool = False
    ):
        super().__init__(plan, source, (), "cpu")
        self.kernels, self.threads, self.bound, self.blas = kernels, threads, dict(bound or {}), blas
        self._fns: list | None = None
        self._fast: FastCall | None | bool = None  # None: not looked up yet; False: none

    def fast(self) -> FastCall | None:
        """The program's one-entry call path, or None (a numpy BLAS kernel, or results that are
        not whole buffers of their own: runtime/cpu_call.py's `simple`)."""
        if self._fast is None:
            ok = simple(self.plan) and not self.plan.checks  # checks are read by the general path (`_results`)
            if ok:
                self._fast = FastCall(self.plan, self._steps(), self.bound, self.threads, self.blas)
            else:
                self._fast = False
        return self._fast or None

    def _steps(self) -> tuple:
        """The program's C entries (ctypes) and numpy BLAS steps in order (runtime/cpu_call.py)."""
        slot = {k: n for n, k in enumerate(buffer_order(self.plan))}
        lib = build(self.source) if any(host is None for _, _, host in self.kernels) else None
        steps = []
        for seg in segments(self.kernels):
            host = self.kernels[seg[0]][2]
            if host is not None:
                steps.append(HostStep(host, tuple(slot[op.key] for op in host.operands), slot[host.out_key]))
                continue
            fn = getattr(lib, entry_name(self.kernels, seg))
            fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_int), None
            steps.append(fn)
        return tuple(steps)

    def __call__(self, args: list, order: str = "forward", seed: int = 0, threads: int | None = None) -> list:
        args = [
            a if isinstance(a, arrays_mod.Arg) else arrays_mod.adopt(a, t.name) for a, t in zip(args, self.plan.inputs)
        ]
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise OptionError(f"target='cpu': threads must be a positive int, got {threads!r}")
        caller = arrays_mod.caller_of(args)
        hosted = [np.ascontiguousarray(arrays_mod.to_host(a)) for a in args]  # a view when already contiguous
        return arrays_mod.deliver(self.run(hosted, threads or self.threads), caller)

    def _entry_points(self) -> list:
        if self._fns is None:
            lib = build(self.source) if any(host is None for _, _, host in self.kernels) else None
            fns = []
            for name, _, host in self.kernels:
                fn = host
                if host is None:
                    fn = getattr(lib, name)
                    fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_int), None
                fns.append(fn)
            self._fns = fns
        return self._fns

    def run(self, inputs: list[np.ndarray], threads: int) -> list[np.ndarray]:
        """The results on contiguous numpy `inputs` (every input, the program's own included)."""
        fast = self.fast()
        if fast is not None:
            results = [np.empty(shape, dt) for _, shape, dt in fast.outs]
            fast.launch([inputs[k] for k in fast.free], results, threads)
            return results
        if self.blas:
            with blas_threads(threads):
                return self._run_each(inputs, threads)
        return self._run_each(inputs, threads)

    def _run_each(self, inputs: list[np.ndarray], threads: int) -> list[np.ndarray]:
        """`run` kernel by kernel, each buffer allocated for the call (no one-table path)."""
        fns = self._entry_points()
        bufs = {t.key: a for t, a in zip(self.plan.inputs, inputs)}
        for key, spec in self.plan.buffers.items():
            if key not in bufs:
                bufs[key] = _alloc(np.empty, spec)
        for fn, (_, keys, host) in zip(fns, self.kernels):
            if host is not None:
                host.run([bufs[op.key] for op in host.operands], bufs[host.out_key])
                continue
            ptrs = (ctypes.c_void_p * max(1, len(keys)))(*[bufs[k].ctypes.data for k in keys])
            fn(ptrs, int(threads))
        return self._results(bufs, inputs)
