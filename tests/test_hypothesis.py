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
    return shape, None if axes is None else tuple(axes), op, chain, split


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.booleans())
def test_random_reductions(case, deterministic):
    shape, axes, op, chain, split = case
    rng = np.random.default_rng(0)
    a = rng.random(shape).astype(np.float32)
    x = pn.placeholder(shape, "float32", name="x")
    e, r = x, a.astype(np.float64)
    for f in chain:
        if f == "mul":
            e, r = e * 0.5, r * 0.5
        elif f == "add":
            e, r = e + 1.0, r + 1.0
        elif f == "neg":
            e, r = -e, -r
        elif f == "sqrt":
            e, r = pn.sqrt(abs(e)), np.sqrt(np.abs(r))
        else:
            e, r = getattr(pn, f)(e), getattr(np, f)(r)
    k = pn.compile(getattr(pn, op)(e, axis=axes), target="emulator", deterministic=deterministic, split=split)
    ref = getattr(np, op)(r, axis=axes)
    o1, o2 = k(a, order="forward"), k(a, order="shuffled", seed=3)
    np.testing.assert_allclose(o1, ref, rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(o2, ref, rtol=2e-5, atol=1e-5)
    if deterministic:
        assert o1.tobytes() == o2.tobytes()
