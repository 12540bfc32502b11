"""The kernel of a stitched ROW group of a parametric program (poly/param_stitch.py).

Each block owns `ty` rows; `tx` threads share a row. The reductions run in phases, one per
accumulator (reductions of one source share it): the threads accumulate over the row (isl's loop
nest over the parametric domain, as codegen/param_kernel.py), then the phase ends as a static
stitched pass does (codegen/row_finish.py, the one printer): the accumulator all-reduced across
the row, every reduction's value in a register, stored by the row's leader; a later phase and
the final MAP read the finished values from registers. The MAP
phase then scans the row once more (an L2 hit for the rows a block holds) and stores the result.

>>> import panamera as pn
>>> from panamera.poly.params import build
>>> from panamera.schedule.param_mapping import map_group
>>> from panamera.schedule.size_class import SizeClass
>>> from panamera.model.gpu import H100
>>> p = build((pn.nn.layer_norm(pn.placeholder(("B", 64), name="x")),))
>>> members = tuple(p.statements[k] for k in p.groups[0])
>>> d = map_group(members, SizeClass.of({"B": 5}), H100, False, "stitched")
>>> k = render_group(members, d, p, "pn_g0", "int", "stitched")
>>> k.statement, k.source.count("pn_allreduce_x<")
('S0+S1+S2', 1)
"""

from __future__ import annotations

from ..poly.params import ParamProgram, PStatement
from ..schedule.param_mapping import ParamDecision
from .expr import convert
from .param_kernel import KernelArg, ParamKernel, _Body, c_m, finish, render
from .row_finish import finish_pass, shared_buffers
from .thread_loop import accumuland, identity_expr


def render_group(
    members: tuple[PStatement, ...], d: ParamDecision, program: ParamProgram, name: str, idx: str, kind: str = "single"
) -> ParamKernel:
    """One kernel for a group of statements (a single statement, an epilogue group or reductions
    sharing one accumulator: param_kernel.render)."""
    if kind == "siblings":
        return render(members[0], d, program, name, idx, siblings=members[1:])
    if kind != "stitched":
        return render(members[0], d, program, name, idx, members[1] if kind == "epilogue" else None)
    *reds, last = members
    row = last.as_rows_of(reds[0])
    own = {m.result.uid for m in members}
    inputs = list(dict.fromkeys(r.tensor.uid for m in members for r in m.reads if r.tensor.uid not in own))
    dtype_of = {r.tensor.uid: r.tensor.dtype for m in members for r in m.reads}
    args = [KernelArg(f"t:{u}", f"const {dtype_of[u].c_type}*", True) for u in inputs]
    args += [KernelArg(f"t:{m.result.uid}", f"{m.result.dtype.c_type}*", True) for m in members]
    scalars = [KernelArg("pn_M", "long long", False), KernelArg("pn_N", "long long", False)]
    scalars += [KernelArg(f"pn_s_{n}", "long long", False) for n in program.parameters]
    names = {u: f"in{k}" for k, u in enumerate(inputs)}
    params = [f"{a.ctype} __restrict__ {names[int(a.key[2:])]}" for a in args[: len(inputs)]]
    params += [f"{a.ctype} __restrict__ out{k}" for k, a in enumerate(args[len(inputs) :])]
    params += [f"{a.ctype} {a.key}" for a in scalars]
    lines = [
        f'extern "C" __global__ void __launch_bounds__({d.threads}) {name}({", ".join(params)}) {{',
        f"  typedef {idx} pn_idx;",
        "  const pn_idx bx = blockIdx.x, by = blockIdx.y, tx = threadIdx.x, ty = threadIdx.y;",
        "  (void)bx; (void)by; (void)tx; (void)ty; (void)pn_M; (void)pn_N;",
    ]
    lines += [f"  (void)pn_s_{n};" for n in program.parameters]
    lines += shared_buffers(reds, d.tx, d.ty)
    lines.append(f"  const pn_idx o = bx * {d.ty} + ty;  // the row this thread works on")
    regs: dict[int, str] = {}
    phases: dict[tuple, list[int]] = {}
    for k, red in enumerate(reds):
        phases.setdefault(red.accumulator_key(), []).append(k)
    owner = [0] * len(reds)
    for ks in phases.values():
        for k in ks:
            owner[k] = ks[0]
    every = {red.result.uid for red in reds}  # every reduction's result is stored (schedule/bound.py)
    for ks in phases.values():
        lead = reds[ks[0]]
        acc = f"acc{ks[0]}"
        lines.append(f"  {lead.acc.compute} {acc} = {identity_expr(lead)};")
        body = _Body(lead, d, names, dict(regs))

        def fold(val, lead=lead, acc=acc):
            return [f"{acc} = {lead.combiner.functor}::apply({acc}, {accumuland(lead, val)});"]

        def iteration(call, body=body, fold=fold):
            from . import islast

            a0, a1 = islast.expr(call.get_op_arg(1)), islast.expr(call.get_op_arg(2))
            return body.lanes(f"const pn_idx i = {a0};", a1, "j", fold)

        lines += body.loops(iteration)
        done, got = finish_pass(reds, ks, owner, d.tx, d.ty, "tx == 0", c_m(lead), every, finish)
        lines += done
        regs.update(got)
    out = len(reds)
    body = _Body(row, d, names, regs)

    def store(val):
        return [f"pn_st(&out{out}[i * pn_N + j], {convert(val, row.body.dtype, row.result.dtype)});"]

    def final(call):
        from . import islast

        a0, a1 = islast.expr(call.get_op_arg(1)), islast.expr(call.get_op_arg(2))
        return body.lanes(f"const pn_idx i = {a0};", a1, "j", store)

    lines += body.loops(final)
    lines.append("}")
    return ParamKernel(name, "+".join(m.name for m in members), "\n".join(lines), tuple(args + scalars))
