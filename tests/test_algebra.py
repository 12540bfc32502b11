"""The reduction algebra is defined once: the numpy definition in algebra.py against the C++ that
codegen/header.py generates from it, run on the emulator, for every combiner and dtype.

Per combiner and accumulator dtype one kernel computes `apply(a[i], b[i])`, the identity, and
merges every a[i] into one word with `pn_atomic` (the native atomic or the CAS loop the combiner's
`atomic()` names); struct accumulators check lift (the converting constructor), two merges and
the identity. The numpy folds are checked against each combiner's `reference` too.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import pytest

from panamera import algebra, dtypes
from panamera.algebra import COMBINERS, AtomicStrategy
from panamera.codegen.header import PRELUDE
from panamera.runtime import emulator

N = 256
SCALAR_DTYPES = {
    "sum": ("float32", "float64", "int32", "int64"),
    "prod": ("float32", "float64", "int32", "int64"),
    "max": ("float32", "float64", "int32", "int64"),
    "min": ("float32", "float64", "int32", "int64"),
    "all": ("int32",),
    "any": ("int32",),
}
STRUCTS = {"welford": (dtypes.welford32, dtypes.welford64), "online_lse": (dtypes.lse32, dtypes.lse64)}
SCALAR_CASES = [(c, d) for c, ds in SCALAR_DTYPES.items() for d in ds]
STRUCT_CASES = [(c, d.name) for c, ds in STRUCTS.items() for d in ds]


def _struct_dtype(name: str) -> dtypes.DType:
    return next(d for ds in STRUCTS.values() for d in ds if d.name == name)


def _scalar_kernel(comb: algebra.Combiner, d: dtypes.DType) -> tuple[str, tuple[str, ...], str]:
    name, t, op = f"k_{comb.name}_{d.name}", d.compute, comb.functor
    src = f"""
__global__ void {name}(const {t}* a, const {t}* b, {t}* out, {t}* ident, {t}* atom, int n) {{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {{
    out[i] = {op}::apply(a[i], b[i]);
    pn_atomic({op}(), atom, a[i]);
  }}
  if (i == 0) ident[0] = {op}::template identity<{t}>();
}}"""
    return name, (f"const {t}*", f"const {t}*", f"{t}*", f"{t}*", f"{t}*", "int"), src


def _struct_kernel(comb: algebra.Combiner, d: dtypes.DType) -> tuple[str, tuple[str, ...], str]:
    name, w, f, op = f"k_{comb.name}_{d.name}", d.compute, d.field.compute, comb.functor
    src = f"""
__global__ void {name}(const {f}* x, const {f}* y, const {f}* z, {w}* out, {w}* ident, int n) {{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = {op}::apply({op}::apply({w}(x[i]), {w}(y[i])), {op}::apply({op}::template identity<{w}>(), {w}(z[i])));
  if (i == 0) ident[0] = {op}::template identity<{w}>();
}}"""
    return name, (f"const {f}*", f"const {f}*", f"const {f}*", f"{w}*", f"{w}*", "int"), src


@functools.cache
def _library():
    """One emulator build holding every test kernel."""
    kernels = [_scalar_kernel(COMBINERS[c], dtypes.as_dtype(d)) for c, d in SCALAR_CASES]
    kernels += [_struct_kernel(COMBINERS[c], _struct_dtype(d)) for c, d in STRUCT_CASES]
    source = PRELUDE + "".join(src for _, _, src in kernels)
    return emulator.build(source, {name: sig for name, sig, _ in kernels})


def _launch(name: str, *arrays, n: int = N) -> None:
    args = [ctypes.c_void_p(a.ctypes.data) for a in arrays] + [ctypes.c_int(n)]
    emulator.launch(_library(), name, (2, 1, 1), (N // 2, 1, 1), args, order="shuffled", seed=3)


def _operands(comb: algebra.Combiner, d: dtypes.DType, rng) -> np.ndarray:
    if comb.truthiness:
        return (rng.random(N) < 0.9).astype(d.np)
    if d.is_float:
        x = rng.uniform(0.9, 1.1, N) if comb.name == "prod" else rng.standard_normal(N) * 100
        x = x.astype(d.np)
        if comb.name in ("max", "min"):
            x[rng.integers(0, N, 3)] = np.nan  # NaN propagates, as numpy's max/min
        return x
    if comb.name == "prod":  # a product of N values that fits in 31 bits: signs and ten 2s
        x = rng.choice(np.array([-1, 1], d.np), N)
        x[rng.choice(N, 10, replace=False)] = 2
        return x
    info = np.iinfo(d.np)
    return rng.integers(info.min // N, info.max // N, N, dtype=d.np)  # no overflow of the sum


def _fold(comb: algebra.Combiner, values):
    acc = None
    for v in values:
        acc = v if acc is None else comb.combine(acc, v)
    return acc


@pytest.mark.parametrize("name,dtype", SCALAR_CASES)
def test_scalar_combiner_matches_its_cpp_rendering(name, dtype, rng):
    comb, d = COMBINERS[name], dtypes.as_dtype(dtype)
    a, b = _operands(comb, d, rng), _operands(comb, d, rng)
    out, ident = np.zeros(N, d.np), np.zeros(1, d.np)
    atom = np.array([comb.identity(d)], d.np)
    _launch(f"k_{name}_{dtype}", a, b, out, ident, atom)

    np.testing.assert_array_equal(out, comb.combine(a, b))  # bit for bit, NaN where numpy has NaN
    np.testing.assert_array_equal(ident, np.array([comb.identity(d)], d.np))
    folded = _fold(comb, a)
    if d.is_float and name in ("sum", "prod"):  # block partials merge in any order
        tol = 4 * np.finfo(d.np).eps * N * np.max(np.abs(a)) ** (1 if name == "sum" else 0) * max(1, abs(folded))
        np.testing.assert_allclose(atom[0], folded, rtol=0, atol=tol)
    else:
        np.testing.assert_array_equal(atom[0], folded)
    expected = {"int32": AtomicStrategy.NATIVE if name in ("sum", "max", "min", "all", "any") else AtomicStrategy.CAS}
    assert comb.atomic(d) == expected.get(dtype, comb.atomic(d))


@pytest.mark.parametrize("name,dtype", SCALAR_CASES)
def test_scalar_fold_matches_the_numpy_reference(name, dtype, rng):
    comb, d = COMBINERS[name], dtypes.as_dtype(dtype)
    a = _operands(comb, d, rng)
    if d.is_float and name in ("max", "min"):
        a = a[~np.isnan(a)]
    ref = comb.reference(a.astype(np.float64) if d.is_float else a)
    got = _fold(comb, a)
    if d.is_float:
        scale = np.max(np.abs(a)) if name == "sum" else max(1.0, abs(float(ref)))
        np.testing.assert_allclose(got, ref, rtol=0, atol=4 * np.finfo(d.np).eps * len(a) * scale)
    else:
        assert got == ref


def _fields(w: np.ndarray) -> tuple[np.ndarray, ...]:
    return tuple(w[f] for f in w.dtype.names)


@pytest.mark.parametrize("name,dtype", STRUCT_CASES)
def test_struct_combiner_matches_its_cpp_rendering(name, dtype, rng):
    comb, d = COMBINERS[name], _struct_dtype(dtype)
    ft = d.field.np
    x, y, z = (rng.standard_normal(N).astype(ft) * 10 for _ in range(3))
    if name == "online_lse":
        x[:4] = -np.inf  # a row that has seen nothing above -inf: no rescaling
        y[:2] = -np.inf
    else:  # inf, -inf and NaN, alone and against each other: NaN variances, numpy's means
        x[:8], y[:8] = [np.inf, np.inf, -np.inf, np.nan, 1, np.inf, 2, 3], [1, np.inf, np.inf, 1, np.nan, -np.inf, 3, 4]
        z[6:8] = [np.inf, -np.inf]
    out, ident = np.zeros(N, d.np), np.zeros(1, d.np)
    _launch(f"k_{name}_{dtype}", x, y, z, out, ident)

    L = comb.lift
    want = comb.combine(
        comb.combine(L(x), L(y)), comb.combine(tuple(np.full(N, v, ft) for v in comb.identity(d)), L(z))
    )
    eps = np.finfo(ft).eps
    for got, exp in zip(_fields(out), want):  # the only difference allowed: libm's exp against numpy's
        np.testing.assert_allclose(got, exp, rtol=8 * eps, atol=8 * eps * np.max(np.abs(exp[np.isfinite(exp)])))
    np.testing.assert_array_equal(np.array(_fields(ident)).ravel(), np.array(comb.identity(d), ft))
    assert comb.atomic(d) == AtomicStrategy.NONE


@pytest.mark.parametrize("name", STRUCTS)
def test_struct_fold_matches_the_numpy_reference(name, rng):
    comb = COMBINERS[name]
    x = rng.standard_normal(1000) * 3 + 1e4
    m = _fold(comb, [comb.lift(v) for v in x])
    if name == "welford":
        shift, mean, m2, n = m
        np.testing.assert_allclose([shift + mean, m2 / n], [x.mean(), comb.reference(x)], rtol=1e-12)
        for special in (
            [np.inf],
            [np.nan],
            [1.0, np.inf, 2.0],
            [np.inf, 1.0],
            [np.inf, -np.inf],
            [-np.inf, -np.inf, 5],
        ):
            shift, mean, m2, n = _fold(comb, [comb.lift(np.float64(v)) for v in special])
            with np.errstate(invalid="ignore"):
                np.testing.assert_array_equal([shift + mean, m2 / n], [np.mean(special), np.var(special)])
    else:
        np.testing.assert_allclose(m[0] + np.log(m[1]), comb.reference(x), rtol=1e-12)


def test_argkeys_match_their_cpp_rendering():
    src = """
__global__ void k_keys(const float* f, const int* v, long long* out, int n) {
  const int i = threadIdx.x;
  if (i < n) {
    out[4 * i + 0] = pn_argkey_max(f[i], (long long)i);
    out[4 * i + 1] = pn_argkey_min(f[i], (long long)i);
    out[4 * i + 2] = pn_argkey_max(v[i], (long long)i);
    out[4 * i + 3] = pn_argkey_min(v[i], (long long)i);
  }
}"""
    lib = emulator.build(PRELUDE + src, {"k_keys": ("const float*", "const int*", "long long*", "int")})
    f = np.array([0.0, -0.0, 1.5, -1.5, np.inf, -np.inf, np.nan, 3.0, 1e-40, -2.0], np.float32)
    v = np.array([0, -1, 7, -(2**31), 2**31 - 1, 3, 3, -7, 1, 0], np.int32)
    out = np.zeros(4 * len(f), np.int64)
    args = [ctypes.c_void_p(a.ctypes.data) for a in (f, v, out)] + [ctypes.c_int(len(f))]
    emulator.launch(lib, "k_keys", (1, 1, 1), (32, 1, 1), args)
    idx = np.arange(len(f))
    for k, (vals, kind) in enumerate(((f, "max"), (f, "min"), (v, "max"), (v, "min"))):
        keys = algebra.argkey(vals, idx, kind)
        np.testing.assert_array_equal(out[k::4], keys)
        pick = np.argmax(keys) if kind == "max" else np.argmin(keys)
        assert pick == (np.argmax(vals) if kind == "max" else np.argmin(vals))  # numpy: first index, NaN wins


def test_every_combiner_is_rendered_once_in_the_prelude():
    for comb in COMBINERS.values():
        assert PRELUDE.count(f"struct {comb.functor} {{") == 1
        for dt in comb.native_dtypes:
            assert f"pn_atomic({comb.functor}, {dtypes.as_dtype(dt).compute}*" in PRELUDE


def test_ordered_images_match_their_cpp_rendering_and_merge_float_extrema():
    """Float max/min merge through integer atomicMax/Min on algebra.ordered images: the images
    order as the floats, NaN wins both ways, and every image reads back as its float."""
    src = """
__global__ void k_ord(const float* f, const double* d, int* fi, long long* di, float* fb, double* db,
                      int* fmax, int* fmin, long long* dmax, long long* dmin, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    fi[2 * i] = pn_ordered(f[i], true); fi[2 * i + 1] = pn_ordered(f[i], false);
    di[2 * i] = pn_ordered(d[i], true); di[2 * i + 1] = pn_ordered(d[i], false);
    fb[i] = pn_unordered(pn_ordered(f[i], true)); db[i] = pn_unordered(pn_ordered(d[i], false));
    pn_atomic_ordered(pn_op_max(), fmax, f[i]); pn_atomic_ordered(pn_op_min(), fmin, f[i]);
    pn_atomic_ordered(pn_op_max(), dmax, d[i]); pn_atomic_ordered(pn_op_min(), dmin, d[i]);
  }
}"""
    sig = ("const float*", "const double*", "int*", "long long*", "float*", "double*", "int*", "int*",
           "long long*", "long long*", "int")  # fmt: skip
    lib = emulator.build(PRELUDE + src, {"k_ord": sig})
    rng = np.random.default_rng(5)
    for with_nan in (False, True):
        f = np.concatenate([rng.standard_normal(60) * 1e3, [0.0, -0.0, np.inf, -np.inf]]).astype(np.float32)
        if with_nan:
            f[7] = np.nan
        d = f.astype(np.float64)
        n = len(f)
        fi, di = np.zeros(2 * n, np.int32), np.zeros(2 * n, np.int64)
        fb, db = np.zeros(n, np.float32), np.zeros(n, np.float64)
        fmax, fmin = (
            algebra.ordered(np.array([-np.inf], np.float32), True),
            algebra.ordered(np.array([np.inf], np.float32), False),
        )
        dmax, dmin = algebra.ordered(np.array([-np.inf]), True), algebra.ordered(np.array([np.inf]), False)
        arrays = (f, d, fi, di, fb, db, fmax, fmin, dmax, dmin)
        args = [ctypes.c_void_p(a.ctypes.data) for a in arrays] + [ctypes.c_int(n)]
        emulator.launch(lib, "k_ord", (2, 1, 1), (32, 1, 1), args, order="shuffled", seed=1)
        np.testing.assert_array_equal(fi[0::2], algebra.ordered(f, True))
        np.testing.assert_array_equal(fi[1::2], algebra.ordered(f, False))
        np.testing.assert_array_equal(di[0::2], algebra.ordered(d, True))
        np.testing.assert_array_equal(di[1::2], algebra.ordered(d, False))
        np.testing.assert_array_equal(fb, f)  # NaN reads back as NaN
        np.testing.assert_array_equal(db, d)
        for img, want in ((fmax, np.max(f)), (fmin, np.min(f)), (dmax, np.max(d)), (dmin, np.min(d))):
            np.testing.assert_array_equal(algebra.unordered(img)[0], want)  # numpy: NaN wins
    finite = f[np.isfinite(f)]
    assert np.all(np.diff(finite[np.argsort(algebra.ordered(finite, True))]) >= 0)  # image order = float order
