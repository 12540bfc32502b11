"""The launch plan: a data object listing every launch of a compiled computation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple  # ("buf", key): the buffers passed, in order
    role: str  # "init" (every call), "init_once" (first call: resident workspaces), "reduce" or "map"
    dynamic_smem_bytes: int = 0
    form: str = ""
    blocks_per_reduction: int = 1
    atomic_outputs: tuple = ()  # (buffer key, initial value) combined by atomics
    modes: tuple = ()  # per statement: store / atomic / atomic_ws / partials
    bytes_read: int = 0
    bytes_written: int = 0
    mapping: str = ""
    modeled_us: float = 0.0
    cost_features: tuple = ()  # what the model was given (model/estimate.py re-models from it)


@dataclass(frozen=True)
class LaunchPlan:
    launches: tuple[Launch, ...]
    buffers: dict = field(default_factory=dict)  # key -> BufferSpec

    def as_dicts(self) -> list[dict]:
        return [asdict(x) for x in self.launches]

    @property
    def per_call(self) -> list[Launch]:
        """The launches of every call (the first call also runs the init_once ones)."""
        return [x for x in self.launches if x.role != "init_once"]

    @property
    def modeled_us(self) -> float:
        """Modeled time of one call (every launch but the first call's resident initialisation)."""
        return sum(x.modeled_us for x in self.per_call)

    @property
    def kernels(self) -> list[Launch]:
        return [x for x in self.launches if not x.role.startswith("init")]
