"""The reduction algebra: identity, combine and the merge of partials, apart from any lowering.

Like loopy's `library/reduction.py`, a `Combiner` says *what* a reduction computes; how it is
mapped to threads and blocks lives in `schedule/` and `codegen/`. Every combiner here is
associative and commutative, which is what lets Panamera reorder partials across threads and
blocks and merge block partials with atomics.

>>> SUM.identity(dtypes.float32)
0.0
>>> MAX.result_dtype(dtypes.int32).name
'int32'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import dtypes
from .dtypes import DType


@dataclass(frozen=True)
class Combiner:
    name: str
    functor: str  # C++ functor in the reduction header (codegen/header.py)
    numpy: str  # numpy reduction used as reference
    has_identity: bool = True
    struct: bool = False  # a multi-value accumulator: no atomic merges it, partials are combined

    def result_dtype(self, d: DType) -> DType:
        """numpy's result dtype: sum/prod of bool and int32 give int64; all/any give bool."""
        if self.name in ("sum", "prod") and d.name in ("bool", "int32"):
            return dtypes.int64
        if self.name in ("all", "any"):
            return dtypes.bool_
        return d

    def acc_dtype(self, d: DType) -> DType:
        """Accumulator dtype: float32 for 16-bit floats, int32 for bool, else the result dtype."""
        r = self.result_dtype(d)
        if r.is_16bit_float:
            return dtypes.float32
        if r.name == "bool":
            return dtypes.int32
        return r

    def identity(self, acc: DType):
        """The neutral element in the accumulator dtype (the lowest value for max)."""
        if self.struct:
            return (0.0, 0.0, 0.0)
        if self.name == "sum" or self.name == "any":
            return 0 if not acc.is_float else 0.0
        if self.name == "prod" or self.name == "all":
            return 1 if not acc.is_float else 1.0
        if acc.is_float:
            return -math.inf if self.name == "max" else math.inf
        info = np.iinfo(acc.np)
        return int(info.min) if self.name == "max" else int(info.max)

    def atomic(self, acc: DType) -> str:
        """How block partials are merged in global memory: a native atomic, a CAS loop, or none
        (struct accumulators: the last block combines the partials)."""
        if self.struct:
            return "none"
        native = {
            "sum": ("float32", "float64", "int32", "int64"),
            "max": ("int32", "int64"),
            "min": ("int32", "int64"),
            "all": ("int32",),
            "any": ("int32",),
        }
        return "native" if acc.name in native.get(self.name, ()) else "cas"


SUM = Combiner("sum", "pn_op_sum", "sum")
PROD = Combiner("prod", "pn_op_prod", "prod")
MAX = Combiner("max", "pn_op_max", "max", has_identity=False)
MIN = Combiner("min", "pn_op_min", "min", has_identity=False)
ALL = Combiner("all", "pn_op_and", "all")
# Welford / Chan et al.: (mean, M2, count) merged pairwise, one pass and numerically stable.
WELFORD = Combiner("welford", "pn_op_welford", "var", struct=True)
ANY = Combiner("any", "pn_op_or", "any")
# Online softmax statistics: (max, sum of exp(x - max)), rescaled when the max grows.
ONLINE_LSE = Combiner("online_lse", "pn_op_lse", "logsumexp", struct=True)
COMBINERS = {c.name: c for c in (SUM, PROD, MAX, MIN, ALL, ANY, WELFORD, ONLINE_LSE)}
