"""Panamera: a polyhedral, reduction-parallelizing compiler for deep-learning operators.

>>> import numpy as np, panamera as pn
>>> x = pn.placeholder((3, 5), "float32", name="x")
>>> k = pn.compile(pn.max(x, axis=0), target="emulator")
>>> k(np.arange(15, dtype=np.float32).reshape(3, 5)).tolist()
[10.0, 11.0, 12.0, 13.0, 14.0]
"""

from . import dtypes, errors, nn
from .compiler import Compiled, compile
from .errors import PanameraError
from .frontend import (
    Tensor,
    abs,
    all,
    any,
    arange,
    argmax,
    argmin,
    exp,
    log,
    max,
    maximum,
    mean,
    min,
    minimum,
    negative,
    placeholder,
    prod,
    reshape,
    rsqrt,
    sqrt,
    sum,
    where,
)
from .nn import std, var

__version__ = "0.1.0"
__all__ = [
    "Compiled",
    "PanameraError",
    "Tensor",
    "abs",
    "all",
    "any",
    "arange",
    "argmax",
    "argmin",
    "compile",
    "dtypes",
    "errors",
    "exp",
    "log",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "nn",
    "std",
    "var",
    "negative",
    "placeholder",
    "prod",
    "reshape",
    "rsqrt",
    "sqrt",
    "sum",
    "where",
]
