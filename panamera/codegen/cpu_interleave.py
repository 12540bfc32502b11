"""Several rows a pass (the decision's `rows` = R > 1, schedule/cpu_rows.py): a stitched ROW group
of short rows runs its passes over R rows at once, so that the rows' dependency chains (softmax's
max -> fold -> exp -> sum -> reciprocal, ~300 instructions a row) are independent work side by
side in the core's window instead of one row's chain at a time.

Each row keeps the one-row code (`_Kernel`'s bodies, finishes, reciprocals): its registers
(`accK`, `pn_rK`, `pn_rcp...`) become arrays over the R rows (`accK_R[r]`), and every piece of row
r's code runs in a scope that binds those names to row r's elements (`auto& accK = accK_R[r];`),
`i` to the row and each scratch row `pn_cseN` to row r's part of an R-row scratch (or to its output
row: `Reuse.into`). The reduction passes step every row's lanes in turn in one scan
(codegen/cpu_lanes.py); their folds, tails, finishes and the element-wise passes run row after row.
Every row's operations and rounding are the one-row code's, so results are bit-identical to R = 1
and across thread counts; the last M % R rows run the one-row loop.
"""

from __future__ import annotations

import re

from .thread_loop import identity_expr

_DECL = re.compile(r"^(float|double|bool) (pn_rcp\w+);$")


def rows_region(kern, tail: list[str], passes: int) -> list[str]:
    """The parallel region of a split-free ROW group whose decision has rows = R > 1: the groups
    of R rows under `omp for`, then `tail` (the one-row loop over the last M % R rows), then
    frees. `kern` is codegen/cpu_kernel.py's `_Kernel`; `passes` its number of row passes."""
    g, d = kern.g, kern.d
    R, full = d.rows, d.M - d.M % d.rows
    regs: list[str] = []  # row registers declared so far, arrays over the rows
    stride = {n: f"((({d.N}LL * sizeof({x.ctype}) + 63) / 64 * 64) / sizeof({x.ctype}))" for n, x in enumerate(d.reuse)}

    def bind(r: int) -> list[str]:
        out = [f"const pn_idx i = pn_i0 + {r};"] + [f"auto& {n} = {n}_R[{r}];" for n in regs]
        return (
            out
            + [
                f"{x.ctype}* __restrict__ pn_cse{n} = pn_cseall{n} + {r} * {stride[n]};"
                for n, x in enumerate(d.reuse)
                if x.into is None
            ]
            + kern.output_scratch()
        )

    def each(lines: list[str], kept: list[str]) -> list[str]:  # per row r: lines, then `kept` names stored to row r's
        return [
            ln
            for r in range(R)
            for ln in ["{", *["  " + x for x in bind(r) + lines + [f"{n}_R[{r}] = {n};" for n in kept]], "}"]
        ]

    body = []
    kern.read_back()
    for lv in range(passes):
        here = [k for k in range(len(g.statements)) if kern.level[k] == lv and k not in kern.epilogues]
        owners = kern.owners(here)
        for k in owners:
            body.append(f"{g.statements[k].acc.compute} acc{k}_R[{R}];")
            regs.append(f"acc{k}")
        pre = [f"acc{k} = {identity_expr(g.statements[k])};" for k in owners]
        rcp = kern.reciprocals(here) if lv else []
        names = [m.groups() for m in map(_DECL.match, rcp) if m]
        body += [f"{t} {n}_R[{R}];" for t, n in names]
        body += each(pre + rcp, [n for _, n in names])
        regs += [n for _, n in names]
        body += kern.row_pass(here, "0", str(d.N), rows=R, bind=bind)
        done = [k for k in here if k in kern.reductions]
        fin = kern.finish(done, lambda k: f"acc{k}")
        body += [f"{g.statements[k].result.dtype.compute} pn_r{k}_R[{R}];" for k in done]
        body += each(fin + kern.run_epilogues(lv), [f"pn_r{k}" for k in done])
        regs += [f"pn_r{k}" for k in done]
    alloc, free = [], []
    for n, x in enumerate(d.reuse):  # R scratch rows per reused value and thread, 64-byte aligned
        if x.into is not None:  # the output rows (bind)
            continue
        alloc.append(
            f"{x.ctype}* __restrict__ pn_cseall{n} = ({x.ctype}*)aligned_alloc(64, {R} * {stride[n]} * sizeof({x.ctype}));"
        )
        alloc.append(f"{x.ctype}* __restrict__ pn_cse{n} = pn_cseall{n};  // the one-row loop's")
        free.append(f"free(pn_cseall{n});")
    loop = ["#pragma omp for schedule(static)", f"for (pn_idx pn_i0 = 0; pn_i0 < {full}; pn_i0 += {R}) {{"]
    loop += ["  " + ln for ln in body] + ["}"]
    if full < d.M:
        loop += ["#pragma omp for schedule(static)", *tail]
    return ["#pragma omp parallel num_threads(pn_nt)", "{", *["  " + ln for ln in alloc + loop + free], "}"]
