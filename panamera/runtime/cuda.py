"""The cuda backend: CuPy RawModule (NVRTC), with a compile cache keyed by source.

Numerics on the GPU, decided per dtype (README, "On a GPU"): CuPy compiles every RawModule with
`-ftz=true` appended after the caller's options, and NVRTC contracts multiply-adds (FMA). We keep
both rather than fight CuPy's appended option:

- float32 and bfloat16 (computed in float32 registers): a denormal (|x| < 2**-126) counts as 0,
  so a result may differ from numpy by at most (elements reduced) x 2**-126 absolute;
- float16: every float16 value, denormals included, is a normal float32: nothing is flushed;
- float64 and the integer types: `-ftz` does not apply.

So a deterministic result is bit-stable run to run on one GPU but not bit-equal to the
emulator's; GPU tests compare with numpy under tolerances, never bitwise with the emulator.
"""

from __future__ import annotations

from ..errors import BackendError, CompileError

# -std=c++17 for the prelude's templates; CuPy adds -arch for the device and -ftz=true (above).
NVRTC_OPTIONS = ("-std=c++17",)

_modules: dict = {}


def available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def compile_error(log: str, source: str) -> CompileError:
    """NVRTC's log of a failed compile as a CompileError that shows the failing line.

    >>> src = 'int a;\\nint b = nope;\\n'
    >>> print(compile_error('kern.cu(2): error: identifier "nope" is undefined', src))
    NVRTC (cuda) rejected generated code at line 2: identifier "nope" is undefined
        1| int a;
        2| int b = nope;
    """
    from .emulator import _explain  # the same translation as g++'s and nvcc's errors

    return CompileError(_explain(log, source, "NVRTC (cuda)"))


def _cccl_include(cupy, source: str) -> tuple[str, ...]:
    """cooperative_groups.h (thread-block clusters, schedule/cluster.py) includes libcu++, which
    CUDA 13 keeps in include/cccl: that directory, where the toolkit has one."""
    if "cooperative_groups.h" not in source:
        return ()
    from pathlib import Path

    cccl = Path(cupy.cuda.get_cuda_path() or "/nonexistent", "include", "cccl")
    return (f"-I{cccl}",) if cccl.is_dir() else ()


def module(source: str):
    try:
        import cupy
    except ImportError as e:
        raise BackendError("cuda backend: CuPy is not installed (pip install 'panamera[cuda12]')") from e
    if not available():
        raise BackendError("cuda backend: no CUDA device is present; use target='emulator'")
    if source not in _modules:
        mod = cupy.RawModule(code=source, options=NVRTC_OPTIONS + _cccl_include(cupy, source))
        try:
            mod.compile()  # NVRTC runs here, not at the first get_function: report it as ours
        except cupy.cuda.compiler.CompileException as e:
            raise compile_error(str(e), source) from None
        _modules[source] = mod
    return _modules[source]
