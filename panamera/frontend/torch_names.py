"""PyTorch's argument names for `pn.nn`: `dim`, `keepdim`, `input`, `weight`, `bias`, ...

`torch_names(dim="axis", ...)` makes a function accept `dim=` as `axis=`, so that code written
against `torch.nn.functional` ports without renaming. Giving both names is an OptionError.

>>> @torch_names(dim="axis", input="x")
... def f(x, axis=-1):
...     return x, axis
>>> f(input=1, dim=0)
(1, 0)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..errors import OptionError


def torch_names(**aliases: str) -> Callable[[Callable], Callable]:
    """A decorator: each keyword `alias` (PyTorch's name) is passed on as `aliases[alias]`."""

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            for alias, name in aliases.items():
                if alias in kwargs:
                    if name in kwargs:
                        raise OptionError(f"{f.__name__}: got both {alias}= (PyTorch's name) and {name}=")
                    kwargs[name] = kwargs.pop(alias)
            return f(*args, **kwargs)

        names = ", ".join(f"{a}= for {n}=" for a, n in aliases.items())
        wrapper.__doc__ = (f.__doc__ or "").rstrip() + f"\n\n    PyTorch's names are accepted: {names}.\n"
        return wrapper

    return decorate
