"""`Compiled.explain(section=...)`: what a compiled program is, in named sections.

    plan         kernels, launches per call, modeled time, target, how partials combine, where the
                 schedule came from
    mapping      each kernel group's mapping: task mappings, contraction figures, pipeline stages
                 (and a fused attention's plan)
    launches     every launch: grid, block, form, split, bytes, initialisations
    model        the performance model's parts of the whole plan (launch, DRAM, L2, issue, tail,
                 atomics) and the limit
    fusion       the isl schedule's fusions and what the planner considered
    formulation  the formulations chosen (e.g. a reduction rewritten as another)
    dependences  isl's flow dependences and whether reduction self-dependences were relaxed
    schedule     every decision as a replayable Schedule (JSON)
    source       the CUDA C source

`explain()` gives every section but `schedule` and `source` (as it always did); `panamera explain
--section NAME` (repeatable) asks for some.

>>> import panamera as pn
>>> k = pn.compile(pn.sum(pn.placeholder((4, 100), name="x"), axis=1), target="emulator")
>>> k.explain("plan").splitlines()[1]
'  schedule: chosen by the model'
>>> [str(s) for s in DEFAULT][:3]
['plan', 'mapping', 'launches']
"""

from __future__ import annotations

from collections.abc import Iterable

from .enums import StrEnum
from .errors import OptionError
from .model.estimate import estimate
from .model.library import library_matmul
from .runtime.plan import LaunchRole
from .schedule.contraction import contraction_info
from .schedule.pipeline import explain_lines as pipeline_lines


class Section(StrEnum):
    PLAN = "plan"
    MAPPING = "mapping"
    LAUNCHES = "launches"
    MODEL = "model"
    FUSION = "fusion"
    FORMULATION = "formulation"
    DEPENDENCES = "dependences"
    SCHEDULE = "schedule"
    SOURCE = "source"


DEFAULT = tuple(s for s in Section if s not in (Section.SCHEDULE, Section.SOURCE))


def sections(which: str | Section | Iterable[str | Section] | None) -> tuple[Section, ...]:
    """The sections asked for, checked: None is DEFAULT, "all" every one."""
    if which is None:
        return DEFAULT
    names = [which] if isinstance(which, str) else list(which)
    if names == ["all"]:
        return tuple(Section)
    out = []
    for n in names:
        try:
            out.append(Section(n))
        except ValueError:
            raise OptionError(
                f"explain: unknown section {n!r}; the sections are {[s.value for s in Section]} (or 'all')"
            ) from None
    return tuple(dict.fromkeys(out))


def render(k, which=None) -> str:
    """The sections of Compiled `k` asked for, in the order given."""
    return "\n".join(line for s in sections(which) for line in _RENDER[s](k))


def _plan(k) -> list[str]:
    plan, gpu = k.plan, k.gpu
    first = len(plan.launches) - len(plan.per_call)
    if k.stages.attention is not None:  # partials merged by one block in split order
        combine = "fixed-order merge"
    else:
        combine = f"{'deterministic' if k.deterministic else 'atomic'} combine"
    return [
        f"Panamera plan: {len(plan.kernels)} kernel(s), {len(plan.per_call)} launch(es) per call"
        f"{f' (+{first} on the first)' if first else ''}, "
        f"{plan.modeled_us:.2f} us modeled on {gpu.name}, "
        f"target {k.target}, {combine}",
        f"  schedule: {k.origin}",
    ] + ([f"  gpu: {k.options.gpu_origin}"] if k.options.gpu_origin else [])


def _mapping(k) -> list[str]:
    lines, gpu = [], k.gpu
    if k.stages.attention is not None:
        p = k.stages.attention
        lines.append(f"  fused attention (poly/attention.py): {p.describe()}")
        lines.append(
            "    considered (split, launches, us modeled): "
            + ", ".join(f"({s}, {n}, {us:.2f})" for s, n, us in p.considered)
        )
    for g, m in zip(k.groups, k.mappings):
        names = ", ".join(
            f"{s.name}={s.result.op}" + (f"[{s.combiner.name}]" if s.combiner else "") for s in g.statements
        )
        lines.append(f"  group {names}: {m.describe()}")
        lines += [f"    {loop} <- {t}" for loop, t in m.tasks.items() if t.extent > 1]
        lines += contraction_lines(g, m, gpu)
        lines += pipeline_lines(g, m, gpu)
    return lines


def _launches(k) -> list[str]:
    lines, gpu = [], k.gpu
    for ln in k.plan.launches:
        extra = ""
        if ln.role in (LaunchRole.REDUCE, LaunchRole.MAP):
            extra = (
                f" form={ln.form} blocks/reduction={ln.blocks_per_reduction} modes={','.join(ln.modes)}"
                f" read={ln.bytes_read}B written={ln.bytes_written}B modeled={ln.modeled_us:.2f}us ({gpu.name}, modeled)"
            )
        elif ln.atomic_outputs:
            when = (
                "on the first call only (resident, reset by the last block)"
                if ln.role == LaunchRole.INIT_ONCE
                else "every call"
            )
            extra = f" initialises {when}: " + ", ".join(f"{key}={v}" for key, v in ln.atomic_outputs)
        if ln.cooperative:
            extra += " cooperative (all blocks resident: split rows exchange partials)"
        if ln.cluster > 1:
            extra += f" clusters of {ln.cluster} blocks (split rows exchange partials in distributed shared memory)"
        lines.append(f"  launch {ln.kernel} grid={ln.grid} block={ln.block}{extra}")
    return lines


def _model(k) -> list[str]:
    e = estimate(k.plan, k.gpu)
    parts = {"launch": e.launch_us, "DRAM": e.dram_us, "L2": e.l2_us, "issue": e.issue_us, "tail": e.tail_us,
             "atomics": e.atomic_us, "grid waits": e.sync_us}  # fmt: skip
    shown = ", ".join(f"{name} {us:.2f}" for name, us in parts.items() if us > 0)
    return [
        f"  model ({e.gpu}, modeled): {e.total_us:.2f} us per call; limit {e.limit_us:.2f} us, ratio "
        f"{e.ratio_to_limit:.2f}; {e.launches} launch(es), {e.dram_bytes} bytes moved ({e.compulsory_bytes} "
        f"compulsory)",
        f"    parts in us (model/kernel_cost.py's kernel_time overlaps some of them): {shown or 'none'}",
    ]


def _fusion(k) -> list[str]:
    lines = [f"  fusion (isl schedule): {f.describe()}" for f in k.program.fusions if f.producers]
    return lines + [f"  planner: {c.describe()}" for c in k.considered]


def _formulation(k) -> list[str]:
    return [f"  formulation: {f.describe()}" for f in k.formulations]


def _dependences(k) -> list[str]:
    if k.program.deps is None:
        return []
    return [
        f"  dependences (isl flow): {k.program.deps.flow}",
        f"  relaxed (reduction self-dependences): {not k.program.deps.relaxed.is_empty()}",
    ]


def _schedule(k) -> list[str]:
    return [f"  schedule ({k.origin}; replay with pn.compile(..., schedule=k.schedule)):", k.schedule.to_json()]


def _source(k) -> list[str]:
    return [k.source.rstrip("\n")]


_RENDER = {
    Section.PLAN: _plan,
    Section.MAPPING: _mapping,
    Section.LAUNCHES: _launches,
    Section.MODEL: _model,
    Section.FUSION: _fusion,
    Section.FORMULATION: _formulation,
    Section.DEPENDENCES: _dependences,
    Section.SCHEDULE: _schedule,
    Section.SOURCE: _source,
}


def contraction_lines(g, m, gpu) -> list[str]:
    """explain()'s figures of a contraction: Panamera's modeled time and what binds it, against
    the library's (cuBLAS on a tensor-core roofline, model/library.py)."""
    info = contraction_info(g)
    if info is None or m.cost is None:
        return []
    c = m.cost
    parts = {"DRAM": c.dram_s, "L2 (re-read operands)": c.l2_s, "arithmetic issue": c.issue_s}
    binds = max(parts, key=parts.get)
    lib = library_matmul(gpu, info.M, info.N, info.K, 1, info.dtype, info.out_itemsize)
    verdict = "compute-bound" if binds == "arithmetic issue" or lib.compute_bound else "memory-bound"
    faster = "Panamera" if c.total_s < lib.total_s else "the library"
    return [
        f"    contraction {info.subscripts}: M={info.M} N={info.N} K={info.K}, {info.flops / 1e6:.1f} MFLOP, "
        f"{verdict}; Panamera {c.total_s * 1e6:.2f} us (bound by {binds}) vs {lib.describe()}: "
        f"{faster} is modeled faster"
    ]
