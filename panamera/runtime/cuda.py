"""The cuda backend: CuPy RawModule (NVRTC), with a compile cache keyed by source."""

from __future__ import annotations

from ..errors import BackendError

_modules: dict = {}


def available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def module(source: str):
    try:
        import cupy
    except ImportError as e:
        raise BackendError("cuda backend: CuPy is not installed (pip install 'panamera[cuda12]')") from e
    if not available():
        raise BackendError("cuda backend: no CUDA device is present; use target='emulator'")
    if source not in _modules:
        _modules[source] = cupy.RawModule(code=source, options=("-std=c++17",))
    return _modules[source]
