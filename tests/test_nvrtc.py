"""Source -> sm_90 binary through NVRTC (the CUDA backend's path), timed without a GPU."""

import pytest

import panamera as pn
from panamera.errors import CompileError
from panamera.runtime import nvrtc

pytestmark = pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc not installed")


def test_a_generated_kernel_compiles_through_nvrtc():
    for dtype in ("float32", "float16"):  # the 16-bit prelude finds cuda_fp16.h
        k = pn.compile(pn.sum(pn.placeholder((64, 256), dtype, name="x"), axis=1), target="emulator")
        assert 0 < nvrtc.compile_source(k.source) < 60


def test_a_rejected_source_names_the_line():
    with pytest.raises(CompileError, match="nvrtc sm_90 rejected generated code at line 2"):
        nvrtc.compile_source("__global__ void k(float* p) {\n  p[0] = undefined_name;\n}\n")
