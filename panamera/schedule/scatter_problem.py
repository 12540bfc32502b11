"""The problem a deterministic scatter-add of rows poses to its plans (frontend/scatter.py
`scatter_add_sorted`, `out[ids[t]] += src[t]`): `n` ids into a table of `rows` rows of `width`
elements, the ids' and the source's dtypes, and `skip` (an id that adds nothing: an embedding's
padding_idx). One value, read by the GPU plan (schedule/segments.py) and its renderer
(codegen/segment_kernel.py) and by the CPU plan (schedule/cpu_segments.py) and its renderer
(codegen/cpu_segments.py); each plan carries it as `problem` and reads its fields through
`OfProblem`.

>>> from panamera.dtypes import as_dtype
>>> p = ScatterProblem(5, 4, 3, as_dtype("int64"), as_dtype("float16"))
>>> p.acc, p.table, p.describe()
('float', 12, '5 ids into 4x3')
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DType, as_dtype


@dataclass(frozen=True)
class ScatterProblem:
    """`n` ids (dtype `ids`) scattering rows of `width` elements of `src` into `rows` rows; an id
    equal to `skip` adds nothing."""

    n: int
    rows: int
    width: int
    ids: DType
    src: DType
    skip: int | None = None

    @property
    def acc(self) -> str:
        """The C type sums are kept in: float for 16-bit sources (rounded once, at the write), else
        the source's own."""
        return self.src.compute

    @property
    def acc_dtype(self) -> DType:
        """The dtype of the accumulators (`acc`): float32 for 16-bit sources, else the source's."""
        return as_dtype("float32") if self.src.is_16bit_float else self.src

    @property
    def table(self) -> int:
        """Elements of the output table."""
        return self.rows * self.width

    def describe(self) -> str:
        return f"{self.n} ids into {self.rows}x{self.width}"


class OfProblem:
    """The problem's fields read on a plan that carries it as `problem` (a mixin of the plans)."""

    problem: ScatterProblem
    n = property(lambda self: self.problem.n)
    rows = property(lambda self: self.problem.rows)
    width = property(lambda self: self.problem.width)
    ids = property(lambda self: self.problem.ids)
    src = property(lambda self: self.problem.src)
    skip = property(lambda self: self.problem.skip)
    acc = property(lambda self: self.problem.acc)
