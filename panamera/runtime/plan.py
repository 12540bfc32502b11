"""The launch plan: every launch of a compiled computation and every buffer it touches, as data.

This is the contract between the compiler and the executor (runtime/executor.py): a buffer's
role is an enum on its spec, never parsed from its key, and the executor needs nothing else.
It is a leaf module (dtypes only), so the mapper can name buffers with the same records.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..dtypes import DType
from ..enums import StrEnum
from ..errors import BackendError


def _header_int(name: str) -> int:
    """The value of `#define name N` in the emulator's cuda_emulation.h: a bound every backend
    enforces and every plan stays within, stated once (in the header)."""
    header = Path(__file__).with_name("cuda_emulation.h")
    m = re.search(rf"^#define {name} (\d+)$", header.read_text(), re.M)
    if m is None:
        raise BackendError(f"{header}: no '#define {name} <int>'")
    return int(m.group(1))


MAX_ASYNC_COPIES = _header_int("PN_MAX_ASYNC")  # cp.async copies one thread may have in flight (kMaxAsync)


class BufferRole(StrEnum):
    """What a buffer is to one kernel, and so how long it lives."""

    INPUT = "input"  # read: a caller's array, or the output of an earlier kernel
    OUTPUT = "output"  # written by the kernel; a fresh buffer every call
    WORKSPACE = "workspace"  # resident: filled with the identity once, reset by the last block
    PARTIALS = "partials"  # resident: one partial per block, combined by the last block
    COUNTER = "counter"  # resident: blocks arrived, per output tile; zeroed once, reset by the last block

    @property
    def resident(self) -> bool:
        """Resident buffers outlive a call: allocated (and initialised) by the first call only."""
        return self in (BufferRole.WORKSPACE, BufferRole.PARTIALS, BufferRole.COUNTER)


class LaunchRole(StrEnum):
    INIT = "init"  # every call: the results of empty reductions
    INIT_ONCE = "init_once"  # the first call only: resident workspaces and counters
    REDUCE = "reduce"
    MAP = "map"


@dataclass(frozen=True)
class BufferSpec:
    """One buffer: `key` names it in the plan ("in:<uid>", "out:<uid>", "ws:<kernel>:<k>",
    "cnt:<kernel>"), `param` is its parameter name in the kernel, `statement` the index of the
    statement of its kernel group it belongs to (-1: none), `uid` the tensor it holds."""

    key: str
    ctype: str  # C storage type
    dtype: DType | None  # None for counters (uint32)
    size: int
    role: BufferRole
    param: str = ""
    statement: int = -1
    uid: int = -1  # the tensor it holds (inputs and outputs)

    @property
    def nbytes(self) -> int:
        return max(self.size, 1) * (self.dtype.itemsize if self.dtype is not None else 4)


@dataclass(frozen=True)
class Fill:
    """A value written over a whole buffer by an init kernel."""

    buffer: str
    ctype: str  # the buffer's C type
    value: object  # the value, as a Python scalar (recorded in the plan)
    c_value: str  # the value as a C expression


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple  # ("buf", key): the buffers passed, in order
    role: LaunchRole
    dynamic_smem_bytes: int = 0
    form: str = ""
    blocks_per_reduction: int = 1
    atomic_outputs: tuple = ()  # (buffer key, initial value) combined by atomics
    modes: tuple = ()  # per statement: the MergeMode of its result
    bytes_read: int = 0
    bytes_written: int = 0
    mapping: str = ""
    modeled_us: float = 0.0
    cost_features: tuple = ()  # what the model was given (model/estimate.py re-models from it)
    cooperative: bool = False  # every block resident at once (its blocks wait for each other)
    cluster: int = 1  # blocks along y per thread-block cluster (__cluster_dims__; 1: no clusters)


@dataclass(frozen=True)
class ResultSpec:
    """Where one output of the computation is found after a call: in a buffer (`key`), or, for
    an output that is an input (or a reshape of one), in the caller's input `input_index`."""

    shape: tuple[int, ...]
    size: int
    key: str = ""
    input_index: int = -1


@dataclass(frozen=True)
class IndexCheck:
    """A run-time check of an index input: after the launches, `key` (one int64) holds the least
    position whose id fell outside [0, extent), or `sentinel` when none did (the kernel that
    reads the ids records it; runtime/executor.py raises an InputError naming `tensor` and `op`)."""

    key: str
    input_index: int
    tensor: str
    extent: int
    sentinel: int
    op: str


@dataclass(frozen=True)
class InputSpec:
    """One input the caller passes: its placeholder's name, shape and dtype, its buffer key, and
    the alignment in bytes its address needs: the widest vector load of it (vector width x item
    size) any kernel makes; 1 when it is only read element by element."""

    name: str
    key: str
    shape: tuple[int, ...]
    dtype: DType
    align: int = 1


@dataclass(frozen=True)
class LaunchPlan:
    launches: tuple[Launch, ...]
    buffers: dict = field(default_factory=dict)  # key -> BufferSpec
    inputs: tuple[InputSpec, ...] = ()
    results: tuple[ResultSpec, ...] = ()
    checks: tuple[IndexCheck, ...] = ()  # index inputs checked after every call

    def as_dicts(self) -> list[dict]:
        return [asdict(x) for x in self.launches]

    @property
    def per_call(self) -> list[Launch]:
        """The launches of every call (the first call also runs the init_once ones)."""
        return [x for x in self.launches if x.role != LaunchRole.INIT_ONCE]

    @property
    def modeled_us(self) -> float:
        """Modeled time of one call (every launch but the first call's resident initialisation)."""
        return sum(x.modeled_us for x in self.per_call)

    @property
    def kernels(self) -> list[Launch]:
        return [x for x in self.launches if x.role in (LaunchRole.REDUCE, LaunchRole.MAP)]
