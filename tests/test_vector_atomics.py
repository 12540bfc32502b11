"""16-byte vector atomics (issue 12): a COLUMN thread's 4 adjacent float32 sums merge as one
atomicAdd(float4*) on sm_90, one reduction instruction in the SASS; emulated lane by lane with
the GPU's alignment rule; never planned for a GPU without them; a schedule that asks for them
there is refused."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import panamera as pn
from panamera.errors import BackendError, ScheduleError
from panamera.model import A100, H100
from panamera.runtime import nvcc


def _column_sum():
    return pn.sum(pn.placeholder((8192, 256), "float32", name="x"), axis=0)


def test_column_sums_merge_four_outputs_per_atomic_on_h100(rng):
    k = pn.compile(_column_sum(), target="emulator", gpu=H100, use_database=False)
    m = k.mappings[0]
    assert m.split > 1 and str(m.merges[0]) == "atomic_ws" and m.atomic_vec == (m.vec,) and m.vec == 4
    assert "pn_atomic_v(&ws0[o], acc0)" in k.source
    a = rng.standard_normal((8192, 256)).astype(np.float32)
    want = a.astype(np.float64).sum(0)
    tol = 4 * np.finfo(np.float32).eps * np.sqrt(8192) * np.abs(a).max()
    for order in ("forward", "reverse", "shuffled"):  # and the resident workspace resets between calls
        np.testing.assert_allclose(k(a, order=order), want, rtol=0, atol=tol)


def test_no_vector_atomics_without_sm90():
    k = pn.compile(_column_sum(), target="emulator", gpu=A100, use_database=False)
    assert set(k.mappings[0].atomic_vec) == {1} and "pn_atomic_v" not in k.source.split("pn_k0")[-1]


def test_a_schedule_asking_for_them_on_a100_is_refused():
    s = pn.compile(_column_sum(), target="emulator", gpu=H100, use_database=False).schedule
    s = dataclasses.replace(s, gpu=A100.name)
    with pytest.raises(ScheduleError, match="vector atomics"):
        pn.compile(_column_sum(), target="emulator", gpu=A100, schedule=s)


def test_the_sm90_sass_has_one_vector_reduction():
    k = pn.compile(_column_sum(), target="emulator", gpu=H100, use_database=False)
    try:
        text = nvcc.sass(k.source, k.plan.kernels[-1].kernel)
    except BackendError as e:
        pytest.skip(str(e))
    assert re.search(r"(RED|ATOM)G\.E\.ADD\.F32x4", text)  # one 16-byte reduction per thread
