"""Task mappings (after Hidet): which block, thread and serial step owns which task index.

A `TaskMapping` of one canonical loop is a product of factors, outermost first. Each factor is
bound to a hardware index (`blockIdx.x` = "bx", "by", `threadIdx.x` = "tx", "ty") or to a serial
loop ("k"), with an extent. Composition with `*` nests the right operand inside the left one:

    task = ((f0 * e1 + f1) * e2 + f2) ...            (mixed radix, outermost factor first)

>>> m = spatial("by", 4) * serial("k", 8) * spatial("tx", 256)
>>> m.extent, m.formula()
(8192, 'by*2048 + k*256 + tx')

The codegen turns a mapping into isl constraints `task == formula(...)` over the statement's
domain; isl's AST generator then scans what each thread owns (codegen/kernel.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskMapping:
    factors: tuple[tuple[str, int], ...]  # (index name, extent), outermost first

    def __mul__(self, inner: TaskMapping) -> TaskMapping:
        return TaskMapping(self.factors + inner.factors)

    @property
    def extent(self) -> int:
        return math.prod(e for _, e in self.factors)

    def strides(self) -> list[tuple[str, int]]:
        out, acc = [], 1
        for name, e in reversed(self.factors):
            out.append((name, acc))
            acc *= e
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
        for name, e in self.factors:
            c = v[name].ge_set(v[0]) & v[name].lt_set(v[0] + e)
            s = c if s is None else s & c
        return s

    def __str__(self) -> str:
        return " * ".join(f"{'serial' if n == 'k' else 'spatial'}({n}={e})" for n, e in self.factors)


def spatial(index: str, extent: int) -> TaskMapping:
    """Each of `extent` workers (blocks or threads along `index`) owns one task."""
    return TaskMapping(((index, int(extent)),))


def serial(index: str, extent: int) -> TaskMapping:
    """One worker runs `extent` tasks one after another (the per-thread accumulation loop)."""
    return TaskMapping(((index, int(extent)),))
