"""Row scans over a flattened reduction on the CPU target: addresses without a division per element.

A ROW group's reduced index j often flattens several axes of its tensor, and then its addresses
are quasi-affine in j: batch_norm over (N, H, W) of an NCHW tensor has j = n * HW + hw and reads
`3136 i + 64 j - 63 (j mod 3136)`, which the row pass printed as a 64-bit division per element
(no SIMD; about 10 ns each: 29 ms for a 25 MB tensor that streams in 2 ms). `row_run` finds the
longest run m, a divisor of the row length N, over which every address of the group is affine
in j: with j = m * pn_q + r and 0 <= r < m, isl rewrites each address without a division in r,
and then in terms of (i, pn_q, j) again (`3136 i + 197568 pn_q + j`). The row pass cuts its blocks
at the multiples of m and sets `pn_q = pn_lo / m` once per block (`block_head`); the loop over j
inside a block is a plain strided scan that vectorizes. The blocks stay at most `inner` long, so
the rounding of a row is still that of a tree of short sums; only where they are cut changes.

A run may be shorter than an address's period: GroupNorm's scale and shift per group of 512
elements and per channel of 256 (`floor(i / 512)`, `floor(i / 256)`) are both constant over runs of
256, but isl's gist keeps `floor((256 pn_q + pn_r) / 512)` (it does not see that pn_r < 256 leaves
the quotient alone). Such an address is written as its value at pn_r = 0 plus a constant slope
times pn_r, checked equal on the whole run domain (`_run_form`): `floor(pn_q / 2)`, loop-invariant.
Without it the loop kept a 64-bit division per element and g++ left it scalar, SiLU's expf included
(UNet's GroupNorm+SiLU epilogue: 30 us for 4096 elements).

>>> import islpy as isl
>>> dom = isl.Set("{ [i, j] : 0 <= i < 64 and 0 <= j < 100352 }")
>>> a = isl.PwAff("{ [i, j] -> [(3136i + 64j - 63*((j) mod 3136))] }")
>>> r = row_run([a], dom, 100352)
>>> r.m, r.address(a)
(3136, '(((3136 * i) + (197568 * pn_q)) + j)')
>>> row_run([isl.PwAff("{ [i, j] -> [(100352i + j)] }")], dom, 100352) is None  # affine already
True
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import islpy as isl

from . import islast
from .thread_loop import ThreadLoop

MIN_RUN = 16  # shorter runs: the division stays (a block per run would cost more than it saves)


def _affine_in(a: isl.PwAff, pos: int) -> bool:
    """Whether no floor division in `a` depends on its input dimension `pos`."""
    return not any(
        aff.get_div(k).involves_dims(isl.dim_type.in_, pos, 1)
        for _, aff in a.get_pieces()
        for k in range(aff.dim(isl.dim_type.div))
    )


def _maps(names: list[str], m: int, dim: str = "j") -> tuple[isl.MultiAff, isl.MultiAff]:
    """[.., pn_q, pn_r, ..] -> [.., j = m pn_q + pn_r, ..] and [.., pn_q, j, ..] -> [.., pn_q, pn_r = j - m pn_q, ..]
    (`dim` the split dimension, j by default)."""
    split = ", ".join("pn_q, pn_r" if n == dim else n for n in names)
    join = ", ".join(f"{m}pn_q + pn_r" if n == dim else n for n in names)
    kept = ", ".join(f"pn_q, {dim}" if n == dim else n for n in names)
    back = ", ".join(f"pn_q, {dim} - {m}pn_q" if n == dim else n for n in names)
    return isl.MultiAff(f"{{ [{split}] -> [{join}] }}"), isl.MultiAff(f"{{ [{kept}] -> [{back}] }}")


@dataclass(frozen=True)
class RowRun:
    """Runs of m consecutive j over which every address of the row is affine; `dom` the domain over
    (.., pn_q, pn_r, ..) the addresses are simplified in."""

    m: int
    split: isl.MultiAff
    back: isl.MultiAff
    dom: isl.Set
    r: int  # pn_r's position in the run domain

    def address(self, addr: isl.PwAff) -> str:
        """`addr` over (i, pn_q, j), pn_q = j / m fixed in a block: affine in j."""
        form = _run_form(addr.pullback_multi_aff(self.split), self.dom, self.r)
        pa = (form if form is not None else addr.pullback_multi_aff(self.split).gist(self.dom)).pullback_multi_aff(
            self.back
        )
        build = isl.AstBuild.from_context(isl.Set.universe(pa.get_domain_space()))
        return islast.expr(build.expr_from_pw_aff(pa))


def _at(names: list[str], r: int, value: int) -> isl.MultiAff:
    """(.., pn_q, pn_r, ..) -> (.., pn_q, value, ..): pn_r (at position r) set to a constant."""
    to = ", ".join(str(value) if k == r else n for k, n in enumerate(names))
    return isl.MultiAff(f"{{ [{', '.join(names)}] -> [{to}] }}")


def _run_form(pa: isl.PwAff, dom: isl.Set, r: int) -> isl.PwAff | None:
    """`pa` (over the run domain's space, pn_r at position r) without a division in pn_r on `dom`, or
    None: isl's gist where that is enough, else pa(pn_r = 0) + c pn_r for a constant slope c, checked
    equal to `pa` at every point of `dom`."""
    gist = pa.gist(dom)
    if _affine_in(gist, r):
        return gist
    names = [dom.get_dim_name(isl.dim_type.set, k) for k in range(dom.dim(isl.dim_type.set))]
    base = pa.pullback_multi_aff(_at(names, r, 0))
    slope = (pa.pullback_multi_aff(_at(names, r, 1)) - base).gist(dom)
    if not slope.is_cst():
        return None
    var = isl.PwAff.var_on_domain(isl.LocalSpace.from_space(pa.get_domain_space()), isl.dim_type.set, r)
    form = base + slope.mul(var)
    return form.gist(dom) if dom.is_subset(form.eq_set(pa)) else None


def row_run(addrs: Sequence[isl.PwAff], dom: isl.Set, n: int, min_run: int = MIN_RUN, dim: str = "j") -> RowRun | None:
    """The longest run (a divisor m of the row length n, min_run <= m < n) over which every address
    in `addrs` (over the canonical domain `dom`, dims i and j) is affine in j; None when no address
    divides j, or none of those runs works, or the domain has parameters. `dim="i"`: runs of the
    element-wise (MAP) index i instead, over i's extent n (`map_run`)."""
    names = [dom.get_dim_name(isl.dim_type.set, k) for k in range(dom.dim(isl.dim_type.set))]
    if dom.dim(isl.dim_type.param) or dim not in names or all(_affine_in(a, names.index(dim)) for a in addrs):
        return None
    split_dims = ", ".join("pn_q, pn_r" if n == dim else n for n in names)
    ms = {d for k in range(1, int(n**0.5) + 1) if n % k == 0 for d in (k, n // k)}
    for m in sorted((d for d in ms if min_run <= d < n), reverse=True):
        split, back = _maps(names, m, dim)
        r = names.index(dim) + 1
        run_dom = dom.preimage_multi_aff(split) & isl.Set(f"{{ [{split_dims}] : 0 <= pn_r < {m} }}")
        if all(_run_form(a.pullback_multi_aff(split), run_dom, r) is not None for a in addrs):
            return RowRun(m, split, back, run_dom, r)
    return None


def block_head(run: RowRun | None, lo: str, hi: str, inner: int) -> list[str]:
    """A row pass's loop over blocks [pn_lo, pn_hi) of at most `inner` iterations within [lo, hi);
    with a run, cut at the multiples of its m, and pn_q the block's run."""
    if run is None:
        return [
            f"for (pn_idx pn_b = {lo}; pn_b < {hi}; pn_b += {inner}LL) {{",
            f"  const pn_idx pn_lo = pn_b, pn_hi = pn_imin({hi}, pn_b + {inner}LL);",
        ]
    end = f"pn_imin(pn_b + {inner}LL, (pn_b / {run.m} + 1) * {run.m}LL)"
    return [
        f"for (pn_idx pn_b = {lo}; pn_b < {hi}; pn_b = {end}) {{",
        f"  const pn_idx pn_lo = pn_b, pn_hi = pn_imin({hi}, {end}), pn_q = pn_b / {run.m};",
    ]


def map_head(run: RowRun, n: int, hoisted: Sequence[str] = ()) -> list[str]:
    """An element-wise loop over i < n in runs of `run.m` (addresses affine in i within a run): the
    runs across threads, each run one `omp simd` loop after the run's invariant lines `hoisted`
    (`split_invariant`); the caller closes both loops."""
    return [
        "#pragma omp parallel for schedule(static) num_threads(pn_nt)",
        f"for (pn_idx pn_q = 0; pn_q < {n // run.m}LL; ++pn_q) {{",
        "  const pn_idx j = 0; (void)j;",
        *("  " + ln for ln in hoisted),
        "  #pragma omp simd",
        f"  for (pn_idx i = pn_q * {run.m}LL; i < (pn_q + 1) * {run.m}LL; ++i) {{",
    ]


_DECL = re.compile(r"const [\w:<> ]+? (\w+) = (.+);")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_WRITTEN = re.compile(r"[A-Za-z_]\w*\b(?!\s*\()")  # an identifier not called


def split_invariant(lines: Sequence[str], index: str = "i") -> tuple[list[str], list[str]]:
    """Straight-line body `lines` split into (hoisted, kept): the top-level `const T name = value;`
    lines whose value reads neither `index` nor a kept name (a run's per-row scale, rsqrt(var + eps):
    computed once per run instead of once per SIMD vector: g++ did not move them out of the
    `omp simd` loop), and the rest in their order. Loads move too: a run has at least MIN_RUN
    iterations, so each is read in the loop anyway. Every name a kept line may write (each
    identifier of a kept line other than a call's) counts as kept: a load from a buffer a kept
    store wrote, or a value read after a kept non-const declaration or assignment, stays below it.

    >>> split_invariant(["const float a = in1[pn_q];", "const float b = rsqrtf(a);",
    ...                  "const float c = in0[i] * b;", "const float d = c + a;", "pn_st(&out0[i], d);"])
    (['const float a = in1[pn_q];', 'const float b = rsqrtf(a);'], ['const float c = in0[i] * b;', \
'const float d = c + a;', 'pn_st(&out0[i], d);'])
    """
    hoisted, kept, variant, depth = [], [], {index}, 0
    for ln in lines:
        m = _DECL.fullmatch(ln.strip())
        if depth == 0 and m and ln == ln.lstrip() and not set(_IDENT.findall(m.group(2))) & variant:
            hoisted.append(ln)
        else:
            variant |= {m.group(1)} if m else set(_WRITTEN.findall(ln))
            kept.append(ln)
        depth += ln.count("{") - ln.count("}")
    return hoisted, kept


class RunLoop(ThreadLoop):
    """The CPU kernel's ThreadLoop: inside `over(run)` (a row pass), addresses are rendered by `run`."""

    run: RowRun | None = None

    def address(self, addr: isl.PwAff) -> str:
        return super().address(addr) if self.run is None else self.run.address(addr)

    @contextmanager
    def over(self, run: RowRun | None):
        self.run = run
        try:
            yield
        finally:
            self.run = None
