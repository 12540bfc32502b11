"""Arrays of every kind in, the same kind out: the boundary between a caller's arrays and the
executor's numpy (emulator) and CuPy (cuda) buffers.

A compiled call takes numpy, CuPy and torch arrays (CPU and CUDA) and any object with
`__dlpack__` (DLPack) or `__array__` (numpy's protocol). `adopt` classifies each input without
copying it and reads its shape and dtype; `to_host` and `to_device` give the executor a numpy or
CuPy array, zero-copy where the layout allows (a numpy view of a CPU tensor, DLPack on a GPU);
`deliver` returns the results as the caller's kind on the caller's device (`Caller`): torch in,
torch out; CuPy in, CuPy out; numpy, `__array__` objects and CPU DLPack objects give numpy, CUDA
DLPack objects give CuPy. On a GPU, `cuda_context` puts the work on the caller's current stream
(torch's `torch.cuda.current_stream()` for torch callers, CuPy's otherwise), so the executor's
resident workspaces, keyed by (device, stream), follow the caller's stream.

torch's bfloat16 crosses as a uint16 view (numpy has no bfloat16; ml_dtypes has):

>>> import numpy as np
>>> arg = adopt(np.ones((2, 3), np.float32), "x")
>>> arg.kind, arg.shape, arg.dtype, arg.device
(<Kind.NUMPY: 'numpy'>, (2, 3), dtype('float32'), Device(type=<DeviceType.CPU: 'cpu'>, index=0))
>>> deliver([np.zeros(2)], caller_of([arg]))[0].tolist()
[0.0, 0.0]
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..dtypes import SUPPORTED
from ..enums import StrEnum
from ..errors import DTypeError, InputError


class Kind(StrEnum):
    """The kinds of array a caller may pass; results come back as the caller's kind."""

    NUMPY = "numpy"
    CUPY = "cupy"
    TORCH = "torch"
    DLPACK = "dlpack"  # any other object with __dlpack__ and __dlpack_device__
    ARRAY = "array"  # any other object with __array__ (numpy's protocol)


class DeviceType(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


@dataclass(frozen=True)
class Device:
    """Where an array lives."""

    type: DeviceType = DeviceType.CPU
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.type == DeviceType.CPU else f"cuda:{self.index}"


CPU = Device()
_DLPACK_CPU, _DLPACK_CUDA, _DLPACK_CUDA_HOST, _DLPACK_CUDA_MANAGED = 1, 2, 3, 13  # DLDeviceType


@dataclass(frozen=True)
class Arg:
    """One input as the caller gave it, classified: `value` is a numpy or CuPy array, or the
    caller's torch tensor (converted only once the backend is known)."""

    value: object
    kind: Kind
    device: Device
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class Caller:
    """The kind and device that results are returned as."""

    kind: Kind = Kind.NUMPY
    device: Device = CPU


def _module(name: str):
    """An already imported array library, or None: Panamera never imports torch or CuPy itself
    to classify an array (whoever made one has imported its library)."""
    return sys.modules.get(name)


def _is_torch(a) -> bool:
    torch = _module("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def _is_cupy(a) -> bool:
    cupy = _module("cupy")
    return cupy is not None and isinstance(getattr(cupy, "ndarray", ()), type) and isinstance(a, cupy.ndarray)


def torch_to_numpy_dtype(dtype, what: str = "tensor") -> np.dtype:
    """numpy's dtype of a torch dtype (bfloat16 is ml_dtypes'); others are a DTypeError naming `what`.

    >>> import torch  # doctest: +SKIP
    >>> torch_to_numpy_dtype(torch.bfloat16)  # doctest: +SKIP
    dtype(bfloat16)
    """
    torch = _module("torch")
    table = {
        torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
        torch.bfloat16: ml_dtypes.bfloat16, torch.int32: np.int32, torch.int64: np.int64, torch.bool: np.bool_,
        torch.int8: np.int8, torch.int16: np.int16, torch.uint8: np.uint8,
    }  # fmt: skip
    if dtype not in table:
        raise DTypeError(f"{what}: {dtype} has no numpy equivalent Panamera supports ({', '.join(SUPPORTED)})")
    return np.dtype(table[dtype])


def numpy_to_torch_dtype(dtype: np.dtype):
    """torch's dtype of a numpy dtype Panamera computes in."""
    torch = _module("torch")
    if dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype)).dtype


def adopt(a, name: str) -> Arg:
    """Classify the caller's input `a` (named `name` in errors) without copying it."""
    if isinstance(a, np.ndarray):
        return Arg(a, Kind.NUMPY, CPU, a.shape, a.dtype)
    if _is_torch(a):
        dev = Device(DeviceType.CUDA, a.device.index or 0) if a.device.type == "cuda" else CPU
        if a.device.type not in ("cpu", "cuda"):
            raise InputError(f"input {name!r}: a torch tensor on {a.device} (Panamera runs on CPU and CUDA tensors)")
        if a.layout != _module("torch").strided:
            raise InputError(
                f"input {name!r}: a torch tensor of layout {a.layout}; Panamera reads dense (strided) tensors: "
                "pass t.to_dense()"
            )
        return Arg(a, Kind.TORCH, dev, tuple(a.shape), torch_to_numpy_dtype(a.dtype, f"input {name!r}"))
    if _is_cupy(a):
        return Arg(a, Kind.CUPY, Device(DeviceType.CUDA, a.device.id), a.shape, a.dtype)
    if hasattr(a, "__dlpack__") and hasattr(a, "__dlpack_device__"):
        dev_type, index = a.__dlpack_device__()
        if int(dev_type) in (_DLPACK_CPU, _DLPACK_CUDA_HOST):
            v = np.from_dlpack(a)
            return Arg(v, Kind.DLPACK, CPU, v.shape, v.dtype)
        if int(dev_type) in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED):
            cupy = _import_cupy(name)
            v = cupy.from_dlpack(a)
            return Arg(v, Kind.DLPACK, Device(DeviceType.CUDA, int(index)), v.shape, v.dtype)
        raise InputError(f"input {name!r}: a DLPack array on device type {int(dev_type)} (CPU and CUDA only)")
    if hasattr(a, "__array__"):
        try:
            v = np.asarray(a)
        except (TypeError, ValueError) as e:  # e.g. a sparse matrix that refuses an implicit conversion
            raise InputError(f"input {name!r}: {type(a).__name__} does not convert to a dense array: {e}") from None
        return Arg(v, Kind.ARRAY, CPU, v.shape, v.dtype)
    raise InputError(
        f"input {name!r}: expected an array (numpy, CuPy, torch, or an object with __dlpack__ or __array__), "
        f"got {type(a).__name__}"
    )


def _import_cupy(name: str):
    try:
        import cupy
    except ImportError:
        raise InputError(f"input {name!r}: a CUDA array needs CuPy (pip install 'panamera[cuda12]')") from None
    return cupy


def refuse_grad(arg: Arg, name: str) -> None:
    """A torch input that requires grad while grad mode is on: a compiled kernel is not
    differentiable, so its results would silently leave the autograd graph (torch would give
    them a grad_fn). Refused, with the two ways out."""
    if arg.kind == Kind.TORCH and arg.value.requires_grad:
        torch = _module("torch")
        if torch.is_grad_enabled():
            raise InputError(
                f"input {name!r} requires grad and grad mode is on, but Panamera's compiled kernels are not "
                "differentiable (the results would have no grad_fn): call under torch.no_grad() or "
                "torch.inference_mode(), or pass t.detach()"
            )


def caller_of(args: Sequence[Arg]) -> Caller:
    """Whose kind the results take: torch if any input is a torch tensor, else CuPy, else a CUDA
    DLPack object (CuPy), else numpy; the device is that of the first such input, and every
    GPU input must be on it.

    >>> a = Arg(None, Kind.NUMPY, CPU, (), np.dtype("f4"))
    >>> caller_of([a]), caller_of([])
    (Caller(kind=<Kind.NUMPY: 'numpy'>, device=Device(type=<DeviceType.CPU: 'cpu'>, index=0)), Caller(kind=<Kind.NUMPY: 'numpy'>, device=Device(type=<DeviceType.CPU: 'cpu'>, index=0)))
    """
    gpus = {str(a.device) for a in args if a.device.type == DeviceType.CUDA}
    if len(gpus) > 1:
        raise InputError(f"inputs on several GPUs ({', '.join(sorted(gpus))}): move them to one device")
    for kind in (Kind.TORCH, Kind.CUPY, Kind.DLPACK):
        of_kind = [a for a in args if a.kind == kind and (kind != Kind.DLPACK or a.device.type == DeviceType.CUDA)]
        if of_kind:
            first = of_kind[0]
            device = first.device
            if kind == Kind.TORCH and gpus and device.type == DeviceType.CPU:  # torch CPU + a CUDA array
                device = next(a.device for a in args if a.device.type == DeviceType.CUDA)
            return Caller(Kind.CUPY if kind == Kind.DLPACK else kind, device)
    return Caller()


def describe(a, what: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, numpy dtype) of any array `adopt` accepts, for checks."""
    arg = adopt(a, what)
    return tuple(arg.shape), arg.dtype


# -- into the executor ------------------------------------------------------------------------
def _torch_plain(t):
    """A torch tensor as plain memory numpy or CuPy can view: no autograd, no lazy conjugate or
    negation, bfloat16 as uint16."""
    import torch

    t = t.detach().resolve_conj().resolve_neg()
    return t.view(torch.uint16) if t.dtype == torch.bfloat16 else t


def to_host(arg: Arg) -> np.ndarray:
    """A numpy array of the input: a view where it is on the CPU, else a copy."""
    v = arg.value
    if arg.kind == Kind.TORCH:
        t = _torch_plain(v)
        return (t if t.device.type == "cpu" else t.cpu()).numpy().view(arg.dtype)
    if isinstance(v, np.ndarray):
        return v
    return v.get()  # a CuPy array (a CuPy input, or a CUDA DLPack object)


def to_device(arg: Arg, cupy):
    """A CuPy array of the input on the current device: zero-copy (DLPack) where it is there."""
    v = arg.value
    if arg.kind == Kind.TORCH:
        t = _torch_plain(v)
        if t.device.type == "cpu":
            return cupy.asarray(t.numpy().view(arg.dtype))
        return cupy.from_dlpack(t).view(arg.dtype)
    return cupy.asarray(v)


@contextlib.contextmanager
def cuda_context(caller: Caller, cupy) -> Iterator[None]:
    """The caller's GPU as CuPy's current device and, for a torch caller, torch's current
    stream of that device as CuPy's current stream: the launches are ordered on it, and the
    executor keys its resident workspaces by it."""
    if caller.device.type != DeviceType.CUDA:
        yield
        return
    with cupy.cuda.Device(caller.device.index):
        if caller.kind == Kind.TORCH:
            import torch

            handle = torch.cuda.current_stream(caller.device.index).cuda_stream
            with cupy.cuda.ExternalStream(handle, caller.device.index):
                yield
        else:
            yield


# -- out of the executor ----------------------------------------------------------------------
def _as_torch(r, device: Device):
    import torch

    if isinstance(r, np.ndarray):
        bf16 = r.dtype == np.dtype(ml_dtypes.bfloat16)
        r = r if r.flags.c_contiguous else r.copy()  # (np.ascontiguousarray would make a 0-d array 1-d)
        t = torch.from_numpy(r.view(np.uint16) if bf16 else r)
        t = t.view(torch.bfloat16) if bf16 else t
        return t if device.type == DeviceType.CPU else t.to(str(device))
    bf16 = r.dtype == np.dtype(ml_dtypes.bfloat16)
    t = torch.utils.dlpack.from_dlpack(r.view(np.uint16) if bf16 else r)  # a CuPy array
    t = t.view(torch.bfloat16) if bf16 else t
    return t if device.type == DeviceType.CUDA else t.cpu()


def deliver(results: Sequence, caller: Caller) -> list:
    """The executor's numpy or CuPy results as the caller's kind, on the caller's device."""
    if caller.kind == Kind.TORCH:
        return [_as_torch(r, caller.device) for r in results]
    if caller.kind == Kind.CUPY:
        cupy = _import_cupy("result")
        return [cupy.asarray(r) for r in results]
    return [r if isinstance(r, np.ndarray) else r.get() for r in results]


def assign(dst, src, what: str) -> None:
    """numpy's `out=`: `src` (a result) written into the caller's array `dst`, whatever the two
    kinds; `dst` must be a numpy, CuPy or torch array of the same shape and dtype."""
    d, s = adopt(dst, what), adopt(src, what)
    if d.kind not in (Kind.NUMPY, Kind.CUPY, Kind.TORCH):
        raise InputError(f"{what}: expected a numpy, CuPy or torch array to write into, got {type(dst).__name__}")
    if tuple(d.shape) != tuple(s.shape):
        raise InputError(f"{what}: expected shape {tuple(s.shape)}, got {tuple(d.shape)}")
    if d.dtype != s.dtype:
        raise DTypeError(f"{what}: expected dtype {s.dtype}, got {d.dtype}")
    if d.kind == Kind.NUMPY and not dst.flags.writeable:
        raise InputError(f"{what}: the numpy array is read-only (flags.writeable is False): pass a writable one")
    if d.kind == Kind.TORCH:
        dst.copy_(src if s.kind == Kind.TORCH else _as_torch(s.value, d.device))
    elif d.kind == Kind.NUMPY:
        dst[...] = to_host(s)
    else:
        dst[...] = to_device(s, _import_cupy(what))
