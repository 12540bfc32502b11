"""The compiled computation: `Compiled` runs a plan through its executor (runtime/executor.py) and
shows it (`explain`, `repr`: `describe_compiled`); `write_out` is numpy's `out=` for every target.

>>> import numpy as np, panamera as pn
>>> k = pn.compile(pn.sum(pn.placeholder((2, 3), name="a"), axis=1), target="emulator")
>>> isinstance(k, Compiled), k.target
(True, 'emulator')
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .codegen.kernel import RenderedKernel
from .errors import InputError
from .explain import render as explain_sections
from .frontend.tensor import Tensor
from .options import Options
from .poly.program import KernelGroup
from .runtime import arrays
from .runtime.executor import Executor
from .schedule.saved import Schedule
from .stages import Artifacts


def refuse_shared_names(names: list[str], named) -> None:
    """An InputError for a call by name (`named`: the names passed) where two placeholders share
    a name: one array must not be bound to both (every target's call, static and symbolic)."""
    shared = sorted({n for n in names if names.count(n) > 1} & set(named))
    if shared:
        raise InputError(
            f"input name(s) {shared} are shared by several placeholders: pass the arrays positionally "
            f"(in placeholder order: {names}), or give the placeholders distinct names"
        )


@dataclass(frozen=True)
class Compiled:
    """A compiled computation: `k(*arrays)` runs it; `k.source`, `k.plan`, `k.explain()`, and
    every stage's artifacts in `k.stages`."""

    stages: Artifacts
    options: Options
    single: bool
    executor: Executor = field(compare=False, repr=False)
    origin: str = "chosen by the model"  # or "from schedules/NAME", or "replayed from the given schedule"

    outputs = property(lambda self: self.stages.outputs)
    program = property(lambda self: self.stages.program)
    mappings = property(lambda self: self.stages.mappings)
    source = property(lambda self: self.stages.source)
    plan = property(lambda self: self.stages.plan)
    signatures = property(lambda self: self.stages.signatures)
    considered = property(lambda self: self.stages.considered)
    formulations = property(lambda self: self.stages.formulations)
    target = property(lambda self: str(self.options.target))
    deterministic = property(lambda self: self.options.deterministic)
    gpu = property(lambda self: self.options.gpu)

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """The placeholders a caller passes arrays for, in order (constant arrays it holds left out)."""
        return tuple(t for t in self.program.inputs if t.attr("bound") is None)

    @property
    def kernels(self) -> tuple[RenderedKernel, ...]:
        """The rendered reduction and map kernels (init kernels are in `stages.kernels`)."""
        return tuple(k for k in self.stages.kernels if isinstance(k, RenderedKernel))

    @property
    def groups(self) -> tuple[KernelGroup, ...]:
        """The kernel groups that run, one per mapping."""
        return tuple(g for g in self.stages.groups if g.M * g.N)

    @property
    def resident(self) -> dict:
        """Resident workspaces and counters per backend (see runtime/executor.py)."""
        return self.executor.resident

    @property
    def schedule(self) -> Schedule:
        """Every decision made for this program, replayable with `pn.compile(..., schedule=)`."""
        return Schedule(
            self.gpu.name,
            tuple(g.names for g in self.groups if g.stitched),
            tuple(m.decision for m in self.mappings),
            formulations=tuple(f.record for f in self.formulations),
            epilogues=tuple(g.names for g in self.groups if g.epilogue),
        )

    def __call__(self, *arrays, **named):
        """Run on arrays of any kind (numpy, CuPy, torch on the CPU or a GPU, or any object with
        `__dlpack__` or `__array__`; runtime/arrays.py), positionally in placeholder order or by
        name; returns new arrays of the caller's kind on the caller's device, or writes them into
        `out=` (an array, or a tuple of them for several outputs, of the results' shapes and
        dtypes) and returns that, as numpy's `out=` does. The emulator's `order=` ("forward",
        "reverse", "shuffled") and `seed=` set its thread order. Inputs are resolved first:
        `out`, `order` and `seed` are options only where no input has that name.

        >>> import numpy as np, panamera as pn
        >>> k = pn.compile(pn.sum(pn.placeholder((2, 3), name="a"), axis=1), target="emulator")
        >>> buf = np.zeros(2, np.float32)
        >>> k(a=np.ones((2, 3), np.float32), out=buf) is buf, buf.tolist()
        (True, [3.0, 3.0])
        """
        args, out, order, seed = self._bind(arrays, named)
        outs = self.executor(args, order, seed)
        if out is not None:
            return write_out(out, outs, self.single)
        return outs[0] if self.single else tuple(outs)

    def _bind(self, arrays: tuple, named: dict) -> tuple[list, object, str, int]:
        """The call's inputs in placeholder order (constant inputs filled in) and its options
        `out=`, `order=`, `seed=`: inputs are resolved first, so those are options only where no
        input has that name. Every target's `__call__` binds through here."""
        bound = {k: t.attr("bound") for k, t in enumerate(self.program.inputs) if t.attr("bound") is not None}
        names = [t.name for k, t in enumerate(self.plan.inputs) if k not in bound]
        opts = {k: named.pop(k) for k in ("out", "order", "seed") if k in named and k not in names}
        refuse_shared_names(names, named)
        args = self.executor.bind(arrays, named, bound)
        return args, opts.get("out"), opts.get("order", "forward"), opts.get("seed", 0)

    def explain(self, section=None) -> str:
        """The plan in named sections (panamera/explain.py): "plan", "mapping", "launches",
        "model", "fusion", "formulation", "dependences", "schedule", "source", a list of them, or
        "all"; by default every one but "schedule" and "source".

        >>> import panamera as pn
        >>> k = pn.compile(pn.sum(pn.placeholder((4, 100), name="x"), axis=1), target="emulator")
        >>> k.explain("launches").split()[:4]
        ['launch', 'pn_k0_reduce', 'grid=(1,', '1,']
        >>> len(k.explain(["plan", "launches"]).splitlines())  # plan, schedule, gpu; one launch
        4
        """
        return explain_sections(self, section)

    def __repr__(self) -> str:
        """A few lines: inputs and outputs with dtypes and shapes, the kernels, target and GPU."""
        return describe_compiled(self)


def _tensors(ts, limit: int = 4) -> str:
    shown = [f"{t.name or t.op}: {t.dtype}{list(t.shape)}" for t in ts[:limit]]
    return ", ".join(shown + ([f"... ({len(ts)} in all)"] if len(ts) > limit else []))


def describe_compiled(k: Compiled) -> str:
    """`repr(Compiled)`: what goes in and out, and what runs where (never the whole plan)."""
    plan = k.plan
    names = [ln.kernel for ln in plan.kernels]
    forms = sorted({str(ln.form) for ln in plan.kernels if ln.form})
    shown = ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
    return (
        f"<Compiled ({_tensors(k.inputs)}) -> ({_tensors(k.outputs)})\n"
        f"  {len(names)} kernel(s) [{shown}] {'/'.join(forms)}, {len(plan.per_call)} launch(es) per call, "
        f"{plan.modeled_us:.2f} us modeled on {k.gpu.name}; target {k.target}; schedule {k.origin}>"
    )


def write_out(out, results: list, single: bool):
    """numpy's `out=`: each result copied into the caller's array (numpy, CuPy or torch) of the same
    shape and dtype."""
    bufs = tuple(out) if isinstance(out, tuple | list) else (out,)
    if len(bufs) != len(results):
        raise InputError(f"out=: expected {len(results)} array(s), one per output, got {len(bufs)}")
    for k, (b, r) in enumerate(zip(bufs, results)):
        arrays.assign(b, r, f"out= output {k}")  # numpy, CuPy or torch, of the result's shape and dtype
    return bufs[0] if single else bufs
