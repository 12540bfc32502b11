"""On a real GPU: the cuda backend against numpy. Skipped where no GPU is present."""

import numpy as np
import pytest

import panamera as pn
from panamera.runtime import cuda

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no CUDA device (CuPy + GPU) present")


@pytest.mark.parametrize("shape,axis", [((256, 802816 // 64), 1), ((8192, 256), 0), ((1 << 20,), None)])
def test_cuda_matches_numpy(shape, axis):
    a = np.random.default_rng(0).random(shape).astype(np.float32)
    k = pn.compile(pn.sum(pn.placeholder(shape, "float32", name="x"), axis=axis), target="cuda")
    np.testing.assert_allclose(k(a), a.astype(np.float64).sum(axis=axis), rtol=1e-4)
