"""Element-wise activations and math models use, composed from the element-wise primitives of
tensor.py (each fuses into its producers and consumers like any element-wise op).

>>> import panamera as pn
>>> x = pn.placeholder((4,), "float32", name="x")
>>> [f(x).dtype.name for f in (pn.gelu, pn.isnan, pn.sign)]
['float32', 'bool', 'float32']
"""

from __future__ import annotations

import math

from ..dtypes import bool_
from ..errors import DTypeError, OptionError
from .tensor import Tensor, binary, constant, unary, where


def _float(x: Tensor, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    if not x.dtype.is_float:
        raise DTypeError(f"{op} of {x.label!r}: needs a floating-point tensor, got {x.dtype}")
    return x


def sin(x: Tensor) -> Tensor:
    """numpy.sin."""
    return unary("sin", x)


def cos(x: Tensor) -> Tensor:
    """numpy.cos."""
    return unary("cos", x)


def fmod(a, b) -> Tensor:
    """numpy.fmod: C's remainder, with the sign of the dividend (an integer divisor 0 gives 0).

    >>> import panamera as pn
    >>> pn.fmod(pn.placeholder((2,), "int32", name="a"), 3).op
    'fmod'
    """
    return binary("fmod", a, b)


def mod(a, b) -> Tensor:
    """numpy.mod (Python's %): the result has the sign of the divisor."""
    return binary("mod", a, b)


def sign(x: Tensor) -> Tensor:
    """numpy.sign: -1, 0 or 1 in x's dtype (NaN stays NaN)."""
    if x.dtype == bool_:
        raise DTypeError(f"sign of bool tensor {x.label!r}: numpy has no sign of booleans")
    one, zero = constant(1, x.dtype), constant(0, x.dtype)
    neg = zero - one if x.dtype.is_float or x.dtype.name.startswith("int") else zero
    return where(x > zero, one, where(x < zero, neg, x))


def isnan(x: Tensor) -> Tensor:
    """numpy.isnan (False for integers)."""
    return x != x  # noqa: PLR0124 - NaN is the one value unequal to itself (never for integers)


def isinf(x: Tensor, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
    """numpy.isinf; ONNX's IsInf may detect one sign only."""
    if not x.dtype.is_float:
        return x != x
    pos, neg = x == math.inf, x == -math.inf
    if detect_positive and detect_negative:
        return pos | neg
    if detect_positive:
        return pos
    if detect_negative:
        return neg
    return x != x


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU: x Φ(x) with the erf form ("none") or the tanh approximation ("tanh"), as torch.

    >>> import panamera as pn
    >>> pn.gelu(pn.placeholder((3,), "float16", name="h"), approximate="tanh").dtype.name
    'float16'
    """
    x = _float(x, "gelu")
    if approximate == "none":
        return 0.5 * x * (1.0 + unary("erf", x * (1.0 / math.sqrt(2.0))))
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + unary("tanh", inner))
    raise OptionError(f"gelu of {x.label!r}: approximate must be 'none' or 'tanh', got {approximate!r}")


def softplus(x: Tensor) -> Tensor:
    """log(1 + exp(x)), computed as max(x, 0) + log(1 + exp(-|x|)) (no overflow)."""
    x = _float(x, "softplus")
    return binary("maximum", x, 0.0) + unary("log", 1.0 + unary("exp", -unary("abs", x)))


def hard_sigmoid(x: Tensor, alpha: float = 0.2, beta: float = 0.5) -> Tensor:
    """max(0, min(1, alpha x + beta)) (ONNX HardSigmoid's defaults)."""
    x = _float(x, "hard_sigmoid")
    return binary("maximum", binary("minimum", x * alpha + beta, 1.0), 0.0)


def hard_swish(x: Tensor) -> Tensor:
    """x hard_sigmoid(x; 1/6, 1/2)."""
    return x * hard_sigmoid(x, 1.0 / 6.0, 0.5)


def leaky_relu(x: Tensor, alpha: float = 0.01) -> Tensor:
    """x for x >= 0, alpha x below."""
    x = _float(x, "leaky_relu")
    return where(x < 0.0, x * alpha, x)


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """x for x > 0, alpha (exp(x) - 1) below."""
    x = _float(x, "elu")
    return where(x < 0.0, (unary("exp", x) - 1.0) * alpha, x)


SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875


def selu(x: Tensor, alpha: float = SELU_ALPHA, gamma: float = SELU_GAMMA) -> Tensor:
    """gamma x for x > 0, gamma alpha (exp(x) - 1) below (ONNX Selu's defaults)."""
    x = _float(x, "selu")
    return where(x <= 0.0, unary("exp", x) * (alpha * gamma) - alpha * gamma, x * gamma)
