"""numpy's BLAS on a Panamera call's thread count.

A CPU program's contractions run on the BLAS numpy links (called from C, runtime/cpu_gemm.py, or
through numpy, runtime/cpu_call.py's HostStep), and that BLAS keeps its own thread pool, sized at
import (OPENBLAS_NUM_THREADS, else every core). So `threads=1` used to run the generated kernels on
one thread and every gemm on all of them: unfair in a one-thread benchmark, and on a loaded
machine a pool thread waiting for a busy core can stall a product 100x. threadpoolctl (the
scikit-learn project's) finds the BLAS libraries loaded in the process and sets their counts;
`blas_threads(n)` holds them at `n` for one call and restores what the user had.

Not thread-safe across concurrent calls with different counts: the BLAS's count is process-wide
(the program's own lock serialises calls of one program).

>>> import numpy as np
>>> with blas_threads(1):
...     _ = np.ones((4, 4)) @ np.ones((4, 4))
"""

from __future__ import annotations

import ctypes
from functools import cache


@cache
def loaded_blas() -> tuple:
    """threadpoolctl's controllers of the BLAS libraries loaded now (numpy's, once imported); each
    has `filepath`, `get_num_threads` and `set_num_threads` (runtime/cpu_gemm.py finds its gemm there)."""
    import numpy  # noqa: F401  (loads numpy's BLAS before the scan)
    from threadpoolctl import ThreadpoolController

    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


class blas_threads:  # noqa: N801  (a context manager used like a function)
    """Within the block every loaded BLAS runs on `n` threads; the previous counts are restored on
    exit. A library already at `n` is not touched (~0.5 us a call to check)."""

    __slots__ = ("n", "changed")

    def __init__(self, n: int):
        self.n, self.changed = int(n), ()

    def __enter__(self) -> blas_threads:
        self.changed = tuple((lib, before) for lib in loaded_blas() if (before := lib.get_num_threads()) != self.n)
        for lib, _ in self.changed:
            lib.set_num_threads(self.n)
        return self

    def __exit__(self, *exc) -> None:
        for lib, before in self.changed:
            lib.set_num_threads(before)


@cache
def native_count() -> tuple[int, int] | None:
    """The addresses of (get, set) of the thread count of the one BLAS loaded, for C to hold it at a
    call's count around that call (subgraph/cpu_chain.py: ~0.05 us instead of this module's ~1.5 us
    of Python a call), or None: not exactly one BLAS, not OpenBLAS on its own threads (an OpenMP
    build's count is per thread: threadpoolctl's business), or no such symbols.

    >>> native_count() is None or all(isinstance(a, int) and a for a in native_count())
    True
    """
    libs = loaded_blas()
    if len(libs) != 1 or getattr(libs[0], "internal_api", "") != "openblas" or libs[0].threading_layer == "openmp":
        return None
    dynlib = getattr(libs[0], "dynlib", None)
    for prefix, suffix in (("", ""), ("scipy_", "64_"), ("scipy_", ""), ("", "64_")):
        get = getattr(dynlib, f"{prefix}openblas_get_num_threads{suffix}", None)
        put = getattr(dynlib, f"{prefix}openblas_set_num_threads{suffix}", None)
        if get is not None and put is not None:
            return ctypes.cast(get, ctypes.c_void_p).value, ctypes.cast(put, ctypes.c_void_p).value
    return None
