"""Bad input: one clear PanameraError each, naming the tensor and the problem."""

import numpy as np
import pytest

import panamera as pn
from panamera import errors


def test_axis_out_of_range():
    with pytest.raises(errors.AxisError, match="'x'.*axis 2 is out of range"):
        pn.sum(pn.placeholder((3, 4), name="x"), axis=2)


def test_axis_repeated():
    with pytest.raises(errors.AxisError, match="repeated"):
        pn.sum(pn.placeholder((3, 4), name="x"), axis=(1, -1))


def test_shape_mismatch_in_broadcast():
    with pytest.raises(errors.ShapeError, match="do not broadcast"):
        pn.placeholder((3, 4), name="a") + pn.placeholder((3,), name="b")


def test_bad_reshape():
    with pytest.raises(errors.ShapeError, match="cannot reshape"):
        pn.placeholder((3, 4), name="a").reshape(5, 2)


def test_unsupported_dtype():
    with pytest.raises(errors.DTypeError, match="unsupported dtype"):
        pn.placeholder((3,), "complex64", name="z")


def test_max_of_empty_has_no_identity():
    with pytest.raises(errors.EmptyReductionError, match="'x'.*no identity"):
        pn.max(pn.placeholder((3, 0), name="x"), axis=1)


def _kernel():
    return pn.compile(pn.sum(pn.placeholder((4, 8), "float32", name="x"), axis=1), target="emulator")


def test_wrong_shape_array():
    with pytest.raises(errors.InputError, match="'x'.*expected shape"):
        _kernel()(np.zeros((4, 9), np.float32))


def test_wrong_dtype_array():
    with pytest.raises(errors.DTypeError, match="'x'.*expected dtype float32"):
        _kernel()(np.zeros((4, 8), np.float64))


def test_wrong_number_of_arrays():
    with pytest.raises(errors.InputError, match="expected 1 input"):
        _kernel()()


def test_non_contiguous_arrays_are_copied():
    base = np.arange(64, dtype=np.float32).reshape(8, 8)
    view = base[::2]
    assert not view.flags.c_contiguous
    np.testing.assert_allclose(_kernel()(view), view.sum(axis=1))


def test_misaligned_arrays_are_copied():
    buf = np.zeros(33, np.float32)
    a = buf[1:].reshape(4, 8)
    a[...] = 1.5
    assert a.ctypes.data % 16
    np.testing.assert_allclose(_kernel()(a), np.full(4, 12.0))


def test_hostile_tensor_names_are_sanitized():
    name = 'onnx::ReduceMean_0"\n*/ #include <evil>'
    x = pn.placeholder((4, 8), "float32", name=name)
    k = pn.compile(pn.sum(x, axis=1), target="emulator")
    assert "evil" not in k.source and "onnx::" not in k.source
    np.testing.assert_allclose(k(np.ones((4, 8), np.float32)), np.full(4, 8.0))
    np.testing.assert_allclose(k(**{name: np.ones((4, 8), np.float32)}), np.full(4, 8.0))


def test_unknown_target():
    with pytest.raises(errors.OptionError, match="unknown target"):
        pn.compile(pn.sum(pn.placeholder((2,), name="x")), target="tpu")


def test_cuda_target_without_gpu_is_a_clear_error():
    from panamera.runtime import cuda

    if cuda.available():
        pytest.skip("a GPU is present")
    k = pn.compile(pn.sum(pn.placeholder((2,), name="x")), target="cuda")
    with pytest.raises(errors.BackendError, match="cuda backend"):
        k(np.ones(2, np.float32))


def test_compile_error_shows_the_source_line():
    from panamera.runtime import emulator

    with pytest.raises(errors.CompileError, match=r"line \d+.*\n.*\|"):
        emulator.build("int main( {", {})


def test_nvcc_error_shows_the_source_line():
    from panamera.codegen.header import PRELUDE
    from panamera.runtime import nvcc

    try:
        nvcc.find_nvcc()
    except errors.BackendError as e:
        pytest.skip(str(e))
    with pytest.raises(errors.CompileError, match=r"nvcc sm_80 rejected generated code at line \d+.*nope"):
        nvcc.compile_cuda(PRELUDE + 'extern "C" __global__ void k(int* p) { p[0] = nope; }')
