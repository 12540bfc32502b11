"""The resident buffers of a symbolic GPU program's classes (dynamic.py, dynamic_attention.py): per
backend (the emulator's, or per CUDA device and stream), each class's merge workspaces and block
counters, grown to a call's need and initialised once (`resident_buffer`); the last block of every
call leaves them as it found them.
"""

from __future__ import annotations

import numpy as np

from .algebra import AtomicStrategy, ordered
from .poly.params import PStatement
from .schedule.decision import MergeMode
from .schedule.derived import workspace_dtype
from .schedule.param_mapping import ParamDecision


def resident_key(backend) -> str:
    """Resident buffers per backend: the emulator's, or per CUDA device and stream."""
    if backend.name != "cuda":
        return backend.name
    from .runtime.executor import current_cuda_key

    return current_cuda_key(backend.cupy)


def resident_buffer(resident: dict, backend, s: PStatement, d: ParamDecision, key: str, M: int, gx: int):  # noqa: N803
    """A class's resident workspace or counter, grown to this call's need (a new one is
    initialised: the identity, or zero counters); the last block of every call resets it."""
    if key.startswith("cnt:"):
        need, dtype, fill = gx, np.uint32, 0
    else:
        need = M * (d.split if d.merge == MergeMode.PARTIALS else 1)
        dtype = workspace_dtype(s, d.merge).np
        fill = workspace_fill(s) if d.merge == MergeMode.ATOMIC_WS else None
    have = resident.get(key)
    if have is None or have[0] < need:
        buf = backend.empty(max(need, 1), dtype)
        if fill is not None:
            backend.fill(buf, fill)
        resident[key] = have = (max(need, 1), buf)
    return have[1]


def workspace_fill(s: PStatement):
    """The identity an atomic workspace starts from: the combiner's, or its integer image
    (algebra.ordered, the numpy definition of codegen/header.py's pn_ordered), as the static
    kernels' workspace_identity (codegen/reduce_kernel.py) prints it."""
    ident = s.combiner.identity(s.acc)
    if s.combiner.atomic(s.acc) == AtomicStrategy.ORDERED:
        return ordered(np.array([ident], s.acc.np), s.combiner.ordered_top)[0]
    return ident
