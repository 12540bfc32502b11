"""The options of a compile and the choice of target: `Options.make` checks what the caller gave
and resolves `target="auto"` (`auto_target`: cuda with a GPU, else `host_target`); `_fall_back`
is the emulator that runs what "auto"'s cpu refuses.

>>> Options.make(target="emulator", gpu="a100").gpu.name
'A100-SXM4-80GB'
>>> str(Options.make(target="emulator").target)
'emulator'
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field

import numpy as np

from . import logs
from .enums import StrEnum
from .errors import EmulatorWarning, OptionError, PanameraError, ScheduleError
from .model.detect import resolve as resolve_gpu
from .model.gpu import H100, GPUSpec
from .runtime import cuda as cuda_backend
from .schedule.saved import Schedule

_log = logs.get("compiler")


class Target(StrEnum):
    AUTO = "auto"  # cuda with a GPU, else cpu (what the CPU target refuses: the emulator, with the reason)
    CUDA = "cuda"
    EMULATOR = "emulator"
    CPU = "cpu"  # C++ with OpenMP + SIMD for this machine's cores (cpu_target.py)


@dataclass(frozen=True)
class Options:
    """Everything that steers a compile besides the graph; hashable (a cache key)."""

    target: Target = Target.EMULATOR
    deterministic: bool = False
    gpu: GPUSpec = H100
    split: int | None = None
    schedule: Schedule | None = None
    gpu_origin: str = field(default="", compare=False)  # why this GPU (explain): named, given or detected
    auto: bool = field(default=False, compare=False)  # target="auto" chose `target`: a CPU refusal falls back

    @staticmethod
    def make(target="auto", deterministic=False, gpu=None, split=None, schedule=None) -> Options:
        """Checked options; `target="auto"` is resolved here."""
        try:
            target = Target(target)
        except ValueError:
            raise OptionError(f"compile: unknown target {target!r}; use 'auto', 'cuda', 'emulator' or 'cpu'") from None
        auto = target == Target.AUTO
        if auto:
            target = auto_target()
        gpu, origin = resolve_gpu(gpu)  # a GPUSpec, a name ("a100"), or None: the GPU CuPy sees, else H100
        if isinstance(split, np.integer):
            split = int(split)
        if split is not None and (isinstance(split, bool) or not isinstance(split, int) or split < 1):
            raise OptionError(f"compile: split must be a positive int (blocks per reduction), got {split!r}")
        if schedule is not None and not isinstance(schedule, Schedule):
            raise OptionError(f"compile: schedule must be a Schedule, got {type(schedule).__name__}")
        if schedule is not None and schedule.gpu != gpu.name:
            raise ScheduleError(f"schedule was made for {schedule.gpu}, not {gpu.name}")
        return Options(target, bool(deterministic), gpu, split, schedule, origin, auto)


def auto_target() -> Target:
    """What `target="auto"` means on this machine: cuda with a GPU (CuPy sees one), else
    `host_target()`."""
    return Target.CUDA if cuda_backend.available() else host_target()


def host_target() -> Target:
    """Where programs on host arrays run by default (auto without a GPU, torch CPU tensors): the
    CPU target. The test suite pins it to the emulator, which checks the CUDA source
    (tests/conftest.py)."""
    return Target.CPU


def _fall_back(options: Options, why: PanameraError) -> Options:
    """target="auto" chose cpu, which refuses this program: the emulator runs it instead (a
    correctness tool, not a fast path), and an EmulatorWarning says why."""
    text = (
        "{auto} chose the CPU target, which refuses this program ({why}); it runs on the CPU emulator "
        "instead, a correctness tool, not a fast CPU path; {emulator} says so explicitly"
    )
    warnings.warn(
        EmulatorWarning(
            text.format(auto='target="auto"', why=why, emulator='target="emulator"'),
            shell=text.format(auto="--target auto", why=why, emulator="--target emulator"),
        ),
        stacklevel=3,
    )
    _log.info("target auto: cpu refused the program (%s); emulator instead", why)
    return dataclasses.replace(options, target=Target.EMULATOR)
