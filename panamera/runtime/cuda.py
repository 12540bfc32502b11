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

The target: CuPy's RawModule takes no architecture. It appends its own `-arch=sm_XY` (or
`compute_XY`) from the device's numeric compute capability (cupy/cuda/compiler.py,
`_get_arch_for_options_for_nvrtc`), and a caller's `-arch` beside it is a duplicate NVRTC rejects
(NVRTC_ERROR_INVALID_OPTION, cupy/cupy#3292). A source with warpgroup MMAs needs the
arch-specific sm_90a (`nvcc.arch_for`), so `build` decides the target once: the device's own,
left to CuPy, or an arch-specific one, which Panamera compiles with NVRTC itself (the same
`-ftz=true`) and loads as a cubin (`RawModule(path=...)`), kept in the kernel cache on disk
(`cubin_KEY.cubin`, keyed by source, target, options, NVRTC's and CuPy's versions and the toolkit's
headers) as CuPy keeps its own; a cached cubin the driver refuses to load is rebuilt once, and a
second refusal is a BackendError.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..errors import BackendError, CompileError
from . import diskcache
from .nvcc import arch_for

# -std=c++17 for the prelude's templates; CuPy adds -arch for the device and -ftz=true (above).
NVRTC_OPTIONS = ("-std=c++17",)


@dataclass(frozen=True)
class Build:
    """How the cuda backend compiles one source on one device: `target` (nvcc.arch_for's choice),
    NVRTC's `options`, and `own`: True where Panamera runs NVRTC itself (an arch-specific target,
    which CuPy cannot ask for), False where CuPy's RawModule compiles for the device.

    >>> build("pn_wgmma<64, __half>(d, a, b);", "sm_90")
    Build(target='sm_90a', options=('--gpu-architecture=sm_90a', '-std=c++17', '-ftz=true'), own=True)
    >>> build("pn_wgmma<64, __half>(d, a, b);", "sm_80").options
    ('-std=c++17',)
    """

    target: str
    options: tuple[str, ...]
    own: bool


def build(source: str, device_arch: str, include: tuple[str, ...] = ()) -> Build:
    """The Build of `source` on a device of `device_arch` ("sm_90"); `include`: extra -I options."""
    target = arch_for(source, device_arch)
    if target == device_arch:
        return Build(target, NVRTC_OPTIONS + include, own=False)
    return Build(target, (f"--gpu-architecture={target}", *NVRTC_OPTIONS, "-ftz=true", *include), own=True)


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


def cubin_key(
    source: str, b: Build, options: tuple[str, ...], nvrtc_version, cupy_version: str = "", toolkit: str = ""
) -> str:
    """The disk-cache key of an arch-specific cubin: everything NVRTC's output depends on, the
    source, the target, the options it really gets (CuPy's include directories among them),
    NVRTC's version, CuPy's (the options name its include directory by path only: an upgrade
    in place changes the headers there, not the path) and the toolkit whose headers
    `-I<cuda>/include` reaches (`toolkit_identity`: a pip NVRTC beside another system toolkit).

    >>> b = build("pn_wgmma<64, __half>(d, a, b);", "sm_90")
    >>> k = cubin_key("src", b, b.options, (12, 4))
    >>> len(k), k == cubin_key("src", b, b.options, (12, 8)), k == cubin_key("src", b, b.options, (12, 4), "14.0")
    (24, False, False)
    >>> k == cubin_key("src", b, b.options, (12, 4), "", "/usr/local/cuda|1f2e")
    False
    """
    parts = (source, b.target, " ".join(options), ".".join(map(str, nvrtc_version)), cupy_version, toolkit)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


TOOLKIT_HEADERS = ("cuda.h", "cuda_runtime_api.h", "mma.h", "cuda_pipeline.h", "cooperative_groups.h")


def toolkit_identity(cuda_path: str | None) -> str:
    """The CUDA toolkit headers NVRTC reads through `-I<cuda_path>/include` (mma.h, cuda_pipeline.h,
    cooperative_groups.h; cuda.h carries CUDA_VERSION), as a key: the path, and each header's size
    and a hash of its bytes; "" without a toolkit. Headers they include in turn change with them
    in a toolkit release.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "include").mkdir()
    >>> _ = (d / "include" / "cuda.h").write_text("#define CUDA_VERSION 12040")
    >>> a = toolkit_identity(str(d))
    >>> _ = (d / "include" / "cuda.h").write_text("#define CUDA_VERSION 12080")
    >>> a == toolkit_identity(str(d)), toolkit_identity(None)
    (False, '')
    """
    if not cuda_path:
        return ""
    from pathlib import Path

    inc = Path(cuda_path, "include")
    found = []
    for name in TOOLKIT_HEADERS:
        try:
            data = (inc / name).read_bytes()
        except OSError:
            continue
        found.append(f"{name}:{len(data)}:{hashlib.sha256(data).hexdigest()[:16]}")
    return "|".join([str(inc), *found])


def _nvrtc_cubin(nvrtc, source: str, options: tuple[str, ...]) -> bytes:
    """`source` compiled by NVRTC with `options` to a cubin; its rejection as a CompileError."""
    prog = nvrtc.createProgram(source, "panamera.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(prog, list(options))
        except nvrtc.NVRTCError:
            raise compile_error(nvrtc.getProgramLog(prog), source) from None
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def _own_module(cupy, source: str, b: Build):
    """`source` compiled by NVRTC with `b.options` (plus CuPy's own include directories, as a
    RawModule of code gets them) and loaded as a cubin: a RawModule like CuPy's. The cubin is kept
    in the kernel cache (runtime/diskcache.py: private directory, verified by its SHA-256), so a
    later process loads it instead of running NVRTC again."""
    nvrtc = cupy.cuda.nvrtc
    core = getattr(getattr(cupy, "_core", None), "core", None)
    assemble = getattr(core, "assemble_cupy_compiler_options", None)
    options = tuple(assemble(b.options)) if assemble else b.options
    toolkit = toolkit_identity(cupy.cuda.get_cuda_path())
    key = cubin_key(source, b, options, nvrtc.getVersion(), str(getattr(cupy, "__version__", "")), toolkit)
    return diskcache.load(
        diskcache.directory() / f"cubin_{key}.cubin",
        lambda: _nvrtc_cubin(nvrtc, source, options),
        "cuda backend",
        lambda path: _load_cubin(cupy, path),
        (cupy.cuda.driver.CUDADriverError,),
    )


def _load_cubin(cupy, path):
    """A RawModule of the cubin at `path`, loaded now (CuPy loads lazily, at the first kernel): a
    cubin the driver refuses (a driver older than the NVRTC that built it) fails here, where the
    cache rebuilds it once (diskcache.load) instead of at the launch."""
    mod = cupy.RawModule(path=str(path))
    mod.compile()  # a file module: cuModuleLoad on the current device
    return mod


def module(source: str):
    try:
        import cupy
    except ImportError as e:
        raise BackendError("cuda backend: CuPy is not installed (pip install 'panamera[cuda12]')") from e
    if not available():
        raise BackendError("cuda backend: no CUDA device is present; use target='emulator'")
    b = build(source, f"sm_{cupy.cuda.Device().compute_capability}", _cccl_include(cupy, source))
    if (source, b.target) not in _modules:
        if b.own:
            mod = _own_module(cupy, source, b)
        else:
            mod = cupy.RawModule(code=source, options=b.options)
            try:
                mod.compile()  # NVRTC runs here, not at the first get_function: report it as ours
            except cupy.cuda.compiler.CompileException as e:
                raise compile_error(str(e), source) from None
        _modules[source, b.target] = mod
    return _modules[source, b.target]
