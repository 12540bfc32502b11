"""Panamera: a polyhedral, reduction-parallelizing compiler for deep-learning operators.

>>> import numpy as np, panamera as pn
>>> x = pn.placeholder((3, 5), "float32", name="x")
>>> k = pn.compile(pn.max(x, axis=0), target="emulator")
>>> k(np.arange(15, dtype=np.float32).reshape(3, 5)).tolist()
[10.0, 11.0, 12.0, 13.0, 14.0]
"""

from . import dtypes, errors
from .compiler import Compiled, compile
from .errors import PanameraError
from .frontend import *  # noqa: F403  (the numpy-like API, listed once in frontend.__all__)
from .frontend import __all__ as _frontend_api
from .frontend import nn
from .frontend.nn import std, var

__version__ = "0.1.0"
__all__ = ["Compiled", "PanameraError", "compile", "dtypes", "errors", "nn", "std", "var", *_frontend_api]
