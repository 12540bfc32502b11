"""Random shapes (1, primes, non-multiples of 32 and of the vector width), axes and producer
chains against numpy, under two thread orders; deterministic mode must be bit-identical."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import panamera as pn

EXTENTS = st.sampled_from([1, 2, 3, 5, 7, 13, 31, 33, 64, 97, 130])


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(EXTENTS) for _ in range(rank))
    while np.prod(shape) > 20000:
        shape = shape[1:]
    rank = len(shape)
    axes = draw(st.one_of(st.none(), st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True)))
    op = draw(st.sampled_from(["sum", "max", "min", "mean"]))
    chain = draw(st.lists(st.sampled_from(["exp", "mul", "add", "abs", "neg", "sqrt"]), max_size=3))
    split = draw(st.sampled_from([None, 2, 5]))
    dtype = draw(st.sampled_from(["float32", "float16", "int32"]))
    if dtype == "int32":
        chain = [f for f in chain if f in ("add", "neg", "abs")]
    return shape, None if axes is None else tuple(axes), op, chain, split, dtype


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.booleans())
def test_random_reductions(case, deterministic):
    shape, axes, op, chain, split, dtype = case
    rng = np.random.default_rng(0)
    a = rng.integers(-9, 9, shape).astype(dtype) if dtype == "int32" else rng.random(shape).astype(dtype)
    x = pn.placeholder(shape, dtype, name="x")
    # The chain runs in numpy at the input's float dtype (float16 rounds after each op, as numpy
    # does); integers go through float64, which is exact for these values.
    e, r = x, (a if dtype == "float16" else a.astype(np.float64))
    for f in chain:
        if f == "mul":
            e, r = e * 0.5, r * 0.5
        elif f == "add" and dtype == "int32":
            e, r = e + 3, r + 3
        elif f == "add":
            e, r = e + 1.0, r + 1.0
        elif f == "neg":
            e, r = -e, -r
        elif f == "sqrt":
            e, r = pn.sqrt(abs(e)), np.sqrt(np.abs(r))
        else:
            e, r = getattr(pn, f)(e), getattr(np, f)(r)
    k = pn.compile(getattr(pn, op)(e, axis=axes), target="emulator", deterministic=deterministic, split=split)
    ref = getattr(np, op)(r.astype(np.float64), axis=axes)
    o1, o2 = k(a, order="forward"), k(a, order="shuffled", seed=3)
    # float16 rounds after every element-wise op (as numpy does) and once more at the end.
    tol = {"float32": 2e-5, "float16": 4e-3 * (len(chain) + 1), "int32": 0}[dtype]
    for o in (o1, o2):
        np.testing.assert_allclose(o.astype(np.float64), ref, rtol=tol, atol=tol)
    if deterministic:
        assert o1.tobytes() == o2.tobytes()


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_reduction_feeding_a_reduction(case):
    """x - op1(x, keepdims) then op2: two kernels, the second reading the first's result."""
    shape, axes, op, _, split, dtype = case
    if dtype != "float32":
        return
    rng = np.random.default_rng(1)
    a = rng.random(shape).astype(np.float32)
    x = pn.placeholder(shape, "float32", name="x")
    inner = pn.max(x, axis=axes, keepdims=True)
    k = pn.compile(getattr(pn, op)(x - inner, axis=axes), target="emulator", split=split)
    r = a.astype(np.float64)
    ref = getattr(np, op)(r - r.max(axis=axes, keepdims=True), axis=axes)
    np.testing.assert_allclose(k(a, order="reverse"), ref, rtol=2e-5, atol=2e-5)


@st.composite
def chains(draw):
    shape = (draw(st.sampled_from([1, 3, 7, 33])), draw(st.sampled_from([1, 5, 64, 130])))
    steps = draw(
        st.lists(
            st.tuples(st.sampled_from(["exp", "scale", "center", "normalize", "square"]), st.sampled_from([0, 1])),
            min_size=1,
            max_size=5,
        )
    )
    final = draw(st.tuples(st.sampled_from(["sum", "max", "mean"]), st.sampled_from([0, 1, None])))
    return shape, steps, final


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_chains_of_reductions_and_broadcast_consumers(case):
    """Depth-5 chains: element-wise ops, reductions whose results are broadcast back to the rows
    (centering, normalizing), and a final reduction, against numpy float64."""
    shape, steps, (op, axis) = case
    a = np.random.default_rng(5).random(shape).astype(np.float32)
    x = pn.placeholder(shape, "float32", name="x")
    e, r = x, a.astype(np.float64)
    for kind, ax in steps:
        if kind == "exp":
            e, r = pn.exp(e * 0.5), np.exp(r * 0.5)
        elif kind == "scale":
            e, r = e * 1.5 + 0.25, r * 1.5 + 0.25
        elif kind == "square":
            e, r = e * e, r * r
        elif kind == "center":
            e, r = e - pn.max(e, axis=ax, keepdims=True), r - r.max(axis=ax, keepdims=True)
        else:
            e = e / (pn.sum(abs(e), axis=ax, keepdims=True) + 1.0)
            r = r / (np.abs(r).sum(axis=ax, keepdims=True) + 1.0)
    k = pn.compile(getattr(pn, op)(e, axis=axis), target="emulator")
    ref = getattr(np, op)(r, axis=axis)
    np.testing.assert_allclose(k(a, order="shuffled", seed=1), ref, rtol=5e-5, atol=5e-6)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(chains(), st.lists(st.integers(0, 4), max_size=3))
def test_chains_with_intermediate_outputs(case, picks):
    """The same chains, with intermediates (element-wise results and reductions) also returned:
    materialized tensors inside fused groups must still be computed and stored correctly."""
    shape, steps, (op, axis) = case
    a = np.random.default_rng(6).random(shape).astype(np.float32)
    x = pn.placeholder(shape, "float32", name="x")
    e, r = x, a.astype(np.float64)
    inter = []
    for kind, ax in steps:
        if kind in ("exp", "scale", "square"):
            e, r = (
                (pn.exp(e * 0.5), np.exp(r * 0.5))
                if kind == "exp"
                else ((e * e, r * r) if kind == "square" else (e * 1.5, r * 1.5))
            )
        elif kind == "center":
            m, mr = pn.max(e, axis=ax, keepdims=True), r.max(axis=ax, keepdims=True)
            inter.append((m, mr))
            e, r = e - m, r - mr
        else:
            s, sr = pn.sum(abs(e), axis=ax, keepdims=True) + 1.0, np.abs(r).sum(axis=ax, keepdims=True) + 1.0
            inter.append((s, sr))
            e, r = e / s, r / sr
        inter.append((e, r))
    outs = [(getattr(pn, op)(e, axis=axis), getattr(np, op)(r, axis=axis))]
    outs += [inter[p % len(inter)] for p in picks]
    k = pn.compile([t for t, _ in outs], target="emulator")
    for got, (_, ref) in zip(k(a, order="reverse"), outs):
        np.testing.assert_allclose(got, ref, rtol=5e-5, atol=5e-6)
