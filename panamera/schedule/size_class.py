"""Size classes of the symbols (issue 22): the mapper decides once per class, not per size.

A class gives every symbol a power-of-two range [2**k, 2**(k+1)) (or exactly 0) and an alignment:
the largest power of two up to `MAX_ALIGN` that divides the size (0 divides everything). The
range bounds the extents (buffer capacities, the index type); the alignment is what a vector
width needs (poly/params.py `Condition`). Each class is planned from one representative size,
chosen from the class alone (never the first size met), so a schedule is a function of the class.

>>> c = SizeClass.of({"B": 24, "S": 7})
>>> c.describe(), c.representative()
('B in [16, 32) align 8, S in [4, 8) align 1', {'B': 24, 'S': 5})
>>> from panamera.poly.params import Condition
>>> from panamera.frontend.symbolic import Dim
>>> B, S = Dim(1, ("B",)), Dim(1, ("S",))
>>> c.holds(Condition(B * 8, 64, "vec")), c.holds(Condition(S, 2, "vec"))
(True, False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_ALIGN = 16


def _valuation(n: int, cap: int = MAX_ALIGN) -> int:
    """The largest power of two <= cap dividing n (cap for 0)."""
    if n == 0:
        return cap
    return min(cap, n & -n)


@dataclass(frozen=True)
class SymbolClass:
    name: str
    k: int  # the size is in [2**k, 2**(k+1)); -1: the size is 0
    align: int  # the largest power of two <= cap dividing every size of the class; 0: not tracked
    cap: int = MAX_ALIGN  # the widest alignment tracked (the program's widest vector, in elements)

    @property
    def low(self) -> int:
        return 0 if self.k < 0 else 2**self.k

    @property
    def high(self) -> int:
        """The largest size of the class."""
        return 0 if self.k < 0 else 2 ** (self.k + 1) - 1

    def contains(self, n: int) -> bool:
        in_range = n == 0 if self.k < 0 else self.low <= n <= self.high
        return in_range and (self.align == 0 or _valuation(n, self.cap) == self.align)

    def representative(self) -> int:
        """The size of the class nearest to sqrt(2) * 2**k (the middle of the range on a log scale)
        whose alignment is exactly the class's."""
        if self.k < 0:
            return 0
        step = self.align or 1
        target = round(self.low * math.sqrt(2) / step)
        for d in range(0, 2**self.k + 2):
            for q in (target - d, target + d):
                n = q * step
                if q > 0 and self.contains(n):
                    return n
        raise AssertionError(f"empty class {self}")

    def extremes(self) -> tuple[int, int]:
        """The smallest and the largest size of the class."""
        if self.k < 0:
            return 0, 0
        lo = next(n for n in range(self.low, self.high + 1) if self.contains(n))
        hi = next(n for n in range(self.high, self.low - 1, -1) if self.contains(n))
        return lo, hi

    def describe(self) -> str:
        if self.k < 0:
            return f"{self.name} = 0"
        align = f" align {self.align}" if self.align else ""
        return f"{self.name} in [{self.low}, {self.high + 1}){align}"


@dataclass(frozen=True)
class SizeClass:
    symbols: tuple[SymbolClass, ...]  # sorted by name

    @staticmethod
    def of(sizes: dict[str, int], aligned: frozenset[str] | None = None, cap: int = MAX_ALIGN) -> SizeClass:
        """The class of `sizes`; only the symbols in `aligned` (default: all) get an alignment, up
        to `cap` (the widest vector the program can load, in elements); the others (no vector
        width depends on them) get one class per range."""

        def one(n: str) -> SymbolClass:
            k = sizes[n].bit_length() - 1 if sizes[n] else -1
            return SymbolClass(n, k, _valuation(sizes[n], cap) if aligned is None or n in aligned else 0, cap)

        return SizeClass(tuple(one(n) for n in sorted(sizes)))

    def get(self, name: str) -> SymbolClass:
        return next(s for s in self.symbols if s.name == name)

    def representative(self) -> dict[str, int]:
        return {s.name: s.representative() for s in self.symbols}

    def samples(self) -> list[dict[str, int]]:
        """Sizes spanning the class (each symbol at its smallest, representative and largest
        size): the mapper keeps the decision whose worst ratio to the best over them is least."""
        points = [{}]
        for sc in self.symbols:
            values = sorted({*sc.extremes(), sc.representative()})
            points = [{**p, sc.name: v} for p in points for v in values]
        return points

    def upper(self) -> dict[str, int]:
        """The largest size of every symbol in the class (capacities, index bounds)."""
        return {s.name: s.high for s in self.symbols}

    def alignment(self, extent) -> int:
        """The largest power of two (<= 2**30) the class proves divides `extent` (an int or a Dim)."""
        if isinstance(extent, int):
            return _valuation(extent) if extent else 2**30
        bits = (extent.coef & -extent.coef).bit_length() - 1
        for n in extent.syms:
            a = self.get(n).align or 1  # untracked: nothing proven
            if self.get(n).k < 0:
                return 2**30
            bits += a.bit_length() - 1
        return 2 ** min(bits, 30)

    def holds(self, condition) -> bool:
        """Whether a `Condition` (poly/params.py: an extent a multiple of a power of two) holds
        for every size of the class."""
        return self.alignment(condition.extent) % condition.multiple == 0

    def describe(self) -> str:
        return ", ".join(s.describe() for s in self.symbols)

    def key(self) -> str:
        """A compact, stable name of the class (schedule files, explain)."""
        return ",".join(f"{s.name}:{s.k}:{s.align}:{s.cap}" for s in self.symbols)

    @staticmethod
    def from_key(key: str) -> SizeClass:
        out = []
        for part in key.split(","):
            if part:
                name, k, align, cap = part.split(":")
                out.append(SymbolClass(name, int(k), int(align), int(cap)))
        return SizeClass(tuple(out))
