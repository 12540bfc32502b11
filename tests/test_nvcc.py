"""Every kind of kernel the suite generates compiles with nvcc for sm_80 and sm_90, no spills; ptxas keeps
the unrolled loads in flight."""

import pytest
from conftest import need_nvcc

import panamera as pn
from panamera.errors import BackendError
from panamera.runtime import nvcc


def _kernels():
    """{dtype: [module with atomics merge, module merged by the last block]} of every reduction op split in 4,
    and the elementwise chain under "map"."""
    out = {}
    for dtype in ["float32", "float64", "float16", "bfloat16", "int32", "int64", "bool"]:
        x = pn.placeholder((64, 1000), dtype, name="x")
        ys = [pn.sum(x, axis=1), pn.mean(x, axis=0), pn.max(x), pn.min(x, axis=0), pn.prod(x, axis=1)]
        ys += [pn.all(x, axis=0), pn.any(x, axis=1)]
        out[dtype] = [pn.compile(ys, target="emulator", deterministic=det, split=4) for det in (False, True)]
    x = pn.placeholder((6, 20), "float32", name="x")
    w = pn.placeholder((20,), "float32", name="w")
    e = pn.where(x > 0, pn.exp(x), pn.log(abs(x) + 1.0)) * pn.rsqrt(w * w + 1.0) - pn.sqrt(abs(w))
    out["map"] = [pn.compile([pn.sum(pn.maximum(e, 0.5), axis=1), e * 2.0], target="emulator")]
    return out


def test_generated_kernels_compile_for_sm80_and_sm90_without_spills():
    """Every kernel rendered here (and anywhere in the suite) is compiled for sm_80 and sm_90 at the end
    of the session, one by one beside the prelude, and a failure or a spill fails the run
    (tests/conftest.py `pytest_sessionfinish`). Here, two modules are compiled whole, as generated:
    16-bit floats merged by the last block, and the elementwise chain."""
    need_nvcc()
    modules = _kernels()
    assert sum(len(k.kernels) for ks in modules.values() for k in ks) > 20
    for k in (modules["bfloat16"][1], modules["map"][0]):
        res = nvcc.compile_cuda(k.source)
        assert {r.arch for r in res} == {"sm_80", "sm_90"}
        for r in res:
            assert r.spill_stores == 0 and r.spill_loads == 0, r
        names = {r.kernel for r in res}
        assert all(kk.name in names for kk in k.kernels)


@pytest.mark.parametrize(
    "dtype,loads",
    [("float32", 4), ("float16", 4), ("bool", 2)],  # 16-byte vectors; bool's 16 lanes unroll twice
)
def test_the_unrolled_loop_keeps_loads_in_flight_in_the_sass(dtype, loads):
    """The model counts `unroll` vector loads in flight per thread; ptxas must issue them back to
    back: the SASS of the streaming loop has `loads` LDG.E.128 before any other instruction that
    uses their results or branches."""
    import re

    k = pn.compile(pn.sum(pn.placeholder((768, 65536), dtype, name="x"), axis=1), target="emulator")
    assert k.mappings[0].unroll == loads
    try:
        text = nvcc.sass(k.source, k.plan.kernels[0].kernel)
    except BackendError as e:
        pytest.skip(str(e))
    ops = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\d\s+)?([A-Z0-9_.]+)", text)]
    runs = [
        len(list(g)) for is_ld, g in __import__("itertools").groupby(ops, lambda o: o.startswith("LDG.E.128")) if is_ld
    ]
    assert max(runs) >= loads, ops[:60]
