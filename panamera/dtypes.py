"""The dtypes Panamera supports, their C types and numpy's promotion rules.

float16 and bfloat16 values live in registers as float (every op on them rounds back to 16 bits,
as numpy does); bool is computed as int so that it can take part in warp shuffles and atomics.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import DTypeError


@dataclass(frozen=True)
class DType:
    name: str
    np: np.dtype
    c_type: str  # storage type in global memory
    compute: str  # register type of values of this dtype
    itemsize: int

    @property
    def is_float(self) -> bool:
        return self.name in ("float16", "bfloat16", "float32", "float64")

    @property
    def is_struct(self) -> bool:
        """An accumulator made of several values (Welford's mean, M2, count)."""
        return self.np.names is not None

    @property
    def field(self) -> DType:
        """The dtype of a struct accumulator's fields."""
        return as_dtype(self.np[0].name)

    @property
    def is_16bit_float(self) -> bool:
        return self.name in ("float16", "bfloat16")

    def __str__(self) -> str:
        return self.name


_TABLE = {
    "float32": DType("float32", np.dtype(np.float32), "float", "float", 4),
    "float64": DType("float64", np.dtype(np.float64), "double", "double", 8),
    "float16": DType("float16", np.dtype(np.float16), "__half", "float", 2),
    "bfloat16": DType("bfloat16", np.dtype(ml_dtypes.bfloat16), "__nv_bfloat16", "float", 2),
    "int32": DType("int32", np.dtype(np.int32), "int", "int", 4),
    "int64": DType("int64", np.dtype(np.int64), "long long", "long long", 8),
    "bool": DType("bool", np.dtype(np.bool_), "bool", "int", 1),
    # 8-bit integers, for quantized weights (computed as int, as C promotes them)
    "int8": DType("int8", np.dtype(np.int8), "signed char", "int", 1),
    "uint8": DType("uint8", np.dtype(np.uint8), "unsigned char", "int", 1),
}
SUPPORTED = tuple(_TABLE)

float32, float64, float16, bfloat16 = (_TABLE[n] for n in ("float32", "float64", "float16", "bfloat16"))

# Welford accumulators (mean, M2, count), never tensor dtypes: only reductions hold them.
_WELFORD_FIELDS = ("shift", "mean", "m2", "n")  # algebra.WELFORD: the mean is of x - shift
welford32 = DType(
    "welford32", np.dtype([(f, "f4") for f in _WELFORD_FIELDS]), "pn_welford<float>", "pn_welford<float>", 16
)
welford64 = DType(
    "welford64", np.dtype([(f, "f8") for f in _WELFORD_FIELDS]), "pn_welford<double>", "pn_welford<double>", 32
)
int32, int64, bool_ = _TABLE["int32"], _TABLE["int64"], _TABLE["bool"]
int8, uint8 = _TABLE["int8"], _TABLE["uint8"]


def as_dtype(d, *, what: str = "dtype") -> DType:
    """Normalise a name, numpy dtype or DType to a supported DType.

    >>> as_dtype("float32").c_type
    'float'
    """
    if isinstance(d, DType):
        return d
    try:
        name = "bool" if d in (bool, "bool") else np.dtype(d).name
    except TypeError:
        name = str(d)
    if name not in _TABLE:
        raise DTypeError(f"{what}: unsupported dtype {d!r}; Panamera supports {', '.join(SUPPORTED)}")
    return _TABLE[name]


def promote(*dtypes: DType, what: str = "promotion") -> DType:
    """numpy's result_type of the given dtypes (bfloat16 follows ml_dtypes' rules, which define
    no common type of bfloat16 with float16 or an integer: that is a DTypeError naming `what`).

    >>> promote(float16, float32).name
    'float32'
    """
    try:
        return as_dtype(np.result_type(*(d.np for d in dtypes)))
    except TypeError:  # numpy's DTypePromotionError
        names = " and ".join(d.name for d in dtypes)
        raise DTypeError(
            f"{what}: no common dtype of {names} (numpy and ml_dtypes define none); cast one operand with .astype()"
        ) from None


def promote_with_scalar(d: DType, value) -> DType:
    """NEP 50: a Python scalar is weak; it only lifts the kind (int tensor + 0.5 -> float64)."""
    if isinstance(value, bool):
        return d
    if isinstance(value, int):
        return int64 if d.name == "bool" else d
    if isinstance(value, float):
        return d if d.is_float else float64
    raise DTypeError(f"unsupported Python scalar {value!r} of type {type(value).__name__}")


# Online softmax statistics (max, sum of exp(x - max)), likewise accumulators only.
lse32 = DType("lse32", np.dtype([("m", "f4"), ("s", "f4")]), "pn_lse<float>", "pn_lse<float>", 8)
lse64 = DType("lse64", np.dtype([("m", "f8"), ("s", "f8")]), "pn_lse<double>", "pn_lse<double>", 16)
