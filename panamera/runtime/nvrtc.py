"""Source -> GPU binary through NVRTC, the path the CUDA backend (CuPy's RawModule) takes, without
a GPU: NVRTC is a library, so the time a user waits for a kernel's binary can be measured on any
machine that has it (the `nvidia-cuda-nvrtc` wheel of the dev extra, or CuPy's CUDA toolkit).

>>> from panamera.runtime import nvrtc
>>> nvrtc.available() in (True, False)
True
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
import time
from pathlib import Path

from ..errors import BackendError, CompileError
from .emulator import _explain
from .nvcc import arch_for


@functools.cache
def _library() -> ctypes.CDLL | None:
    names = []
    for base in sys.path:
        names += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libnvrtc.so*")))
        names += sorted(glob.glob(os.path.join(base, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*")))
    names += ["libnvrtc.so"]
    for name in names:
        if "builtins" in name or name.endswith(".alt.so"):
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _include_dirs() -> list[str]:
    """The CUDA headers the 16-bit prelude includes (cuda_fp16.h): the nvcc wheel's, and its cccl/."""
    out = []
    for base in sys.path:
        out += glob.glob(os.path.join(base, "nvidia", "*", "include"))
        out += glob.glob(os.path.join(base, "nvidia", "cuda_runtime", "include"))
    found = [d for d in out if Path(d, "cuda_fp16.h").exists()]
    # cooperative_groups.h (thread-block clusters) includes libcu++, which CUDA 13 keeps in cccl/
    return found + [str(Path(d, "cccl")) for d in found if Path(d, "cccl").is_dir()]


def available() -> bool:
    return _library() is not None


def compile_source(source: str, arch: str = "sm_90") -> float:
    """Compile `source` to a `arch` binary with NVRTC; returns the seconds it took. A rejected
    source is a CompileError naming the line, as the emulator and nvcc paths report it."""
    lib = _library()
    if lib is None:
        raise BackendError("nvrtc: libnvrtc not found (pip install nvidia-cuda-nvrtc)")
    prog = ctypes.c_void_p()
    opts = [f"--gpu-architecture={arch_for(source, arch)}", "-std=c++17", *(f"-I{d}" for d in _include_dirs())]
    argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    t0 = time.perf_counter()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"panamera.cu", 0, None, None):
        raise BackendError("nvrtc: nvrtcCreateProgram failed")
    try:
        status = lib.nvrtcCompileProgram(prog, len(opts), argv)
        elapsed = time.perf_counter() - t0
        if status:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise CompileError(_explain(log.value.decode(errors="replace"), source, f"nvrtc {arch}"))
        return elapsed
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
