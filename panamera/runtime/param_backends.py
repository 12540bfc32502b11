"""Where the kernels of a symbolic program run (panamera/dynamic.py): the emulator or CuPy.

A backend allocates buffers, passes pointers and `long long` extents to a kernel and launches it;
the symbolic executor decides everything else (grids from the bound sizes, resident workspaces),
the same way for both.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import arrays as arrays_mod
from . import cuda as cuda_backend
from . import emulator
from .executor import aligned_copy, aligned_empty, needs_copy

ALIGN = 16  # bytes: every input is aligned for the widest vector load (16 bytes)


class EmulatorBackend:
    name = "emulator"

    def __init__(self, source: str, signatures: dict, order: str = "forward", seed: int = 0):
        self.library = emulator.build(source, signatures)
        self.order, self.seed = order, seed

    def input(self, arg) -> np.ndarray:
        a = np.asarray(arrays_mod.to_host(arg))
        if needs_copy(a.ctypes.data, a.flags.c_contiguous, ALIGN):
            a = aligned_copy(np.ascontiguousarray(a))
        return a.reshape(-1)

    @staticmethod
    def empty(n: int, dtype) -> np.ndarray:
        return aligned_empty(n, dtype)

    @staticmethod
    def fill(buf, value) -> None:
        buf[...] = value

    @staticmethod
    def pointer(buf):
        return ctypes.c_void_p(buf.ctypes.data)

    @staticmethod
    def scalar(value: int):
        return ctypes.c_longlong(value)

    def launch(self, kernel: str, grid, block, args) -> None:
        emulator.launch(self.library, kernel, grid, block, args, self.order, self.seed)

    @staticmethod
    def copy(buf):
        return np.array(buf, copy=True)


class CudaBackend:
    """CuPy RawModule kernels on the current device and stream (runtime/cuda.py compiles)."""

    name = "cuda"

    def __init__(self, source: str, signatures: dict):
        self.module = cuda_backend.module(source)  # a clear BackendError without CuPy or a GPU
        import cupy

        self.cupy = cupy
        self.functions = {name: self.module.get_function(name) for name in signatures}

    def input(self, arg):
        a = self.cupy.asarray(arrays_mod.to_device(arg, self.cupy))
        if needs_copy(a.data.ptr, a.flags.c_contiguous, ALIGN):
            a = a.copy(order="C")
        return a.reshape(-1)

    def empty(self, n: int, dtype):
        dt = np.dtype(dtype)
        if dt.names:  # a struct workspace: raw bytes (CuPy has no structured dtypes)
            return self.cupy.empty(max(n, 1) * dt.itemsize, np.uint8)
        return self.cupy.empty(n, dt)

    @staticmethod
    def fill(buf, value) -> None:
        buf.fill(value)

    @staticmethod
    def pointer(buf):
        return buf

    @staticmethod
    def scalar(value: int):
        return np.int64(value)

    def launch(self, kernel: str, grid, block, args) -> None:
        self.functions[kernel](tuple(grid), tuple(block), tuple(args))

    @staticmethod
    def copy(buf):
        return buf.copy()
