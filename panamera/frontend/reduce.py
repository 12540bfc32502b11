"""Reductions with numpy's interface: `axis`, `dtype`, `out`, `keepdims`, `initial`, `where`.

The keywords are lowered into the graph, never into the kernels: `dtype=` casts the input and
sets the accumulator, `where=` reduces `where(mask, x, fill)` (the combiner's identity, or
`initial` for max and min, which have none), `initial=` is folded in after the reduction, and a
masked mean divides by the masked count, itself a reduction. `out=` has nothing to write into
while a graph is built: the compiled call takes it (`pn.compile(y)(a, out=buf)`).

>>> import panamera as pn
>>> x = pn.placeholder((3, 4), "int32", name="x")
>>> pn.sum(x, axis=1).dtype.name, pn.sum(x, axis=1, dtype="int32").dtype.name
('int64', 'int32')
>>> pn.max(x, axis=1, initial=0, where=x > 2).shape
(3,)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

import numpy as np

from .. import algebra, dtypes
from ..dtypes import DType, as_dtype
from ..errors import AxisError, DTypeError, EmptyReductionError, OptionError, ShapeError
from .symbolic import Dim
from .tensor import Tensor, binary, bound_array, broadcast_shapes, broadcast_to, constant, full, iota, where

_BINARY_OF = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}  # how `initial` folds in


def normalize_axes(axis, ndim: int, tensor: str) -> tuple[int, ...]:
    """numpy's axis argument (None, an integer or a tuple of them, numpy integers included;
    negatives allowed) as sorted positive axes."""
    if axis is None:
        return tuple(range(ndim))
    items = list(axis) if isinstance(axis, Iterable) and not isinstance(axis, str) else [axis]
    out = []
    for a in items:
        if isinstance(a, (bool, np.bool_)):
            raise AxisError(f"reduction of {tensor!r}: axis {a!r} is not an integer")
        try:
            a = operator.index(a)
        except TypeError:
            raise AxisError(f"reduction of {tensor!r}: axis {a!r} is not an integer") from None
        if not -ndim <= a < ndim:
            raise AxisError(f"reduction of {tensor!r}: axis {a} is out of range for rank {ndim}")
        a %= ndim
        if a in out:
            raise AxisError(f"reduction of {tensor!r}: axis {a} is repeated in {axis!r}")
        out.append(a)
    return tuple(sorted(out))


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    return tuple(1 if k in axes else s for k, s in enumerate(shape) if keepdims or k not in axes)


def _tensor(x, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    return x


def reduction(
    name: str,
    x: Tensor,
    axis,
    keepdims: bool,
    mean: bool = False,
    post: algebra.Finish | None = None,
    res: DType | None = None,
) -> Tensor:
    """One reduce node: `name` is a combiner of algebra.COMBINERS. `res` is numpy's `dtype=`:
    the input is cast to it and the reduction accumulates (16-bit floats in float32) and returns
    it, instead of numpy's default result dtype (sum of int32 is int64)."""
    x = _tensor(x, name)
    comb = algebra.COMBINERS[name]
    axes = normalize_axes(axis, x.ndim, x.label)
    n = math.prod(x.shape[a] for a in axes)
    out_shape = reduced_shape(x.shape, axes, keepdims)
    if n == 0 and not comb.has_identity:  # numpy refuses it even where the result is empty too
        raise EmptyReductionError(
            f"{name} of {x.label!r} over axes {axes}: zero-size reduction (shape {x.shape}) has no identity"
        )
    if mean:
        res = x.dtype if x.dtype.is_float else dtypes.float64
        acc = dtypes.float32 if res.is_16bit_float else res
        src = x if x.dtype == acc or x.dtype.is_16bit_float else x.astype(acc)
    elif res is not None:
        src = x.astype(res)
        acc = dtypes.float32 if res.is_16bit_float else dtypes.int32 if res.name == "bool" else res
    else:
        src, res, acc = x, comb.result_dtype(x.dtype), comb.acc_dtype(x.dtype)
    attrs = (("combiner", comb), ("axes", axes), ("keepdims", bool(keepdims)), ("mean", mean), ("acc", acc))
    if post is not None:
        attrs += (("post", post),)
    return Tensor("reduce", (src,), out_shape, res, attrs=attrs)


def keep_inputs(y: Tensor, *unread: Tensor) -> Tensor:
    """`y` with tensors it does not read kept in its graph, so that the placeholders among them
    stay inputs of the compiled kernel (in placeholder order, as the caller passes them): the
    zero-size operands an op skips (a concatenate's empty piece, a padded empty tensor). Each is
    the condition of a select whose branches are both `y`: an `any` of nothing, always False.

    >>> import panamera as pn
    >>> e, w = pn.placeholder((0,), name="e"), pn.placeholder((3,), name="w")
    >>> [t.name for t in pn.compile(pn.concatenate([e, w]), target="emulator").inputs]
    ['e', 'w']
    """
    for t in unread:
        y = where(reduction("any", t, None, False), y, y)
    return y


# -- the keywords -------------------------------------------------------------------------------
def refuse_out(out, op: str, x: Tensor) -> None:
    """numpy's `out=`: a graph being built has no array to write into."""
    if out is not None:
        raise OptionError(
            f"{op} of {x.label!r}: out= names an array to write into, and a graph being built has none; "
            "pass it to the compiled call instead: pn.compile(y)(a, out=buf)"
        )


def scalar(value, d: DType, what: str):
    """`value` cast to dtype `d` as numpy casts a reduction's `initial` (unsafe), as a Python scalar."""
    try:
        with np.errstate(all="ignore"):
            v = np.asarray(value).astype(d.np)
    except (TypeError, ValueError):
        raise DTypeError(f"{what}: {value!r} is not a number") from None
    if v.ndim:
        raise ShapeError(f"{what}: expected a scalar, got an array of shape {v.shape}")
    v = v[()]
    return bool(v) if d.name == "bool" else float(v) if d.is_float else int(v)


def mask_of(where_, x: Tensor, op: str) -> Tensor | None:
    """numpy's `where=`: None for True, else a bool tensor of x's shape. An array (numpy's
    array_like of bool) is a constant mask the compiled kernel holds (`bound_array`); one that is
    all True or all False is no mask or an all-False one, with nothing to read.

    >>> import numpy as np, panamera as pn
    >>> k = pn.compile(pn.sum(pn.placeholder((3,), name="v"), where=np.array([True, False, True])), target="emulator")
    >>> float(k(np.array([1, 10, 100], np.float32))), [t.name for t in k.inputs]
    (101.0, ['v'])
    """
    if isinstance(where_, (bool, np.bool_)):
        return None if where_ else full(x.shape, False, dtypes.bool_)
    if not isinstance(where_, Tensor):
        try:
            m = np.asarray(where_)
        except (TypeError, ValueError):
            m = np.asarray(None)
        if m.dtype != np.bool_:
            raise OptionError(
                f"{op} of {x.label!r}: where= must be a bool Tensor, a bool array or a bool, got "
                f"{type(where_).__name__}" + (f" of dtype {m.dtype}" if m.dtype != object else "")
            )
        if broadcast_shapes(m.shape, x.shape, what=f"{op} of {x.label!r} where=") != x.shape:
            raise ShapeError(f"{op} of {x.label!r}: where= array of shape {m.shape} does not broadcast to {x.shape}")
        if m.all() or not m.any():
            return mask_of(bool(m.all()), x, op)
        where_ = bound_array(m, f"{op}_where")
    if where_.dtype.name != "bool":
        raise DTypeError(f"{op} of {x.label!r}: where= {where_.label!r} must be bool, got {where_.dtype}")
    if broadcast_shapes(where_.shape, x.shape, what=f"{op} of {x.label!r} where={where_.label!r}") != x.shape:
        raise ShapeError(f"{op} of {x.label!r}: where= {where_.label!r} {where_.shape} does not broadcast to {x.shape}")
    return broadcast_to(where_, x.shape)


def count(mask: Tensor, axes: tuple[int, ...], keepdims: bool) -> Tensor:
    """The number of True elements of `mask` over `axes` (int64)."""
    return reduction("sum", mask, axes, keepdims)


def numpy_reduce(name: str, x, axis, dtype, out, keepdims: bool, initial, where_) -> Tensor:
    """sum, prod, max, min, all and any with numpy's keywords (see the module docstring)."""
    x = _tensor(x, name)
    refuse_out(out, name, x)
    axes = normalize_axes(axis, x.ndim, x.label)
    d = None if dtype is None else as_dtype(dtype, what=f"{name} of {x.label!r}: dtype=")
    if d is not None and d.name == "bool" and name in ("sum", "prod"):  # numpy: add is or, multiply is and
        r = numpy_reduce("any" if name == "sum" else "all", x, axes, None, None, keepdims, None, where_)
        if initial is None:
            return r
        return binary("or" if name == "sum" else "and", r, constant(bool(initial), dtypes.bool_))
    src = x if d is None else x.astype(d)
    comb = algebra.COMBINERS[name]
    res = d or comb.result_dtype(x.dtype)
    mask = mask_of(where_, x, name)
    if mask is not None:
        if comb.has_identity:
            fill = scalar(comb.identity(res), src.dtype, f"{name} of {x.label!r}")
        elif initial is None:
            raise OptionError(f"{name} of {x.label!r}: {name} has no identity, so where= needs initial= (numpy's rule)")
        else:
            fill = scalar(initial, src.dtype, f"{name} of {x.label!r}: initial=")
        src = where(mask, src, constant(fill, src.dtype))
    n = math.prod(x.shape[a] for a in axes)
    if initial is not None and n == 0 and not comb.has_identity:  # `initial` everywhere; x stays an input
        c = constant(scalar(initial, res, f"{name} initial="), res)
        return where(reduction("any", x, axes, keepdims), c, c)
    r = reduction(name, src, axes, keepdims, res=d)
    if initial is None:  # (a masked max/min filled with `initial` still folds it in: a row may be all selected)
        return r
    if name not in _BINARY_OF:
        raise OptionError(f"{name} of {x.label!r}: numpy's {name} takes no initial=")
    return binary(_BINARY_OF[name], r, constant(scalar(initial, res, f"{name} initial="), res))


def numpy_mean(x, axis, dtype, out, keepdims: bool, where_) -> Tensor:
    """numpy.mean with its keywords: float64 for integers unless `dtype=`; an integer `dtype=`
    truncates the quotient as numpy does; a masked mean divides by the masked count."""
    x = _tensor(x, "mean")
    refuse_out(out, "mean", x)
    axes = normalize_axes(axis, x.ndim, x.label)
    d = None if dtype is None else as_dtype(dtype, what=f"mean of {x.label!r}: dtype=")
    if d is not None and d.name == "bool":
        raise DTypeError(f"mean of {x.label!r}: dtype=bool has no mean")
    mask = mask_of(where_, x, "mean")
    if mask is None and (d is None or d.is_float):
        return reduction("sum", x if d is None else x.astype(d), axes, keepdims, mean=True)
    res = d or (x.dtype if x.dtype.is_float else dtypes.float64)
    acc = dtypes.float32 if res.is_16bit_float else res
    src = x.astype(acc)
    total = reduction("sum", src if mask is None else where(mask, src, constant(0, acc)), axes, keepdims, res=acc)
    n = count(mask, axes, keepdims) if mask is not None else math.prod(x.shape[a] for a in axes)
    return (total / n).astype(res)


def check_ddof(ddof, correction, op: str, x: Tensor) -> int:
    """numpy's `ddof`, or its alias `correction` (numpy 2, the Python array API), as an int."""
    if correction is not None:
        if ddof not in (0, None):
            raise OptionError(f"{op} of {x.label!r}: ddof and correction can't be provided simultaneously")
        ddof = correction
    if isinstance(ddof, (bool, np.bool_)):
        raise OptionError(f"{op} of {x.label!r}: ddof must be an integer, got {ddof!r}")
    try:
        return operator.index(ddof)
    except TypeError:
        raise OptionError(f"{op} of {x.label!r}: ddof must be an integer, got {ddof!r}") from None


def welford(x: Tensor, axis=None, keepdims: bool = False, field: str = "var", ddof: int = 0) -> Tensor:
    """One-pass Welford reduction: the mean (field="mean") or the variance with `ddof`
    (field="var") of x over `axis`. Two of them over the same input share its one pass.
    A divisor n - ddof <= 0 divides by 0 (inf, or nan for zero spread), as numpy does."""
    x = _tensor(x, "welford")
    axes = normalize_axes(axis, x.ndim, x.label)
    res = x.dtype if x.dtype.is_float else dtypes.float64
    # float32 accumulators for 16- and 32-bit floats, float64 for float64 and integers: the
    # shifted merge (algebra.WELFORD) accumulates deviations, so float32 keeps float32 precision
    # on data with a large mean, and the kernel issues no FP64 work for float32 inputs.
    acc = dtypes.welford64 if res.name == "float64" else dtypes.welford32
    src = x if x.dtype.is_float else x.astype(dtypes.float64)
    n = math.prod(x.shape[a] for a in axes)
    if field == "mean":
        post = algebra.Finish(algebra.FinishKind.WELFORD_MEAN)
    else:  # numpy: max(n - ddof, 0)
        ddof = int(ddof) if isinstance(n, Dim) else min(int(ddof), n)  # symbolic n: the kernel's count
        post = algebra.Finish(algebra.FinishKind.WELFORD_VAR, ddof=ddof)
    attrs = (("combiner", algebra.WELFORD), ("axes", axes), ("keepdims", bool(keepdims)), ("mean", False),
             ("acc", acc), ("post", post))  # fmt: skip
    return Tensor("reduce", (src,), reduced_shape(x.shape, axes, keepdims), res, attrs=attrs)


def masked_var(x: Tensor, axes, keepdims: bool, ddof: int, mask: Tensor, res: DType) -> Tensor:
    """numpy's two-pass masked variance: sum(where(mask, x - mean, 0)^2) / max(count - ddof, 0)."""
    acc = dtypes.float64 if res.name == "float64" else dtypes.float32
    xc = x.astype(acc)
    cnt = count(mask, axes, True).astype(acc)
    mean = reduction("sum", where(mask, xc, constant(0.0, acc)), axes, True) / cnt
    dev = where(mask, xc - mean, constant(0.0, acc))
    v = reduction("sum", dev * dev, axes, True) / binary("maximum", cnt - float(ddof), 0.0)
    return v.astype(res).reshape(reduced_shape(x.shape, axes, keepdims))


def arg_index(kind: str, x, axis, out, keepdims: bool, last: bool) -> Tensor:
    """argmax/argmin: the reduction of (value, index) keys; see ops.argmax."""
    x = _tensor(x, f"arg{kind}")
    refuse_out(out, f"arg{kind}", x)
    if x.dtype.itemsize == 8:
        raise DTypeError(
            f"arg{kind} of tensor {x.label!r}: {x.dtype} values are not supported (Panamera packs a 32-bit "
            "ordered value and a 32-bit index into one 64-bit key)"
        )
    if axis is not None and (isinstance(axis, (bool, tuple, list)) or not hasattr(axis, "__index__")):
        raise AxisError(f"arg{kind} of {x.label!r}: axis must be None or an int, as in numpy, got {axis!r}")
    axes = normalize_axes(axis, x.ndim, x.label)
    n = math.prod(x.shape[a] for a in axes)
    if n == 0:
        raise EmptyReductionError(f"arg{kind} of {x.label!r}: attempt to get arg{kind} of an empty sequence")
    if isinstance(n, int) and n >= 2**32:  # a symbolic extent is checked when it is bound (dynamic_cpu.py)
        raise AxisError(f"arg{kind} of {x.label!r}: the reduced extent {n} does not fit a 32-bit index")
    idx = iota(x.shape, None if axis is None else axes[0])
    if last:  # the first index of the reversed order is the last index
        idx = (n - 1) - idx
    key = Tensor(f"argkey_{kind}", (x, idx), x.shape, dtypes.int64)
    # The index is taken from the merged key where the reduction stores its result (the last
    # block of a split), so argmax is one kernel however it is mapped.
    return reduction(
        kind,
        key,
        axis,
        keepdims,
        post=algebra.Finish(
            algebra.FinishKind.ARGMAX_INDEX if kind == "max" else algebra.FinishKind.ARGMIN_INDEX,
            last_index=n - 1 if last else -1,
        ),
    )
