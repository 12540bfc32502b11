"""The split of symbolic fused attention per size class (issue 22), chosen by the model.

The block shape of fused attention (schedule/attention.py: rows per tile, vector loads, lanes per
key, unroll) depends only on static extents; the key split and the merge depend on the key
length (and the batch). For a size class (schedule/size_class.py) the candidates are every split
(not only the static plan's powers of two) within the static model's limits over the class
(schedule/attention.py `split_limits`: a key step per block at the class's most keys, one wave of
blocks), capped at the class's smallest key length (every block of every call then owns at least
one key: the kernel divides a call's keys evenly among its `split` blocks), with either merge.
Each candidate is costed with schedule/attention.py's model at the
class's samples (smallest, representative, largest sizes) and divided by the static plan's
figure at that size; the one whose worst ratio is least is kept, as schedule/param_mapping.py
does for the other kernels.

>>> import panamera as pn
>>> from panamera.poly.param_attention import recognize_symbolic
>>> from panamera.schedule.size_class import SizeClass
>>> q = pn.placeholder((1, 8, 1, 64), name="q")
>>> kv = pn.placeholder((1, 8, "T", 64), name="k")
>>> a = recognize_symbolic((pn.nn.attention(q, kv, kv),))
>>> p = plan_class(a, SizeClass.of({"T": 3000}, frozenset()), pn.model.gpu.H100)
>>> p.plan.split > 1, p.worst < 1.05
(True, True)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..errors import ScheduleError
from ..model.gpu import GPUSpec
from ..model.kernel_cost import sequence_s
from ..poly.param_attention import SymbolicAttention
from .attention import AttentionPlan, _costs, plan_attention, split_limits
from .size_class import SizeClass


@dataclass(frozen=True)
class AttentionClassPlan:
    """One size class's fused attention: the plan at the representative size (its split and
    merge serve the whole class) and the worst modeled ratio to the static plan over the class."""

    cls: SizeClass
    plan: AttentionPlan
    worst: float

    def describe(self) -> str:
        rep = ", ".join(f"{k}={v}" for k, v in self.cls.representative().items())
        p = self.plan
        return (
            f"class {self.cls.describe()} (planned at {rep}, {p.modeled_us:.2f} us modeled, worst {self.worst:.3f} "
            f"of the static plan over the class): fused attention split={p.split} launches={p.launches} "
            f"rows/tile={p.rows_per_tile} vec={p.vec} lanes/key={p.lanes} unroll={p.unroll}"
        )


def split_us(
    a: SymbolicAttention, sizes: dict[str, int], gpu: GPUSpec, base: AttentionPlan, split: int, n: int
) -> float:
    """The modeled µs of `base`'s block shape with `split` blocks per row tile and `n` launches at `sizes`."""
    c = a.at(sizes)
    costs = _costs(c, gpu, base.vec, base.lanes, base.slots, base.unroll, base.rows_per_tile, split, n)
    return sequence_s(costs, gpu) * 1e6


def plan_class(a: SymbolicAttention, cls: SizeClass, gpu: GPUSpec) -> AttentionClassPlan:
    """The class's plan: the candidate split and merge with the least worst ratio to the static plan."""
    rep = cls.representative()
    base = plan_attention(a.at(rep), gpu)
    k_len = a.node.inputs[1].shape[2]
    samples = [s for s in cls.samples() if all(v > 0 for v in s.values())]
    fewest = min(symbolic_at(k_len, s) for s in samples)
    limits = [split_limits(a.at(s), gpu) for s in samples]
    # every split some static plan of the class could weigh (a key step per block at its largest
    # keys, one wave of blocks at its largest batch), each block owning a key at the fewest keys:
    # not only the powers of two (a split of 3 serves T in [32, 64) within 1.05 of each static plan)
    top = min(fewest, max(m for m, _ in limits), min(r for _, r in limits))
    candidates = [(1, 1)] + [(s, n) for s in range(2, top + 1) for n in (1, 2)]
    static = [plan_attention(a.at(s), gpu).modeled_us for s in samples]
    best, worst = None, math.inf
    for split, n in candidates:
        w = max(split_us(a, s, gpu, base, split, n) / ref for s, ref in zip(samples, static))
        if w < worst - 1e-12:
            best, worst = (split, n), w
    split, n = best
    c = a.at(rep)
    costs = _costs(c, gpu, base.vec, base.lanes, base.slots, base.unroll, base.rows_per_tile, split, n)
    plan = dataclasses.replace(base, split=split, launches=n, chunk=math.ceil(c.Lk / split), costs=costs)
    return AttentionClassPlan(cls, plan, round(worst, 4))


def replay_class(a: SymbolicAttention, cls: SizeClass, gpu: GPUSpec, split: int, launches: int, where: str):
    """A saved class decision (split, merge) as the class's plan, validated: a split the class's
    smallest key length allows (every block owns a key) and a merge that exists; else ScheduleError."""
    k_len = a.node.inputs[1].shape[2]
    samples = [s for s in cls.samples() if all(v > 0 for v in s.values())]
    if not samples:
        raise ScheduleError(f"{where}: class {cls.describe()} has no keys to plan")
    fewest = min(symbolic_at(k_len, s) for s in samples)
    if not 1 <= split <= fewest or launches not in (1, 2) or (split == 1 and launches != 1):
        raise ScheduleError(f"{where}: class {cls.describe()}: split={split} launches={launches} is not legal "
                            f"(1 <= split <= {fewest}, the class's fewest keys; launches 1, or 2 with a split)")  # fmt: skip
    rep = cls.representative()
    base = plan_attention(a.at(rep), gpu)
    c = a.at(rep)
    costs = _costs(c, gpu, base.vec, base.lanes, base.slots, base.unroll, base.rows_per_tile, split, launches)
    worst = max(split_us(a, s, gpu, base, split, launches) / plan_attention(a.at(s), gpu).modeled_us for s in samples)
    plan = dataclasses.replace(base, split=split, launches=launches, chunk=math.ceil(c.Lk / split), costs=costs)
    return AttentionClassPlan(cls, plan, round(worst, 4))


def symbolic_at(extent, sizes: dict[str, int]) -> int:
    """An extent (int or Dim) at concrete sizes."""
    return extent if isinstance(extent, int) else extent.evaluate(sizes)
