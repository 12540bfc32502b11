"""What a workload is as the peers see it (panamera/bench/peers.py explains peers): its reductions in canonical form
(`Reduction`: M outputs over N values, ROW, COLUMN or ALL) and the whole graph (`Work`), read from
Panamera's front-end graph (`describe`).

>>> canonical((64, 128, 32), {1, 2}), canonical((64, 128), {0}), canonical((8, 1, 16), {0, 2})
(('ROW', 64, 4096, True), ('COLUMN', 128, 64, True), ('ALL', 1, 128, True))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..frontend.tensor import Tensor, topological

INLINE = ("const", "iota", "argkey_max", "argkey_min", "placeholder", "reshape")


@dataclass(frozen=True)
class Reduction:
    """One reduction of the graph in canonical form: M outputs, each over N values."""

    form: str  # ROW (reduced values contiguous), COLUMN (outputs contiguous), ALL
    M: int
    N: int
    combiner: str
    in_bytes: int  # element size of the reduced operand as stored in DRAM
    out_bytes: int
    coalesced: bool = True  # the reduced axes are one contiguous run (else e.g. NCHW over N,H,W)
    operand_bytes: int = 4  # element size of the reduction's direct operand (what an unfused kernel reads)
    source: int = 0  # uid of the graph input it streams (two reductions of one input share it)


@dataclass(frozen=True)
class Work:
    pattern: str  # reduce | softmax | log_softmax | cross_entropy | layer_norm | rms_norm | l2_normalize | batch_norm | group_norm | argmax
    reductions: tuple[Reduction, ...]
    eager_ops: tuple  # (op, out elements, bytes read, bytes written) per element-wise kernel, graph order
    M: int
    N: int
    in_bytes: int
    out_bytes: int
    pointwise: int  # element-wise ops fused before the reductions
    input_bytes: int = 0  # every graph input's bytes (what a fully fused kernel reads)
    output_bytes: int = 0  # every graph output's bytes


def _root(t: Tensor) -> Tensor:
    """The graph input an element-wise chain streams (through casts, views, scalars)."""
    while t.op not in ("placeholder",) and t.inputs:
        big = [i for i in t.inputs if i.size == t.size and i.op not in ("const", "iota")]
        if not big:
            break
        t = big[0]
    return t


def canonical(shape, axes) -> tuple[str, int, int, bool]:
    """(form, M, N, coalesced) of reducing `axes` of a row-major `shape`, size-1 axes dropped."""
    dims = [(s, i in axes) for i, s in enumerate(shape) if s != 1]
    runs: list[list] = []
    for s, red in dims:
        if runs and runs[-1][1] == red:
            runs[-1][0] *= s
        else:
            runs.append([s, red])
    N = math.prod(s for s, r in runs if r)
    M = math.prod(s for s, r in runs if not r)
    if not any(not r for _, r in runs):
        return "ALL", 1, N, True
    if not any(r for _, r in runs):
        return "ALL", M, 1, True
    if runs[-1][1]:
        return "ROW", M, N, len([r for _, r in runs if r]) == 1
    return "COLUMN", M, N, len([r for _, r in runs if r]) == 1


def describe(outs) -> Work:
    """The workload as the peers see it, from Panamera's front-end graph."""
    order = topological(outs)
    ops = {t.op for t in order}
    reduces = [t for t in order if t.op == "reduce"]
    choose = next((t for t in order if t.op == "choose"), None)
    names = {t.attr("combiner").name for t in reduces}
    if choose is not None:
        pattern = choose.attr("formulation")
    elif not reduces:  # an element-wise graph (a backward without a reduction, e.g. threshold_backward)
        pattern = "elementwise"
    elif {"argkey_max", "argkey_min"} & ops:
        pattern = "argmax"
    elif {"iota", "eq", "where"} <= ops:
        pattern = "cross_entropy"
    elif "welford" in names:
        src = _root(reduces[0].inputs[0])
        axes = reduces[0].attr("axes")
        pattern = "group_norm" if "reshape" in ops and src.ndim == 4 and len(axes) == 2 else (
            "batch_norm" if src.ndim == 4 else "layer_norm")  # fmt: skip
    elif "rsqrt" in ops and "maximum" in ops:
        pattern = "l2_normalize"
    elif "rsqrt" in ops:
        pattern = "rms_norm"
    else:
        pattern = "reduce"
    reds = []
    for r in reduces:
        x = r.inputs[0]
        src = _root(x)
        form, M, N, co = canonical(x.shape, set(r.attr("axes")))
        reds.append(Reduction(form, M, N, r.attr("combiner").name, src.dtype.itemsize, r.dtype.itemsize, co,
                              x.dtype.itemsize, src.uid))  # fmt: skip
    eager = []
    for t in order:
        if t.op in INLINE or t.op in ("reduce", "choose"):
            continue
        read = sum(i.size * i.dtype.itemsize for i in t.inputs if i.op not in ("const", "iota"))
        eager.append((t.op, t.size, read, t.size * t.dtype.itemsize))
    big = [t for t in order if t.op == "placeholder"]
    in_bytes = max(big, key=lambda t: t.size).dtype.itemsize if big else outs[0].dtype.itemsize
    out = outs[0]
    M, N = (reds[0].M, reds[0].N) if reds else (out.size, 1)
    pointwise = sum(1 for t in order if t.op not in INLINE and t.op != "reduce" and t.op != "choose")
    inputs = sum(t.size * t.dtype.itemsize for t in big)
    written = sum(t.size * t.dtype.itemsize for t in outs)
    return Work(pattern, tuple(reds), tuple(eager), M, N, in_bytes, out.dtype.itemsize, pointwise, inputs, written)


def _acc(r: Reduction, argmax: bool = False) -> int:
    """Bytes of the accumulator a peer keeps for reduction `r` (a (value, int64 index) pair for argmax)."""
    if argmax:  # (value, int64 index) pair
        return 16
    if r.combiner in ("and", "or", "all", "any"):
        return 1
    return max(4, r.in_bytes, r.out_bytes)
