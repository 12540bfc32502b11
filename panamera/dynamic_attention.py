"""Symbolic fused attention (issue 22): decode over a growing KV cache, one kernel per size class.

`pn.compile` of a symbolic `pn.nn.attention` whose fused plan is legal over the symbols
(poly/param_attention.py) returns a `DynamicAttention`: the call binds the batch and key length,
picks the size class, plans the class's split and merge (schedule/param_attention.py) and
compiles the class's kernels (codegen/attention_kernel.py with the key length as an argument) on
first use. A decode loop whose key length grows by one per token meets one class per power of
two, and one or two launches per token (the main kernel; a merge kernel where the class merges in
a second launch).

>>> import numpy as np, panamera as pn
>>> q = pn.placeholder((1, 2, 1, 8), name="q")
>>> kv = pn.placeholder((1, 2, "T", 8), name="k")
>>> k = pn.compile(pn.nn.attention(q, kv, kv), target="emulator", cache=False)
>>> [k(np.ones((1, 2, 1, 8), np.float32), np.ones((1, 2, t, 8), np.float32)).shape for t in (1, 3)]
[(1, 2, 1, 8), (1, 2, 1, 8)]
>>> k.program.formulations, k.stats()["classes_compiled"]
(('attention=fused',), 2)
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass, field

import numpy as np

from . import dynamic
from .codegen import islast
from .codegen.attention_kernel import render_attention
from .codegen.header import prelude
from .dynamic_resident import resident_key
from .errors import EmptyReductionError, ScheduleError
from .frontend import symbolic
from .model.detect import resolve as resolve_gpu
from .poly.param_attention import SymbolicAttention
from .runtime.plan import BufferRole
from .schedule.param_attention import AttentionClassPlan, plan_class, replay_class, split_us
from .schedule.param_schedule import AttentionClassDecision, SymbolicSchedule
from .schedule.size_class import SizeClass


@dataclass(frozen=True)
class _Kernel:
    name: str
    signature: tuple[str, ...]


@dataclass(frozen=True)
class FusedProgram:
    """What `DynamicCompiled` reads of a program (inputs, symbols, kernels) for the fused plan."""

    attention: SymbolicAttention
    outputs: tuple

    @property
    def inputs(self):
        return tuple(sorted({t.uid: t for t in self.attention.inputs}.values(), key=lambda t: t.uid))

    @property
    def parameters(self) -> tuple[str, ...]:
        return self.attention.symbols

    formulations = ("attention=fused",)
    kinds = ("attention",)


@dataclass
class _ClassKernels:
    plan: AttentionClassPlan
    kernels: tuple[_Kernel, ...]
    source: str
    main: str
    merge: str
    specs: dict  # kernel name -> BufferSpecs in argument order
    resident: dict = field(default_factory=dict)


class DynamicAttention(dynamic.DynamicCompiled):
    """A symbolic fused attention: `k(q, k, v)` at any batch and key length."""

    def __init__(self, outputs, single: bool, target: str, deterministic: bool, gpu, attention: SymbolicAttention,
                 schedule: SymbolicSchedule | None = None):  # fmt: skip
        if target == "auto":
            target = "cuda" if dynamic.cuda_backend.available() else "emulator"
        if target not in ("emulator", "cuda"):
            raise dynamic.BackendError(
                f"symbolic programs run on the emulator or cuda (target {target!r} asked); compile at concrete "
                "sizes with DynamicCompiled.specialize or panamera.dynamic.specialize"
            )
        self.outputs, self.single, self.deterministic = tuple(outputs), single, bool(deterministic)
        self.target = target
        self.gpu, _ = resolve_gpu(gpu)
        self.program = FusedProgram(attention, self.outputs)
        self._plans: dict[SizeClass, AttentionClassPlan] = {}
        self._classes: dict[SizeClass, _ClassKernels] = {}
        self._lock = threading.Lock()
        self.counters = {"programs_compiled": 1, "classes_compiled": 0, "classes_planned": 0, "calls": 0}
        self.origin = "chosen by the model" if schedule is None else "replayed from the given schedule"
        dynamic._count("programs_compiled")
        if schedule is not None:
            if schedule.gpu != self.gpu.name:
                raise ScheduleError(f"schedule was made for {schedule.gpu}, not {self.gpu.name}")
            if schedule.formulations != FusedProgram.formulations:
                raise ScheduleError(f"schedule is for formulations {schedule.formulations}, the program is fused "
                                    "attention")  # fmt: skip
            for d in schedule.classes:
                if not isinstance(d, AttentionClassDecision):
                    raise ScheduleError(f"schedule: class {d.cls.describe()} plans kernels, not fused attention")
                self._plans[d.cls] = replay_class(attention, d.cls, self.gpu, d.split, d.launches, "schedule")

    @property
    def schedule(self) -> SymbolicSchedule:
        """Every class planned so far (its split and merge), replayable with `pn.compile(..., schedule=)`."""
        plans = sorted(self._plans.values(), key=lambda p: p.cls.key())
        decisions = tuple(AttentionClassDecision(p.cls, p.plan.split, p.plan.launches) for p in plans)
        return SymbolicSchedule(self.gpu.name, self.deterministic, decisions, FusedProgram.formulations)

    def explain(self) -> str:
        a = self.program.attention
        q, k = a.inputs[0], a.inputs[1]
        lines = [
            f"symbolic program over {', '.join(self.symbols)}: 1 kernel (fused attention, q {q.shape}, k/v {k.shape})",
            "  formulations: attention=fused",
            f"  class plans: {self.origin} (a class without one is planned by the model on first use)",
        ]
        for p in sorted(self._plans.values(), key=lambda p: p.cls.key()):
            lines.append(f"  {'compiled' if p.cls in self._classes else 'planned'} {p.describe()}")
        return "\n".join(lines)

    def modeled_us(self, **sizes: int) -> float:
        """The modeled time (µs) of one call at `sizes`: its class's split and merge costed there."""
        sizes = self.given_sizes(sizes)
        p = self.plan(self.size_class(sizes)).plan
        return split_us(self.program.attention, sizes, self.gpu, p, p.split, p.launches)

    def size_class(self, sizes: dict[str, int]) -> SizeClass:
        """A range per symbol, no alignment: the vector loads run along the static head dim."""
        return SizeClass.of(sizes, frozenset())

    def plan(self, cls: SizeClass) -> AttentionClassPlan:
        if cls not in self._plans:
            self._plans[cls] = plan_class(self.program.attention, cls, self.gpu)
            self.counters["classes_planned"] += 1
        return self._plans[cls]

    def _class(self, cls: SizeClass) -> _ClassKernels:
        if any(s.k < 0 for s in cls.symbols):  # a zero size: no keys is an error; an empty batch runs nothing
            k = self.program.attention.inputs[1]
            zero = {s.name for s in cls.symbols if s.k < 0}
            if zero & symbolic.symbols_of((k.shape[2],)):
                raise EmptyReductionError(f"attention: k {k.label!r} has no keys at this call ({k.shape[2]} = 0)")
            cls = SizeClass(tuple(dataclasses.replace(s, k=0) if s.k < 0 else s for s in cls.symbols))
        if cls in self._classes:
            return self._classes[cls]
        plan = self.plan(cls)
        name = f"pn_da_s{plan.plan.split}l{plan.plan.launches}"  # one source per decision, shared by classes
        rk = render_attention(plan.plan, name, lk_arg=True)
        sigs = {}
        for name, specs in rk.params.items():
            sigs[name] = tuple(f"{'const ' if b.role == BufferRole.INPUT else ''}{b.ctype}*" for b in specs)
        sigs[rk.main] += ("long long",)
        body = "\n".join([islast.HELPERS, rk.source]) + "\n"
        source = prelude(body) + body
        if self.target == "emulator":
            dynamic.emulator.build(source, sigs)
        ck = _ClassKernels(plan, tuple(_Kernel(n, s) for n, s in sigs.items()), source, rk.main, rk.merge, rk.params)
        self._classes[cls] = ck
        self.counters["classes_compiled"] += 1
        dynamic._count("classes_compiled")
        return ck

    def _run(self, ck: _ClassKernels, inputs: list, sizes: dict[str, int], backend) -> list:
        a, p = self.program.attention, ck.plan.plan
        q, k = a.inputs[0], a.inputs[1]
        batch, keys = (symbolic.evaluate((e,), sizes)[0] for e in (q.shape[0], k.shape[2]))
        shape = symbolic.evaluate(a.node.shape, sizes)
        out = backend.empty(math.prod(shape), a.node.dtype.np)
        if batch == 0:
            return [out.reshape(shape)]
        if keys < p.split:
            raise ScheduleError(f"attention: class {ck.plan.cls.describe()} splits the keys {p.split} ways, "
                                f"the call has {keys}")  # fmt: skip
        c = p.chain
        grid_y = batch * c.Hkv
        need = {"m": p.split * p.row_tiles * grid_y * p.rows_per_tile}
        need["s"], need["o"], need["cnt"] = need["m"], need["m"] * c.D, p.row_tiles * grid_y
        resident = ck.resident.setdefault(resident_key(backend), {})
        bufs = {f"in:{t.uid}": x for t, x in zip(self.inputs, inputs)}
        for name, grid in ((ck.main, (p.split * p.row_tiles, grid_y, 1)), (ck.merge, (p.row_tiles, grid_y, 1))):
            if not name:
                continue
            args = []
            for b in ck.specs[name]:
                if b.role == BufferRole.INPUT:
                    args.append(bufs[f"in:{_original(a, b.param).uid}"])
                elif b.role == BufferRole.OUTPUT:
                    args.append(out)
                else:
                    part = "cnt" if b.role == BufferRole.COUNTER else b.param.removeprefix("ws_")
                    args.append(_grown(resident, backend, part, need[part], np.uint32 if part == "cnt" else c.acc.np))
            args = [backend.pointer(x) for x in args]
            if name == ck.main:
                args.append(backend.scalar(keys))
            backend.launch(name, grid, (p.threads, 1, 1), args)
        return [out.reshape(shape)]


def _original(a: SymbolicAttention, param: str):
    """The symbolic placeholder of a kernel parameter ("q", "k", "v")."""
    return a.inputs[("q", "k", "v").index(param)]


def _grown(resident: dict, backend, key: str, need: int, dtype):
    """A class's resident partials or counters, grown to this call's need (a new counter starts
    at zero; the last block of every call resets it)."""
    have = resident.get(key)
    if have is None or have[0] < need:
        buf = backend.empty(max(need, 1), dtype)
        if key == "cnt":
            backend.fill(buf, 0)
        resident[key] = have = (max(need, 1), buf)
    return have[1]
