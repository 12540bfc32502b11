"""The cuda backend's target, without a GPU (issue 25): a source with warpgroup MMAs is compiled for
sm_90a by NVRTC itself and loaded as a cubin (CuPy's RawModule takes no architecture and rejects a
second -arch), a plain source goes to RawModule as before; detect offers wgmma on sm_90 devices
whose NVRTC and driver know sm_90a. A fake `cupy` module records what would reach CuPy."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from panamera import cache
from panamera.errors import BackendError, CompileError
from panamera.model import detect
from panamera.runtime import cuda, diskcache

WGMMA = "__global__ void k() { pn_wgmma<64, __half>(d, a, b); }\n"
PLAIN = "__global__ void k() { nvcuda::wmma::mma_sync(d, a, b, d); }\n"


class _NVRTCError(RuntimeError):
    pass


class _DriverError(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path):
    """Every test's kernel cache is its own directory (cubins land there, never in ~/.cache)."""
    monkeypatch.setenv("PANAMERA_CACHE", str(tmp_path / "cache"))


def fake_cupy(
    monkeypatch, cc="90", fail=False, nvrtc_version=(12, 4), driver=12040, version="13.6.0", refusals=0, cuda_path=None
):
    """A stand-in `cupy` on sys.modules; returns its record of RawModule and NVRTC calls. The
    driver refuses the first `refusals` cubins it is asked to load."""
    calls = {"raw": [], "nvrtc": [], "refusals": refusals}

    class RawModule:
        def __init__(self, **kw):
            calls["raw"].append(kw)

        def compile(self):
            if "path" in calls["raw"][-1] and calls["refusals"] > 0:
                calls["refusals"] -= 1
                raise _DriverError("CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the provided PTX was compiled with an "
                                   "unsupported toolchain.")  # fmt: skip

    def compile_program(prog, options):
        calls["nvrtc"].append(tuple(options))
        if fail:
            raise _NVRTCError("NVRTC_ERROR_COMPILATION")

    nvrtc = types.SimpleNamespace(
        NVRTCError=_NVRTCError,
        createProgram=lambda src, name, headers, names: 7,
        compileProgram=compile_program,
        getCUBIN=lambda prog: b"cubin bytes",
        getProgramLog=lambda prog: 'panamera.cu(1): error: identifier "d" is undefined',
        destroyProgram=lambda prog: None,
        getVersion=lambda: nvrtc_version,
    )
    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        driverGetVersion=lambda: driver,
        getDeviceProperties=lambda i: {"name": b"NVIDIA H100 80GB HBM3", "major": int(cc[:-1]), "minor": int(cc[-1])},
    )
    fake = types.SimpleNamespace(
        __version__=version,
        RawModule=RawModule,
        cuda=types.SimpleNamespace(
            runtime=runtime,
            nvrtc=nvrtc,
            Device=lambda: types.SimpleNamespace(compute_capability=cc),
            compiler=types.SimpleNamespace(CompileException=RuntimeError),
            get_cuda_path=lambda: cuda_path,
            driver=types.SimpleNamespace(CUDADriverError=_DriverError),
        ),
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(cuda, "_modules", {})
    return calls


def test_a_plain_source_goes_to_rawmodule_with_cupys_target(monkeypatch):
    calls = fake_cupy(monkeypatch)
    cuda.module(PLAIN)
    assert calls["raw"] == [{"code": PLAIN, "options": cuda.NVRTC_OPTIONS}] and calls["nvrtc"] == []


def test_a_wgmma_source_is_compiled_for_sm90a_and_loaded_as_a_cubin(monkeypatch):
    calls = fake_cupy(monkeypatch)
    cuda.module(WGMMA)
    (opts,) = calls["nvrtc"]
    assert "--gpu-architecture=sm_90a" in opts and "-ftz=true" in opts and "-std=c++17" in opts
    assert not any(o.startswith("-arch") for o in opts)  # one target, never CuPy's beside ours
    (raw,) = calls["raw"]
    assert set(raw) == {"path"} and open(raw["path"], "rb").read() == b"cubin bytes"
    cuda.module(WGMMA)  # cached per source and target
    assert len(calls["nvrtc"]) == 1


def _new_process(monkeypatch):
    """What a later process sees: the in-memory module table empty, the disk cache kept."""
    monkeypatch.setattr(cuda, "_modules", {})


def test_the_sm90a_cubin_is_kept_on_disk_for_the_next_process(monkeypatch, tmp_path):
    calls = fake_cupy(monkeypatch)
    cuda.module(WGMMA)
    (path,) = [r["path"] for r in calls["raw"]]
    assert Path(path).parent == tmp_path / "cache" and Path(path).name.startswith("cubin_")
    assert diskcache.verified(Path(path))  # with its SHA-256 sidecar, as the emulator's libraries
    _new_process(monkeypatch)
    cuda.module(WGMMA)
    assert len(calls["nvrtc"]) == 1 and calls["raw"][1] == {"path": path}  # loaded, NVRTC not run again
    info = cache.disk_info()
    assert info.files == 1 and info.bytes > 0  # `panamera cache info` counts it, `cache clear` removes it
    assert cache.disk_clear() == 1 and not Path(path).exists()


@pytest.mark.parametrize("change", ["source", "nvrtc", "options", "cupy"])
def test_a_new_source_nvrtc_option_or_cupy_compiles_again(monkeypatch, change):
    """CuPy's version too: its include directory (in the options by path) holds other headers after
    an upgrade in place."""
    calls = fake_cupy(monkeypatch)
    cuda.module(WGMMA)
    first = calls["raw"][0]["path"]
    source, version, cupy_version = WGMMA, (12, 4), "13.6.0"
    if change == "source":
        source = WGMMA + "// another kernel\n"
    elif change == "nvrtc":
        version = (12, 8)
    elif change == "cupy":
        cupy_version = "14.0.0"
    else:
        monkeypatch.setattr(cuda, "NVRTC_OPTIONS", ("-std=c++20",))
    calls = fake_cupy(monkeypatch, nvrtc_version=version, version=cupy_version)  # a later process, the cache kept
    cuda.module(source)
    assert len(calls["nvrtc"]) == 1 and calls["raw"][0]["path"] != first


def test_a_corrupt_cached_cubin_is_rebuilt(monkeypatch, caplog):
    calls = fake_cupy(monkeypatch)
    cuda.module(WGMMA)
    path = Path(calls["raw"][0]["path"])
    path.write_bytes(b"truncated")
    _new_process(monkeypatch)
    cuda.module(WGMMA)
    assert len(calls["nvrtc"]) == 2 and path.read_bytes() == b"cubin bytes" and "rebuilding" in caplog.text


def test_a_cached_cubin_the_driver_refuses_is_rebuilt_once(monkeypatch, caplog):
    calls = fake_cupy(monkeypatch)
    cuda.module(WGMMA)
    _new_process(monkeypatch)
    calls = fake_cupy(monkeypatch, refusals=1)  # e.g. the driver was downgraded under the same NVRTC
    cuda.module(WGMMA)
    assert len(calls["nvrtc"]) == 1 and len(calls["raw"]) == 2 and "does not load" in caplog.text


def test_a_cubin_refused_twice_is_a_backend_error(monkeypatch):
    fake_cupy(monkeypatch, refusals=2)
    with pytest.raises(BackendError, match="cuda backend: .*does not load: CUDA_ERROR_UNSUPPORTED_PTX_VERSION"):
        cuda.module(WGMMA)


def test_other_toolkit_headers_compile_again(monkeypatch, tmp_path):
    """The toolkit's headers (mma.h, cuda_pipeline.h) reach NVRTC through -I<cuda>/include: another
    toolkit at that path keys the cubin apart, though NVRTC's own version is the same."""
    inc = tmp_path / "cuda" / "include"
    inc.mkdir(parents=True)
    (inc / "cuda.h").write_text("#define CUDA_VERSION 12040\n")
    calls = fake_cupy(monkeypatch, cuda_path=str(tmp_path / "cuda"))
    cuda.module(WGMMA)
    (inc / "cuda.h").write_text("#define CUDA_VERSION 12080\n")
    _new_process(monkeypatch)
    again = fake_cupy(monkeypatch, cuda_path=str(tmp_path / "cuda"))
    cuda.module(WGMMA)
    assert len(again["nvrtc"]) == 1 and again["raw"][0]["path"] != calls["raw"][0]["path"]


def test_a_wgmma_source_on_sm80_is_left_to_cupy(monkeypatch):
    calls = fake_cupy(monkeypatch, cc="80")
    cuda.module(WGMMA)  # the PTX is guarded: it traps there, and the planner never offers it on sm_80
    assert calls["raw"] == [{"code": WGMMA, "options": cuda.NVRTC_OPTIONS}] and calls["nvrtc"] == []


def test_nvrtcs_rejection_is_a_compile_error_naming_the_line(monkeypatch):
    fake_cupy(monkeypatch, fail=True)
    with pytest.raises(CompileError, match="line 1"):
        cuda.module(WGMMA)


@pytest.mark.parametrize(
    "cc,nvrtc_version,driver,offered",
    [("90", (12, 4), 12040, True), ("90", (11, 8), 12040, False), ("90", (12, 4), 11080, False),
     ("89", (12, 4), 12040, False), ("100", (12, 8), 12080, False)],
)  # fmt: skip
def test_detect_offers_wgmma_on_sm90_with_an_sm90a_toolchain(monkeypatch, cc, nvrtc_version, driver, offered):
    fake_cupy(monkeypatch, cc=cc, nvrtc_version=nvrtc_version, driver=driver)
    detect.detect.cache_clear()
    try:
        assert detect.detect().warpgroup_mma is offered
    finally:
        detect.detect.cache_clear()
