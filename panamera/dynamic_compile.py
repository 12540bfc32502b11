"""The compiler's entry for symbolic graphs (issue 22; registered in compiler.SYMBOLIC on import,
by panamera/__init__.py): the target (dynamic.py `resolve_target`), the program for it (`_program`: the CPU's
kernels, dynamic_cpu.py; decode attention's fused plan, dynamic_attention.py; else
dynamic.py's `DynamicCompiled`), a plan replayed from the schedule database (`_from_database`)
and the in-memory cache of programs (`compile_symbolic`).
"""

from __future__ import annotations

import warnings

from . import cache as compile_cache
from . import compiler
from .dynamic import DynamicCompiled, resolve_target
from .errors import EmulatorWarning, OptionError, ScheduleError, StaleScheduleWarning, TargetRefused
from .model.detect import resolve as resolve_gpu
from .poly.param_attention import recognize_symbolic
from .schedule import database
from .schedule.param_schedule import SymbolicSchedule


def _program(outputs, single: bool, target: str, deterministic: bool, gpu, schedule) -> DynamicCompiled:
    """On the CPU target, the parametric program's CPU kernels (dynamic_cpu.py); else decode
    attention's fused plan over the symbols where it is legal (dynamic_attention.py) and the
    schedule, if any, is a fused one; else the parametric program (poly/params.py)."""
    if resolve_target(target) == "cpu":
        from .dynamic_cpu import DynamicCpuCompiled

        if schedule is not None:
            raise OptionError("target='cpu': schedule= replays GPU class plans; a symbolic CPU program has none")
        if recognize_symbolic(tuple(outputs)) is not None:
            raise TargetRefused(
                "target='cpu': a symbolic fused attention has no CPU kernels (its chain's contractions are not "
                "symbolic either); compile it at concrete sizes (DynamicCompiled.specialize) or on the emulator"
            )
        return DynamicCpuCompiled(outputs, single, deterministic, gpu)
    fused = recognize_symbolic(tuple(outputs))
    if fused is not None and (schedule is None or schedule.formulations == ("attention=fused",)):
        from .dynamic_attention import DynamicAttention

        return DynamicAttention(outputs, single, target, deterministic, gpu, fused, schedule)
    return DynamicCompiled(outputs, single, target, deterministic, gpu, schedule)


def _from_database(outputs, single: bool, target: str, deterministic: bool, gpu) -> DynamicCompiled | None:
    """The program with its class plans replayed from the database entry of its signature, or
    None (no entry, or a stale one: skipped with a one-line StaleScheduleWarning)."""
    entry = database.lookup(database.signature(tuple(outputs)), resolve_gpu(gpu)[0].name)
    if entry is None:
        return None
    if not isinstance(entry.schedule, SymbolicSchedule):
        warnings.warn(f"schedules/{entry.name}: skipped (a static schedule for a symbolic program)",
                      StaleScheduleWarning, stacklevel=4)  # fmt: skip
        return None
    try:
        k = _program(outputs, single, target, deterministic, gpu, entry.schedule)
    except ScheduleError as e:
        warnings.warn(f"schedules/{entry.name}: skipped ({e})", StaleScheduleWarning, stacklevel=4)
        return None
    k.origin = f"from schedules/{entry.name}"
    return k


_PROGRAMS: dict = {}  # the in-memory cache of symbolic programs, by graph and options


def compile_symbolic(
    outputs, single: bool, target: str, deterministic: bool, gpu, split, schedule, cache=True, use_database=True
):
    """The compiler's entry for symbolic graphs (registered in compiler.SYMBOLIC): a program
    compiled before (the same graph and options) is returned with its classes. A plain compile
    (no schedule, not deterministic) replays the schedule database's entry for the program's
    signature (schedule/database.py); a stale one is skipped with a StaleScheduleWarning."""
    if split is not None:
        raise OptionError("compile: split= is a static override; a symbolic program decides the split per size class")
    if schedule is not None and not isinstance(schedule, SymbolicSchedule):
        raise OptionError(f"compile: a symbolic program replays a SymbolicSchedule, got {type(schedule).__name__}")
    gpu_name = resolve_gpu(gpu)[0].name
    auto, target = str(target) == "auto", resolve_target(target)
    database_ok = use_database and target != "cpu"  # the database holds GPU class plans
    key = (compile_cache.graph_key(outputs), target, bool(deterministic), gpu_name, single, bool(database_ok))
    if cache and schedule is None and key in _PROGRAMS:
        return _PROGRAMS[key]
    k = _from_database(outputs, single, target, deterministic, gpu) if database_ok and not (
        schedule is not None or deterministic
    ) else None  # fmt: skip
    if k is None:
        try:
            k = _program(outputs, single, target, deterministic, gpu, schedule)
        except TargetRefused as e:  # auto chose cpu, which refuses: the emulator, as for static programs
            if not auto:
                raise
            text = ("{auto} chose the CPU target, which refuses this symbolic program ({why}); it runs on the CPU "
                    "emulator instead, a correctness tool, not a fast CPU path; {emulator} says so explicitly")  # fmt: skip
            warnings.warn(
                EmulatorWarning(
                    text.format(auto='target="auto"', why=e, emulator='target="emulator"'),
                    shell=text.format(auto="--target auto", why=e, emulator="--target emulator"),
                ),
                stacklevel=3,
            )
            return compile_symbolic(
                outputs, single, "emulator", deterministic, gpu, split, schedule, cache, use_database
            )
    if cache and schedule is None:
        if len(_PROGRAMS) >= 64:
            _PROGRAMS.pop(next(iter(_PROGRAMS)))
        _PROGRAMS[key] = k
    return k


compiler.SYMBOLIC.append(compile_symbolic)
