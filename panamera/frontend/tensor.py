"""Tensors: immutable nodes of the operator graph a user builds with the numpy-like API.

>>> import panamera as pn
>>> x = pn.placeholder((4, 8), "float32", name="x")
>>> y = pn.sum(x * 2.0, axis=1)
>>> y.shape, y.dtype.name
((4,), 'float32')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import count

import numpy as np

from .. import dtypes
from ..dtypes import DType, as_dtype, promote, promote_with_scalar
from ..errors import DTypeError, ShapeError

_ids = count()

UNARY_FLOAT = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "floor", "ceil")  # float results, as in numpy
UNARY = ("neg", "abs", "not") + UNARY_FLOAT
BINARY_ARITH = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "trunc_div")
LOGICAL = ("and", "or", "xor")  # bool operands only (numpy.logical_*)
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
# Internal element-wise ops of argmax/argmin: a (value, index) pair packed into one int64 key
# whose integer order is "larger value first, then smaller index" (see codegen/header.py).
ARG_OPS = ("argkey_max", "argkey_min")
MAX_RANK = 8


@dataclass(frozen=True, eq=False)
class Tensor:
    """A node of the graph: `op` applied to `inputs`, with a static shape and dtype.

    Tensors are values: nothing mutates them, transformations build new graphs. Equality is
    identity, so tensors can be networkx nodes.
    """

    op: str
    inputs: tuple[Tensor, ...]
    shape: tuple[int, ...]
    dtype: DType
    attrs: tuple = ()
    name: str = ""
    uid: int = field(default_factory=lambda: next(_ids))

    def attr(self, key, default=None):
        return dict(self.attrs).get(key, default)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"<Tensor{label} {self.op} {self.shape} {self.dtype}>"

    # numpy-like operators -------------------------------------------------------------------
    def __add__(self, o):
        return binary("add", self, o)

    def __radd__(self, o):
        return binary("add", o, self)

    def __sub__(self, o):
        return binary("sub", self, o)

    def __rsub__(self, o):
        return binary("sub", o, self)

    def __mul__(self, o):
        return binary("mul", self, o)

    def __rmul__(self, o):
        return binary("mul", o, self)

    def __truediv__(self, o):
        return binary("div", self, o)

    def __rtruediv__(self, o):
        return binary("div", o, self)

    def __neg__(self):
        return unary("neg", self)

    def __abs__(self):
        return unary("abs", self)

    def __invert__(self):
        if self.dtype.name != "bool":
            raise DTypeError(f"~ of tensor {self.name or self.op!r}: only bool tensors are supported")
        return unary("not", self)

    def __and__(self, o):
        return binary("and", self, o)

    def __or__(self, o):
        return binary("or", self, o)

    def __xor__(self, o):
        return binary("xor", self, o)

    def __pow__(self, o):
        return binary("pow", self, o)

    def __rpow__(self, o):
        return binary("pow", o, self)

    def __lt__(self, o):
        return binary("lt", self, o)

    def __le__(self, o):
        return binary("le", self, o)

    def __gt__(self, o):
        return binary("gt", self, o)

    def __ge__(self, o):
        return binary("ge", self, o)

    def __eq__(self, o):  # type: ignore[override]
        return binary("eq", self, o)

    def __ne__(self, o):  # type: ignore[override]
        return binary("ne", self, o)

    __hash__ = object.__hash__

    def astype(self, dtype) -> Tensor:
        d = as_dtype(dtype, what=f"astype of tensor {self.label!r}")
        if d == self.dtype:
            return self
        return Tensor("cast", (self,), self.shape, d)

    def reshape(self, *shape) -> Tensor:
        return reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)

    @property
    def label(self) -> str:
        return self.name or f"{self.op}#{self.uid}"


def _check_shape(shape, what: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError as e:
        raise ShapeError(f"{what}: shape {shape!r} is not a sequence of integers") from e
    if len(shape) > MAX_RANK:
        raise ShapeError(f"{what}: rank {len(shape)} exceeds Panamera's maximum rank {MAX_RANK}")
    if any(s < 0 for s in shape):
        raise ShapeError(f"{what}: negative extent in shape {shape}")
    return shape


def placeholder(shape, dtype="float32", name: str = "x") -> Tensor:
    """An input of the computation; `name` may be any string (it is sanitized for code).

    >>> placeholder((2, 3), "float16", name="onnx::ReduceMean_0").dtype.name
    'float16'
    """
    what = f"placeholder {name!r}"
    return Tensor("placeholder", (), _check_shape(shape, what), as_dtype(dtype, what=what), name=str(name))


def iota(shape, axis: int | None = None) -> Tensor:
    """int64 tensor whose value is the index along `axis` (the flat C-order index if None)."""
    shape = _check_shape(shape, "iota")
    return Tensor("iota", (), shape, dtypes.int64, attrs=(("axis", axis),))


def constant(value, dtype: DType) -> Tensor:
    return Tensor("const", (), (), dtype, attrs=(("value", value),))


def broadcast_shapes(*shapes: tuple[int, ...], what: str = "operands") -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"{what}: shapes {' and '.join(map(str, shapes))} do not broadcast") from None


def _as_tensor_pair(a, b, op: str):
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a, b, promote(a.dtype, b.dtype)
    if isinstance(a, Tensor):
        d = promote_with_scalar(a.dtype, b)
        return a, constant(b, d), d
    if isinstance(b, Tensor):
        d = promote_with_scalar(b.dtype, a)
        return constant(a, d), b, d
    raise DTypeError(f"{op}: at least one operand must be a Tensor, got {a!r} and {b!r}")


def binary(op: str, a, b) -> Tensor:
    a, b, d = _as_tensor_pair(a, b, op)
    shape = broadcast_shapes(a.shape, b.shape, what=f"{op} of {a.label!r} and {b.label!r}")
    if op in LOGICAL and (a.dtype.name != "bool" or b.dtype.name != "bool"):
        raise DTypeError(f"logical {op} of {a.label!r} and {b.label!r}: both operands must be bool")
    if op in COMPARE or op in LOGICAL:
        out = dtypes.bool_
    elif op == "div":
        out = d if d.is_float else dtypes.float64
    elif op == "trunc_div":  # C integer division (ONNX Div of integers), x / 0 gives 0
        if d.is_float or d.name == "bool":
            raise DTypeError(f"trunc_div of {a.label!r} and {b.label!r}: integer operands only")
        out = d
    else:
        out = d
        if op == "sub" and d.name == "bool":
            raise DTypeError(f"sub of {a.label!r} and {b.label!r}: numpy does not subtract booleans")
        if op == "pow" and d.name == "bool":
            raise DTypeError(f"pow of {a.label!r} and {b.label!r}: booleans have no power")
    return Tensor(op, (a, b), shape, out)


def unary(op: str, x: Tensor) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    d = x.dtype
    if op in UNARY_FLOAT and not d.is_float:
        d = dtypes.float16 if d.name == "bool" else dtypes.float64
    if op == "neg" and d.name == "bool":
        raise DTypeError(f"neg of bool tensor {x.label!r}: numpy does not negate booleans; use ~")
    return Tensor(op, (x,), x.shape, d)


def where(cond, a, b) -> Tensor:
    """numpy.where(cond, a, b) with broadcasting; cond must be bool."""
    if not isinstance(cond, Tensor) or cond.dtype.name != "bool":
        raise DTypeError("where: the condition must be a bool Tensor")
    a, b, d = _as_tensor_pair(a, b, "where")
    shape = broadcast_shapes(cond.shape, a.shape, b.shape, what="where")
    return Tensor("where", (cond, a, b), shape, d)


def reshape(x: Tensor, shape) -> Tensor:
    """A view with a new shape (C order); one extent may be -1."""
    shape = list(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape of {x.label!r}: more than one -1 in {tuple(shape)}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or x.size % known:
            raise ShapeError(f"reshape of {x.label!r}: cannot infer -1 in {tuple(shape)} from {x.shape}")
        shape[shape.index(-1)] = x.size // known
    shape = _check_shape(shape, f"reshape of {x.label!r}")
    if math.prod(shape) != x.size:
        raise ShapeError(f"reshape of {x.label!r}: cannot reshape {x.shape} ({x.size} elements) into {shape}")
    if shape == x.shape:
        return x
    return Tensor("reshape", (x,), shape, x.dtype)


def alternatives(op: str, names: tuple[str, ...], options: tuple[Tensor, ...]) -> Tensor:
    """One value with several formulations (`names[k]` computes it as `options[k]`); the
    compiler's planner keeps one of them (schedule/formulation.py). The frontend only builds.

    >>> x = placeholder((4,), "float32", name="x")
    >>> alternatives("double", ("add", "mul"), (x + x, x * 2.0)).op
    'choose'
    """
    first = options[0]
    if len(names) != len(options) or any((t.shape, t.dtype) != (first.shape, first.dtype) for t in options):
        raise ShapeError(f"{op}: formulations must agree in number, shape and dtype")
    return Tensor(
        "choose", tuple(options), first.shape, first.dtype, (("formulation", op), ("names", tuple(names))), first.name
    )
