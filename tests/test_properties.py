"""Property-based tests that look for the next wrong answer (issue 18): random reduction programs
against numpy, with the values where kernels tend to break.

A program is an element-wise producer of one or two inputs whose shapes broadcast (from either
side, extents 0 and 1 included), a short chain of element-wise ops, and one reduction (sum,
mean, max, min, prod, var, argmax) over random axes, in float16/32/64, int32/64 or bool. Each
compiled kernel runs on three sets of values: ordinary ones, the dtype's special values (inf,
-inf and NaN; INT_MIN) sprinkled in, and all special. The reference is numpy on the same ops,
reduced in float64 for floats; the tolerance is derived per output element from the dtype, the
reduction length and the magnitudes reduced (see `_bound`). Where numpy refuses a program
(max of nothing), Panamera must raise the matching PanameraError.

tests/test_hypothesis.py draws the shapes, axes, splits and producer chains of ordinary values;
this module adds the special values, empty and broadcast shapes, more dtypes and combiners.
The "ci" profile (derandomized, 30 programs) runs in `make test`; `PANAMERA_PROPERTIES=deep`
draws 400 random ones for a longer hunt.
"""

from __future__ import annotations

import math
import os
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import panamera as pn
from panamera.errors import DTypeError, EmptyReductionError

settings.register_profile(
    "ci", max_examples=30, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
settings.register_profile("deep", max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
PROFILE = settings.get_profile(os.environ.get("PANAMERA_PROPERTIES", "ci"))

DTYPES = ("float16", "float32", "float64", "int32", "int64", "bool")
EPS = {"float16": 2**-10, "float32": 2**-23, "float64": 2**-52}
OPS = ("sum", "mean", "max", "min", "prod", "var", "argmax")
EXTENTS = (0, 1, 1, 2, 3, 5, 8, 17, 33)
MAX_SIZE = 600
# Element-wise ops per dtype family, chosen so that numpy and C agree without undefined
# behaviour (no signed overflow: INT_MIN is never negated, doubled or added to).
UNARY = {
    "float": ("neg", "abs", "exp", "half", "shift", "relu", "sqrt_abs"),
    "int": ("shift", "relu"),
    "bool": ("not",),
}
BINARY = {"float": ("add", "mul", "maximum"), "int": ("maximum", "minimum"), "bool": ("and", "or")}


def _family(dtype: str) -> str:
    return "float" if dtype.startswith("float") else "bool" if dtype == "bool" else "int"


@st.composite
def programs(draw):
    dtype = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(1, 3))
    full = [draw(st.sampled_from(EXTENTS)) for _ in range(rank)]
    while math.prod(full) > MAX_SIZE:
        full[full.index(max(full))] //= 2
    ones = st.lists(st.booleans(), min_size=rank, max_size=rank)
    xs = tuple(1 if b else e for e, b in zip(full, draw(ones)))
    ys = None
    if draw(st.booleans()):  # a second operand: axes of 1 and fewer leading axes broadcast it
        ys = tuple(1 if b else e for e, b in zip(full, draw(ones)))[draw(st.integers(0, rank - 1)) :]
    shape = np.broadcast_shapes(xs, ys) if ys is not None else xs
    fam = _family(dtype)
    chain = draw(st.lists(st.sampled_from(UNARY[fam]), max_size=3))
    binary = draw(st.sampled_from(BINARY[fam]))
    op = draw(st.sampled_from(OPS))
    if op == "argmax":
        chain = [f for f in chain if f in ("neg", "abs", "relu", "not")]  # exact: no ties moved by rounding
        axis = draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    else:
        axes = draw(st.one_of(st.none(), st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True)))
        axis = None if axes is None else tuple(axes)
    return dtype, xs, ys, binary, tuple(chain), op, axis, draw(st.booleans())


def _values(rng, shape, dtype: str, kind: str, op: str) -> np.ndarray:
    """Ordinary values ("plain"), the dtype's special values sprinkled in ("some") or only
    special values ("all"). Factors of a product stay near 1 in magnitude (no underflow)."""
    fam = _family(dtype)
    if fam == "bool":
        return rng.random(shape) < (0.5 if kind == "plain" else 0.9 if kind == "some" else 1.0)
    if fam == "int":
        a = rng.integers(-9, 10, shape).astype(dtype)
        special = np.array([np.iinfo(dtype).min], dtype)
    else:
        a = rng.uniform(-2, 2, shape) if op != "prod" else rng.choice([-1, 1], shape) * rng.uniform(0.8, 1.25, shape)
        a = a.astype(dtype)
        special = np.array([np.inf, -np.inf, np.nan], dtype)
    if kind != "plain" and a.size:
        pick = rng.random(shape) < (0.15 if kind == "some" else 1.0)
        a = np.where(pick, rng.choice(special, shape), a)
    return a


def _build(lib, dtype: str, x, y, binary: str, chain: tuple[str, ...]):
    """The producer with `lib` = pn on tensors or np on arrays (numpy's dtype rules both ways)."""
    e = x
    if y is not None:
        e = {"add": lambda: x + y, "mul": lambda: x * y, "and": lambda: x & y, "or": lambda: x | y}.get(
            binary, lambda: getattr(lib, binary)(x, y)
        )()
    for f in chain:
        if f == "neg":
            e = -e
        elif f == "abs":
            e = abs(e)
        elif f == "exp":
            e = lib.exp(e)
        elif f == "half":
            e = e * 0.5
        elif f == "shift":
            e = e + (3 if _family(dtype) == "int" else 0.5)
        elif f == "relu":
            e = lib.maximum(e, 0 if _family(dtype) == "int" else 0.0)
        elif f == "sqrt_abs":
            e = lib.sqrt(abs(e))
        else:
            e = ~e
    return e


def _reduce(lib, op: str, e, axis, keepdims: bool):
    if op == "argmax":
        return lib.argmax(e, axis=axis, keepdims=keepdims)
    return getattr(lib, op)(e, axis=axis, keepdims=keepdims)


def _bound(op: str, e: np.ndarray, axis, keepdims: bool, chain_len: int) -> np.ndarray:
    """The error allowed per output element. The producer is evaluated in the input dtype by
    both sides but may round differently (libm's exp against numpy's): `chain_len + 1` ulps of
    each element. The reduction adds what its length and magnitudes allow (conftest.tolerance:
    8 eps sqrt(n) of the accumulator: float32 for 16-bit floats, float64 for the mean and
    variance of integers), and the result rounds once to its dtype. Non-finite elements are left
    out of the magnitudes (their outputs must match exactly)."""
    exact = e.dtype.kind != "f"
    if exact and op not in ("mean", "var"):
        return np.zeros(np.shape(np.sum(e, axis=axis, keepdims=keepdims)))
    eps = EPS["float64"] if exact else EPS.get(str(e.dtype), EPS["float32"])
    acc = EPS["float32"] if str(e.dtype) == "float16" else eps
    a = np.where(np.isfinite(e), np.abs(e.astype(np.float64)), 0.0)
    axes = tuple(range(e.ndim)) if axis is None else (axis,) if isinstance(axis, int) else axis
    n = max(1, math.prod(e.shape[k] for k in axes))
    elem = 0.0 if exact else (chain_len + 1) * eps
    red = 8 * acc * math.sqrt(n) + 2 * eps
    total = np.sum(a, axis=axis, keepdims=keepdims)
    peak = np.max(a, axis=axis, keepdims=keepdims, initial=0.0)
    if op == "sum":
        return (elem + red) * total
    if op == "mean":
        return (elem + red) * total / n
    if op in ("max", "min"):
        return (elem + eps) * peak
    if op == "prod":  # relative: every factor's rounding and every multiply's; the smallest normal absolute
        p = np.abs(np.prod(np.where(np.isfinite(e), e.astype(np.float64), 1.0), axis=axis, keepdims=keepdims))
        return (n * (elem + 2 * acc) + 2 * eps) * p + np.finfo(np.float32).tiny
    # var: every deviation from the mean is below 2 * peak, perturbed by elem and red of peak
    return 4 * (elem + red + 2 * eps) * peak * peak


@PROFILE
@given(programs())
def test_random_reduction_programs_match_numpy(program):
    dtype, xs, ys, binary, chain, op, axis, keepdims = program
    x = pn.placeholder(xs, dtype, name="x")
    y = None if ys is None else pn.placeholder(ys, dtype, name="y")
    rng = np.random.default_rng(zlib.crc32(repr(program).encode()))
    plain = tuple(None if s is None else _values(rng, s, dtype, "plain", op) for s in (xs, ys))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        e = _build(np, dtype, *plain, binary, chain)
        try:
            _reduce(np, op, e, axis, keepdims)
            numpy_refuses = False
        except ValueError:  # a reduction of nothing without an identity (max, min, argmax)
            numpy_refuses = True
        if numpy_refuses:
            with pytest.raises(EmptyReductionError):
                _reduce(pn, op, _build(pn, dtype, x, y, binary, chain), axis, keepdims)
            return
        out = _build(pn, dtype, x, y, binary, chain)
        if op == "argmax" and out.dtype.itemsize == 8:  # Panamera packs 32-bit values into its keys
            with pytest.raises(DTypeError, match="argmax"):
                _reduce(pn, op, out, axis, keepdims)
            return
        k = pn.compile(_reduce(pn, op, out, axis, keepdims), target="emulator")
        for kind in ("plain", "some", "all"):
            a = (
                plain
                if kind == "plain"
                else tuple(None if s is None else _values(rng, s, dtype, kind, op) for s in (xs, ys))
            )
            arrays = [v for v in a if v is not None]
            e = _build(np, dtype, *a, binary, chain)
            ref = _reduce(np, op, e.astype(np.float64) if e.dtype.kind == "f" else e, axis, keepdims)
            got = k(*arrays, order="shuffled", seed=len(chain))
            _compare(
                got, ref, _reduce(np, op, e, axis, keepdims), _bound(op, e, axis, keepdims, len(chain)), program, kind
            )


def _compare(got, ref, native, bound, program, kind) -> None:
    """`got` against the float64 reference `ref` within `bound`, with numpy's result dtype
    (`native`: the same reduction in the input's dtype) and its NaN, inf and sign exactly."""
    what = f"{program} on {kind} values"
    got, ref, native = np.asarray(got), np.asarray(ref), np.asarray(native)
    assert got.shape == native.shape, what
    assert got.dtype == native.dtype, f"{what}: dtype {got.dtype}, numpy's {native.dtype}"
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, native, err_msg=what)
        return
    want = ref.astype(got.dtype).astype(np.float64)  # rounded (or overflowed) to the result dtype
    g = got.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(want), err_msg=f"{what}: NaN")
    fin = np.isfinite(want)
    np.testing.assert_array_equal(g[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)], err_msg=f"{what}: inf")
    err = np.abs(g - ref)[fin]
    assert (err <= np.broadcast_to(bound, ref.shape)[fin] + np.abs(want - ref)[fin]).all(), (
        f"{what}: error {err.max()} above the bound"
    )
