"""The mapping of a parametric statement for one size class (issue 22).

The mapper evaluates the GPU model (model/kernel_cost.py `kernel_time`) at the class's representative
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

import dataclasses
import math
from dataclasses import asdict, dataclass

from ..frontend import symbolic
from ..model.gpu import GPUSpec
from ..poly.access import vector_widths
from ..poly.params import PStatement
from ..poly.statement import Form, StatementKind
from .bound import as_decision, bound
from .cost import decision_cost
from .decision import MergeMode
from .derived import merge_of, partials_options, unroll_for, vector_atomic
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
    atomic_vec: int = 1  # outputs per atomic merge (a COLUMN thread's float2/float4 atomicAdd on sm_90)
    unroll: int = 1  # copies of the innermost loop's body per step: vector loads in flight per thread

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
            MergeMode(d["merge"]), float(d.get("modeled_us", 0.0)), int(d.get("atomic_vec", 1)), int(d.get("unroll", 1)),
        )  # fmt: skip

    def describe(self) -> str:
        atomics = f" atomic_vec={self.atomic_vec}" if self.atomic_vec > 1 else ""
        unroll = f" unroll={self.unroll}" if self.unroll > 1 else ""
        return f"{self.form} block=({self.tx},{self.ty}) split={self.split} vec={self.vec} merge={self.merge}{atomics}{unroll}"

    def grid(self, M: int) -> tuple[int, int]:  # noqa: N803
        """The grid at the bound canonical extent M."""
        if self.form == Form.MAP:
            return max(1, math.ceil(M / (self.tx * self.vec))), 1
        if self.form == Form.COLUMN:
            return max(1, math.ceil(M / (self.tx * self.vec))), self.split
        return max(1, math.ceil(M / self.ty)), self.split

    def iterations(self, M: int, N: int) -> int:  # noqa: N803
        """Steps of a thread's innermost loop at the bound canonical extents M, N (schedule/derived.py
        `unroll_for` caps the unroll by them)."""
        if self.form == Form.MAP:
            return 1
        if self.form == Form.COLUMN:
            return max(1, math.ceil(N / (self.split * self.ty)))
        return max(1, math.ceil(N / (self.vec * self.split * self.tx)))


def widest_vec(s: PStatement, cls: SizeClass, registers: frozenset[int] = frozenset()) -> int:
    """The widest vector (16 bytes at most) every contiguous read can take in this class (reads
    of the tensors `registers`, a stitched group's own results, are registers, not loads)."""
    loads = [r.tensor.dtype.itemsize for r in s.reads if r.tensor.uid not in registers]
    for v in vector_widths(loads):  # the static mapper's widths (poly/access.py); results are stored per lane
        if cls.holds(s.vector_condition(v)):
            return v
    return 1


def merge_mode(s: PStatement, split: int, deterministic: bool) -> MergeMode:
    """The merge a split of `split` blocks takes when the model has no choice (schedule/derived.py
    `merge_of`, `partials_options`: partials where deterministic or no atomic merges the combiner)."""
    return merge_of(s.kind, split, partials_options((s,), deterministic)[0])


def atomic_width(s: PStatement, d: ParamDecision, gpu: GPUSpec) -> int:
    """Outputs per atomic merge (schedule/derived.py `vector_atomic`): the class proved M a
    multiple of vec (a COLUMN vector's condition, poly/params.py precondition 3)."""
    return d.vec if vector_atomic(gpu, s.form, d.vec, True, d.merge, s) else 1


def cost(s: PStatement, d: ParamDecision, sizes: dict[str, int], gpu: GPUSpec):
    """The modeled time (model/kernel_cost.py KernelCost) of statement `s` under decision `d` at `sizes`:
    schedule/cost.py's, on the kernel's static view (schedule/bound.py)."""
    return group_cost((s,), d, sizes, gpu, "single")


def candidates(s: PStatement, cls: SizeClass, deterministic: bool, N: int, M: int, gpu: GPUSpec):  # noqa: N803
    """The decisions the mapper weighs: threads per row, rows per block, blocks per reduction."""
    vec = widest_vec(s, cls)
    if s.kind == StatementKind.MAP:
        yield ParamDecision(s.name, str(Form.MAP), MAP_THREADS, 1, 1, vec, MergeMode.STORE)
        return
    for tx in (32, 64, 128, 256, 512, 1024):
        for ty in (1, 2, 4, 8, 16, 32):
            if not 32 <= tx * ty <= 1024:
                continue
            along = N if s.form != Form.COLUMN else M
            if tx > 32 and tx * vec > 2 * max(1, along):
                continue  # threads past the row's length (a COLUMN block's columns) idle
            if s.form != Form.COLUMN and ty > 1 and ty > M:
                continue  # rows of the block past the last row idle (ALL has one)
            for split in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048):
                if split > 1 and split * (ty if s.form == Form.COLUMN else tx) * vec > max(1, N):
                    break
                for partials in partials_options((s,), deterministic) if split > 1 else (False,):
                    d = ParamDecision(s.name, str(s.form), tx, ty, split, vec, merge_of(s.kind, split, partials))
                    d = dataclasses.replace(d, unroll=unroll_for(vec, d.iterations(M, N)))
                    yield dataclasses.replace(d, atomic_vec=atomic_width(s, d, gpu))


def robust(cands, cost_at, cls: SizeClass) -> tuple[ParamDecision, object]:
    """The candidate whose worst ratio to the best candidate, over sizes spanning the class
    (`SizeClass.samples`), is least (ties: the fastest at the representative size): one decision
    holds for every size of the class. Returns it with its cost at the representative."""
    cands = list(cands)
    points = cls.samples()
    rep = cls.representative()
    rep_at = points.index(rep) if rep in points else 0
    table = [[cost_at(d, p).total_s for p in points] for d in cands]
    best = [min(col) for col in zip(*table)]
    score = [max(c / b if b > 0 else 1.0 for c, b in zip(row, best)) for row in table]
    k = min(range(len(cands)), key=lambda i: (round(score[i], 3), table[i][rep_at]))
    return cands[k], cost_at(cands[k], rep)


def map_statement(
    s: PStatement, cls: SizeClass, gpu: GPUSpec, deterministic: bool, members: tuple[PStatement, ...] = (), kind=""
) -> ParamDecision:
    """The mapping of `s` for its size class: the candidates (sized for the class's largest sizes)
    weighed by the model over the class (`robust`); `members` and `kind`: the kernel `s` leads
    (an epilogue group, siblings), costed whole."""
    top = cls.upper()
    M, N = _at(s.M, top), _at(s.N, top)  # noqa: N806
    members, kind = members or (s,), kind or "single"
    d, c = robust(candidates(s, cls, deterministic, N, M, gpu), costing(members, kind, gpu), cls)
    return _with_cost(d, c)


def _with_cost(d: ParamDecision, cost) -> ParamDecision:
    return dataclasses.replace(d, modeled_us=cost.total_s * 1e6)


def _at(extent, sizes: dict[str, int]) -> int:
    return symbolic.evaluate((extent,), sizes)[0]


def group_name(members: tuple[PStatement, ...]) -> str:
    return "+".join(s.name for s in members)


def stitched_cost(members: tuple[PStatement, ...], d: ParamDecision, sizes: dict[str, int], gpu: GPUSpec):
    """A stitched ROW group (poly/param_stitch.py) at `sizes`: schedule/cost.py's stitched cost
    (its passes, their L2 or DRAM re-reads, the block reductions, the arithmetic)."""
    return group_cost(members, d, sizes, gpu, "stitched")


def map_group(
    members: tuple[PStatement, ...], cls: SizeClass, gpu: GPUSpec, deterministic: bool, kind: str = "single"
) -> ParamDecision:
    """One kernel's decision: a single statement's, an epilogue group's (its reduction's), or a
    stitched group's (ROW, no split: precondition 4 of poly/param_stitch.py; the narrowest vector
    any member can take)."""
    if kind != "stitched":
        d = map_statement(members[0], cls, gpu, deterministic, members, kind)
        return dataclasses.replace(d, statement=group_name(members))
    top = cls.upper()
    red = members[0]
    M, N = _at(red.M, top), _at(red.N, top)  # noqa: N806
    own = frozenset(m.result.uid for m in members)
    vec = min(widest_vec(m if m.kind == StatementKind.REDUCE else m.as_rows_of(red), cls, own) for m in members)
    name = group_name(members)
    rows = {(d.tx, d.ty): ParamDecision(name, str(Form.ROW), d.tx, d.ty, 1, vec, MergeMode.STORE)
            for d in candidates(red, cls, deterministic, N, M, gpu) if d.split == 1}  # fmt: skip
    cands = [dataclasses.replace(d, unroll=unroll_for(vec, d.iterations(M, N))) for d in rows.values()]
    d, c = robust(cands, costing(members, "stitched", gpu), cls)
    return _with_cost(d, c)


def group_cost(members: tuple[PStatement, ...], d: ParamDecision, sizes: dict[str, int], gpu: GPUSpec, kind: str):
    """The modeled time of one kernel at `sizes`: the static model's (schedule/cost.py
    `decision_cost`) of the kernel's static view (schedule/bound.py), so a class plan and a static
    plan are weighed by the same terms."""
    return costing(members, kind, gpu)(d, sizes)


def costing(members: tuple[PStatement, ...], kind: str, gpu: GPUSpec):
    """`group_cost` as a function of (decision, sizes) that builds the kernel's static view once
    per sizes (the mapper weighs every candidate at the same few sizes)."""
    views: dict[tuple, object] = {}

    def cost_at(d: ParamDecision, sizes: dict[str, int]):
        key = tuple(sorted(sizes.items()))
        if key not in views:
            views[key] = bound(members, kind, sizes)
        group = views[key]
        return decision_cost(group, gpu, as_decision(group, members, d, kind), d.merge == MergeMode.PARTIALS)

    return cost_at
