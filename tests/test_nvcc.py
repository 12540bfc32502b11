"""Every kind of kernel the suite generates compiles with nvcc for sm_80 and sm_90, no spills."""

import pytest

import panamera as pn
from panamera.errors import BackendError
from panamera.runtime import nvcc


def _kernels():
    out = []
    for dtype in ["float32", "float64", "float16", "bfloat16", "int32", "int64", "bool"]:
        x = pn.placeholder((64, 1000), dtype, name="x")
        ys = [pn.sum(x, axis=1), pn.mean(x, axis=0), pn.max(x), pn.min(x, axis=0), pn.prod(x, axis=1)]
        ys += [pn.all(x, axis=0), pn.any(x, axis=1)]
        for det in (False, True):
            out.append(pn.compile(ys, target="emulator", deterministic=det, split=4))
    x = pn.placeholder((6, 20), "float32", name="x")
    w = pn.placeholder((20,), "float32", name="w")
    e = pn.where(x > 0, pn.exp(x), pn.log(abs(x) + 1.0)) * pn.rsqrt(w * w + 1.0) - pn.sqrt(abs(w))
    out.append(pn.compile([pn.sum(pn.maximum(e, 0.5), axis=1), e * 2.0], target="emulator"))
    return out


def test_generated_kernels_compile_for_sm80_and_sm90_without_spills():
    try:
        nvcc.find_nvcc()
    except BackendError as e:
        pytest.skip(str(e))
    seen = 0
    for k in _kernels():
        res = nvcc.compile_cuda(k.source)
        assert {r.arch for r in res} == {"sm_80", "sm_90"}
        for r in res:
            assert r.spill_stores == 0 and r.spill_loads == 0, r
        names = {r.kernel for r in res}
        assert all(kk.name in names for kk in k.kernels)
        seen += len(k.kernels)
    assert seen > 20
