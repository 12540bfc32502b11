"""Resident workspaces: a split reduction merges into a workspace that the last block turns into
the output and resets, so only the first call runs the init kernel; every later call is one
launch and must give the same (correct) answer."""

from __future__ import annotations

import numpy as np
import pytest

import panamera as pn
from panamera.errors import BackendError


@pytest.mark.parametrize(
    "op,dtype,shape,axis",
    [
        ("sum", "float32", (4, 70000), 1),  # ROW split
        ("max", "int32", (70000, 3), 0),  # COLUMN split
        ("mean", "float16", (50000,), None),  # ALL, converted by the last block
        ("all", "bool", (3, 40000), 1),
        ("prod", "float64", (2, 30000), 1),
    ],
)
def test_repeated_calls_reuse_the_reset_workspace(op, dtype, shape, axis, rng):
    y = getattr(pn, op)(pn.placeholder(shape, dtype, name="x"), axis=axis)
    k = pn.compile(y, target="emulator")
    assert k.mappings[0].split > 1 and [ln.role for ln in k.plan.launches] == ["init_once", "reduce"]
    for call, order in enumerate(("forward", "reverse", "shuffled", "forward")):
        if dtype == "bool":
            a = rng.random(shape) > 0.01 * call
        elif op == "prod":
            a = 1 + rng.standard_normal(shape) * 1e-4
        else:
            a = (rng.standard_normal(shape) * 10).astype(dtype)
        want = getattr(np, op)(a.astype(np.float64) if dtype != "bool" else a, axis=axis)
        got = k(a, order=order)
        tol = 2e-3 if dtype == "float16" else 1e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        ws = k.resident["emulator"]
        assert all(not v.any() for key, v in ws.items() if key.startswith("cnt:"))  # counters back to 0


def test_deterministic_partials_need_no_init_at_all(rng):
    k = pn.compile(
        pn.sum(pn.placeholder((3, 90000), "float32", name="x"), axis=1), target="emulator", deterministic=True
    )
    assert k.mappings[0].split > 1 and len(k.plan.per_call) == 1
    a = rng.standard_normal((3, 90000)).astype(np.float32)
    first = k(a, order="shuffled", seed=1)
    assert np.array_equal(first, k(a, order="reverse")) and np.array_equal(first, k(a, order="forward"))


def test_a_failed_call_drops_the_resident_workspace(rng, monkeypatch):
    k = pn.compile(pn.sum(pn.placeholder((2, 80000), "float32", name="x"), axis=1), target="emulator")
    a = rng.standard_normal((2, 80000)).astype(np.float32)
    k(a)
    from panamera.runtime import emulator

    real, seen = emulator.run, []

    def broken(fn, name, grid, block, args, *rest, **kw):
        seen.append(name)
        if not name.endswith("_init"):  # half of the blocks merged, then the call dies
            ws = k.resident["emulator"]
            next(v for key, v in ws.items() if k.plan.buffers[key].role == "workspace")[:] = 123.0
            raise BackendError("interrupted")
        real(fn, name, grid, block, args, *rest, **kw)

    monkeypatch.setattr(emulator, "run", broken)
    with pytest.raises(BackendError):
        k(a)
    assert "emulator" not in k.resident and seen == ["pn_k0_reduce"]
    monkeypatch.setattr(emulator, "run", lambda fn, name, *r, **kw: (seen.append(name), real(fn, name, *r, **kw)))
    np.testing.assert_allclose(k(a), a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)
    assert seen[1:] == ["pn_k0_reduce_init", "pn_k0_reduce"]  # the next call initialises again
