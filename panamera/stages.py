"""The ordered list of named stages over immutable values (`STAGES`, run by `run_stages`):

    graph ─formulations─► graph' ─program─► Program ─groups─► kernel groups ─mappings─► Mappings
          ─kernels─► CUDA C per group ─plan─► LaunchPlan + source

Each stage takes the `Artifacts` so far and the `Options` and returns new Artifacts; each decision
is made once, by the stage that owns it, and carried downstream as data.

>>> import panamera as pn
>>> from panamera.options import Options
>>> x = pn.placeholder((4, 100), "float32", name="x")
>>> run_stages((pn.sum(x, axis=1),), Options.make(target="emulator"), stop_after="groups")
<Artifacts of 1 output(s): stages formulations, program, groups done>
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import cache as compile_cache
from . import logs
from . import segments as sorted_segments
from .codegen import islast
from .codegen.attention_kernel import AttentionKernels, render_attention
from .codegen.header import prelude
from .codegen.kernel import InitKernel, RenderedKernel, render_empty, render_kernel, render_zero
from .errors import OptionError, ScheduleError, Unsupported
from .frontend.tensor import Tensor
from .launch_plan import (
    _init_launch,
    _kernel_launch,
    _output_specs,
    _queued,
    _result_spec,
    vector_alignments,
    view_source,
)
from .options import Options, Target
from .poly import attention as fused_attention
from .poly.program import KernelGroup, Program, build_program
from .runtime.plan import BufferRole, InputSpec, Launch, LaunchPlan, LaunchRole
from .schedule.attention import AttentionPlan, plan_attention
from .schedule.cpu_operands import stored_operands
from .schedule.formulation import Formulation, choose_formulations, substitute
from .schedule.mapping import Mapping, map_group, replay
from .schedule.planner import Considered, EpilogueConsidered, plan_groups
from .schedule.segments import SegmentPlan

_log = logs.get("compiler")


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


def rebind_stages(a: Artifacts, outs: tuple[Tensor, ...]) -> Artifacts:
    """The stages of a program compiled before, for a graph of the same signature: its outputs and
    placeholders (whose names bind the inputs)."""
    holders = compile_cache.placeholders(outs)
    specs = tuple(dataclasses.replace(s, name=t.name) for s, t in zip(a.plan.inputs, holders))
    plan = dataclasses.replace(a.plan, inputs=specs)
    return dataclasses.replace(a, outputs=outs, plan=plan, program=dataclasses.replace(a.program, inputs=holders))
