"""The values a stitched CPU row carries between its passes (codegen/cpu_kernel.py's `_Kernel`
mixes these in): a value an earlier pass evaluates and later ones need again (the decision's
`reuse`, schedule/cpu_reuse.py) stored by the earlier pass to a per-thread scratch row `pn_cseK`
(or to the output row the last pass writes: `Reuse.into`) and read back by the later ones; a
later pass's division by a row invariant as a product with its reciprocal `pn_rcp...`, computed
once per row, the pass unswitched on whether that product is exact enough (`unswitched`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..dtypes import bool_
from ..poly.expr import Expr
from ..schedule.cpu_reuse import nodes_with, varying
from .expr import convert


class RowValues:
    """Needs of its host: `g` (the group), `d` (the CpuDecision), `loop` (a ThreadLoop), `held`
    (statement -> {node id: C expression holding its value}), `bodies` (statement -> its
    rewritten body), `rcp_flags` (statement -> {a reciprocal's flag: its node's id}), `epilogues`
    and `reductions` (statement indices)."""

    def store_reused(self, k: int) -> list[str]:
        """Statement k's values that later passes read back (decision.reuse): each evaluated in a
        block of its own and stored to its scratch row at j, where k's own body reads it (the
        compiler forwards the store)."""
        out = []
        for n, x in enumerate(self.d.reuse):
            if x.producer == k:
                node = nodes_with(self.g.statements[k], x.key)[0]
                # values of earlier reuses inside it are read back too, never the value itself: the
                # body may be printed several times (cpu_lanes prints it per lane and for the tail)
                given = {i: v for i, v in self.held.get(k, {}).items() if i != id(node)}
                lines, val = self.loop.body_lines(k, None, expr=node, given=given)
                out += ["{"] + ["  " + ln for ln in lines] + [f"  pn_cse{n}[j] = {val};", "}"]
                self.held.setdefault(k, {})[id(node)] = f"pn_cse{n}[j]"
        return out

    def output_scratch(self) -> list[str]:
        """Row i's scratch rows that are its output rows (`Reuse.into`, schedule/cpu_reuse.py): the
        output row's start, `i` in scope. The other scratch rows are allocated per thread."""
        return [
            f"{x.ctype}* const pn_cse{n} = &out{x.into}[{self.d.N}LL * i];  // the output row as scratch"
            for n, x in enumerate(self.d.reuse)
            if x.into is not None
        ]

    def read_back(self) -> None:
        """The consumers of each reused value read it from its scratch row at j."""
        for n, x in enumerate(self.d.reuse):
            for c in x.consumers:
                for node in nodes_with(self.g.statements[c], x.key):
                    self.held.setdefault(c, {})[id(node)] = f"pn_cse{n}[j]"

    def reciprocals(self, here: list[int]) -> list[str]:
        """A division by a row invariant (a value of the group's earlier passes or a constant) in
        the statements `here` becomes a product with its reciprocal, computed here once per row."""
        g, out = self.g, []
        for k in here:
            s = g.statements[k]
            if k in self.epilogues or k in self.reductions:
                continue
            along = varying(s, g.on_chip)
            table = {}
            self.rcp_flags[k] = {}
            for e in s.body.walk():
                if e.op == "div" and e.dtype.is_float and id(e.args[1]) not in along and id(e.args[0]) in along:
                    name = f"pn_rcp{k}_{len(table)}"
                    lines, val = self.loop.body_lines(k, None, expr=e.args[1])
                    decl, code, table[id(e)] = reciprocal(self, k, e, name, lines, val)
                    out = decl + out + code
            if table:
                self.bodies[k] = _substitute(s.body, table)
        return out

    def unswitched(self, here: list[int], rows: int, emit: Callable[[], list[str]]) -> list[str]:
        """The pass `emit()` prints over the statements `here`, unswitched on their reciprocals'
        flags (`pn_rcp..._ok`, `reciprocals`): `if (every flag) {the pass, each flag true} else {the
        pass, each flag false}`, so that each version's select folds to the product or to the
        division. Left to g++ (a `?:` on a loop-invariant bool in the `omp simd` loop), g++ 12 on an
        AVX2 machine neither unswitches nor if-converts it (a bool has no vector mask there, unlike
        AVX-512's mask registers): the loop stayed scalar (softmax [8x128256]'s last pass, exp
        included: 4.0 ms instead of ~0.4 ms, 1 thread) or, where the flag is read through a
        reference, computed both the product and the division and blended them (a vdivps per 8
        elements). `rows` > 1: the flags of rows 0..rows-1 (codegen/cpu_interleave.py's `..._R`)."""
        flags = [(k, name, i) for k in here for name, i in self.rcp_flags.get(k, {}).items()]
        if not flags:
            return emit()
        names = [n for _, n, _ in flags]
        cond = " && ".join(names if rows == 1 else [f"{n}_R[{r}]" for n in names for r in range(rows)])
        versions = []
        for value in ("true", "false"):
            for k, _, i in flags:
                self.held[k][i] = value
            versions.append(emit())
        for k, name, i in flags:
            self.held[k][i] = name
        a, b = (["  " + ln for ln in v] for v in versions)
        return [f"if ({cond}) {{", *a, "} else {", *b, "}"]


def reciprocal(host, k: int, e: Expr, name: str, lines: list[str], val: str) -> tuple[list[str], list[str], Expr]:
    """Division e (x / s, s a row invariant whose value `lines` compute into `val`) of statement k
    as `name_ok ? x * name_v : x / s`: the declarations, the once-per-row code, the rewritten node;
    the registers recorded in the host's `held` and `rcp_flags` (for `unswitched`). The static
    (`RowValues.reciprocals`) and the symbolic CPU kernels (codegen/cpu_param_kernel.py) print it."""
    t = e.dtype.compute
    # x * (1/s) is x / s within one more rounding only where s and 1/s are both normal
    # (1/s of a subnormal s is inf); other rows divide (the pass unswitched on the flag: `unswitched`)
    code = (
        ["{"]
        + ["  " + ln for ln in lines]
        + [
            f"  const {t} pn_d = {convert(val, e.args[1].dtype, e.dtype)};",
            f"  {name}_v = ({t})1 / pn_d;",
            f"  {name}_ok = std::isnormal(pn_d) && std::isnormal({name}_v);",
            "}",
        ]
    )
    r, ok = Expr("load", (), e.dtype), Expr("load", (), bool_)
    host.held.setdefault(k, {}).update({id(r): f"{name}_v", id(ok): f"{name}_ok"})
    host.rcp_flags.setdefault(k, {})[f"{name}_ok"] = id(ok)
    return (
        [f"{t} {name}_v;", f"bool {name}_ok;"],
        code,
        Expr("where", (ok, Expr("mul", (e.args[0], r), e.dtype), e), e.dtype),
    )


def _substitute(e: Expr, table: dict[int, Expr]) -> Expr:
    """Expression e with the nodes of `table` (by id) replaced; the other nodes kept as they are."""
    memo: dict[int, Expr] = {}
    for n in e.walk():
        if id(n) in table:
            memo[id(n)] = table[id(n)]
            continue
        args = tuple(memo[id(a)] for a in n.args)
        memo[id(n)] = n if all(a is b for a, b in zip(args, n.args)) else dataclasses.replace(n, args=args)
    return memo[id(e)]
