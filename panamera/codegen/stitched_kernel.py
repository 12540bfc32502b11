"""The stitched template: reductions and their consumers over whole rows (poly/stitch.py).

A block owns whole rows and makes one pass over each row per level of the mapping's `levels`:
the pass's reductions are all-reduced across the row and broadcast through shared memory, so the
next pass reads them from registers; a row epilogue runs on the row's leader thread once the
values it reads are final.
"""

from __future__ import annotations

from ..poly.statement import StatementKind
from ..poly.stitch import is_epilogue
from ..schedule.mapping import passes
from .expr import convert
from .thread_loop import ThreadLoop, c_ident, identity_expr, post, post_dtype


def emit_stitched(loop: ThreadLoop) -> list[str]:
    g, m = loop.g, loop.m
    level = m.levels
    epilogues = [k for k, s in enumerate(g.statements) if is_epilogue(s)]
    out = [f"  const pn_idx o = bx * {m.ty} + ty;  // the row this thread works on"]
    for ct in dict.fromkeys(s.acc.compute for s in g.statements if s.kind == StatementKind.REDUCE):
        safe = c_ident(ct)
        out.append(f"  __shared__ {ct} pn_smem_{safe}[{m.ty * max(1, m.tx // 32)}];")
        out.append(f"  __shared__ {ct} pn_bcast_{safe}[{m.ty}];")
    for lv in range(passes(g, level)):
        here = [k for k in range(len(g.statements)) if level[k] == lv and k not in epilogues]
        out.append(f"  // pass {lv}: " + ", ".join(g.statements[k].name for k in here))
        own = g.accumulator_of  # a statement that shares an accumulator reads its owner's
        for k in here:
            s = g.statements[k]
            if s.kind == StatementKind.REDUCE and own[k] == k:
                out.append(f"  {s.acc.compute} acc{k} = {identity_expr(s)};")
        out += loop.loops(lambda call, here=here: loop.iteration(call, here))
        for k in here:
            s = g.statements[k]
            if s.kind != StatementKind.REDUCE:
                continue
            if own[k] == k:
                safe = c_ident(s.acc.compute)
                tmpl = f"<{s.combiner.functor}, {m.tx}, {m.ty}>"
                out.append(f"  acc{k} = pn_allreduce_x{tmpl}(acc{k}, pn_smem_{safe}, pn_bcast_{safe});")
            reg = f"r{k}"
            final = convert(post(s, f"acc{own[k]}"), post_dtype(s), s.result.dtype)
            out.append(f"  const {s.result.dtype.compute} {reg} = {final};")
            loop.regs[s.result.uid] = reg
            if s.result.uid in g.external:
                out.append(f"  if (tx == 0 && o < {g.M}) pn_st(&out{k}[o], {reg});")
        for k in epilogues:  # the row's leader, once every value the epilogue reads is final
            s = g.statements[k]
            if level[k] != lv + 1:
                continue
            body, val = loop.body_lines(k, None)
            out.append(f"  if (tx == 0 && o < {g.M}) {{")
            out.append("    const pn_idx i = o; const pn_idx j = 0;")
            out += ["    " + ln for ln in body]
            out.append(f"    pn_st(&out{k}[{loop.address(s.write)}], {convert(val, s.body.dtype, s.result.dtype)});")
            out.append("  }")
    return out
