"""`pn.compile`: an ordered list of named stages over immutable values, then an executor.

    graph ─formulations─► graph' ─program─► Program ─groups─► kernel groups ─mappings─► Mappings
          ─kernels─► CUDA C per group ─plan─► LaunchPlan + source  ──►  Compiled (runtime/executor.py)

Each stage takes the `Artifacts` so far and the `Options` and returns new Artifacts; each decision
is made once, by the stage that owns it, and carried downstream as data. `lower(...,
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
import logging
import math
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import cache as compile_cache
from . import logs
from . import segments as sorted_segments
from .codegen import islast
from .codegen.attention_kernel import AttentionKernels, render_attention
from .codegen.header import prelude
from .codegen.kernel import InitKernel, RenderedKernel, render_empty, render_kernel, render_zero
from .enums import StrEnum
from .errors import EmulatorWarning, InputError, OptionError, PanameraError, ScheduleError, TargetRefused, Unsupported
from .explain import contraction_lines  # noqa: F401  (the public name it always had)
from .explain import render as explain_sections
from .frontend.tensor import Tensor
from .model.detect import resolve as resolve_gpu
from .model.gpu import H100, GPUSpec, kernel_time
from .poly import attention as fused_attention
from .poly.access import AccessKind
from .poly.program import KernelGroup, Program, build_program
from .poly.statement import Form
from .runtime import arrays
from .runtime import cuda as cuda_backend
from .runtime.executor import Executor
from .runtime.plan import BufferRole, BufferSpec, InputSpec, Launch, LaunchPlan, LaunchRole, ResultSpec
from .schedule import database
from .schedule.attention import AttentionPlan, plan_attention
from .schedule.cpu_operands import stored_operands
from .schedule.formulation import Formulation, choose_formulations, substitute
from .schedule.mapping import Mapping, map_group, replay
from .schedule.planner import Considered, EpilogueConsidered, plan_groups
from .schedule.saved import Schedule
from .schedule.segments import SegmentPlan

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


# Targets compiled by a later module, which registers itself here on import (the package imports
# cpu_target.py, which builds on this module's stages, for target="cpu").
TARGET_COMPILERS: dict[Target, Callable] = {}

# The compiler of graphs with symbolic extents (panamera/dynamic.py registers itself on import).
SYMBOLIC: list[Callable] = []


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


@dataclass(frozen=True)
class Artifacts:
    """What the stages have produced so far; each stage fills its own fields."""

    outputs: tuple[Tensor, ...]  # as the user gave them
    graph: tuple[Tensor, ...] = ()  # formulations: the outputs with every formulation chosen
    formulations: tuple[Formulation, ...] = ()
    program: Program | None = None  # program
    groups: tuple[KernelGroup, ...] = ()  # groups: every kernel group, empty ones too
    considered: tuple[Considered | EpilogueConsidered, ...] = ()
    mappings: tuple[Mapping, ...] = ()  # mappings: one per group with iterations, in order
    kernels: tuple[RenderedKernel | InitKernel, ...] = ()  # kernels: per group, in order
    plan: LaunchPlan | None = None  # plan
    source: str = ""
    signatures: tuple[tuple[str, tuple[str, ...]], ...] = ()  # C parameter types of every kernel
    fused: fused_attention.AttentionChain | None = None  # program: a legal fused attention (poly/attention.py)
    attention: AttentionPlan | None = None  # mappings: its plan (schedule/attention.py)
    attention_kernels: AttentionKernels | None = None  # kernels: its CUDA C
    segment: Tensor | None = None  # program: a sorted-segment scatter-add, the whole computation (segments.py)
    segments: SegmentPlan | None = None  # mappings: its plan (schedule/segments.py)

    def __repr__(self) -> str:
        """One line: which stages are done (every stage's value is an attribute)."""
        done = [n for n, v in (("formulations", self.graph), ("program", self.program),
                               ("groups", self.groups or self.fused), ("mappings", self.mappings or self.attention or self.segments),
                               ("kernels", self.kernels or self.attention_kernels), ("plan", self.plan)) if v]  # fmt: skip
        return f"<Artifacts of {len(self.outputs)} output(s): stages {', '.join(done) or 'none'} done>"


def sanitize(name: str, limit: int = 24) -> str:
    """An identifier safe for C made of a tensor name (ONNX names have ':' and worse)."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)[:limit].strip("_")
    return s or "t"


def view_source(t: Tensor) -> Tensor:
    """The tensor whose buffer holds `t`: an output reshape is a view, never a kernel."""
    while t.op == "reshape":
        t = t.inputs[0]
    return t


def kernel_name(k: int, group: KernelGroup) -> str:
    if group.M > 0 and group.N == 0:
        return f"pn_k{k}_empty"
    res = group.statements[0].result
    return f"pn_k{k}_{sanitize(res.name or res.op)}"


# -- the stages ---------------------------------------------------------------------------------
def _formulations(a: Artifacts, o: Options) -> Artifacts:
    def cost(outputs: tuple[Tensor, ...]) -> float:  # an alternative alone, planned freely on this GPU
        if not sorted_segments.fits(a.outputs, outputs):  # sorted segments inside a larger computation
            return math.inf
        alone = Options(Target.EMULATOR, False, o.gpu)
        try:
            return run_stages(outputs, alone).plan.modeled_us
        except Unsupported:  # a form that cannot take this graph (segments.py's preconditions)
            return math.inf

    saved = o.schedule.formulations if o.schedule is not None else None
    graph, chosen = choose_formulations(a.outputs, cost, saved, o.deterministic)
    return dataclasses.replace(a, graph=graph, formulations=chosen)


def _program(a: Artifacts, o: Options) -> Artifacts:
    node = sorted_segments.recognize(a.graph)
    if node is not None:
        return dataclasses.replace(a, program=sorted_segments.program_of(node, a.graph), segment=node)
    fused = fused_attention.recognize(a.graph)
    if fused is not None:
        return dataclasses.replace(a, program=fused_attention.program_of(fused), fused=fused)
    nodes = fused_attention.chains_in(a.graph)  # fused attention where it is not legal: its chain
    graph = substitute(a.graph, {t.uid: fused_attention.chain_of(t) for t in nodes}) if nodes else a.graph
    outs = tuple(view_source(t) for t in graph)
    stored = stored_operands(outs) if o.target == Target.CPU else frozenset()  # no on-chip operand tiles
    return dataclasses.replace(a, graph=graph, program=build_program(outs, stored))


def _groups(a: Artifacts, o: Options) -> Artifacts:
    if a.fused is not None or a.segment is not None:
        return a
    replayed = o.schedule.stitched if o.schedule is not None else None
    epilogues = o.schedule.epilogues if o.schedule is not None else ()
    groups, considered = plan_groups(
        a.program,
        o.gpu,
        allow_stitch=o.split is None,
        replay=replayed,
        replay_epilogues=epilogues,
        deterministic=o.deterministic,
        columns=o.target != Target.CPU,  # the CPU kernels have no column partials
    )
    return dataclasses.replace(a, groups=groups, considered=considered)


def _mappings(a: Artifacts, o: Options) -> Artifacts:
    if a.fused is not None:
        return dataclasses.replace(a, attention=plan_attention(a.fused, o.gpu, o.split))
    if a.segment is not None:
        return dataclasses.replace(a, segments=sorted_segments.plan_of(a.segment, o.gpu))
    mappings = []
    for k, grp in enumerate(a.groups):
        if grp.M * grp.N == 0:
            continue
        name = kernel_name(k, grp)
        if o.schedule is not None:
            saved = o.schedule.kernel(len(mappings), f"{grp.form} {grp.M}x{grp.N}")
            mappings.append(replay(grp, saved, o.gpu, name, o.deterministic, f"schedule kernel {len(mappings)}: "))
        else:
            mappings.append(map_group(grp, o.gpu, o.split, o.deterministic, name=name))
    if o.schedule is not None and len(o.schedule.kernels) != len(mappings):
        raise ScheduleError(f"schedule has {len(o.schedule.kernels)} kernel(s), the program {len(mappings)}")
    return dataclasses.replace(a, mappings=tuple(mappings))


def _kernels(a: Artifacts, o: Options) -> Artifacts:
    if a.attention is not None:
        return dataclasses.replace(a, attention_kernels=render_attention(a.attention, "pn_k0_attention"))
    if a.segments is not None:
        return a  # rendered with its plan (segments.py)
    kernels, mappings = [], iter(a.mappings)
    specs = _output_specs(a.groups)
    for k, grp in enumerate(a.groups):
        if grp.M > 0 and grp.N == 0:  # reductions over nothing
            kernels.append(render_empty(kernel_name(k, grp), grp, specs))
        elif grp.M * grp.N:
            m = next(mappings)
            kernels += [z for z in (render_zero(f"{m.name}_zero", grp, specs),) if z is not None]  # a scatter's output
            kernels.append(render_kernel(m.name, grp, m))
    return dataclasses.replace(a, kernels=tuple(kernels))


def _plan(a: Artifacts, o: Options) -> Artifacts:
    if a.attention_kernels is not None:
        return _attention_plan(a, o)
    if a.segments is not None:
        plan, source, signatures = sorted_segments.launch_plan(a.segment, a.segments, a.graph, a.program.inputs)
        plan = dataclasses.replace(plan, launches=_queued(list(plan.launches), o.gpu))
        return dataclasses.replace(a, plan=plan, source=source, signatures=signatures)
    buffers = _output_specs(a.groups)
    launches, parts, signatures = [], [islast.HELPERS], {}
    live = [g for g in a.groups if g.M * g.N]
    by_name = {m.name: (g, m) for g, m in zip(live, a.mappings)}

    def add_init(init: InitKernel, role: LaunchRole):
        launches.append(_init_launch(init, buffers, o.gpu, role))
        parts.append(init.source)
        signatures[init.name] = tuple(init.signature)

    for rk in a.kernels:
        if isinstance(rk, InitKernel):
            add_init(rk, LaunchRole.INIT)
            continue
        grp, m = by_name[rk.name]
        for p in rk.params:
            buffers.setdefault(p.key, p)
        if rk.init:
            add_init(rk.init, LaunchRole.INIT_ONCE)
        parts.append(rk.source)
        signatures[rk.name] = tuple(rk.signature)
        launches.append(_kernel_launch(rk, grp, m))
    inputs = a.program.inputs
    aligns = vector_alignments(live, a.mappings)
    plan = LaunchPlan(
        _queued(launches, o.gpu),
        buffers,
        tuple(InputSpec(t.name, f"in:{t.uid}", t.shape, t.dtype, aligns.get(t.uid, 1)) for t in inputs),
        tuple(_result_spec(t, inputs) for t in a.graph),
    )
    body = "\n".join(parts) + "\n"
    source = prelude(body) + body  # the 16-bit headers only where a 16-bit type occurs
    return dataclasses.replace(a, plan=plan, source=source, signatures=tuple(signatures.items()))


def _attention_plan(a: Artifacts, o: Options) -> Artifacts:
    """The launches of a fused attention: the counter init (first call only), the main kernel,
    the merge kernel where the plan has two launches."""
    p, rk = a.attention, a.attention_kernels
    buffers = {b.key: b for specs in rk.params.values() for b in specs}
    launches, parts, signatures = [], [islast.HELPERS], {}
    if rk.init is not None:
        launches.append(_init_launch(rk.init, buffers, o.gpu, LaunchRole.INIT_ONCE))
        parts.append(rk.init.source)
        signatures[rk.init.name] = tuple(rk.init.signature)
    parts.append(rk.source)
    grids = {rk.main: p.grid, rk.merge: (p.row_tiles, p.grid[1])}
    for (name, specs), cost in zip(rk.params.items(), p.costs):
        signatures[name] = tuple(f"{'const ' if b.role == BufferRole.INPUT else ''}{b.ctype}*" for b in specs)
        io = {b.key: b for b in specs if b.role in (BufferRole.INPUT, BufferRole.OUTPUT)}.values()
        stores = name != rk.main or not rk.merge  # a two-launch split's main kernel writes partials only
        launches.append(
            Launch(
                name,
                (*grids[name], 1),
                (p.threads, 1, 1),
                tuple(("buf", b.key) for b in specs),
                role=LaunchRole.REDUCE,
                form="ATTENTION",
                blocks_per_reduction=p.split if name == rk.main else 1,
                bytes_read=sum(b.nbytes for b in io if b.role == BufferRole.INPUT),
                bytes_written=sum(b.nbytes for b in io if b.role == BufferRole.OUTPUT) if stores else 0,
                mapping=p.describe(),
                modeled_us=cost.total_s * 1e6,
                cost_features=cost.features,
            )  # fmt: skip
        )
    align = p.vec * p.chain.dtype.itemsize
    inputs = a.program.inputs
    specs = tuple(
        InputSpec(t.name, f"in:{t.uid}", t.shape, t.dtype, align if t.uid in (p.chain.q.uid, p.chain.k.uid, p.chain.v.uid) else 1)
        for t in inputs
    )  # fmt: skip
    plan = LaunchPlan(_queued(launches, o.gpu), buffers, specs, tuple(_result_spec(t, inputs) for t in a.graph))
    body = "\n".join(parts) + "\n"
    return dataclasses.replace(a, plan=plan, source=prelude(body) + body, signatures=tuple(signatures.items()))


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Artifacts, Options], Artifacts]


STAGES: tuple[Stage, ...] = (
    Stage("formulations", _formulations),
    Stage("program", _program),
    Stage("groups", _groups),
    Stage("mappings", _mappings),
    Stage("kernels", _kernels),
    Stage("plan", _plan),
)


def run_stages(outputs: tuple[Tensor, ...], options: Options, stop_after: str | None = None) -> Artifacts:
    names = [s.name for s in STAGES]
    if stop_after is not None and stop_after not in names:
        raise OptionError(f"unknown stage {stop_after!r}; the stages are {names}")
    a = Artifacts(outputs)
    timing = _log.isEnabledFor(logging.DEBUG)
    for stage in STAGES:
        t0 = time.perf_counter() if timing else 0.0
        a = stage.run(a, options)
        if timing:
            _log.debug("stage %s: %.1f ms", stage.name, (time.perf_counter() - t0) * 1e3)
        if stage.name == stop_after:
            break
    return a


# -- pieces of the plan -------------------------------------------------------------------------
def _output_specs(groups) -> dict[str, BufferSpec]:
    out = {}
    for grp in groups:
        for s in grp.statements:
            res = s.result
            out[f"out:{res.uid}"] = BufferSpec(
                f"out:{res.uid}", res.dtype.c_type, res.dtype, res.size, BufferRole.OUTPUT
            )
    return out


def vector_alignments(groups, mappings) -> dict[int, int]:
    """Per tensor uid, the alignment in bytes its buffer needs: the widest vector load any kernel
    makes of it (vector width x item size; a contiguous read at width `vec` starts at a multiple
    of `vec` elements, which isl checked when it classified the read)."""
    out: dict[int, int] = {}
    for grp, m in zip(groups, mappings):
        for s, kinds in zip(grp.statements, m.access):
            for r, kind in zip(s.reads, kinds):
                if kind == AccessKind.CONTIG and m.vec > 1:
                    uid = r.tensor.uid
                    out[uid] = max(out.get(uid, 1), m.vec * r.tensor.dtype.itemsize)
    return out


def _result_spec(t: Tensor, inputs: tuple[Tensor, ...]) -> ResultSpec:
    src = view_source(t)
    if src.op == "placeholder":
        return ResultSpec(t.shape, src.size, input_index=[i.uid for i in inputs].index(src.uid))
    return ResultSpec(t.shape, src.size, key=f"out:{src.uid}")


def _queued(launches: list[Launch], gpu: GPUSpec) -> tuple[Launch, ...]:
    """Every launch of a call after its first is queued behind another: its modeled time pays the
    gap of a queued launch, not the per-kernel floor (model/estimate.py does the same)."""
    saving = (gpu.launch_s - gpu.queued_s) * 1e6
    out, first = [], True
    for ln in launches:
        if ln.role != LaunchRole.INIT_ONCE:
            ln = ln if first else dataclasses.replace(ln, modeled_us=ln.modeled_us - saving)
            first = False
        out.append(ln)
    return tuple(out)


def _init_launch(init: InitKernel, buffers: dict, gpu: GPUSpec, role: LaunchRole) -> Launch:
    """The one launch that initialises a kernel's atomic outputs, workspaces and counters."""
    specs = [buffers[f.buffer] for f in init.fills]
    nbytes = sum(p.nbytes for p in specs)
    threads, blocks = 256, min(math.ceil(max(p.size for p in specs) / 256), 1024)
    cost = kernel_time(
        gpu, dram_bytes=nbytes, write_bytes=nbytes, blocks=blocks, threads=threads, bytes_in_flight_per_thread=4
    )
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


def _kernel_launch(rk: RenderedKernel, grp: KernelGroup, m: Mapping) -> Launch:
    return Launch(
        rk.name,
        (*m.launch_grid, 1),
        (m.tx, m.ty, 1),
        tuple(("buf", p.key) for p in rk.params),
        role=LaunchRole.MAP if grp.form == Form.MAP else LaunchRole.REDUCE,
        form=grp.form,
        blocks_per_reduction=m.split,
        atomic_outputs=tuple((f.buffer, f.value) for f in rk.fills if f.buffer != f"cnt:{rk.name}"),
        modes=rk.modes,
        bytes_read=sum(p.size * p.dtype.itemsize for p in rk.params if p.role == BufferRole.INPUT),
        bytes_written=sum(p.size * p.dtype.itemsize for p in rk.params if p.role == BufferRole.OUTPUT),
        mapping=m.describe(),
        modeled_us=m.cost.total_s * 1e6,
        cost_features=m.cost.features,
        cooperative=m.cooperative,
        cluster=m.cluster,
    )


# -- the compiled computation -------------------------------------------------------------------
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
        if named:
            shared = sorted({n for n in names if names.count(n) > 1} & set(named))
            if shared:
                raise InputError(
                    f"input name(s) {shared} are shared by several placeholders: pass the arrays positionally "
                    f"(in placeholder order: {names}), or give the placeholders distinct names"
                )
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


def _outputs(outputs) -> tuple[bool, tuple[Tensor, ...]]:
    single = isinstance(outputs, Tensor)
    outs = (outputs,) if single else tuple(outputs)
    if not outs or not all(isinstance(t, Tensor) for t in outs):
        raise PanameraError("compile: expected a Tensor or a non-empty list of Tensors")
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


def rebind_stages(a: Artifacts, outs: tuple[Tensor, ...]) -> Artifacts:
    """The stages of a program compiled before, for a graph of the same signature: its outputs and
    placeholders (whose names bind the inputs)."""
    holders = compile_cache.placeholders(outs)
    specs = tuple(dataclasses.replace(s, name=t.name) for s, t in zip(a.plan.inputs, holders))
    plan = dataclasses.replace(a.plan, inputs=specs)
    return dataclasses.replace(a, outputs=outs, plan=plan, program=dataclasses.replace(a.program, inputs=holders))
