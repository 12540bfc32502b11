"""Task mappings (after Hidet): which block, thread and serial step owns which task index.

A `TaskMapping` of one canonical loop is a product of factors, outermost first. Each factor is
bound to a hardware index (`blockIdx.x` = "bx", "by", `threadIdx.x` = "tx", "ty") or to a serial
loop ("k"), with an extent. Composition with `*` nests the right operand inside the left one:

    task = ((f0 * e1 + f1) * e2 + f2) ...            (mixed radix, outermost factor first)

>>> m = spatial("by", 4) * serial("k", 8) * spatial("tx", 256)
>>> m.extent, m.formula()
(8192, 'by*2048 + k*256 + tx')
>>> str(m)
'spatial(by=4) * serial(k=8) * spatial(tx=256)'

A mixed-radix product is injective by construction: each task has at most one owner. The codegen
turns a mapping into isl constraints `task == formula(...)` over the statement's domain; isl's AST
generator then scans what each thread owns (codegen/thread_loop.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ..enums import StrEnum


class FactorKind(StrEnum):
    SPATIAL = "spatial"  # bound to a hardware index: one worker per value
    SERIAL = "serial"  # a loop one worker runs


class Factor(NamedTuple):
    index: str  # "bx", "by", "tx", "ty", or a serial loop's name
    extent: int
    kind: FactorKind


@dataclass(frozen=True)
class TaskMapping:
    factors: tuple[Factor, ...]  # outermost first

    def __mul__(self, inner: TaskMapping) -> TaskMapping:
        return TaskMapping(self.factors + inner.factors)

    @property
    def extent(self) -> int:
        return math.prod(f.extent for f in self.factors)

    def strides(self) -> list[tuple[str, int]]:
        out, acc = [], 1
        for f in reversed(self.factors):
            out.append((f.index, acc))
            acc *= f.extent
        return out[::-1]

    def formula(self) -> str:
        return " + ".join(f"{n}*{s}" if s != 1 else n for n, s in self.strides())

    def affine(self, v: dict):
        """The task index as an isl PwAff of the index variables in `v` (from make_zero_and_vars)."""
        total = v[0]
        for name, stride in self.strides():
            total = total + v[name] * stride
        return total

    def bounds(self, v: dict):
        """isl constraints 0 <= index < extent for every factor."""
        s = None
        for f in self.factors:
            c = v[f.index].ge_set(v[0]) & v[f.index].lt_set(v[0] + f.extent)
            s = c if s is None else s & c
        return s

    def serial_indices(self) -> list[str]:
        return [f.index for f in self.factors if f.kind == FactorKind.SERIAL]

    def __str__(self) -> str:
        return " * ".join(f"{f.kind}({f.index}={f.extent})" for f in self.factors)


def spatial(index: str, extent: int) -> TaskMapping:
    """Each of `extent` workers (blocks or threads along `index`) owns one task."""
    return TaskMapping((Factor(index, int(extent), FactorKind.SPATIAL),))


def serial(index: str, extent: int) -> TaskMapping:
    """One worker runs `extent` tasks one after another (the per-thread accumulation loop)."""
    return TaskMapping((Factor(index, int(extent), FactorKind.SERIAL),))
