"""The numpy-like frontend: tensors and the ops users compose."""

from .ops import abs, all, any, exp, log, max, maximum, mean, min, minimum, negative, prod, rsqrt, sqrt, sum
from .tensor import Tensor, placeholder, reshape, where

__all__ = [
    "Tensor",
    "placeholder",
    "reshape",
    "where",
    "abs",
    "all",
    "any",
    "exp",
    "log",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "negative",
    "prod",
    "rsqrt",
    "sqrt",
    "sum",
]
