"""Symbolic extents: a shape may hold named sizes bound when the compiled program is called.

`pn.placeholder(("B", "S", 4096))` makes "B" and "S" symbols; one name is one value across the
whole program. An extent is an `int` or a `Dim`: a monomial `coef * s1 * s2 * ...` of symbols,
which is what sizes and strides of C-order tensors are made of (products), so a reshape of
(B, S, 4096) into (B * S, 4096) stays exact. Anything else (a sum, a comparison, a slice bound)
cannot be proven at build time and raises `SymbolicShapeError` naming the symbol and the op.

>>> B, S = sym("B"), sym("S")
>>> B * S * 4096, (B * S * 4096) // 4096 == B * S, B * 1
(4096*B*S, True, B)
>>> broadcast((B, 1, 8), (S, 8), what="add")
(B, S, 8)
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ShapeError, SymbolicShapeError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FRONTEND = str(Path(__file__).parent)


def _op_in_progress() -> str:
    """The outermost frontend function on the stack (the op the user called), for messages."""
    f, name = sys._getframe(2), ""
    while f is not None:
        if f.f_code.co_filename.startswith(_FRONTEND) and not f.f_code.co_filename.endswith("symbolic.py"):
            name = f.f_code.co_name
        f = f.f_back
    return name.strip("_") or "an op"


@dataclass(frozen=True, eq=False)
class Dim:
    """A symbolic extent: `coef` times the product of the symbols `syms` (sorted, repeats kept).
    Built by `sym`; ints and Dims multiply into Dims; an extent without symbols is a plain int."""

    coef: int
    syms: tuple[str, ...]

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(self.syms)

    def evaluate(self, sizes: dict[str, int]) -> int:
        """The extent at the bound sizes.

        >>> (sym("B") * 3).evaluate({"B": 5})
        15
        """
        return self.coef * math.prod(sizes[s] for s in self.syms)

    def __mul__(self, o):
        if isinstance(o, Dim):
            return make(self.coef * o.coef, self.syms + o.syms)
        if isinstance(o, int) and not isinstance(o, bool):
            return make(self.coef * o, self.syms)
        return self._refuse(f"multiplied by {o!r}")

    __rmul__ = __mul__

    def __floordiv__(self, o):
        """Exact division only: 4096*B*S // 4096 is B*S, B // 2 raises."""
        syms, coef = list(self.syms), self.coef
        if isinstance(o, Dim):
            for s in o.syms:
                if s not in syms:
                    return self._refuse(f"divided by {o}")
                syms.remove(s)
            o = o.coef
        if isinstance(o, int) and o != 0 and coef % o == 0:
            return make(coef // o, tuple(syms))
        return self._refuse(f"divided by {o!r}")

    def divides(self, o) -> bool:
        """Whether `o // self` is exact for every value of the symbols."""
        if isinstance(o, int):
            return False
        rest = list(o.syms)
        for s in self.syms:
            if s not in rest:
                return False
            rest.remove(s)
        return o.coef % self.coef == 0 if self.coef else False

    def __eq__(self, o):
        return isinstance(o, Dim) and (self.coef, self.syms) == (o.coef, o.syms)

    def __ne__(self, o):
        return not self.__eq__(o)

    def __hash__(self):
        return hash(("Dim", self.coef, self.syms))

    def __repr__(self) -> str:
        return "*".join(([str(self.coef)] if self.coef != 1 else []) + list(self.syms))

    __str__ = __repr__

    def _refuse(self, what: str):
        raise SymbolicShapeError(
            f"{_op_in_progress()}: the symbolic extent {self} is {what}, which cannot be proven for every "
            f"value of {', '.join(sorted(self.symbols))}; this op needs constant extents here"
        )

    # Everything an op does with an extent besides products: not provable, refused clearly.
    def __add__(self, o):
        return self._refuse(f"added to {o!r}")

    __radd__ = __add__

    def __sub__(self, o):
        return self._refuse(f"subtracted {o!r} from")

    def __rsub__(self, o):
        return self._refuse(f"subtracted from {o!r}")

    def __rfloordiv__(self, o):
        return self._refuse(f"a divisor of {o!r}")

    def __mod__(self, o):
        return self._refuse(f"taken modulo {o!r}")

    def __rmod__(self, o):
        return self._refuse(f"a modulus of {o!r}")

    def __truediv__(self, o):
        return self._refuse(f"divided by {o!r}")

    def __rtruediv__(self, o):
        return self._refuse(f"a divisor of {o!r}")

    def __neg__(self):
        return self._refuse("negated")

    def __lt__(self, o):
        return self._refuse(f"compared with {o!r}")

    __le__ = __gt__ = __ge__ = __lt__

    def __index__(self):
        return self._refuse("used as a constant integer")

    def __int__(self):
        return self._refuse("used as a constant integer")

    def __float__(self):
        return self._refuse("used as a number")

    def __bool__(self):
        return self._refuse("tested for zero")


def make(coef: int, syms: Iterable[str]) -> int | Dim:
    """The extent `coef * prod(syms)`: an int when there is no symbol (or the coefficient is 0)."""
    syms = tuple(sorted(syms))
    return coef if not syms or coef == 0 else Dim(coef, syms)


def sym(name: str) -> Dim:
    """The symbol `name` as an extent.

    >>> sym("batch")
    batch
    """
    if not isinstance(name, str) or not NAME.match(name):
        raise SymbolicShapeError(f"symbol {name!r}: a symbol's name is an identifier (letters, digits, _)")
    return Dim(1, (name,))


def is_symbolic(shape) -> bool:
    return any(isinstance(s, Dim) for s in shape)


def symbols_of(shape) -> frozenset[str]:
    """Every symbol a shape uses."""
    return frozenset(n for s in shape if isinstance(s, Dim) for n in s.syms)


def evaluate(shape, sizes: dict[str, int]) -> tuple[int, ...]:
    """A shape at the bound sizes."""
    return tuple(s.evaluate(sizes) if isinstance(s, Dim) else s for s in shape)


def extent(value, what: str) -> int | Dim:
    """One extent of a shape being built: an int, a symbol's name, or a Dim."""
    if isinstance(value, str):
        return sym(value)
    if isinstance(value, Dim):
        return value
    raise TypeError(what)  # the caller's integer checks take over


def prod(shape) -> int | Dim:
    """The number of elements of a shape (a Dim where it has symbols)."""
    out: int | Dim = 1
    for s in shape:
        out = s * out if isinstance(s, Dim) else out * s
    return out


def larger(a, b) -> bool:
    """`a > b` for extents, where symbols stand for large sizes (a heuristic for choices such as
    the streamed operand of a contraction, never for legality): more symbols first, then the
    coefficient.

    >>> larger(sym("T") * 64, 4096), larger(8, 4)
    (True, True)
    """
    if isinstance(a, int) and isinstance(b, int):
        return a > b

    def key(e):
        return (len(e.syms), e.coef) if isinstance(e, Dim) else (0, e)

    return key(a) > key(b)


def broadcast(*shapes, what: str = "operands") -> tuple:
    """numpy broadcasting where extents may be symbols: trailing dims align; equal extents, or
    1, broadcast. A symbol against a different symbol or a constant other than 1 cannot be
    proven equal and raises `SymbolicShapeError` naming them.

    >>> broadcast((sym("N"),), (1,), what="mul")
    (N,)
    """
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        dims = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        kept = {d for d in dims if not (isinstance(d, int) and d == 1)}
        if len(kept) > 1:
            shown = " and ".join(str(tuple(s)) for s in shapes)
            if not any(isinstance(d, Dim) for d in kept):
                raise ShapeError(f"{what}: shapes {shown} do not broadcast")
            raise SymbolicShapeError(
                f"{what}: shapes {shown} do not broadcast: extents {' and '.join(sorted(map(str, kept)))} of axis "
                f"{k - rank} are not provably equal (use one symbol for one size, or 1 to broadcast)"
            )
        out.append(kept.pop() if kept else 1)
    return tuple(out)


def reshape_shape(old, new, what: str) -> tuple:
    """The new shape of a reshape of a symbolic shape `old` (one extent may be -1): the element
    counts must be provably equal (the same monomial)."""
    new = [extent(s, what) if isinstance(s, (str, Dim)) else int(s) for s in new]
    if new.count(-1) > 1:
        raise ShapeError(f"{what}: more than one -1 in {tuple(new)}")
    total = prod(old)
    if -1 in new:
        known = prod(s for s in new if not (isinstance(s, int) and s == -1))
        try:
            new[new.index(-1)] = total // known
        except (SymbolicShapeError, ZeroDivisionError):
            raise SymbolicShapeError(
                f"{what}: cannot infer -1 in {tuple(new)} from {tuple(old)}: {total} is not provably a multiple of {known}"
            ) from None
    if prod(new) != total:
        raise SymbolicShapeError(
            f"{what}: cannot prove {tuple(new)} ({prod(new)} elements) has as many elements as {tuple(old)} ({total})"
        )
    return tuple(new)
