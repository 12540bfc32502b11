"""Compiled programs over symbolic shapes (issue 22): one program, kernels per size class.

`pn.compile` of a graph with symbolic extents (frontend/symbolic.py) returns a
`DynamicCompiled`. The program is built once (poly/params.py). At each call the executor binds
every symbol from the arrays' shapes, picks the size class (schedule/size_class.py), maps the
class from its representative size (schedule/param_mapping.py) and compiles the class's kernels
(codegen/param_kernel.py) on first use, cached in memory here and on disk by the backend; it
computes every grid from the bound sizes and passes the extents as kernel arguments.

>>> import numpy as np, panamera as pn
>>> x = pn.placeholder(("B", 8), name="x")
>>> k = pn.compile(pn.sum(x, axis=1), target="emulator", cache=False)  # its own counters
>>> [k(np.ones((n, 8), np.float32)).tolist() for n in (1, 2)]
[[8.0], [8.0, 8.0]]
>>> k.stats()["classes_compiled"], k.stats()["calls"]
(2, 2)
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass, field

import numpy as np

from . import compiler
from . import options as _options
from .codegen import islast
from .codegen.header import prelude
from .codegen.param_kernel import ParamKernel
from .codegen.param_stitched import render_group
from .compiled import refuse_shared_names, write_out
from .dynamic_resident import resident_buffer, resident_key
from .errors import (
    BackendError,
    DTypeError,
    EmptyReductionError,
    InputError,
    OptionError,
    ScheduleError,
    SymbolBindingError,
)
from .frontend import symbolic
from .frontend.gather import refuse_empty_axis
from .frontend.symbolic import Dim
from .frontend.tensor import Tensor, topological
from .model.detect import resolve as resolve_gpu
from .model.kernel_cost import sequence_s
from .poly.params import ParamProgram, PStatement, build, storage
from .poly.statement import Form, StatementKind
from .runtime import arrays as arrays_mod
from .runtime import cuda as cuda_backend
from .runtime import emulator
from .runtime.param_backends import CudaBackend, EmulatorBackend
from .schedule.param_mapping import ParamDecision, group_cost, group_name, map_group
from .schedule.param_schedule import ClassPlan, SymbolicSchedule, check_bound
from .schedule.size_class import SizeClass

_STATS = {"programs_compiled": 0, "classes_compiled": 0, "calls": 0}
_stats_lock = threading.Lock()


def stats() -> dict[str, int]:
    """Process-wide counters of symbolic programs: programs compiled, classes compiled, calls."""
    return dict(_STATS)


def _count(key: str) -> None:
    with _stats_lock:
        _STATS[key] += 1


def is_symbolic(outputs) -> bool:
    """Whether any tensor of the graph has a symbolic extent."""
    return any(t.symbolic for t in topological(outputs))


def specialize(outputs, sizes: dict[str, int]) -> tuple[Tensor, ...]:
    """The graph at concrete sizes (every symbol replaced), for a static `pn.compile`.

    >>> import panamera as pn
    >>> specialize((pn.placeholder(("B", 4), name="x") * 2.0,), {"B": 3})[0].shape
    (3, 4)
    """
    memo: dict[int, Tensor] = {}
    for t in topological(outputs):
        ins = tuple(memo[a.uid] for a in t.inputs)
        memo[t.uid] = Tensor(t.op, ins, symbolic.evaluate(t.shape, sizes), t.dtype, t.attrs, t.name)
    return tuple(memo[t.uid] for t in outputs)


def members(program: ParamProgram) -> list[tuple[PStatement, ...]]:
    """The statements of every kernel, in launch order."""
    return [tuple(program.statements[k] for k in g) for g in program.groups]


def index_type(program: ParamProgram, cls: SizeClass, plan: tuple[ParamDecision, ...]) -> str:
    """int while every extent, address and loop counter of every size of the class fits in 31
    bits with room (the static kernels' index_bound in spirit: twice the largest size)."""
    upper = cls.upper()
    sizes = [symbolic.evaluate((t.size,), upper)[0] for t in program.inputs]
    for group, d in zip(members(program), plan):
        for s in group:
            sizes.append(symbolic.evaluate((symbolic.prod(s.shape),), upper)[0] * max(1, d.vec) + d.threads * d.split)
    return "int" if 4 * max(sizes, default=0) < 2**31 else "long long"


def check_plan(program: ParamProgram, plan: ClassPlan, where: str, gpu, deterministic: bool = False) -> None:
    """A replayed class plan fits the program:

    1. one decision per kernel, in launch order, each of its kernel's form;
    2. a stitched group is never split (poly/param_stitch.py precondition 4);
    3. every vector width one the class proves legal (poly/params.py precondition 3);
    4. schedule/replay.py's rules that read a kernel's statements, not its isl domains (2 launch,
       3 vector bytes, 4 cover, 5 merges, 7 unroll, 8 vector atomics), held by replay's own code
       on the kernel's static view (schedule/bound.py) at every sample size of the class.
    Anything else is a ScheduleError naming the class, the kernel and the rule.
    """
    kernels = [group_name(g) for g in members(program)]
    if [d.statement for d in plan.decisions] != kernels:
        raise ScheduleError(f"{where}: class {plan.cls.describe()} plans kernels "
                            f"{[d.statement for d in plan.decisions]}, the program has {kernels}")  # fmt: skip
    for group, d, kind in zip(members(program), plan.decisions, program.kinds):
        if d.form != str(group[0].form):
            raise ScheduleError(f"{where}: {group_name(group)} is {group[0].form}, the schedule says {d.form}")
        if kind == "stitched" and d.split != 1:
            raise ScheduleError(f"{where}: stitched group {group_name(group)} cannot be split (split={d.split})")
        for s in group:
            if kind == "epilogue" and s.kind == StatementKind.MAP:
                continue  # evaluated per output, without vectors
            cond = (
                s if s.kind == StatementKind.REDUCE or len(group) == 1 else s.as_rows_of(group[0])
            ).vector_condition(d.vec)
            if cond is not None and not plan.cls.holds(cond):
                raise ScheduleError(f"{where}: class {plan.cls.describe()}: vec={d.vec} needs {cond}, not proven")
        for sizes in plan.cls.samples():
            at = f"{where}: class {plan.cls.describe()} at {', '.join(f'{k}={v}' for k, v in sizes.items())}: "
            check_bound(group, d, kind, sizes, gpu, deterministic, f"{at}kernel {group_name(group)}")


@dataclass
class _ClassKernels:
    plan: ClassPlan
    kernels: tuple[ParamKernel, ...]
    source: str
    resident: dict = field(default_factory=dict)  # per backend: ws/cnt buffers by key (grown on demand)


class DynamicCompiled:
    """A compiled symbolic program: `k(*arrays)` binds the symbols and runs the class's kernels."""

    TARGETS = ("emulator", "cuda")  # the CPU target's programs are dynamic_cpu.DynamicCpuCompiled

    def __init__(self, outputs: tuple[Tensor, ...], single: bool, target: str, deterministic: bool, gpu,
                 schedule: SymbolicSchedule | None = None):  # fmt: skip
        target = resolve_target(target)
        if target not in self.TARGETS:
            raise BackendError(
                f"{type(self).__name__} runs on {' or '.join(self.TARGETS)} (target {target!r} asked); "
                "compile with pn.compile, which picks the program of the target"
            )
        self.outputs, self.single, self.deterministic = tuple(outputs), single, bool(deterministic)
        self.target = target
        self.gpu, _ = resolve_gpu(gpu)
        self.program = self.build(self.outputs)
        self._plans: dict[SizeClass, ClassPlan] = {}
        self._classes: dict[SizeClass, _ClassKernels] = {}
        self._lock = threading.Lock()
        self.counters = {"programs_compiled": 1, "classes_compiled": 0, "classes_planned": 0, "calls": 0}
        self.origin = "chosen by the model" if schedule is None else "replayed from the given schedule"
        _count("programs_compiled")
        if schedule is not None:
            if schedule.gpu != self.gpu.name:
                raise ScheduleError(f"schedule was made for {schedule.gpu}, not {self.gpu.name}")
            if schedule.deterministic != self.deterministic:
                raise ScheduleError(f"schedule was made with deterministic={schedule.deterministic}")
            for p in schedule.classes:
                if not isinstance(p, ClassPlan):
                    raise ScheduleError(f"schedule: class {p.cls.describe()} is a fused attention's, this program "
                                        f"has kernels {[group_name(g) for g in members(self.program)]}")  # fmt: skip
                check_plan(self.program, p, "schedule", self.gpu, self.deterministic)
                self._plans[p.cls] = p

    def build(self, outputs: tuple[Tensor, ...], cost=None):
        """The parametric program of `outputs` as this target compiles it (poly/params.py)."""
        return build(outputs, cost)

    # -- public ----------------------------------------------------------------------------------
    @property
    def symbols(self) -> tuple[str, ...]:
        return self.program.parameters

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return self.program.inputs

    @property
    def schedule(self) -> SymbolicSchedule:
        """Every class planned so far, replayable with `pn.compile(..., schedule=)`."""
        plans = tuple(sorted(self._plans.values(), key=lambda p: p.cls.key()))
        return SymbolicSchedule(self.gpu.name, self.deterministic, plans, self.program.formulations)

    def stats(self) -> dict[str, int]:
        """This program's counters: programs compiled (1), classes planned and compiled, calls."""
        return dict(self.counters)

    def given_sizes(self, sizes: dict) -> dict[str, int]:
        """`sizes` a caller names (`modeled_us`, `source`, `specialize`): every symbol (others are
        ignored: a size hint may name more), each a non-negative int; else a SymbolBindingError."""
        missing = sorted(set(self.symbols) - set(sizes))
        bad = {k: sizes[k] for k in self.symbols if k in sizes and not _is_size(sizes[k])}
        if missing or bad:
            what = f"missing {missing}" if missing else f"not a size (an int >= 0): {bad}"
            raise SymbolBindingError(f"sizes {sizes} of a program over {list(self.symbols)}: {what}")
        return {**sizes, **{k: int(sizes[k]) for k in self.symbols}}

    def modeled_us(self, **sizes: int) -> float:
        """The modeled time (µs, on this program's GPU) of one call at `sizes`: its class's plan
        (planned now if it was not) costed at those sizes, the figure a report gives at a size hint.
        Its kernels run back to back, as a static plan's: every one after the first pays only the
        queued-launch gap (model/kernel_cost.sequence_s).

        >>> import panamera as pn
        >>> k = pn.compile(pn.sum(pn.placeholder(("B", 768), name="x"), axis=1), target="emulator")
        >>> k.modeled_us(B=64) > k.modeled_us(B=1) > 0
        True
        """
        sizes = self.given_sizes(sizes)
        plan = self.plan(self.size_class(sizes))
        kernels = zip(members(self.program), plan.decisions, self.program.kinds)
        return sequence_s((group_cost(g, d, sizes, self.gpu, kind) for g, d, kind in kernels), self.gpu) * 1e6

    def specialize(self, **sizes: int):
        """A static `pn.compile` of the program at concrete sizes (every op the static compiler has)."""
        outs = specialize(self.outputs, self.given_sizes(sizes))
        return compiler.compile(outs[0] if self.single else list(outs), target=self.target,
                                deterministic=self.deterministic, gpu=self.gpu)  # fmt: skip

    def explain(self) -> str:
        """The statements and every class planned so far with its decisions."""
        groups = members(self.program)
        lines = [f"symbolic program over {', '.join(self.symbols)}: {len(groups)} kernel(s)"]
        for g, kind in zip(groups, self.program.kinds):
            how = "" if kind == "single" else f"{kind} "
            lines.append(
                f"  {group_name(g)} {how}{g[0].form} M={g[0].M} N={g[0].N} ({', '.join(s.result.label for s in g)})"
            )
        if self.program.formulations:
            lines.append(f"  formulations: {', '.join(self.program.formulations)}")
        lines.append(f"  class plans: {self.origin} (a class without one is planned by the model on first use)")
        for p in sorted(self._plans.values(), key=lambda p: p.cls.key()):
            compiled = "compiled" if p.cls in self._classes else "planned"
            lines.append(f"  {compiled} {self.describe_plan(p)}")
        return "\n".join(lines)

    def describe_plan(self, plan: ClassPlan) -> str:
        """One class plan's line in `explain()`, modeled on this program's GPU."""
        return plan.describe(self.gpu)

    def bind_sizes(self, arrays: list) -> dict[str, int]:
        """Every symbol's size from the arrays' shapes (in placeholder order); a symbol bound to
        two sizes, a wrong static extent or rank is a SymbolBindingError naming them."""
        sizes: dict[str, tuple[int, str, int]] = {}
        composite = []
        for t, a in zip(self.inputs, arrays):
            shape = tuple(a.shape)
            if len(shape) != len(t.shape):
                raise SymbolBindingError(
                    f"input {t.name!r}: expected rank {len(t.shape)} (shape {t.shape}), got shape {shape}"
                )
            for axis, (e, n) in enumerate(zip(t.shape, shape)):
                if isinstance(e, Dim) and e.coef == 1 and len(e.syms) == 1:
                    name = e.syms[0]
                    if name in sizes and sizes[name][0] != n:
                        n0, t0, a0 = sizes[name]
                        raise SymbolBindingError(
                            f"symbol {name!r} is {n} at input {t.name!r} axis {axis} but {n0} at input {t0!r} axis {a0}"
                        )
                    sizes.setdefault(name, (n, t.name, axis))
                elif isinstance(e, Dim):
                    composite.append((t, axis, e, n))
                elif e != n:
                    raise SymbolBindingError(
                        f"input {t.name!r} axis {axis}: expected extent {e}, got {n} (shape {shape})"
                    )
        bound = {k: v[0] for k, v in sizes.items()}
        for t, axis, e, n in composite:
            missing = sorted(set(e.syms) - set(bound))
            if missing:
                raise SymbolBindingError(
                    f"input {t.name!r} axis {axis}: extent {e} needs symbol(s) {missing} bound by another axis"
                )
            if e.evaluate(bound) != n:
                raise SymbolBindingError(
                    f"input {t.name!r} axis {axis}: extent {e} is {e.evaluate(bound)} at {bound}, got {n}"
                )
        for g in self._gathers:  # an empty axis under a non-empty index: the frontend's refusal at these sizes
            refuse_empty_axis("take_along_axis" if g.attr("elements") else "take", *g.inputs, g.attr("axis"), bound)
        return bound

    @functools.cached_property
    def _gathers(self) -> tuple[Tensor, ...]:
        """The gathers of the caller's graph (before any target's rewrite) whose emptiness the frontend
        could not decide: a symbolic extent of the data's axis or of the index."""
        return tuple(
            t for t in topological(self.outputs)
            if t.op == "gather" and any(isinstance(e, Dim) for e in (t.inputs[0].shape[t.attr("axis")], *t.inputs[1].shape))
        )  # fmt: skip

    def __call__(self, *arrays, **named):
        """Run on arrays (numpy, CuPy, torch: runtime/arrays.py), positionally in placeholder order
        or by name; `out=` (an array, or a tuple for several outputs, of this call's result shapes
        and dtypes) receives the results, as numpy's; the emulator's `order=` and `seed=` set its
        thread order, the CPU target's `threads=` its OpenMP threads (options only where no input
        has that name)."""
        names = [t.name for t in self.inputs]
        out, order, seed, threads = (
            named.pop(k) if k in named and k not in names else d
            for k, d in (("out", None), ("order", "forward"), ("seed", 0), ("threads", None))
        )
        if named:
            unknown = sorted(set(named) - set(names))
            if unknown or arrays:
                raise InputError(f"unknown input name(s) {unknown}; inputs are {names}" if unknown
                                 else "pass inputs either positionally or by name, not both")  # fmt: skip
            missing = [n for n in names if n not in named]
            if missing:
                raise InputError(f"missing input(s) {missing}")
            refuse_shared_names(names, named)
            arrays = tuple(named[n] for n in names)
        if len(arrays) != len(names):
            raise InputError(f"expected {len(names)} input(s) {names}, got {len(arrays)}")
        args = [arrays_mod.adopt(a, t.name) for t, a in zip(self.inputs, arrays)]
        for t, a in zip(self.inputs, args):
            arrays_mod.refuse_grad(a, t.name)
            if a.dtype != t.dtype.np:
                raise DTypeError(f"input {t.name!r}: expected dtype {t.dtype}, got {a.dtype}")
        sizes = self.bind_sizes(args)
        caller = arrays_mod.caller_of(args)
        if order not in emulator.ORDERS:
            raise OptionError(f"unknown thread order {order!r}; use one of {sorted(emulator.ORDERS)}")
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed < 2**32:
            raise OptionError(f"seed must be an int in [0, 2**32), got {seed!r}")
        with self._lock:
            self.counters["calls"] += 1
            _count("calls")
            outs = self._execute(args, sizes, order, int(seed), threads)
        outs = arrays_mod.deliver(outs, caller)
        if out is not None:  # numpy's out=: the results written into the caller's arrays (sizes of this call)
            return write_out(out, list(outs), self.single)
        return outs[0] if self.single else tuple(outs)

    def _execute(self, args: list, sizes: dict[str, int], order: str, seed: int, threads: int | None) -> list:
        """The class's kernels on the target's backend (the emulator's thread `order` and `seed`;
        `threads` is the CPU target's option)."""
        if threads is not None:
            raise OptionError(f"threads= sets the CPU target's OpenMP threads; this program runs on {self.target}")
        ck = self._class(self.size_class(sizes))
        signatures = {k.name: k.signature for k in ck.kernels}
        if self.target == "cuda":
            import cupy

            with arrays_mod.cuda_context(arrays_mod.caller_of(args), cupy):  # the caller's device and stream
                backend = CudaBackend(ck.source, signatures)
                return self._run(ck, [backend.input(a) for a in args], sizes, backend)
        backend = EmulatorBackend(ck.source, signatures, order, seed)
        return self._run(ck, [backend.input(a) for a in args], sizes, backend)

    def __repr__(self) -> str:
        return (f"<DynamicCompiled over {', '.join(self.symbols)}: {len(self.program.statements)} kernel(s), "
                f"{len(self._classes)} class(es) compiled; target {self.target}>")  # fmt: skip

    # -- classes ---------------------------------------------------------------------------------
    def size_class(self, sizes: dict[str, int]) -> SizeClass:
        """The class of the bound sizes: a range per symbol, and an alignment for the symbols a
        vector width depends on (those of a contiguous extent: N of a ROW/ALL kernel or a stitched
        group, M of a MAP/COLUMN one); the others get none, so their sizes do not multiply the
        classes."""
        return SizeClass.of(sizes, self.aligned, self.max_vector)

    @property
    def max_vector(self) -> int:
        """The widest vector any load of the program can take, in elements (16 bytes)."""
        loads = [r.tensor.dtype.itemsize for s in self.program.statements for r in s.reads]
        return max(1, 16 // min(loads or [4]))

    @property
    def aligned(self) -> frozenset[str]:
        out: set[str] = set()
        for group in members(self.program):
            for s in group:
                n = s.N if s.form in (Form.ROW, Form.ALL) or len(group) > 1 else s.M
                out |= set(n.syms) if isinstance(n, Dim) else set()
        return frozenset(out)

    def plan(self, cls: SizeClass) -> ClassPlan:
        """The class's plan: replayed from the schedule, or decided now by the model."""
        if cls not in self._plans:
            decisions = tuple(
                map_group(g, cls, self.gpu, self.deterministic, kind)
                for g, kind in zip(members(self.program), self.program.kinds)
            )
            self._plans[cls] = ClassPlan(cls, decisions, index_type(self.program, cls, decisions))
            self.counters["classes_planned"] += 1
        return self._plans[cls]

    def _class(self, cls: SizeClass) -> _ClassKernels:
        if cls in self._classes:
            return self._classes[cls]
        plan = self.plan(cls)
        kernels = tuple(
            render_group(g, d, self.program, f"pn_d{k}_{cls_tag(cls)}", plan.index_type, kind)
            for k, (g, d, kind) in enumerate(zip(members(self.program), plan.decisions, self.program.kinds))
        )
        body = "\n".join([islast.HELPERS] + [k.source for k in kernels]) + "\n"
        source = prelude(body) + body
        if self.target == "emulator":  # built now (memory and disk cache); cuda compiles at the first call
            emulator.build(source, {k.name: k.signature for k in kernels})
        ck = self._classes[cls] = _ClassKernels(plan, kernels, source)
        self.counters["classes_compiled"] += 1
        _count("classes_compiled")
        return ck

    def source(self, **sizes: int) -> str:
        """The CUDA C of the class of these sizes (compiled if it was not)."""
        return self._class(self.size_class(self.given_sizes(sizes))).source

    # -- running ---------------------------------------------------------------------------------
    def _run(self, ck: _ClassKernels, inputs: list, sizes: dict[str, int], backend) -> list:
        """One call: every kernel of the class in order, grids and extents from the bound sizes."""
        bufs = {f"t:{t.uid}": a for t, a in zip(self.inputs, inputs)}
        resident = ck.resident.setdefault(resident_key(backend), {})
        for group, d, k in zip(members(self.program), ck.plan.decisions, ck.kernels):
            for m in group:
                bufs[f"t:{m.result.uid}"] = backend.empty(
                    math.prod(symbolic.evaluate(m.result.shape, sizes)), m.result.dtype.np
                )
            s = group[0]
            M, N = _at(s.M, sizes), _at(s.N, sizes)  # noqa: N806
            if M == 0 or math.prod(symbolic.evaluate(s.shape, sizes)) == 0 and s.kind == StatementKind.MAP:
                continue
            if s.kind == StatementKind.REDUCE and N == 0:  # the kernel stores the identity's finish
                for m in group:
                    if m.kind == StatementKind.REDUCE:
                        _refuse_empty(m)
            gx, gy = d.grid(M)
            args = []
            for a in k.args:
                if not a.buffer:
                    value = M if a.key == "pn_M" else N if a.key == "pn_N" else sizes[a.key.removeprefix("pn_s_")]
                    args.append(backend.scalar(value))
                elif a.key.startswith(("ws:", "cnt:")):
                    args.append(backend.pointer(resident_buffer(resident, backend, s, d, a.key, M, gx)))
                else:
                    args.append(backend.pointer(bufs[a.key]))
            backend.launch(k.name, (gx, gy, 1), (d.tx, d.ty, 1), args)
        results, used = [], set()
        for o in self.program.outputs:
            key = f"t:{storage(o).uid}"
            shape = symbolic.evaluate(o.shape, sizes)
            fresh = storage(o).op != "placeholder" and key not in used  # two outputs never share memory
            results.append((bufs[key] if fresh else backend.copy(bufs[key])).reshape(shape))
            used.add(key)
        return results


def _is_size(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | np.integer) and v >= 0


def cls_tag(cls: SizeClass) -> str:
    return "_".join(f"{s.k + 1}a{s.align}" for s in cls.symbols) or "c"


def _at(extent, sizes: dict[str, int]) -> int:
    return symbolic.evaluate((extent,), sizes)[0]


def _refuse_empty(s: PStatement) -> None:
    """A reduction over a zero extent (bound at call time) whose combiner has no identity: the
    error numpy raises (max and min of nothing). The others store their identity's finish (0 for
    a sum, NaN for a mean or variance: 0 / 0), as numpy."""
    if not s.combiner.has_identity:
        raise EmptyReductionError(
            f"{s.combiner.name} of {s.result.label!r}: the reduced extent {s.N} is 0 at this call; {s.combiner.name} "
            "of nothing has no identity"
        )


def resolve_target(target) -> str:
    """`target="auto"`: cuda with a GPU, else the host target (panamera/options.py: host_target, cpu)."""
    target = str(target)
    if target == "auto":
        return "cuda" if cuda_backend.available() else str(_options.host_target())
    return target
