"""target="cpu": programs with numpy BLAS kernels between compiled ones take the one-table call path
(runtime/cpu_call.py: one C entry per run of compiled kernels, the BLAS steps between them on the
table's arrays, intermediates allocated once), by position and by name. Against float64 numpy."""

import numpy as np
from conftest import random_array, tolerance

import panamera as pn
from panamera.runtime.cpu_call import HostStep


def _close(got, ref, n: int, scale: float):
    t = tolerance("float32", n)
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=t, atol=t * scale)


def test_blas_between_compiled_kernels_in_one_table(rng):
    """exp(a) (compiled, stored), its product with b (BLAS), then a row sum and a max of the product
    (compiled): three steps, one table. Two calls with other inputs (the resident intermediate
    rewritten), a call by name, out= in place, and torch inputs (the general path) agree."""
    a, b = pn.placeholder((64, 48), "float32", name="a"), pn.placeholder((48, 80), "float32", name="b")
    p = pn.exp(a) @ b
    k = pn.compile([pn.sum(p * 2.0, axis=1), pn.max(p, axis=0)], target="cpu")
    fast = k.executor.fast()
    assert fast is not None and fast.hosts
    kinds = [type(st) is HostStep for st in fast.steps]
    assert kinds == [False, True, False], k.explain()
    for _ in range(2):
        A, B = random_array((64, 48), "float32", rng), random_array((48, 80), "float32", rng)
        P = np.exp(A.astype(np.float64)) @ B.astype(np.float64)
        scale = float((np.exp(np.abs(A.astype(np.float64))) @ np.abs(B.astype(np.float64))).max())
        for s, m in (k(A, B), k(a=A, b=B)):
            _close(s, 2 * P.sum(1), 48 + 80, 2 * 80 * scale)
            _close(m, P.max(0), 48, scale)
    outs = (np.empty(64, np.float32), np.empty(80, np.float32))
    got = k(A, B, out=outs)
    assert got[0] is outs[0] and got[1] is outs[1]
    _close(outs[0], 2 * P.sum(1), 48 + 80, 2 * 80 * scale)
    import torch

    ts, tm = k(torch.from_numpy(A), torch.from_numpy(B))
    assert isinstance(ts, torch.Tensor)
    _close(ts.numpy(), 2 * P.sum(1), 48 + 80, 2 * 80 * scale)
    _close(tm.numpy(), P.max(0), 48, scale)
