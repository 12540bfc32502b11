"""The mapping of a parametric statement for one size class (issue 22).

The mapper evaluates the GPU model (model/gpu.py `kernel_time`) at the class's representative
size over a small space (threads per row, rows per block, blocks per reduction) and keeps the
fastest; the vector width is the widest the class proves legal (poly/params.py precondition 3).
The result is one frozen `ParamDecision` per statement, serialized with the class.

>>> import panamera as pn
>>> from panamera.poly.params import build
>>> from panamera.schedule.size_class import SizeClass
>>> p = build((pn.sum(pn.placeholder(("B", 4096), name="x"), axis=1),))
>>> from panamera.model.gpu import H100
>>> d = map_statement(p.statements[0], SizeClass.of({"B": 8}), H100, False)
>>> d.vec, d.merge
(4, <MergeMode.STORE: 'store'>)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..algebra import AtomicStrategy
from ..frontend import symbolic
from ..model.gpu import GPUSpec, kernel_time
from ..poly.params import PStatement
from ..poly.statement import Form, StatementKind
from .decision import MergeMode
from .size_class import SizeClass

MAP_THREADS = 256


@dataclass(frozen=True)
class ParamDecision:
    """Every decision codegen and the executor need for one statement in one class."""

    statement: str
    form: str
    tx: int  # threads along the row (ROW/ALL), along i (COLUMN, MAP)
    ty: int  # rows per block (ROW), threads down the reduced extent (COLUMN)
    split: int  # blocks per reduction (grid y)
    vec: int
    merge: MergeMode
    modeled_us: float = 0.0

    @property
    def threads(self) -> int:
        return self.tx * self.ty

    def to_dict(self) -> dict:
        d = asdict(self)
        d["merge"] = str(self.merge)
        return d

    @staticmethod
    def from_dict(d: dict) -> ParamDecision:
        return ParamDecision(
            str(d["statement"]), str(d["form"]), int(d["tx"]), int(d["ty"]), int(d["split"]), int(d["vec"]),
            MergeMode(d["merge"]), float(d.get("modeled_us", 0.0)),
        )  # fmt: skip

    def describe(self) -> str:
        return f"{self.form} block=({self.tx},{self.ty}) split={self.split} vec={self.vec} merge={self.merge}"

    def grid(self, M: int) -> tuple[int, int]:  # noqa: N803
        """The grid at the bound canonical extent M."""
        if self.form == Form.MAP:
            return max(1, math.ceil(M / (self.tx * self.vec))), 1
        if self.form == Form.COLUMN:
            return max(1, math.ceil(M / (self.tx * self.vec))), self.split
        return max(1, math.ceil(M / self.ty)), self.split


def widest_vec(s: PStatement, cls: SizeClass) -> int:
    """The widest vector (16 bytes at most) every contiguous read can take in this class."""
    item = max([r.tensor.dtype.itemsize for r in s.reads] or [4])
    if s.result.dtype.itemsize > item:
        item = s.result.dtype.itemsize
    for v in (16 // item, 8 // item, 4 // item, 2, 1):
        if v >= 1 and (v == 1 or cls.holds(s.vector_condition(v))):
            return max(1, v)
    return 1


def merge_mode(s: PStatement, split: int, deterministic: bool) -> MergeMode:
    if split == 1:
        return MergeMode.STORE
    if deterministic or s.combiner.atomic(s.acc) == AtomicStrategy.NONE:
        return MergeMode.PARTIALS
    return MergeMode.ATOMIC_WS


def map_statement(s: PStatement, cls: SizeClass, gpu: GPUSpec, deterministic: bool) -> ParamDecision:
    """The fastest modeled mapping of `s` at the class's representative size."""
    rep = cls.representative()
    M = _at(s.M, rep)  # noqa: N806
    N = _at(s.N, rep)  # noqa: N806
    vec = widest_vec(s, cls)
    item = max([r.tensor.dtype.itemsize for r in s.reads] or [4])
    read_bytes = sum(r.tensor.dtype.itemsize for r in s.reads)
    out_item = s.result.dtype.itemsize
    if s.kind == StatementKind.MAP:
        d = ParamDecision(s.name, str(Form.MAP), MAP_THREADS, 1, 1, vec, MergeMode.STORE)
        cost = kernel_time(gpu, dram_bytes=M * (read_bytes + out_item), write_bytes=M * out_item,
                           blocks=d.grid(M)[0], threads=MAP_THREADS, bytes_in_flight_per_thread=vec * item)  # fmt: skip
        return _with_cost(d, cost)
    best = None
    for tx in (32, 64, 128, 256, 512, 1024):
        for ty in (1, 2, 4, 8, 16, 32):
            if not 32 <= tx * ty <= 1024:
                continue
            along = N if s.form != Form.COLUMN else M
            if s.form != Form.COLUMN and tx > 32 and tx * vec > 2 * max(1, along):
                continue  # threads past the row's length idle
            for split in (1, 2, 4, 8, 16, 32, 64):
                if split > 1 and split * (ty if s.form == Form.COLUMN else tx) * vec > max(1, N):
                    break
                merge = merge_mode(s, split, deterministic)
                d = ParamDecision(s.name, str(s.form), tx, ty, split, vec, merge)
                gx, gy = d.grid(M)
                outputs = M if merge != MergeMode.STORE else 0
                atomics = gx * gy * (ty if s.form != Form.COLUMN else tx * vec) if merge == MergeMode.ATOMIC_WS else 0
                partial_bytes = 2 * split * outputs * s.acc.itemsize if merge == MergeMode.PARTIALS else 0
                cost = kernel_time(
                    gpu, dram_bytes=M * N * read_bytes + M * out_item + partial_bytes, write_bytes=M * out_item,
                    blocks=gx * gy, threads=tx * ty, bytes_in_flight_per_thread=vec * item,
                    atomics=atomics + (gx * gy if split > 1 else 0), same_address=split if split > 1 else 0,
                )  # fmt: skip
                if best is None or cost.total_s < best[0].total_s:
                    best = (cost, d)
    return _with_cost(best[1], best[0])


def _with_cost(d: ParamDecision, cost) -> ParamDecision:
    return ParamDecision(d.statement, d.form, d.tx, d.ty, d.split, d.vec, d.merge, cost.total_s * 1e6)


def _at(extent, sizes: dict[str, int]) -> int:
    return symbolic.evaluate((extent,), sizes)[0]
