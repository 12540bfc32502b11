"""Arrays of every kind in, the same kind out (runtime/arrays.py): numpy, torch CPU tensors
(float32, float16, bfloat16), DLPack-only and `__array__`-only objects, through `pn.compile` on
the emulator; the caller's stream on a GPU (with stand-ins for CuPy and torch.cuda here)."""

import sys
import types

import numpy as np
import pytest
from conftest import tolerance

import panamera as pn
from panamera.errors import InputError
from panamera.runtime import arrays, executor


class DLPackOnly:
    """An array that speaks only DLPack (as JAX's, TensorFlow's or PaddlePaddle's do)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class ArrayOnly:
    """An object that speaks only numpy's `__array__` protocol."""

    def __init__(self, a):
        self._a = a

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)


def _sum_kernel(shape=(6, 70), dtype="float32"):
    return pn.compile(pn.sum(pn.placeholder(shape, dtype, name="x"), axis=1), target="emulator")


def test_dlpack_only_and_array_only_objects_give_numpy(rng):
    a = rng.standard_normal((6, 70)).astype(np.float32)
    k = _sum_kernel()
    for obj in (DLPackOnly(a), ArrayOnly(a)):
        out = k(obj)
        assert type(out) is np.ndarray
        np.testing.assert_allclose(out, a.astype(np.float64).sum(axis=1), rtol=tolerance("float32", 70))


def test_a_dlpack_object_is_viewed_not_copied(rng):
    a = executor.aligned_empty(6 * 70, np.float32).reshape(6, 70)
    arg = arrays.adopt(DLPackOnly(a), "x")
    assert arg.kind == arrays.Kind.DLPACK and np.shares_memory(arrays.to_host(arg), a)


def test_an_unsupported_object_names_the_input():
    k = _sum_kernel()
    with pytest.raises(pn.InputError, match=r"input 'x': expected an array .*got list"):
        k([[1.0] * 70] * 6)
    with pytest.raises(pn.InputError, match=r"input 'x'.*got object"):
        k(x=object())


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_cpu_tensors_in_torch_tensors_out(torch, dtype):
    n = 96
    x = pn.placeholder((5, n), dtype, name="x")
    w, b = pn.placeholder((n,), dtype, name="w"), pn.placeholder((n,), dtype, name="b")
    k = pn.compile([pn.nn.layer_norm(x, w, b), pn.sum(x, axis=1)], target="emulator")
    g = torch.Generator().manual_seed(0)
    tx, tw, tb = (torch.randn(s, generator=g).to(getattr(torch, dtype)) for s in ((5, n), (n,), (n,)))
    y, s = k(tx, tw, tb)
    assert isinstance(y, torch.Tensor) and y.dtype == tx.dtype and y.device == tx.device and y.shape == tx.shape
    ref_y = torch.nn.functional.layer_norm(tx.double(), (n,), tw.double(), tb.double())
    tol = tolerance(dtype, n)
    assert (y.double() - ref_y).abs().max() <= 4 * tol * max(1.0, ref_y.abs().max().item())
    assert s.dtype == tx.dtype and (s.double() - tx.double().sum(1)).abs().max() <= tol * tx.abs().sum(1).max()


def test_torch_views_and_tensors_that_require_grad(torch):
    k = _sum_kernel((6, 70))
    base = torch.randn(70, 6, requires_grad=True)
    t = base.t()  # non-contiguous, requires grad: copied for the kernel, read through .detach()
    with pytest.raises(InputError, match="requires grad and grad mode is on.*torch.no_grad"):
        k(t)  # torch would give the result a grad_fn; a compiled kernel has none: refused, not dropped
    with torch.no_grad():
        out = k(t)
    assert isinstance(out, torch.Tensor) and not out.requires_grad
    torch.testing.assert_close(out, t.detach().sum(1), rtol=tolerance("float32", 70), atol=1e-5)
    torch.testing.assert_close(k(t.detach()), out)


def test_a_cpu_tensor_is_viewed_not_copied(torch):
    t = torch.randn(6, 70)
    arg = arrays.adopt(t, "x")
    assert arg.kind == arrays.Kind.TORCH and arrays.to_host(arg).ctypes.data == t.data_ptr()
    bf = torch.randn(6, 70).to(torch.bfloat16)
    assert arrays.to_host(arrays.adopt(bf, "x")).ctypes.data == bf.data_ptr()  # bfloat16: a uint16 view


def test_torch_out_and_mixed_kinds(torch, rng):
    k = _sum_kernel()
    t = torch.randn(6, 70)
    buf = torch.empty(6)
    assert k(t, out=buf) is buf
    torch.testing.assert_close(buf, t.sum(1), rtol=1e-5, atol=1e-5)
    into = np.empty(6, np.float32)
    k(t, out=into)  # a torch result written into a numpy array
    np.testing.assert_allclose(into, buf.numpy())
    x, y = pn.placeholder((3, 4), name="x"), pn.placeholder((3, 4), name="y")
    mixed = pn.compile(pn.sum(x * y, axis=1), target="emulator")
    out = mixed(rng.random((3, 4)).astype(np.float32), torch.ones(3, 4))
    assert isinstance(out, torch.Tensor)  # torch anywhere in: torch out


def test_unsupported_torch_dtypes_name_the_input(torch):
    k = _sum_kernel()
    with pytest.raises(pn.DTypeError, match=r"input 'x': torch.complex64 has no numpy equivalent"):
        k(torch.zeros(6, 70, dtype=torch.complex64))
    with pytest.raises(pn.DTypeError, match=r"input 'x': expected dtype float32, got int8"):
        k(torch.zeros(6, 70, dtype=torch.int8))


def test_work_runs_on_torchs_current_stream(torch, monkeypatch):
    """A torch caller on a GPU: CuPy's current stream is torch's during the call, so the resident
    workspaces are keyed by torch's stream (stand-ins for CuPy and torch.cuda: no GPU here)."""
    current = [0]

    class Stream:
        def __init__(self, ptr, device_id=-1):
            self.ptr = ptr

        def __enter__(self):
            self.saved, current[0] = current[0], self.ptr

        def __exit__(self, *exc):
            current[0] = self.saved

    class Device:
        def __init__(self, index=0):
            self.id = index

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            Device=Device, ExternalStream=Stream, get_current_stream=lambda: types.SimpleNamespace(ptr=current[0])
        )
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0x5A0))
    caller = arrays.Caller(arrays.Kind.TORCH, arrays.Device(arrays.DeviceType.CUDA, 0))
    with arrays.cuda_context(caller, fake):
        assert executor.current_cuda_key(fake) == executor.cuda_resident_key(0, 0x5A0)
    assert executor.current_cuda_key(fake) == executor.cuda_resident_key(0, 0)  # restored
    cupy_caller = arrays.Caller(arrays.Kind.CUPY, arrays.Device(arrays.DeviceType.CUDA, 0))
    with arrays.cuda_context(cupy_caller, fake):  # a CuPy caller: CuPy's own current stream
        assert executor.current_cuda_key(fake) == executor.cuda_resident_key(0, 0)
