"""`pn.compile`: graph → Program (poly) → Mappings (schedule) → CUDA (codegen) → Compiled.

>>> import numpy as np, panamera as pn
>>> x = pn.placeholder((4, 100), "float32", name="x")
>>> k = pn.compile(pn.sum(x, axis=1), target="emulator")
>>> a = np.ones((4, 100), np.float32)
>>> k(a).tolist()
[100.0, 100.0, 100.0, 100.0]
"""

from __future__ import annotations

import ctypes
import math
import re
import threading
from dataclasses import dataclass, field

import numpy as np

from .codegen import islast
from .codegen.header import PRELUDE
from .codegen.kernel import BufferSpec, InitKernel, RenderedKernel, render_empty, render_kernel
from .errors import BackendError, DTypeError, InputError, PanameraError, ScheduleError
from .frontend.tensor import Tensor
from .model.gpu import H100, GPUSpec, kernel_time
from .poly.program import KernelGroup, Program, build_program
from .runtime import cuda as cuda_backend
from .runtime import emulator
from .runtime.plan import Launch, LaunchPlan
from .schedule.mapping import Mapping, map_group
from .schedule.planner import Considered, plan_groups
from .schedule.saved import KernelChoice, Schedule


def sanitize(name: str, limit: int = 24) -> str:
    """An identifier safe for C made of a tensor name (ONNX names have ':' and worse)."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)[:limit].strip("_")
    return s or "t"


@dataclass(frozen=True)
class Compiled:
    """A compiled computation: `k(*arrays)` runs it; `k.source`, `k.plan`, `k.explain()`."""

    outputs: tuple[Tensor, ...]
    single: bool
    program: Program
    mappings: tuple[Mapping, ...]
    kernels: tuple[RenderedKernel, ...]
    source: str
    plan: LaunchPlan
    target: str
    deterministic: bool
    gpu: GPUSpec
    signatures: tuple[tuple[str, tuple[str, ...]], ...]  # C parameter types of every kernel
    groups: tuple[KernelGroup, ...] = ()  # the kernel groups that run, one per mapping
    considered: tuple[Considered, ...] = ()  # the planner's stitching decisions
    # Resident workspaces and counters per backend: initialised by the first call, left at the
    # identity / zero by the last block of every call, so later calls launch no init kernel.
    # Calls of one Compiled are serialized (the lock); on a GPU, keep them on one stream.
    resident: dict = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return self.program.inputs

    @property
    def sources(self) -> tuple[Tensor, ...]:
        """Per output, the tensor whose buffer holds it: an output reshape is a view."""
        return tuple(_view_source(t) for t in self.outputs)

    @property
    def schedule(self) -> Schedule:
        """The decisions made for this program, replayable with `pn.compile(..., schedule=)`."""
        stitched = tuple(tuple(s.name for s in g.statements) for g in self.groups if g.stitched)
        kernels = tuple(KernelChoice(g.form, g.M, g.N, m.split, m.threads) for g, m in zip(self.groups, self.mappings))
        return Schedule(self.gpu.name, stitched, kernels)

    def __call__(self, *arrays, order: str = "forward", seed: int = 0, **named):
        arrays = self._bind(arrays, named)
        is_cupy = any(type(a).__module__.startswith("cupy") for a in arrays)
        if self.target == "emulator":
            host = [self._host_input(t, a) for t, a in zip(self.inputs, arrays)]
            outs = self._run_emulator(host, order, seed)
        else:
            outs = self._run_cuda(arrays)
        if not is_cupy and self.target == "cuda":
            outs = [o.get() for o in outs]
        return outs[0] if self.single else tuple(outs)

    # -- argument checking ------------------------------------------------------------------
    def _bind(self, arrays, named) -> list:
        if named:
            by_name = {t.name: t for t in self.inputs}
            unknown = set(named) - set(by_name)
            if unknown:
                raise InputError(f"unknown input name(s) {sorted(unknown)}; inputs are {[t.name for t in self.inputs]}")
            if arrays:
                raise InputError("pass inputs either positionally or by name, not both")
            missing = [t.name for t in self.inputs if t.name not in named]
            if missing:
                raise InputError(f"missing input(s) {missing}")
            arrays = [named[t.name] for t in self.inputs]
        if len(arrays) != len(self.inputs):
            raise InputError(f"expected {len(self.inputs)} input(s) {[t.name for t in self.inputs]}, got {len(arrays)}")
        for t, a in zip(self.inputs, arrays):
            if not hasattr(a, "shape") or not hasattr(a, "dtype"):
                raise InputError(f"input {t.name!r}: expected an array, got {type(a).__name__}")
            if tuple(a.shape) != t.shape:
                raise InputError(f"input {t.name!r}: expected shape {t.shape}, got {tuple(a.shape)}")
            if np.dtype(a.dtype) != t.dtype.np:
                raise DTypeError(f"input {t.name!r}: expected dtype {t.dtype}, got {np.dtype(a.dtype)}")
        return list(arrays)

    @staticmethod
    def _host_input(t: Tensor, a) -> np.ndarray:
        if type(a).__module__.startswith("cupy"):
            a = a.get()
        a = np.asarray(a)
        # Non-contiguous or misaligned arrays are copied (vector loads need 16-byte alignment).
        if not a.flags.c_contiguous or a.ctypes.data % 16:
            a = _aligned_copy(a)
        return a

    # -- execution --------------------------------------------------------------------------
    def _buffers(self, alloc, inputs, backend: str) -> tuple[dict, bool]:
        """Buffers of one call, and whether the resident ones are new (their init must run)."""
        bufs = {f"in:{t.uid}": a for t, a in zip(self.inputs, inputs)}
        fresh = backend not in self.resident
        resident = self.resident.setdefault(backend, {})
        for key, spec in self.plan.buffers.items():
            if key.startswith(("ws:", "cnt:")):
                if key not in resident:
                    resident[key] = self._alloc(alloc, spec)
                bufs[key] = resident[key]
            elif key not in bufs:
                bufs[key] = self._alloc(alloc, spec)
        return bufs, fresh

    @staticmethod
    def _alloc(alloc, spec):
        dt = spec.dtype.np if spec.dtype is not None else np.dtype(np.uint32)
        if dt.names:  # a struct workspace: raw bytes (CuPy has no structured dtypes)
            return alloc(max(spec.size, 1) * dt.itemsize, np.uint8)
        return alloc(max(spec.size, 1), dt)

    def _launches(self, backend: str, fresh: bool, launch) -> None:
        try:
            for ln in self.plan.launches:
                if ln.role != "init_once" or fresh:
                    launch(ln)
        except BaseException:  # a failed call may leave workspaces dirty: start over next time
            self.resident.pop(backend, None)
            raise

    def _results(self, bufs, inputs):
        out, used = [], set()
        pos = {t.uid: k for k, t in enumerate(self.inputs)}
        for t, src in zip(self.outputs, self.sources):
            if src.op == "placeholder":
                out.append(inputs[pos[src.uid]].copy().reshape(t.shape))
                continue
            a = bufs[f"out:{src.uid}"][: src.size].reshape(t.shape)
            out.append(a.copy() if src.uid in used else a)  # two outputs never share memory
            used.add(src.uid)
        return out

    def _run_emulator(self, inputs, order, seed):
        lib = emulator.build(self.source, self.signatures)
        with self._lock:
            bufs, fresh = self._buffers(lambda n, dt: _aligned_empty(n, dt), inputs, "emulator")

            def launch(ln):
                args = [ctypes.c_void_p(bufs[key].ctypes.data) for _, key in ln.args]
                emulator.launch(lib, ln.kernel, ln.grid, ln.block, args, order, seed)

            self._launches("emulator", fresh, launch)
            return self._results(bufs, inputs)

    def _run_cuda(self, arrays):
        mod = cuda_backend.module(self.source)  # a clear BackendError without CuPy or a GPU
        import cupy

        inputs = [cupy.ascontiguousarray(cupy.asarray(a)) for a in arrays]
        backend = f"cuda:{cupy.cuda.Device().id}"
        with self._lock:
            bufs, fresh = self._buffers(lambda n, dt: cupy.empty(n, dt), inputs, backend)

            def launch(ln):
                mod.get_function(ln.kernel)(ln.grid, ln.block, tuple(bufs[key] for _, key in ln.args))

            self._launches(backend, fresh, launch)
            return self._results(bufs, inputs)

    # -- reporting --------------------------------------------------------------------------
    def explain(self) -> str:
        """Canonical forms, mappings, grids, atomics and bytes of every launch, and the model."""
        lines = [
            f"Panamera plan: {len(self.plan.kernels)} kernel(s), {len(self.plan.per_call)} launch(es) per call"
            f"{f' (+{len(self.plan.launches) - len(self.plan.per_call)} on the first)' if len(self.plan.per_call) < len(self.plan.launches) else ''}, "
            f"{self.plan.modeled_us:.2f} us modeled on {self.gpu.name}, "
            f"target {self.target}, {'deterministic' if self.deterministic else 'atomic'} combine"
        ]
        for g, m in zip(self.groups, self.mappings):
            names = ", ".join(
                f"{s.name}={s.result.op}" + (f"[{s.combiner.name}]" if s.combiner else "") for s in g.statements
            )
            lines.append(f"  group {names}: {m.describe()}")
            lines += [f"    {loop} <- {t}" for loop, t in m.tasks.items() if t.extent > 1]
        for ln in self.plan.launches:
            extra = ""
            if not ln.role.startswith("init"):
                extra = (
                    f" form={ln.form} blocks/reduction={ln.blocks_per_reduction} modes={','.join(ln.modes)}"
                    f" read={ln.bytes_read}B written={ln.bytes_written}B modeled={ln.modeled_us:.2f}us ({self.gpu.name}, modeled)"
                )
            elif ln.atomic_outputs:
                when = (
                    "on the first call only (resident, reset by the last block)"
                    if ln.role == "init_once"
                    else "every call"
                )
                extra = f" initialises {when}: " + ", ".join(f"{k}={v}" for k, v in ln.atomic_outputs)
            lines.append(f"  launch {ln.kernel} grid={ln.grid} block={ln.block}{extra}")
        lines += [f"  fusion (isl schedule): {f.describe()}" for f in self.program.fusions if f.producers]
        lines += [f"  planner: {c.describe()}" for c in self.considered]
        lines += [f"  formulation: {t.attr('choice')}" for t in self.program.graph if t.attr("choice")]
        if self.program.deps is not None:
            lines.append(f"  dependences (isl flow): {self.program.deps.flow}")
            lines.append(f"  relaxed (reduction self-dependences): {not self.program.deps.relaxed.is_empty()}")
        return "\n".join(lines)


def _view_source(t: Tensor) -> Tensor:
    while t.op == "reshape":
        t = t.inputs[0]
    return t


def _aligned_empty(n: int, dt) -> np.ndarray:
    dt = np.dtype(dt)
    raw = np.empty(n * dt.itemsize + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off : off + n * dt.itemsize].view(dt)


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    out = _aligned_empty(a.size, a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _init_launch(init: InitKernel, buffers: dict, gpu: GPUSpec, role: str = "init") -> Launch:
    """The one launch that initialises a kernel's atomic outputs, workspaces and counters."""
    specs = [buffers[f.buffer] for f in init.fills]
    nbytes = sum(max(p.size, 1) * (p.dtype.itemsize if p.dtype is not None else 4) for p in specs)
    threads, blocks = 256, min(math.ceil(max(p.size for p in specs) / 256), 1024)
    cost = kernel_time(gpu, dram_bytes=nbytes, blocks=blocks, threads=threads, bytes_in_flight_per_thread=4)
    return Launch(
        init.name,
        (blocks, 1, 1),
        (threads, 1, 1),
        tuple(("buf", f.buffer) for f in init.fills),
        role=role,
        atomic_outputs=tuple((f.buffer, f.value) for f in init.fills),
        bytes_written=nbytes,
        modeled_us=cost.total_s * 1e6,
        cost_features=cost.features,
    )


def compile(  # noqa: A001
    outputs,
    target: str = "auto",
    deterministic: bool = False,
    gpu: GPUSpec = H100,
    split: int | None = None,
    schedule: Schedule | None = None,
) -> Compiled:
    """Compile one tensor or a list of tensors into a Compiled computation.

    target: "auto" (cuda with a GPU, else emulator), "cuda" or "emulator".
    deterministic: merge block partials in a fixed order (no float atomics): identical bits
    on every run and every thread order, still in one launch.
    split: override the model's choice of blocks per reduction (a schedule override, used by
    tests and experiments; the mapper clamps it to what the extents allow).
    schedule: replay saved decisions (`Compiled.schedule`) instead of asking the model; a
    schedule that does not fit this program or GPU raises ScheduleError.
    """
    single = isinstance(outputs, Tensor)
    outs = (outputs,) if single else tuple(outputs)
    if not outs or not all(isinstance(t, Tensor) for t in outs):
        raise PanameraError("compile: expected a Tensor or a non-empty list of Tensors")
    if target == "auto":
        target = "cuda" if cuda_backend.available() else "emulator"
    if target not in ("cuda", "emulator"):
        raise BackendError(f"compile: unknown target {target!r}; use 'auto', 'cuda' or 'emulator'")
    prog = build_program(tuple(_view_source(t) for t in outs))  # an output reshape is a view: no kernel
    if schedule is not None and schedule.gpu != gpu.name:
        raise ScheduleError(f"schedule was made for {schedule.gpu}, not {gpu.name}")
    replay = schedule.stitched if schedule is not None else None
    groups, considered = plan_groups(prog, gpu, allow_stitch=split is None, replay=replay)
    mappings, kernels, launches, buffers, live_groups = [], [], [], {}, []
    parts, signatures = [PRELUDE, islast.HELPERS], {}

    def add_init(init: InitKernel, role: str = "init"):
        launches.append(_init_launch(init, buffers, gpu, role))
        parts.append(init.source)
        signatures[init.name] = tuple(init.signature)

    for k, grp in enumerate(groups):
        for s in grp.statements:
            res = s.result
            buffers[f"out:{res.uid}"] = BufferSpec(f"out:{res.uid}", res.dtype.c_type, res.dtype, res.size, "output")
        if grp.M > 0 and grp.N == 0:  # reductions over nothing
            add_init(render_empty(f"pn_k{k}_empty", grp, buffers))
        if grp.M * grp.N == 0:
            continue
        if schedule is not None:
            choice = schedule.check_kernel(len(mappings), grp.form, grp.M, grp.N)
            m = map_group(grp, gpu, choice.split, deterministic, choice.threads)
        else:
            m = map_group(grp, gpu, split, deterministic)
        label = sanitize(grp.statements[0].result.name or grp.statements[0].result.op)
        rk = render_kernel(f"pn_k{k}_{label}", grp, m, deterministic)
        mappings.append(m)
        kernels.append(rk)
        live_groups.append(grp)
        for p in rk.params:
            buffers.setdefault(p.key, p)
        if rk.init:
            add_init(rk.init, "init_once")
        parts.append(rk.source)
        signatures[rk.name] = tuple(rk.signature)
        bytes_read = sum(p.size * p.dtype.itemsize for p in rk.params if p.role == "input")
        bytes_written = sum(p.size * p.dtype.itemsize for p in rk.params if p.role == "output")
        launches.append(
            Launch(
                rk.name,
                (m.grid[0], m.grid[1], 1),
                (m.tx, m.ty, 1),
                tuple(("buf", p.key) for p in rk.params),
                role="map" if grp.form == "MAP" else "reduce",
                form=grp.form,
                blocks_per_reduction=m.split,
                atomic_outputs=tuple((f.buffer, f.value) for f in rk.fills if not f.buffer.startswith("cnt:")),
                modes=rk.modes,
                bytes_read=bytes_read,
                bytes_written=bytes_written,
                mapping=m.describe(),
                modeled_us=m.cost.total_s * 1e6,
                cost_features=m.cost.features,
            )
        )
    if schedule is not None and len(schedule.kernels) != len(mappings):
        raise ScheduleError(f"schedule has {len(schedule.kernels)} kernel(s), the program {len(mappings)}")
    return Compiled(
        outs,
        single,
        prog,
        tuple(mappings),
        tuple(kernels),
        "\n".join(parts) + "\n",
        LaunchPlan(tuple(launches), buffers),
        target,
        deterministic,
        gpu,
        tuple(signatures.items()),
        tuple(live_groups),
        considered,
    )
