"""`pn.compile`: an ordered list of named stages over immutable values, then an executor.

    graph ─formulations─► graph' ─program─► Program ─groups─► kernel groups ─mappings─► Mappings
          ─kernels─► CUDA C per group ─plan─► LaunchPlan + source  ──►  Compiled (runtime/executor.py)

This module is the public API (`compile`, `lower`) and the compile cache's lookup; the pieces live
by idea: options.py (`Options`, the target), stages.py (`Artifacts`, `STAGES`, `run_stages`),
launch_plan.py (the launches and buffers of the plan stage), compiled.py (`Compiled`). Each stage
takes the `Artifacts` so far and the `Options` and returns new Artifacts; each decision is made
once, by the stage that owns it, and carried downstream as data. `lower(...,
stop_after="mappings")` stops after any stage (as Triton's stage dictionary does); `explain()`
is built from the artifacts.

>>> import numpy as np, panamera as pn
>>> x = pn.placeholder((4, 100), "float32", name="x")
>>> k = pn.compile(pn.sum(x, axis=1), target="emulator")
>>> a = np.ones((4, 100), np.float32)
>>> k(a).tolist()
[100.0, 100.0, 100.0, 100.0]
>>> [stage.name for stage in STAGES]
['formulations', 'program', 'groups', 'mappings', 'kernels', 'plan']
>>> lower(pn.sum(x, axis=1), stop_after="mappings").mappings[0].describe()
'ROW M=4 N=100 vec=4 block=(32,4) grid=(1,1) split=1'
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable

from . import cache as compile_cache
from . import logs
from .compiled import Compiled
from .errors import OptionError, PanameraError, ScheduleError, TargetRefused
from .explain import contraction_lines  # noqa: F401  (the public name it always had)
from .frontend.tensor import Tensor
from .model.gpu import GPUSpec
from .options import Options, Target, _fall_back
from .runtime.executor import Executor
from .schedule import database
from .schedule.saved import Schedule
from .stages import STAGES, Artifacts, rebind_stages, run_stages  # noqa: F401  (STAGES: the public name it always had)

_log = logs.get("compiler")


# Targets compiled by a later module, which registers itself here on import (the package imports
# cpu_target.py, which builds on the stages of stages.py, for target="cpu").
TARGET_COMPILERS: dict[Target, Callable] = {}

# The compiler of graphs with symbolic extents (panamera/dynamic_compile.py registers itself on import).
SYMBOLIC: list[Callable] = []


def _outputs(outputs) -> tuple[bool, tuple[Tensor, ...]]:
    single = isinstance(outputs, Tensor)
    outs = (outputs,) if single else tuple(outputs) if hasattr(outputs, "__iter__") else ()  # not 3, None
    if not outs or not all(isinstance(t, Tensor) for t in outs):
        raise PanameraError(f"compile: expected a Tensor or a non-empty list of Tensors, got {type(outputs).__name__}")
    return single, outs


def lower(outputs, stop_after: str | None = None, **options) -> Artifacts:
    """Run the stages up to and including `stop_after` (all of them by default); `options` as
    for `compile`."""
    outs = _outputs(outputs)[1]
    if any(t.symbolic for t in compile_cache.placeholders(outs)):
        raise OptionError("lower: the stages are static; a graph with symbolic extents compiles with pn.compile "
                          "(DynamicCompiled.explain() shows its plan; panamera.dynamic.specialize gives static shapes)")  # fmt: skip
    return run_stages(outs, Options.make(**options), stop_after)


def compile(  # noqa: A001
    outputs,
    target: str = "auto",
    deterministic: bool = False,
    gpu: GPUSpec | str | None = None,
    split: int | None = None,
    schedule: Schedule | None = None,
    use_database: bool = True,
    cache: bool = True,
) -> Compiled:
    """Compile one tensor or a list of tensors into a Compiled computation.

    target: "auto" (cuda with a GPU, else cpu), "cuda", "emulator" (the CUDA source run on the
    CPU by g++: a correctness tool) or "cpu" (OpenMP + SIMD C++ for this machine; cpu_target.py
    lists what it covers). A program "auto"'s cpu refuses runs on the emulator, with an
    EmulatorWarning that says why.
    gpu: the GPU to plan for: a GPUSpec, a name ("h100", "h200", "a100", "v100"), or None: the GPU
    CuPy sees (from its properties, model/detect.py), else H100 (`explain()` says which).
    deterministic: merge block partials in a fixed order (no float atomics): identical bits
    on every run and every thread order, still in one launch.
    split: override the model's choice of blocks per reduction (a schedule override, used by
    tests and experiments; the mapper clamps it to what the extents allow).
    schedule: replay saved decisions (`Compiled.schedule`) instead of asking the model; a
    schedule that does not fit this program or GPU raises ScheduleError.
    use_database: consult the schedule database (schedule/database.py) for a plain compile (no
    split, not deterministic, no schedule); a stale entry is skipped with a warning.
    cache: look the program up in the in-memory compile cache (panamera/cache.py) first; a
    program compiled before costs well under a millisecond.
    """
    single, outs = _outputs(outputs)
    if SYMBOLIC and any(t.symbolic for t in compile_cache.placeholders(outs)):  # issue 22: dynamic shapes
        return SYMBOLIC[0](
            outs, single, target, deterministic, gpu, split, schedule, cache=cache, use_database=use_database
        )
    options = Options.make(target, deterministic, gpu, split, schedule)
    key = (compile_cache.graph_key(outs), compile_cache.options_key(options, use_database)) if cache else None
    hit = compile_cache.COMPILED.get(key) if cache else None
    if options.target in TARGET_COMPILERS:  # target="cpu": cpu_target.py, cached as its Compiled
        if hit is not None:
            return hit.rebound(outs, single)
        try:
            compiled = TARGET_COMPILERS[options.target](outs, options, single)
        except TargetRefused as e:  # a kind the CPU target does not cover: the emulator, when "auto" chose cpu
            if not options.auto:
                raise
            options = _fall_back(options, e)
            key = (key[0], compile_cache.options_key(options, use_database)) if cache else None
            hit = compile_cache.COMPILED.get(key) if cache else None
        else:
            if cache:
                compile_cache.COMPILED.put(key, compiled)
            return compiled
    if hit is not None:
        _log.debug("compile: in the compile cache")
        return _from_cache(hit, outs, options, single)
    t0 = time.perf_counter()
    a, origin = None, "chosen by the model" if schedule is None else "replayed from the given schedule"
    if use_database and schedule is None and split is None and not deterministic:
        entry = database.lookup(database.signature(outs), options.gpu.name)
        if entry is not None:
            try:
                a = run_stages(outs, dataclasses.replace(options, schedule=entry.schedule))
                origin = f"from schedules/{entry.name}"
            except ScheduleError as e:
                warnings.warn(f"schedules/{entry.name}: skipped ({e})", database.StaleScheduleWarning, stacklevel=2)
    if a is None:
        a = run_stages(outs, options)
    if cache:
        compile_cache.COMPILED.put(key, (a, origin))
    _log.debug(
        "compile: %d kernel(s), schedule %s, %.1f ms", len(a.plan.kernels), origin, (time.perf_counter() - t0) * 1e3
    )
    return Compiled(a, options, single, Executor(a.plan, a.source, a.signatures, str(options.target)), origin)


def _from_cache(hit: tuple[Artifacts, str], outs: tuple[Tensor, ...], options: Options, single: bool) -> Compiled:
    """A new Compiled of a program compiled before: the stored stages with this graph's
    outputs and placeholders (their names bind the inputs), and its own executor."""
    a, origin = hit
    a = rebind_stages(a, outs)
    return Compiled(a, options, single, Executor(a.plan, a.source, a.signatures, str(options.target)), origin)
