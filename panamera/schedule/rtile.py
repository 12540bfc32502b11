"""Register tiles: a thread computes several rows of a ROW/ALL reduction that share operands.

The rows of a contraction `x @ W.T` (ROW: i = m * N + n over the outputs, j = k) share
operands: rows (m, n) and (m + 1, n) read one weight row, rows (m, n) and (m, n + 1) one
activation row. A register tile gives one thread the rtile x ctile rows

    i(r, c) = (q * rtile + r) * rstride + p * ctile + c        r < rtile, c < ctile

for its tile row t = q * (rstride / ctile) + p of the scanned i loop. A read UNIFORM along the
tile's rows (isl: `contraction.shared_along_rows`) is loaded once for all of them: shared along
r (`rshared`, the weights: once per c), along c (`cshared`, the activations: once per r), or
both (once per tile). Each row keeps its accumulator in a register.

Before (one row per thread; the weight row W[n, :] is re-read for every m, through L2)::

    for i < M * N (thread), j < K:   acc[i] += x[i / N, j] * w[i % N, j]

After (rtile = R, rstride = N, ctile = C)::

    for t < ceil(M / R) * N / C (thread), j < K:
        wv[c] = w[(t % (N / C)) * C + c, j]       for c < C      (rshared)
        for r < R:  xv = x[q * R + r, j]                         (cshared)
            for c < C: acc[r * C + c] += xv * wv[c]

Preconditions (`check`, rule 9 of schedule/mapping.py's `replay`; one negative test each in
tests/test_register_tile.py):
  1. a ROW/ALL group (its rows are reduced by the block's x threads), stitched only with whole
     rows per block (split 1: a split stitched row exchanges one partial per row);
  2. rtile and ctile are powers of two, rtile from 2 to MAX_RTILE, ctile to MAX_CTILE;
  3. rstride is one of `contraction.row_strides` (it divides M) and ctile divides it, so a tile's
     consecutive rows never cross from one m to the next; rows of a tile past M are guarded;
  4. `rshared` and `cshared` are exactly the reads isl finds shared at that stride and ctile.

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> a = lower(pn.placeholder((4, 64), name="x") @ pn.placeholder((32, 64), name="w").T,
...           stop_after="groups", target="emulator")
>>> [(R, S, C) for R, S, C, _, _ in tilings(a.groups[0])][:4]
[(1, 1, 1), (2, 32, 1), (2, 32, 2), (2, 32, 4)]
"""

from __future__ import annotations

import math

import islpy as isl

from ..errors import ScheduleError
from ..model.gpu import launch_bound_registers
from ..poly.access import AccessKind
from ..poly.program import KernelGroup
from ..poly.statement import Form
from .contraction import row_strides, shared_along_rows
from .decision import Decision

MAX_RTILE = 16
MAX_CTILE = 4
Shared = tuple[tuple[bool, ...], ...]
Tile = tuple[int, int, int, Shared, Shared]  # (rtile, rstride, ctile, rshared, cshared)
NO_TILE: Tile = (1, 1, 1, (), ())


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def shared_reads(group: KernelGroup, stride: int, within: int = 0) -> Shared:
    """Per statement and read: shared along rows `stride` apart (within aligned groups of
    `within` rows when > 0)."""
    return tuple(
        tuple(shared_along_rows(st, k, stride, within) if st.M == group.M else False for k in range(len(st.reads)))
        for st in group.statements
    )


def tilings(group: KernelGroup) -> list[Tile]:
    """Tiles to try, no tile first: at the smallest row stride at which some read is shared,
    rtile = 2, 4, ... up to the count of rows that far apart rounded up to a power of two (at
    most MAX_RTILE), times ctile = 1, 2, 4 consecutive rows where ctile divides the stride."""
    if group.form not in (Form.ROW, Form.ALL):
        return [NO_TILE]
    M = group.M
    for stride in sorted({p for st in group.statements for p in row_strides(st) if M % p == 0}):
        rshared = shared_reads(group, stride)
        if not any(any(a) for a in rshared):
            continue
        rows = M // stride
        top = min(MAX_RTILE, 1 << max(0, rows - 1).bit_length())
        out = [NO_TILE]
        for C in (c for c in (1, 2, 4) if c <= MAX_CTILE and stride % c == 0):
            cshared = shared_reads(group, 1, C) if C > 1 else ()
            out += [(1 << e, stride, C, rshared, cshared) for e in range(1, 5) if 1 << e <= top]
        return sorted(out, key=lambda t: (t[0], t[2]))
    return [NO_TILE]


def op_divisors(s, k: int, d: Decision) -> dict[int, int]:
    """For each node of statement k's body (by id): how many rows of the tile share its value
    (1 when it depends on a per-row load): rtile if all its loads are rshared, times ctile if
    all are cshared. The model's issue term divides the node's work by it."""
    rs = d.rshared[k] if d.rshared else (False,) * len(s.reads)
    cs = d.cshared[k] if d.cshared else (False,) * len(s.reads)
    along_r: set[int] = set()
    along_c: set[int] = set()
    for e in s.body.walk():
        args = e.args
        if e.op == "load":
            r_ok, c_ok = rs[e.read], cs[e.read]
        else:
            r_ok = all(id(a) in along_r for a in args)
            c_ok = all(id(a) in along_c for a in args)
        if r_ok:
            along_r.add(id(e))
        if c_ok:
            along_c.add(id(e))
    return {id(e): (d.rtile if id(e) in along_r else 1) * (d.ctile if id(e) in along_c else 1) for e in s.body.walk()}


def registers(group: KernelGroup, d: Decision) -> int:
    """Registers a thread needs at most, estimated: 32 for indices and addresses, the tile's
    accumulators, and per unrolled step the bytes of each contiguous vector load in flight (a
    read shared both ways once, along r once per c, along c once per r, else once per row), in
    4-byte registers."""
    acc = sum(
        max(1, s.acc.itemsize // 4)
        for k, s in enumerate(group.statements)
        if group.accumulator_of[k] == k and s.acc is not None
    )
    loads, seen = 0, set()
    for k, s in enumerate(group.statements):
        for ri, r in enumerate(s.reads):
            key = (r.tensor.uid, str(r.addr))
            if not d.access or d.access[k][ri] != AccessKind.CONTIG or key in seen:
                continue
            seen.add(key)
            rs = bool(d.rshared) and d.rshared[k][ri]
            cs = bool(d.cshared) and d.cshared[k][ri]
            copies = (1 if rs else d.rtile) * (1 if cs else d.ctile)
            loads += math.ceil(d.vec * r.tensor.dtype.itemsize / 4) * copies
    return 32 + address_registers(group) + acc * d.rtile * d.ctile + d.unroll * loads


def address_registers(group: KernelGroup) -> int:
    """Registers beyond the 32 of `registers` for quasi-affine addresses: two per integer
    division in the widest piece of each distinct memory read's address (a clamped window
    view's, a Conv's: its quotients and remainders stay live across the tile's rows; issue 20's
    register-tiled ResNet Conv spilled on sm_90 without them)."""
    regs, seen = 0, set()
    for s in group.statements:
        for r in s.reads:
            key = (r.tensor.uid, str(r.addr))
            if not r.memory or key in seen:
                continue
            seen.add(key)
            divs = [aff.dim(isl.dim_type.div) for _, aff in r.addr.get_pieces()]
            regs += 2 * max(divs, default=0)
    return regs


def register_budget(d: Decision) -> int:
    """Registers per thread ptxas may use under the kernel's launch bounds (`min_blocks`)."""
    return launch_bound_registers(d.threads, d.min_blocks)


def check(group: KernelGroup, d: Decision, at: str) -> None:
    """The preconditions of the module docstring; a ScheduleError naming the kernel otherwise."""
    if (d.rtile, d.rstride, d.ctile, d.rshared, d.cshared) == NO_TILE:
        return
    if group.form not in (Form.ROW, Form.ALL) or (group.stitched and d.split > 1):
        raise ScheduleError(
            f"{at}: a register tile of {d.rtile}x{d.ctile} rows in a {group.form} group"
            + (" split across blocks" if group.stitched else "")
            + " (only ROW/ALL, stitched rows unsplit)"
        )
    if not (_pow2(d.rtile) and 1 <= d.rtile <= MAX_RTILE and _pow2(d.ctile) and d.ctile <= MAX_CTILE):
        raise ScheduleError(
            f"{at}: register tile of {d.rtile}x{d.ctile} rows is not a power of two up to {MAX_RTILE}x{MAX_CTILE}"
        )
    strides = {p for st in group.statements for p in row_strides(st)}
    if d.rstride not in strides or group.M % d.rstride or d.rstride % d.ctile:
        raise ScheduleError(
            f"{at}: register tile stride {d.rstride} (ctile {d.ctile}) is not one of the group's row "
            f"strides {sorted(strides)} divisible by ctile"
        )
    want_c = shared_reads(group, 1, d.ctile) if d.ctile > 1 else ()
    if d.rshared != shared_reads(group, d.rstride) or d.cshared != want_c:
        raise ScheduleError(
            f"{at}: reads shared along the register tile {d.to_dict()['rshared']}, {d.to_dict()['cshared']} "
            f"are not what isl finds at stride {d.rstride} and ctile {d.ctile}"
        )
