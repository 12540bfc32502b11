"""The numpy-like functions of the public API: elementwise math and reductions."""

from __future__ import annotations

import math
from collections.abc import Iterable

from .. import algebra, dtypes
from ..errors import AxisError, DTypeError, EmptyReductionError
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


def normalize_axes(axis, ndim: int, tensor: str) -> tuple[int, ...]:
    """numpy's axis argument (None, int or tuple; negatives allowed) as sorted positive axes."""
    if axis is None:
        return tuple(range(ndim))
    items = list(axis) if isinstance(axis, Iterable) and not isinstance(axis, str) else [axis]
    out = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, int):
            raise AxisError(f"reduction of {tensor!r}: axis {a!r} is not an integer")
        if not -ndim <= a < ndim:
            raise AxisError(f"reduction of {tensor!r}: axis {a} is out of range for rank {ndim}")
        a %= ndim
        if a in out:
            raise AxisError(f"reduction of {tensor!r}: axis {a} is repeated in {axis!r}")
        out.append(a)
    return tuple(sorted(out))


def _reduce(name: str, x: Tensor, axis, keepdims: bool, mean: bool = False, post: tuple = ()) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{name}: expected a Tensor, got {type(x).__name__}")
    comb = algebra.COMBINERS[name]
    axes = normalize_axes(axis, x.ndim, x.label)
    n = math.prod(x.shape[a] for a in axes)
    out_shape = tuple(1 if k in axes else s for k, s in enumerate(x.shape) if keepdims or k not in axes)
    if n == 0 and not comb.has_identity and math.prod(out_shape) > 0:
        raise EmptyReductionError(
            f"{name} of {x.label!r} over axes {axes}: zero-size reduction (shape {x.shape}) has no identity"
        )
    if mean:
        res = x.dtype if x.dtype.is_float else dtypes.float64
        acc = dtypes.float32 if res.is_16bit_float else res
        src = x if x.dtype == acc or x.dtype.is_16bit_float else x.astype(acc)
    else:
        res = comb.result_dtype(x.dtype)
        acc = comb.acc_dtype(x.dtype)
        src = x
    attrs = (("combiner", comb), ("axes", axes), ("keepdims", bool(keepdims)), ("mean", mean), ("acc", acc))
    if post:
        attrs += (("post", post),)
    return Tensor("reduce", (src,), out_shape, res, attrs=attrs)


def sum(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """numpy.sum. int32 and bool inputs give int64, as numpy does on Linux.

    >>> import panamera as pn
    >>> pn.sum(pn.placeholder((3, 4), "int32"), axis=-1).dtype.name
    'int64'
    """
    return _reduce("sum", x, axis, keepdims)


def mean(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """numpy.mean: integers give float64; float16 accumulates in float32."""
    return _reduce("sum", x, axis, keepdims, mean=True)


def max(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """numpy.max (NaN propagates); empty reductions raise EmptyReductionError."""
    return _reduce("max", x, axis, keepdims)


def min(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return _reduce("min", x, axis, keepdims)


def prod(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    return _reduce("prod", x, axis, keepdims)


def all(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return _reduce("all", x, axis, keepdims)


def any(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return _reduce("any", x, axis, keepdims)


def arange(n: int) -> Tensor:
    """numpy.arange(n) as an int64 tensor (computed in the kernel, never read from memory)."""
    return iota((int(n),), 0)


def _arg(kind: str, x: Tensor, axis, keepdims: bool, last: bool = False) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"arg{kind}: expected a Tensor, got {type(x).__name__}")
    if x.dtype.itemsize == 8:
        raise DTypeError(
            f"arg{kind} of tensor {x.label!r}: {x.dtype} values are not supported (Panamera packs a 32-bit "
            "ordered value and a 32-bit index into one 64-bit key)"
        )
    if axis is not None and not isinstance(axis, int):
        raise AxisError(f"arg{kind} of {x.label!r}: axis must be None or an int, as in numpy, got {axis!r}")
    axes = normalize_axes(axis, x.ndim, x.label)
    n = math.prod(x.shape[a] for a in axes)
    if n == 0:
        raise EmptyReductionError(f"arg{kind} of {x.label!r}: attempt to get arg{kind} of an empty sequence")
    if n >= 2**32:
        raise AxisError(f"arg{kind} of {x.label!r}: the reduced extent {n} does not fit a 32-bit index")
    idx = iota(x.shape, None if axis is None else axes[0])
    if last:  # the first index of the reversed order is the last index
        idx = (n - 1) - idx
    key = Tensor(f"argkey_{kind}", (x, idx), x.shape, dtypes.int64)
    # The index is taken from the merged key where the reduction stores its result (the last
    # block of a split), so argmax is one kernel however it is mapped.
    return _reduce(kind, key, axis, keepdims, post=("argindex", kind, n - 1 if last else -1))


def argmax(x: Tensor, axis=None, keepdims: bool = False, last: bool = False) -> Tensor:
    """numpy.argmax: the first index of the maximum (the last with last=True); a NaN wins.

    >>> import panamera as pn
    >>> pn.argmax(pn.placeholder((4, 10), "float32"), axis=1).dtype.name
    'int64'
    """
    return _arg("max", x, axis, keepdims, last)


def argmin(x: Tensor, axis=None, keepdims: bool = False, last: bool = False) -> Tensor:
    """numpy.argmin: the first index of the minimum (the last with last=True); a NaN wins."""
    return _arg("min", x, axis, keepdims, last)


def welford(x: Tensor, axis=None, keepdims: bool = False, field: str = "var", ddof: int = 0) -> Tensor:
    """One-pass Welford reduction: the mean (field="mean") or the variance with `ddof`
    (field="var") of x over `axis`. Two of them over the same input share its one pass."""
    if not isinstance(x, Tensor):
        raise DTypeError(f"welford: expected a Tensor, got {type(x).__name__}")
    axes = normalize_axes(axis, x.ndim, x.label)
    res = x.dtype if x.dtype.is_float else dtypes.float64
    # float64 accumulators: Welford's running mean in float32 drifts by ~n ulps on data with a
    # large mean (5e-5 relative error at mean 1e4); in float64 the result keeps float32 precision.
    acc = dtypes.welford64
    src = x if x.dtype.is_float else x.astype(dtypes.float64)
    out_shape = tuple(1 if k in axes else s for k, s in enumerate(x.shape) if keepdims or k not in axes)
    post = ("mean",) if field == "mean" else ("var", int(ddof))
    attrs = (("combiner", algebra.WELFORD), ("axes", axes), ("keepdims", bool(keepdims)), ("mean", False),
             ("acc", acc), ("post", post))  # fmt: skip
    return Tensor("reduce", (src,), out_shape, res, attrs=attrs)


def online_softmax_stats(x: Tensor, axis=-1, keepdims: bool = True) -> tuple[Tensor, Tensor]:
    """(max, sum of exp(x - max)) of x over `axis` from one pass (online rescaling)."""
    axes = normalize_axes(axis, x.ndim, x.label)
    acc = dtypes.lse64 if x.dtype.name == "float64" else dtypes.lse32
    out_shape = tuple(1 if k in axes else s for k, s in enumerate(x.shape) if keepdims or k not in axes)
    res = x.dtype

    def stat(field):
        attrs = (("combiner", algebra.ONLINE_LSE), ("axes", axes), ("keepdims", bool(keepdims)), ("mean", False),
                 ("acc", acc), ("post", (field,)))  # fmt: skip
        return Tensor("reduce", (x,), out_shape, res, attrs=attrs)

    return stat("m"), stat("s")
