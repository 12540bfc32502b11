"""Panamera: a polyhedral, reduction-parallelizing compiler for deep-learning operators.

>>> import numpy as np, panamera as pn
>>> x = pn.placeholder((3, 5), "float32", name="x")
>>> k = pn.compile(pn.max(x, axis=0), target="emulator")
>>> k(np.arange(15, dtype=np.float32).reshape(3, 5)).tolist()
[10.0, 11.0, 12.0, 13.0, 14.0]
>>> issubclass(pn.ScheduleError, pn.PanameraError)
True
"""

import sys

from . import cpu_target as _cpu_target  # noqa: F401  (registers target="cpu" with the compiler)
from . import dtypes, errors
from . import dynamic_compile as _dynamic_compile  # noqa: F401  (registers symbolic graphs with the compiler)
from ._version import __version__ as __version__
from .compiler import Compiled, compile
from .dynamic import DynamicCompiled, SymbolicSchedule
from .errors import *  # noqa: F403  (every public error and warning, listed once in errors.__all__)
from .errors import __all__ as _errors_api
from .frontend import *  # noqa: F403  (the numpy-like API, listed once in frontend.__all__)
from .frontend import __all__ as _frontend_api
from .frontend import nn
from .frontend.nn import std, var

if "torch" in sys.modules:  # torch.compile(backend="panamera"); else torch finds the entry point
    from .torch_backend import register as _register_torch_backend

    _register_torch_backend()

__all__ = [
    "Compiled",
    "DynamicCompiled",
    "SymbolicSchedule",
    "compile",
    "dtypes",
    "errors",
    "nn",
    "std",
    "var",
    *_errors_api,
    *_frontend_api,
]
