"""The re-read a grid-wide dependence forces on every implementation: the limit's second term
(docs/GPU_MODEL.md, "The limit").

A reduction `r` whose result is needed by a consumer that also reads `r`'s own inputs again
(BatchNorm backward: dx needs the per-channel sums of dy and dy·x̂, and dy and x themselves) cannot
write any consumer element of a group before the group's reduction has read all of its inputs. The
*group* is the smallest set of `r`'s outputs whose inputs can be read apart from the others: one row
for a row reduction; for a reduction that keeps the contiguous axis (a column sum), the kept
elements that share one `LINE_BYTES` line (32 fp32 channels), since every rate the limit is built
from was measured on streams of whole lines. At the moment a group resolves, at most the on-chip
capacity `on_chip_bytes(gpu)` (L2 + shared memory + registers of every SM) of its G input bytes can
still be held, so at least G − capacity are read again from DRAM, for every group:

    forced re-read = Σ_inputs bytes × max(0, 1 − capacity / G)

A LayerNorm backward's row fits on chip (no re-read) and its dgamma/dbeta columns feed no consumer
(no dependence); BatchNorm backward NHWC over 802816 × 256 fp32 has G = 802816 × 128 B × 2 = 205 MB
per 32 channels against 118 MB on an H100, so 43 % of dy and x are read twice by any plan.

A floor, not a plan: the capacity counts every register and the whole L2 as holding the group. What
a kernel can hold (shared memory, registers beyond its computation, the L2 lines a stream leaves:
74-92 MB on an H100) puts BatchNorm backward NHWC's reachable floor at 1.06-1.11x this limit
(docs/GPU_MODEL.md, "The forced re-read").

>>> import panamera as pn
>>> from panamera.model import H100
>>> dy = pn.placeholder((1 << 20, 256), "float32", name="dy")
>>> forced_reread([dy - pn.sum(dy, axis=0)], H100) > 0, forced_reread([pn.sum(dy, axis=0)], H100)
(True, 0)
"""

from __future__ import annotations

import math

from ..frontend.tensor import Tensor, topological
from ..model.gpu import GPUSpec

LINE_BYTES = 128  # an L2 line: the unit of the coalesced streams every measured rate of the limit read


def on_chip_bytes(gpu: GPUSpec) -> int:
    """What a GPU can hold on chip at once: its L2, and every SM's shared memory and registers.

    >>> from panamera.model import H100
    >>> round(on_chip_bytes(H100) / 1e6)
    118
    """
    return gpu.l2_size + gpu.sms * (gpu.smem_per_block + 4 * gpu.registers_per_sm)  # 32-bit registers


def forced_reread(outs, gpu: GPUSpec) -> int:
    """Bytes every implementation of the graph `outs` reads from DRAM a second time on `gpu`
    (module docstring): 0 for a graph without a reduction whose consumer re-reads its inputs, or
    whose groups fit on chip."""
    order = topological(list(outs))
    if any(t.symbolic for t in order):
        return 0  # symbolic extents: no figure (the limit stays the compulsory bytes)
    capacity = on_chip_bytes(gpu)
    frac: dict[int, tuple[Tensor, float]] = {}
    for r in order:
        if r.op != "reduce":
            continue
        again = _read_again(r, order)
        group = sum(_group_bytes(p, r) for p in again)
        if group > capacity:
            for p in again:
                f = 1.0 - capacity / group
                frac[p.uid] = (p, max(f, frac.get(p.uid, (p, 0.0))[1]))
    return int(sum(p.size * p.dtype.itemsize * f for p, f in frac.values()))


def _reach(t: Tensor) -> set[Tensor]:
    """Placeholders `t` reads element-wise: its ancestors through any op but a reduction."""
    seen, out, todo = set(), set(), [t]
    while todo:
        n = todo.pop()
        if n.uid in seen:
            continue
        seen.add(n.uid)
        if n.op == "placeholder":
            out.add(n)
        elif n.op != "reduce":
            todo.extend(n.inputs)
    return out


def _read_again(r: Tensor, order: list[Tensor]) -> list[Tensor]:
    """`r`'s full-domain inputs that a node depending on `r` reads again, not through `r`."""
    domain = r.inputs[0].shape
    sources = {p for p in _reach(r.inputs[0]) if p.shape == domain}
    after: set[int] = {r.uid}
    again: set[Tensor] = set()
    for n in order:
        if n is r or not any(i.uid in after for i in n.inputs):
            continue
        after.add(n.uid)
        again |= {p for i in n.inputs if i.uid not in after for p in _reach(i)} & sources
    return sorted(again, key=lambda p: p.uid)


def _group_bytes(p: Tensor, r: Tensor) -> int:
    """Bytes of `p` one group of `r` reads: the reduced extents times the kept elements of one line."""
    axes = set(r.attr("axes") or range(p.ndim))
    reduced = math.prod(p.shape[a] for a in axes)
    run = 1  # the contiguous kept elements: trailing axes that are not reduced
    for a in reversed(range(p.ndim)):
        if a in axes:
            break
        run *= p.shape[a]
    e = p.dtype.itemsize
    return reduced * min(run, max(1, LINE_BYTES // e)) * e
