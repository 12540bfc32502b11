"""The numpy-like functions of the public API: elementwise math and reductions (their numpy
keywords are lowered in frontend/reduce.py)."""

from __future__ import annotations

import operator

from .. import algebra, dtypes
from ..errors import ShapeError
from .reduce import arg_index, numpy_mean, numpy_reduce, reduced_shape
from .reduce import normalize_axes as normalize_axes
from .reduce import welford as welford
from .symbolic import Dim
from .tensor import Tensor, binary, iota, unary


def exp(x: Tensor) -> Tensor:
    return unary("exp", x)


def log(x: Tensor) -> Tensor:
    return unary("log", x)


def sqrt(x: Tensor) -> Tensor:
    return unary("sqrt", x)


def rsqrt(x: Tensor) -> Tensor:
    """1 / sqrt(x)."""
    return unary("rsqrt", x)


def tanh(x: Tensor) -> Tensor:
    return unary("tanh", x)


def erf(x: Tensor) -> Tensor:
    """The Gauss error function (scipy.special.erf)."""
    return unary("erf", x)


def floor(x: Tensor) -> Tensor:
    return unary("floor", x)


def ceil(x: Tensor) -> Tensor:
    return unary("ceil", x)


def power(a, b) -> Tensor:
    """numpy.power: float operands use pow(); integer operands multiply exactly."""
    return binary("pow", a, b)


def logical_and(a: Tensor, b: Tensor) -> Tensor:
    return binary("and", a, b)


def logical_or(a: Tensor, b: Tensor) -> Tensor:
    return binary("or", a, b)


def logical_xor(a: Tensor, b: Tensor) -> Tensor:
    return binary("xor", a, b)


def logical_not(x: Tensor) -> Tensor:
    return ~x


def abs(x: Tensor) -> Tensor:  # noqa: A001 - numpy's name
    return unary("abs", x)


def negative(x: Tensor) -> Tensor:
    return unary("neg", x)


def maximum(a, b) -> Tensor:
    """Elementwise maximum; NaN propagates as in numpy."""
    return binary("maximum", a, b)


def minimum(a, b) -> Tensor:
    return binary("minimum", a, b)


def sum(x: Tensor, axis=None, dtype=None, out=None, keepdims: bool = False, initial=None, where=True) -> Tensor:  # noqa: A001
    """numpy.sum. int32 and bool inputs give int64, as numpy does on Linux; `dtype=` sets the
    accumulator and result; `initial=` is added; `where=` (a bool tensor) masks elements.

    >>> import panamera as pn
    >>> pn.sum(pn.placeholder((3, 4), "int32"), axis=-1).dtype.name
    'int64'
    """
    return numpy_reduce("sum", x, axis, dtype, out, keepdims, initial, where)


def mean(x: Tensor, axis=None, dtype=None, out=None, keepdims: bool = False, *, where=True) -> Tensor:
    """numpy.mean: integers give float64; float16 accumulates in float32; `where=` divides by
    the number of unmasked elements.

    >>> import panamera as pn
    >>> pn.mean(pn.placeholder((3, 4), "int32"), axis=0, dtype="float32").dtype.name
    'float32'
    """
    return numpy_mean(x, axis, dtype, out, keepdims, where)


def max(x: Tensor, axis=None, out=None, keepdims: bool = False, initial=None, where=True) -> Tensor:  # noqa: A001
    """numpy.max (NaN propagates); an empty reduction needs `initial=` (else EmptyReductionError),
    and so does `where=`, as in numpy.

    >>> import panamera as pn
    >>> pn.max(pn.placeholder((3, 0)), axis=1, initial=0.0).shape
    (3,)
    """
    return numpy_reduce("max", x, axis, None, out, keepdims, initial, where)


def min(x: Tensor, axis=None, out=None, keepdims: bool = False, initial=None, where=True) -> Tensor:  # noqa: A001
    """numpy.min; see max."""
    return numpy_reduce("min", x, axis, None, out, keepdims, initial, where)


def prod(x: Tensor, axis=None, dtype=None, out=None, keepdims: bool = False, initial=None, where=True) -> Tensor:
    """numpy.prod; keywords as for sum."""
    return numpy_reduce("prod", x, axis, dtype, out, keepdims, initial, where)


def all(x: Tensor, axis=None, out=None, keepdims: bool = False, *, where=True) -> Tensor:  # noqa: A001
    """numpy.all: a bool result; masked elements count as True."""
    return numpy_reduce("all", x, axis, None, out, keepdims, None, where)


def any(x: Tensor, axis=None, out=None, keepdims: bool = False, *, where=True) -> Tensor:  # noqa: A001
    """numpy.any: a bool result; masked elements count as False."""
    return numpy_reduce("any", x, axis, None, out, keepdims, None, where)


def arange(n: int | str | Dim) -> Tensor:
    """numpy.arange(n) as an int64 tensor (computed in the kernel, never read from memory); `n`
    an integer (empty below 1, as numpy's) or a symbol's name (frontend/symbolic.py).

    >>> arange("C").shape, arange(-2).shape
    ((C,), (0,))
    """
    if isinstance(n, (str, Dim)):
        return iota((n,), 0)
    if not hasattr(n, "__index__"):  # numpy's float stop would give floats; Panamera's iota is int64
        raise ShapeError(f"arange: n must be an integer or a symbol's name, got {n!r}")
    n = operator.index(n)
    return iota((n if n > 0 else 0,), 0)  # (the builtin max is shadowed here)


def argmax(x: Tensor, axis=None, out=None, *, keepdims: bool = False, last: bool = False) -> Tensor:
    """numpy.argmax: the first index of the maximum (the last with last=True); a NaN wins.

    >>> import panamera as pn
    >>> pn.argmax(pn.placeholder((4, 10), "float32"), axis=1).dtype.name
    'int64'
    """
    return arg_index("max", x, axis, out, keepdims, last)


def argmin(x: Tensor, axis=None, out=None, *, keepdims: bool = False, last: bool = False) -> Tensor:
    """numpy.argmin: the first index of the minimum (the last with last=True); a NaN wins."""
    return arg_index("min", x, axis, out, keepdims, last)


def online_softmax_stats(x: Tensor, axis=-1, keepdims: bool = True) -> tuple[Tensor, Tensor]:
    """(max, sum of exp(x - max)) of x over `axis` from one pass (online rescaling)."""
    axes = normalize_axes(axis, x.ndim, x.label)
    acc = dtypes.lse64 if x.dtype.name == "float64" else dtypes.lse32
    out_shape = reduced_shape(x.shape, axes, keepdims)
    res = x.dtype

    def stat(field: algebra.FinishKind) -> Tensor:
        attrs = (("combiner", algebra.ONLINE_LSE), ("axes", axes), ("keepdims", bool(keepdims)), ("mean", False),
                 ("acc", acc), ("post", algebra.Finish(field)))  # fmt: skip
        return Tensor("reduce", (x,), out_shape, res, attrs=attrs)

    return stat(algebra.FinishKind.LSE_MAX), stat(algebra.FinishKind.LSE_SUM)
