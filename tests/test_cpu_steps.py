"""target="cpu": programs with BLAS kernels between compiled ones take the one-table call path
(runtime/cpu_call.py): with the BLAS's gemm callable from C (runtime/cpu_gemm.py) the whole program
is one C entry; without it, one C entry per run of compiled kernels and numpy's BLAS steps between
them on the table's arrays. Intermediates allocated once; by position and by name. Against float64
numpy."""

import numpy as np
import pytest
from conftest import random_array, tolerance

import panamera as pn
import panamera.schedule.cpu_contraction as cpu_contraction
from panamera.runtime import cpu_gemm
from panamera.runtime.cpu_call import HostStep


def _close(got, ref, n: int, scale: float):
    t = tolerance("float32", n)
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=t, atol=t * scale)


@pytest.mark.parametrize("gemm_in_c", [True, False], ids=["gemm-in-c", "numpy-blas"])
def test_blas_between_compiled_kernels_in_one_table(rng, monkeypatch, gemm_in_c):
    """exp(a) (compiled, stored), its product with b (BLAS), then a row sum and a max of the product
    (compiled): one C entry (gemm from C) or three steps, one table. Two calls with other inputs (the
    resident intermediate rewritten), a call by name, out= in place, and torch inputs agree."""
    # the BLAS, not the tile kernel (test_cpu_tile.py)
    monkeypatch.setattr(cpu_contraction, "gemm_tile", lambda *a: None)
    if not gemm_in_c:
        monkeypatch.setattr(cpu_gemm, "blas", lambda: None)
    elif cpu_gemm.blas() is None:
        pytest.skip("no CBLAS gemm found in numpy's BLAS")
    n = 80 if gemm_in_c else 72  # another signature: the compile cache holds the other case's program
    a, b = pn.placeholder((64, 48), "float32", name="a"), pn.placeholder((48, n), "float32", name="b")
    p = pn.exp(a) @ b
    k = pn.compile([pn.sum(p * 2.0, axis=1), pn.max(p, axis=0)], target="cpu", cache=False)
    fast = k.executor.fast()
    assert fast is not None and fast.hosts is not gemm_in_c
    kinds = [type(st) is HostStep for st in fast.steps]
    assert kinds == ([False] if gemm_in_c else [False, True, False]), k.explain()
    assert ("pn_gemm<float>" in k.source) is gemm_in_c
    for _ in range(2):
        A, B = random_array((64, 48), "float32", rng), random_array((48, n), "float32", rng)
        P = np.exp(A.astype(np.float64)) @ B.astype(np.float64)
        scale = float((np.exp(np.abs(A.astype(np.float64))) @ np.abs(B.astype(np.float64))).max())
        for s, m in (k(A, B), k(a=A, b=B)):
            _close(s, 2 * P.sum(1), 48 + n, 2 * n * scale)
            _close(m, P.max(0), 48, scale)
    outs = (np.full(64, np.nan, np.float32), np.full(n, np.nan, np.float32))
    got = k(A, B, out=outs)
    assert got[0] is outs[0] and got[1] is outs[1]
    _close(outs[0], 2 * P.sum(1), 48 + n, 2 * n * scale)
    _close(outs[1], P.max(0), 48, scale)
    import torch

    ts, tm = k(torch.from_numpy(A), torch.from_numpy(B))
    assert isinstance(ts, torch.Tensor)
    _close(ts.numpy(), 2 * P.sum(1), 48 + n, 2 * n * scale)
    _close(tm.numpy(), P.max(0), 48, scale)
