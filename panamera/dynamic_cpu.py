"""Symbolic programs on the CPU target (issues 22 and 24): one program, a CPU library per class plan.

`pn.compile` of a graph with symbolic extents with `target="cpu"` (or "auto" without a GPU)
returns a `DynamicCpuCompiled`: the program is built once (poly/params.py); at each call the
symbols are bound from the arrays' shapes (as `DynamicCompiled`), the size class is a
power-of-two range per symbol (no alignment: a CPU's `omp simd` loops have scalar tails), the
class's kernels are mapped by the CPU model (schedule/cpu_param_mapping.py: the split, robust
over the class) and printed as C++ with OpenMP + SIMD whose extents are arguments
(codegen/cpu_param_kernel.py). A class's source is built by g++ once (runtime/cpu.py: memory and
disk cache by content), so classes with equal plans share one library; every call passes the
bound extents to the kernels through ctypes.

>>> import numpy as np, panamera as pn
>>> x = pn.placeholder(("B", 8), name="x")
>>> k = pn.compile(pn.sum(x, axis=1), target="cpu")
>>> [k(np.ones((n, 8), np.float32)).tolist() for n in (1, 3)]
[[8.0], [8.0, 8.0, 8.0]]
>>> k.stats()["classes_compiled"], k.stats()["sources_built"]
(2, 1)
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import numpy as np

from .algebra import FinishKind
from .codegen.cpu_param_kernel import CpuParamKernel, render_cpu_group, scalars
from .cpu_target import cpu_model, cpu_source
from .dynamic import DynamicCompiled, _at, _count, _refuse_empty, members
from .errors import AxisError, EmptyReductionError, OptionError, PanameraError
from .frontend import symbolic
from .poly.params import build, storage
from .poly.statement import StatementKind
from .runtime import arrays as arrays_mod
from .runtime import cpu as cpu_backend
from .runtime.cpu_call import address
from .schedule import onehot
from .schedule.cpu_mapper import CpuMachine
from .schedule.cpu_param_mapping import CpuClassPlan, map_cpu_group, time_at
from .schedule.size_class import SizeClass

FORMULATION_HINT = 1024  # the size of every symbol a formulation is chosen at
MAX_CALLS = 256  # the sizes whose calls are kept prepared (DynamicCpuCompiled._prepare)


@dataclass(frozen=True)
class _Call:
    allocs: tuple  # (elements, numpy dtype) of every statement's result: buffers len(inputs) on
    steps: tuple  # (entry point, its pointer table, the buffers' slots, extents array, reductions to refuse)
    results: tuple  # (buffer slot, shape, copied) of every output


@dataclass
class _CpuClass:
    plan: CpuClassPlan
    kernels: tuple[CpuParamKernel, ...]
    source: str
    entries: tuple  # the kernels' ctypes functions, in order


class DynamicCpuCompiled(DynamicCompiled):
    """A symbolic program on the CPU: `k(*arrays, threads=None)` binds the symbols and runs the
    class's CPU kernels on `threads` OpenMP threads (default: the machine's cores)."""

    TARGETS = ("cpu",)

    def __init__(self, outputs, single: bool, deterministic: bool, gpu, split: int | None = None):
        super().__init__(outputs, single, "cpu", deterministic, gpu)
        self.machine = CpuMachine.detect()
        self.model = cpu_model(self.machine)
        self.split = split  # an override of the model's chunks per reduction (tests, experiments)
        self._libs: dict[str, ctypes.CDLL] = {}
        self._calls: dict[tuple[int, ...], _Call] = {}
        self._fast: dict[tuple, _Call] = {}  # by the inputs' (shape, dtype): calls whose checks held (`__call__`)
        self._names = frozenset(t.name for t in self.inputs)
        self.counters["sources_built"] = 0
        self.origin = "chosen by the CPU model"
        if self.program.formulations:  # ranked by the CPU model instead of by their reductions
            self.program = self.build(self.outputs, cost=self.formulation_cost)
        self._symbols = self.program.parameters  # (a property that sorts them: once, not per call)

    def formulation_cost(self, outputs) -> float:
        """The CPU model's time of a formulation's kernels (the best split of each) at a size hint
        of FORMULATION_HINT per symbol: the formulation is one for the program, not per class (an
        online softmax's struct accumulator costs more here than a second pass over a row in cache)."""
        try:
            p = self.build(outputs)
        except PanameraError:
            return math.inf
        hint = SizeClass.of({n: FORMULATION_HINT for n in p.parameters}, frozenset(), 1)
        return sum(
            map_cpu_group(g, kind, hint, self.model, self.deterministic).modeled_us
            for g, kind in zip(members(p), p.kinds)
        )

    def build(self, outputs, cost=None):
        """The program of the graph the CPU plans: one-hot selections summed over their axis read
        as gathers (schedule/onehot.py, as the static CPU target: cross_entropy's target logit one
        load per row, not a compare and a select per element), gathers read indirectly."""
        return build(onehot.gathers(tuple(outputs)), cost, gathers=True)

    def modeled_us(self, **sizes: int) -> float:
        """The CPU model's time (µs) of one call's kernels at `sizes` with its class's decisions (the
        figure a report gives at a size hint; DynamicCompiled's is the GPU model's).

        >>> import panamera as pn
        >>> k = pn.compile(pn.sum(pn.placeholder(("B", 768), name="x"), axis=1), target="cpu")
        >>> k.modeled_us(B=4096) > k.modeled_us(B=1) > 0
        True
        """
        sizes = self.given_sizes(sizes)
        plan = self.plan(self.size_class(sizes))
        kernels = zip(members(self.program), self.program.kinds, plan.decisions)
        return sum(
            time_at(g, kind, sizes, d.split, d.block, d.lanes, self.model, d.threads).total_us for g, kind, d in kernels
        )

    @property
    def schedule(self):
        raise OptionError(
            "target='cpu': a symbolic CPU program has no replayable schedule (its class plans are in explain())"
        )

    def size_class(self, sizes: dict[str, int]) -> SizeClass:
        """A power-of-two range per symbol, no alignment: no CPU decision needs one."""
        return SizeClass.of(sizes, frozenset(), 1)

    def explain(self) -> str:
        """The kernels, every class planned so far with its CPU decisions, and the machine."""
        return super().explain() + f"\n  machine: {self.model.describe()}"

    def describe_plan(self, plan: CpuClassPlan) -> str:
        """One CPU class plan's line in `explain()` (the CPU model's figure: no launches)."""
        return plan.describe()

    def plan(self, cls: SizeClass) -> CpuClassPlan:
        """The class's CPU plan, decided now by the CPU model (once per class)."""
        if cls not in self._plans:
            decisions = tuple(
                map_cpu_group(g, kind, cls, self.model, self.deterministic, self.split)
                for g, kind in zip(members(self.program), self.program.kinds)
            )
            self._plans[cls] = CpuClassPlan(cls, decisions)
            self.counters["classes_planned"] += 1
        return self._plans[cls]

    def _class(self, cls: SizeClass) -> _CpuClass:
        if cls in self._classes:
            return self._classes[cls]
        plan = self.plan(cls)
        kernels = tuple(
            render_cpu_group(g, d, self.program, f"pn_c{k}")
            for k, (g, d) in enumerate(zip(members(self.program), plan.decisions))
        )
        decls = sorted({r for k in kernels for r in k.reductions})
        source = cpu_source([*decls, *(k.source for k in kernels)])
        if source not in self._libs:  # classes with equal plans print equal sources: one library
            self._libs[source] = cpu_backend.build(source)
            self.counters["sources_built"] += 1
        entries = []
        for k in kernels:
            fn = getattr(self._libs[source], k.name)
            fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int), None
            entries.append(fn)
        ck = self._classes[cls] = _CpuClass(plan, kernels, source, tuple(entries))
        self.counters["classes_compiled"] += 1
        _count("classes_compiled")
        return ck

    def __call__(self, *arrays, **named):
        """DynamicCompiled's call; plain C-contiguous numpy arrays passed positionally (and
        `threads=`, a positive int) at shapes and dtypes a call has run at before skip its checks
        and its symbol binding, which held for that key: the prepared call runs at once (~15 µs
        a call instead of ~44 at rms_norm 1x8: a small kernel's whole time)."""
        threads = named.get("threads")
        if (not named or (len(named) == 1 and threads is not None and "threads" not in self._names)) and (
            threads is None or (type(threads) is int and threads >= 1)
        ):
            try:
                key = tuple((a.shape, a.dtype) for a in arrays if type(a) is np.ndarray and a.flags.c_contiguous)
            except AttributeError:
                key = ()
            call = self._fast.get(key) if len(key) == len(arrays) else None
            if call is not None:
                with self._lock:
                    self.counters["calls"] += 1
                    _count("calls")
                    outs = self._run_cpu(call, list(arrays), threads or self.machine.cores)
                return outs[0] if self.single else tuple(outs)
            result = super().__call__(*arrays, **named)
            if len(key) == len(arrays) == len(self.inputs):  # checked by the general path: kept for this key
                sizes = self.bind_sizes(arrays)
                call = self._calls.get(tuple(sizes[n] for n in self._symbols))
                if call is not None:
                    if len(self._fast) >= MAX_CALLS:
                        self._fast.clear()
                    self._fast[key] = call
            return result
        return super().__call__(*arrays, **named)

    def bind_sizes(self, arrays: list) -> dict[str, int]:
        """DynamicCompiled's binding, and the check the frontend leaves to it for a symbolic
        argmax/argmin (frontend/reduce.py `arg_index`): its reduced extent is at least 1 and fits the
        32-bit index of its key, at every call."""
        sizes = super().bind_sizes(arrays)
        for s in self.program.statements:
            if s.post is None or s.post.kind not in (FinishKind.ARGMAX_INDEX, FinishKind.ARGMIN_INDEX):
                continue
            n, what = _at(s.N, sizes), "argmax" if s.post.kind == FinishKind.ARGMAX_INDEX else "argmin"
            if n == 0:
                raise EmptyReductionError(
                    f"{what} of {s.result.label!r}: attempt to get {what} of an empty sequence (extent {s.N} is 0)"
                )
            if n >= 2**32:
                raise AxisError(
                    f"{what} of {s.result.label!r}: the reduced extent {s.N} = {n} does not fit a 32-bit index"
                )
        return sizes

    def _execute(self, args: list, sizes: dict[str, int], order: str, seed: int, threads: int | None) -> list:
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise OptionError(f"target='cpu': threads must be a positive int, got {threads!r}")
        key = tuple(sizes[n] for n in self._symbols)
        call = self._calls.get(key)
        if call is None:
            call = self._prepare(sizes)
        hosted = [np.ascontiguousarray(arrays_mod.to_host(a)) for a in args]  # a view when already contiguous
        return self._run_cpu(call, hosted, threads or self.machine.cores)

    def _prepare(self, sizes: dict[str, int]) -> _Call:
        """What every call at these sizes does (kept for the next call at them, up to MAX_CALLS
        sizes): the class's entry points with their extents, the buffers to allocate, the results."""
        ck = self._class(self.size_class(sizes))
        symbols = [sizes[n] for n in self.program.parameters]
        slot = {f"t:{t.uid}": n for n, t in enumerate(self.inputs)}
        allocs, steps = [], []
        for group, k, fn in zip(members(self.program), ck.kernels, ck.entries):
            for m in group:
                slot[f"t:{m.result.uid}"] = len(slot)
                allocs.append((math.prod(symbolic.evaluate(m.result.shape, sizes)), m.result.dtype.np))
            s = group[0]
            M, N = _at(s.M, sizes), _at(s.N, sizes)  # noqa: N806
            if M == 0:
                continue
            empty = tuple(m for m in group if m.kind == StatementKind.REDUCE and N == 0 and not m.combiner.has_identity)
            xs = (ctypes.c_longlong * len(scalars(self.program)))(M, N, *symbols)
            table = (ctypes.c_void_p * len(k.buffers))()  # filled per call (under the program's lock)
            steps.append((fn, table, tuple(slot[b] for b in k.buffers), xs, empty))
        results, used = [], set()
        for o in self.program.outputs:
            key = f"t:{storage(o).uid}"
            fresh = storage(o).op != "placeholder" and key not in used  # two outputs never share memory
            results.append((slot[key], symbolic.evaluate(o.shape, sizes), not fresh))
            used.add(key)
        if len(self._calls) >= MAX_CALLS:
            self._calls.clear()
        call = self._calls[tuple(symbols)] = _Call(tuple(allocs), tuple(steps), tuple(results))
        return call

    def _run_cpu(self, call: _Call, inputs: list[np.ndarray], threads: int) -> list:
        """One call: the outputs allocated, every kernel of the class in order."""
        bufs = inputs + [np.empty(n, dtype) for n, dtype in call.allocs]
        at = [address(b) for b in bufs]
        for fn, table, slots, xs, empty in call.steps:
            for m in empty:  # a reduction over nothing without an identity (max, min): numpy's error
                _refuse_empty(m)
            for q, k in enumerate(slots):
                table[q] = at[k]
            fn(table, xs, threads)
        return [(bufs[k].copy() if copy else bufs[k]).reshape(shape) for k, shape, copy in call.results]
