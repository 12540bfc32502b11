"""Tensors: immutable nodes of the operator graph a user builds with the numpy-like API.

>>> import panamera as pn
>>> x = pn.placeholder((4, 8), "float32", name="x")
>>> y = pn.sum(x * 2.0, axis=1)
>>> y.shape, y.dtype.name
((4,), 'float32')
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from itertools import count

import numpy as np

from .. import dtypes
from ..dtypes import DType, as_dtype, promote, promote_with_scalar
from ..errors import AxisError, DTypeError, ShapeError
from . import symbolic
from .symbolic import Dim
from .walk import postorder

_ids = count()
_unnamed = count()  # placeholders created without a name are x0, x1, ...

UNARY_FLOAT = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "floor", "ceil", "sin", "cos")  # float results, as numpy
UNARY = ("neg", "abs", "not") + UNARY_FLOAT
BINARY_ARITH = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "trunc_div", "fmod", "mod")
LOGICAL = ("and", "or", "xor")  # bool operands only (numpy.logical_*)
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
# Internal element-wise ops of argmax/argmin: a (value, index) pair packed into one int64 key
# whose integer order is "larger value first, then smaller index" (see codegen/header.py).
ARG_OPS = ("argkey_max", "argkey_min")
# Integer bit operations (numpy's &, |, ^ of integers, >> and <<): quantized weights unpacked in
# registers, e.g. int4 nibbles `(w >> 4) & 0xF`.
BITWISE = ("bitand", "bitor", "bitxor", "shr", "shl")
MAX_RANK = 8
# The most elements a tensor (an input, a result or an iteration space such as a contraction's
# broadcast product) may have: 2**56, far past any device's memory, leaves int64 index
# arithmetic (64-bit `pn_idx`, isl's intermediate terms, byte offsets) 2**7 of headroom.
MAX_ELEMENTS = 2**56


@dataclass(frozen=True, eq=False)
class Tensor:
    """A node of the graph: `op` applied to `inputs`, with a static shape and dtype.

    Tensors are values: nothing mutates them, transformations build new graphs. Equality is
    identity, so tensors can be networkx nodes.
    """

    op: str
    inputs: tuple[Tensor, ...]
    shape: tuple[int | Dim, ...]  # an extent is an int or a symbolic Dim (frontend/symbolic.py)
    dtype: DType
    attrs: tuple = ()
    name: str = ""
    uid: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self):
        if not symbolic.is_symbolic(self.shape) and math.prod(self.shape) > MAX_ELEMENTS:
            what = f"placeholder {self.name!r}" if self.op == "placeholder" else f"{self.op} result {self.label!r}"
            raise ShapeError(
                f"{what}: shape {self.shape} has {math.prod(self.shape)} elements, more than the {MAX_ELEMENTS} "
                "(2**56) Panamera indexes with 64-bit integers"
            )

    def attr(self, key, default=None):
        return dict(self.attrs).get(key, default)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int | Dim:
        return symbolic.prod(self.shape)

    @property
    def symbolic(self) -> bool:
        """Whether an extent of this tensor is a symbol (bound when the compiled program is called)."""
        return symbolic.is_symbolic(self.shape)

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

    def __mod__(self, o):  # numpy's %: np.mod (pn.mod), the sign of the divisor
        return binary("mod", self, o)

    def __rmod__(self, o):
        return binary("mod", o, self)

    def __neg__(self):
        return unary("neg", self)

    def __abs__(self):
        return unary("abs", self)

    def __invert__(self):
        if self.dtype.name != "bool":
            raise DTypeError(f"~ of tensor {self.name or self.op!r}: only bool tensors are supported")
        return unary("not", self)

    def __and__(self, o):
        return logical_or_bitwise("and", self, o)

    def __rand__(self, o):
        return logical_or_bitwise("and", o, self)

    def __or__(self, o):
        return logical_or_bitwise("or", self, o)

    def __ror__(self, o):
        return logical_or_bitwise("or", o, self)

    def __xor__(self, o):
        return logical_or_bitwise("xor", self, o)

    def __rxor__(self, o):
        return logical_or_bitwise("xor", o, self)

    def __rshift__(self, o):
        return bitwise("shr", self, o)

    def __rrshift__(self, o):
        return bitwise("shr", o, self)

    def __lshift__(self, o):
        return bitwise("shl", self, o)

    def __rlshift__(self, o):
        return bitwise("shl", o, self)

    def __matmul__(self, o):
        from .contract import matmul

        return matmul(self, o)

    def __rmatmul__(self, o):
        from .contract import matmul

        return matmul(o, self)

    def __getitem__(self, key) -> Tensor:
        """numpy's basic indexing (integers, slices, None, ..., one integer Tensor): gather.index."""
        from .gather import index

        return index(self, key)

    __iter__ = None  # not a sequence: __getitem__ alone would make it iterate until an IndexError

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
        """numpy's astype: a cast (a no-op for the same dtype).

        >>> placeholder((2,), "int32", name="i").astype("float32").dtype.name
        'float32'
        """
        d = as_dtype(dtype, what=f"astype of tensor {self.label!r}")
        if d == self.dtype:
            return self
        return Tensor("cast", (self,), self.shape, d)

    def reshape(self, *shape) -> Tensor:
        """numpy's reshape, as `x.reshape(2, 3)` or `x.reshape((2, 3))`."""
        return reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)

    def transpose(self, *axes) -> Tensor:
        """numpy's transpose: axes reversed, or permuted as given."""
        return transpose(self, axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes or None)

    @property
    def T(self) -> Tensor:  # noqa: N802 - numpy's name
        """The axes reversed (numpy's `.T`).

        >>> placeholder((2, 3), name="m").T.shape
        (3, 2)
        """
        return transpose(self)

    # numpy's reduction methods: the functions of frontend/ops.py and frontend/nn.py ----------
    def sum(self, axis=None, dtype=None, out=None, keepdims: bool = False, initial=None, where=True) -> Tensor:
        """`pn.sum(self, ...)`.

        >>> placeholder((2, 3), "int32", name="i").sum(axis=1).dtype.name
        'int64'
        """
        from . import ops

        return ops.sum(self, axis, dtype, out, keepdims, initial, where)

    def mean(self, axis=None, dtype=None, out=None, keepdims: bool = False, *, where=True) -> Tensor:
        """`pn.mean(self, ...)`."""
        from . import ops

        return ops.mean(self, axis, dtype, out, keepdims, where=where)

    def max(self, axis=None, out=None, keepdims: bool = False, initial=None, where=True) -> Tensor:
        """`pn.max(self, ...)`."""
        from . import ops

        return ops.max(self, axis, out, keepdims, initial, where)

    def min(self, axis=None, out=None, keepdims: bool = False, initial=None, where=True) -> Tensor:
        """`pn.min(self, ...)`."""
        from . import ops

        return ops.min(self, axis, out, keepdims, initial, where)

    def prod(self, axis=None, dtype=None, out=None, keepdims: bool = False, initial=None, where=True) -> Tensor:
        """`pn.prod(self, ...)`."""
        from . import ops

        return ops.prod(self, axis, dtype, out, keepdims, initial, where)

    def all(self, axis=None, out=None, keepdims: bool = False, *, where=True) -> Tensor:
        """`pn.all(self, ...)`."""
        from . import ops

        return ops.all(self, axis, out, keepdims, where=where)

    def any(self, axis=None, out=None, keepdims: bool = False, *, where=True) -> Tensor:
        """`pn.any(self, ...)`."""
        from . import ops

        return ops.any(self, axis, out, keepdims, where=where)

    def var(self, axis=None, dtype=None, out=None, ddof=0, keepdims: bool = False, *, where=True) -> Tensor:
        """`pn.var(self, ...)`."""
        from . import nn

        return nn.var(self, axis, dtype, out, ddof, keepdims, where=where)

    def std(self, axis=None, dtype=None, out=None, ddof=0, keepdims: bool = False, *, where=True) -> Tensor:
        """`pn.std(self, ...)`."""
        from . import nn

        return nn.std(self, axis, dtype, out, ddof, keepdims, where=where)

    def argmax(self, axis=None, out=None, *, keepdims: bool = False) -> Tensor:
        """`pn.argmax(self, ...)`."""
        from . import ops

        return ops.argmax(self, axis, out, keepdims=keepdims)

    def argmin(self, axis=None, out=None, *, keepdims: bool = False) -> Tensor:
        """`pn.argmin(self, ...)`."""
        from . import ops

        return ops.argmin(self, axis, out, keepdims=keepdims)

    @property
    def label(self) -> str:
        return self.name or f"{self.op}#{self.uid}"


def _extent(s, what: str) -> int | Dim:
    """One extent: an integer, a symbol's name ("B") or a symbolic Dim."""
    if isinstance(s, (str, Dim)):
        return symbolic.extent(s, what)
    return operator.index(s)


def _check_shape(shape, what: str) -> tuple[int | Dim, ...]:
    """A shape as a tuple of extents: a sequence of integers (numpy integers too) and symbols
    (names such as "B", frontend/symbolic.py), or one integer; a bare string, floats and nested
    sequences are refused."""
    if isinstance(shape, (str, bytes)):
        raise ShapeError(f"{what}: shape {shape!r} is a string, not a sequence of integers")
    try:
        if not hasattr(shape, "__iter__"):
            shape = (operator.index(shape),)
        else:
            shape = tuple(_extent(s, what) for s in shape)
    except TypeError as e:
        raise ShapeError(f"{what}: shape {shape!r} is not a sequence of integers and symbol names") from e
    if len(shape) > MAX_RANK:
        raise ShapeError(f"{what}: rank {len(shape)} exceeds Panamera's maximum rank {MAX_RANK}")
    if any(not isinstance(s, Dim) and s < 0 for s in shape):
        raise ShapeError(f"{what}: negative extent in shape {shape}")
    return shape


def placeholder(shape, dtype="float32", name: str | None = None) -> Tensor:
    """An input of the computation; `name` may be any string (it is sanitized for code).
    Unnamed placeholders are called x0, x1, ... in creation order, so no two share a name.
    An extent may be a symbol's name: its size is bound when the compiled program is called
    (frontend/symbolic.py; one name is one size across the program).

    >>> placeholder(("B", "S", 64), name="h").shape
    (B, S, 64)

    >>> placeholder((2, 3), "float16", name="onnx::ReduceMean_0").dtype.name
    'float16'
    >>> placeholder((2,)).name != placeholder((2,)).name
    True
    """
    name = f"x{next(_unnamed)}" if name is None else str(name)
    what = f"placeholder {name!r}"
    return Tensor("placeholder", (), _check_shape(shape, what), as_dtype(dtype, what=what), name=name)


def bound_array(value, name: str) -> Tensor:
    """A constant array as an input the compiled kernel supplies itself: a placeholder that holds
    a read-only copy of `value` (attribute "bound"), left out of `Compiled.inputs` and of the
    arrays a caller passes. The graph's key hashes its contents (cache.graph_key).

    >>> import numpy as np
    >>> m = bound_array(np.array([True, False]), "mask")
    >>> m.op, m.shape, m.dtype.name, m.attr("bound").flags.writeable
    ('placeholder', (2,), 'bool', False)
    """
    a = np.array(value, copy=True)
    a.flags.writeable = False
    d = as_dtype(a.dtype, what=f"constant array {name!r}")
    return Tensor("placeholder", (), _check_shape(a.shape, f"constant array {name!r}"), d, (("bound", a),), name)


def iota(shape, axis: int | None = None) -> Tensor:
    """int64 tensor whose value is the index along `axis` (the flat C-order index if None)."""
    shape = _check_shape(shape, "iota")
    return Tensor("iota", (), shape, dtypes.int64, attrs=(("axis", axis),))


def constant(value, dtype: DType) -> Tensor:
    return Tensor("const", (), (), dtype, attrs=(("value", value),))


def broadcast_to(x: Tensor, shape) -> Tensor:
    """numpy.broadcast_to: `x` read at the broadcast index (computed, never stored).

    >>> broadcast_to(placeholder((3, 1), name="c"), (3, 4)).shape
    (3, 4)
    """
    shape = broadcast_shapes(x.shape, _check_shape(shape, f"broadcast_to of {x.label!r}"), what="broadcast_to")
    if shape == x.shape:
        return x
    return where(iota(shape) >= 0, x, x)


def full(shape, value, dtype) -> Tensor:
    """numpy.full: `shape` filled with `value` (computed in the kernel, never read from memory)."""
    c = constant(value, as_dtype(dtype, what="full"))
    return broadcast_to(c, shape)


def broadcast_shapes(*shapes: tuple[int, ...], what: str = "operands") -> tuple[int, ...]:
    if any(symbolic.is_symbolic(s) for s in shapes):
        return symbolic.broadcast(*shapes, what=what)
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"{what}: shapes {' and '.join(map(str, shapes))} do not broadcast") from None


def _as_tensor_pair(a, b, op: str):
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a, b, promote(a.dtype, b.dtype, what=f"{op} of {a.label!r} and {b.label!r}")
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


def logical_or_bitwise(op: str, a, b) -> Tensor:
    """numpy's `&`, `|`, `^`: logical for bool operands, bitwise for integers.

    >>> w = placeholder((4,), "uint8", name="w")
    >>> ((w >> 4) & 0xF).op, ((w >> 4) & 0xF).dtype.name
    ('bitand', 'uint8')
    """
    ints = [t.dtype for t in (a, b) if isinstance(t, Tensor)]
    if all(d.name == "bool" for d in ints) and not any(isinstance(v, int) and not isinstance(v, bool) for v in (a, b)):
        return binary(op, a, b)
    return bitwise({"and": "bitand", "or": "bitor", "xor": "bitxor"}[op], a, b)


def bitwise(op: str, a, b) -> Tensor:
    """An integer bit operation of BITWISE (numpy's promotion; a shift keeps the left dtype's
    kind). Float operands are a DTypeError naming the tensors.

    >>> (placeholder((2,), "int8", name="q") >> 4).dtype.name
    'int8'
    """
    a, b, d = _as_tensor_pair(a, b, op)
    if d.is_float or d.name == "bool" or not d.name.startswith(("int", "uint")):
        raise DTypeError(f"{op} of {a.label!r} and {b.label!r}: bit operations need integer operands, got {d}")
    shape = broadcast_shapes(a.shape, b.shape, what=f"{op} of {a.label!r} and {b.label!r}")
    return Tensor(op, (a, b), shape, d)


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
    """A view with a new shape (C order); one extent may be -1. Symbolic shapes reshape where the
    element counts are provably equal (frontend/symbolic.py).

    >>> reshape(placeholder(("B", "S", 8), name="r"), (-1, 8)).shape
    (B*S, 8)
    """
    if hasattr(shape, "__index__") or isinstance(shape, str):
        shape = (shape,)  # one extent, as numpy's reshape(x, 6)
    try:
        shape = [s if isinstance(s, (str, Dim)) else operator.index(s) for s in shape]
    except TypeError as e:  # None, floats (numpy's TypeError), not a sequence
        raise ShapeError(f"reshape of {x.label!r}: {shape!r} is not a shape of integers and symbol names") from e
    if x.symbolic or any(isinstance(s, (str, Dim)) for s in shape):
        new = symbolic.reshape_shape(x.shape, shape, f"reshape of {x.label!r}")
        return x if new == x.shape else Tensor("reshape", (x,), new, x.dtype)
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


def transpose(x: Tensor, axes=None) -> Tensor:
    """numpy.transpose: the axes reversed (None) or permuted; an access relation, fused into
    its consumer like a broadcast.

    >>> transpose(placeholder((2, 3, 4), name="t"), (1, 0, 2)).shape
    (3, 2, 4)
    """
    if not isinstance(x, Tensor):
        raise DTypeError(f"transpose: expected a Tensor, got {type(x).__name__}")
    if axes is None:
        perm = tuple(reversed(range(x.ndim)))
    else:
        try:
            perm = tuple(operator.index(a) % x.ndim if -x.ndim <= operator.index(a) < x.ndim else -1 for a in axes)
        except TypeError:
            raise AxisError(f"transpose of {x.label!r}: axes {axes!r} are not integers") from None
        if sorted(perm) != list(range(x.ndim)):
            raise AxisError(f"transpose of {x.label!r}: axes {tuple(axes)} are not a permutation of {x.ndim} axes")
    if perm == tuple(range(x.ndim)):
        return x
    return Tensor("transpose", (x,), tuple(x.shape[a] for a in perm), x.dtype, attrs=(("perm", perm),))


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


def topological(outputs) -> list[Tensor]:
    """Every tensor `outputs` depend on, each once, producers before consumers."""
    return postorder(outputs, lambda t: t.inputs, key=lambda t: t.uid)  # iterative: chains of any depth
