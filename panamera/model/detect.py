"""The GPU to plan for: by name, or detected from the device's properties.

`spec_from_properties` builds a `GPUSpec` from what `cudaGetDeviceProperties` reports (CuPy's
`cupy.cuda.runtime.getDeviceProperties`: SM count, clocks, memory bus width and clock, L2, shared
memory, thread and block limits). A device whose name matches a GPU with published measurements
(H100, H200, A100) keeps that GPU's calibrated terms (model/gpu.py) with the device's own figures;
any other sm_80+ device takes the terms of its generation's GPU, marked assumed, and has no
measured limit. `default_gpu` is the detected device when CuPy sees one, else H100.

>>> props = {"name": b"NVIDIA H100 PCIe", "major": 9, "minor": 0, "multiProcessorCount": 114,
...          "clockRate": 1755000, "memoryClockRate": 1593000, "memoryBusWidth": 5120,
...          "l2CacheSize": 50 * 2**20, "sharedMemPerBlockOptin": 232448,
...          "maxThreadsPerMultiProcessor": 2048, "maxBlocksPerMultiProcessor": 32}
>>> g = spec_from_properties(props)
>>> g.name, g.sms, round(g.dram_bw / 1e12, 2)
('NVIDIA H100 PCIe', 114, 2.04)
>>> gpu_by_name("a100").name
'A100-SXM4-80GB'
"""

from __future__ import annotations

import dataclasses
import functools

from ..errors import OptionError
from .gpu import A100, GPUS, H100, H200, GPUSpec

MIN_MAJOR = 8  # sm_80: the generated kernels' floor (cp.async, bf16)
# name fragments of devices with published measurements, most specific first
KNOWN = (("h200", H200), ("h100", H100), ("gh200", H100), ("a100", A100))


def gpu_by_name(name: str) -> GPUSpec:
    """The GPU called `name`: a short name of `model.gpu.GPUS` ("h100", "a100", ...) or a spec's
    full name ("H100-SXM5"), any case. Anything else is an OptionError listing the names."""
    key = name.strip().lower()
    if key in GPUS:
        return GPUS[key]
    for g in GPUS.values():
        if g.name.lower() == key:
            return g
    raise OptionError(f"gpu: unknown GPU {name!r}; the GPUs with specs are {', '.join(sorted(GPUS))}")


def _base(name: str, major: int) -> GPUSpec:
    low = name.lower()
    for frag, g in KNOWN:
        if frag in low:
            return g
    return H100 if major >= 9 else A100


# sm_90a (wgmma's target): NVRTC and the driver of CUDA 12.0 first know it
SM90A_NVRTC = (12, 0)
SM90A_DRIVER = 12000


def arch_specific_ok(nvrtc_version: tuple[int, int], driver_version: int) -> bool:
    """Whether this NVRTC and driver build and load an arch-specific sm_90a binary (the cuda
    backend compiles warpgroup-MMA sources for it, runtime/cuda.py).

    >>> arch_specific_ok((12, 4), 12040), arch_specific_ok((11, 8), 12040)
    (True, False)
    """
    return tuple(nvrtc_version) >= SM90A_NVRTC and driver_version >= SM90A_DRIVER


def spec_from_properties(props: dict, arch_specific: bool = False) -> GPUSpec:
    """A GPUSpec from a `cudaGetDeviceProperties` dict (CuPy's keys). Figures the driver reports
    replace the base GPU's; a field it leaves out (or reports as 0) keeps the base's. Raises
    OptionError for a GPU below sm_80. `arch_specific`: the toolchain builds sm_90a
    (`arch_specific_ok`); with it an sm_90 device offers warpgroup MMAs."""
    raw = props.get("name", b"")
    name = (raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)).strip("\x00 ") or "GPU"
    major = int(props.get("major", 0))
    if major < MIN_MAJOR:
        raise OptionError(
            f"gpu: {name} is sm_{major}{props.get('minor', 0)}; Panamera's kernels need sm_80 or newer "
            f"(pass gpu='h100' or another of {', '.join(sorted(GPUS))} to plan for one)"
        )
    base = _base(name, major)

    def got(key: str) -> float:
        v = props.get(key) or 0
        return float(v)

    mem_clock, bus = got("memoryClockRate"), got("memoryBusWidth")  # kHz, bits
    peak = 2 * mem_clock * 1e3 * bus / 8 if mem_clock and bus else base.dram_bw  # double data rate
    known = base.name.split("-")[0].lower() in name.lower()
    fields = {
        "name": name,
        "sms": int(got("multiProcessorCount")) or base.sms,
        "clock_hz": got("clockRate") * 1e3 or base.clock_hz,
        "dram_bw": peak,
        "l2_size": int(got("l2CacheSize")) or base.l2_size,
        "smem_per_block": int(got("sharedMemPerBlockOptin")) or base.smem_per_block,
        "smem_per_sm": int(got("sharedMemPerMultiprocessor")) or base.smem_per_sm,
        "smem_reserved_per_block": int(got("reservedSharedMemPerBlock")) or base.smem_reserved_per_block,
        "max_threads_sm": int(got("maxThreadsPerMultiProcessor")) or base.max_threads_sm,
        "max_blocks_sm": int(got("maxBlocksPerMultiProcessor")) or base.max_blocks_sm,
        "vector_atomics": major >= 9,
        # wgmma exists on sm_90 devices only, compiled for sm_90a (runtime/cuda.py builds such sources
        # for it where NVRTC and the driver know the target)
        "warpgroup_mma": arch_specific and (major, int(props.get("minor", 0))) == (9, 0),
    }
    same = all(
        abs(getattr(base, k) - v) <= 0.02 * abs(getattr(base, k))
        for k, v in fields.items()
        if k not in ("name", "warpgroup_mma")
    )
    tag = "measured on this GPU" if known and same else f"assumed: {base.name}'s (no measurement on {name})"
    sources = (
        (
            "sms/clock_hz/dram_bw/l2_size/smem/limits",
            "[spec] cudaGetDeviceProperties (bandwidth: 2 x memory clock x bus width)",
        ),  # fmt: skip
        ("calibrated terms", f"[{'measured' if known and same else 'assumed'}] {tag}"),
        *((k, v) for k, v in base.sources if not k.startswith("sms/")),
    )
    if known and same:  # the calibrated GPU itself: its name keys the schedule database and saved schedules
        fields["name"] = base.name
    return dataclasses.replace(
        base, **fields, sources=sources, measured_limit=base.measured_limit if known and same else None
    )


@functools.cache
def detect() -> GPUSpec | None:
    """The spec of CUDA device 0 as CuPy sees it, or None (no CuPy, no device, or below sm_80)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        ok = arch_specific_ok(cupy.cuda.nvrtc.getVersion(), cupy.cuda.runtime.driverGetVersion())
        return spec_from_properties(cupy.cuda.runtime.getDeviceProperties(0), arch_specific=ok)
    except Exception:  # no CuPy, no driver, no device, an old GPU: plan for the default
        return None


def default_gpu() -> tuple[GPUSpec, str]:
    """(the GPU to plan for when none is named, why): the detected device, else H100."""
    g = detect()
    if g is not None:
        return g, f"{g.name}: the GPU CuPy sees"
    return H100, "H100-SXM5: the default (CuPy sees no sm_80+ GPU)"


def resolve(gpu) -> tuple[GPUSpec, str]:
    """A `gpu=` option as given (a GPUSpec, a name, or None for the default) and why it is that GPU."""
    if gpu is None:
        return default_gpu()
    if isinstance(gpu, GPUSpec):
        return gpu, f"{gpu.name}: given"
    if isinstance(gpu, str):
        g = gpu_by_name(gpu)
        return g, f"{g.name}: named {gpu!r}"
    raise OptionError(
        f"compile: gpu must be a GPUSpec or a GPU name ({', '.join(sorted(GPUS))}), got {type(gpu).__name__}"
    )
