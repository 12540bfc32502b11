"""The plan of a symbolic program as data (issue 22): per size class, every kernel's decision.

A `ClassPlan` holds the decisions of one size class (schedule/size_class.py) and the C index type
its kernels use; a `SymbolicSchedule` is every class planned so far, serialized (readable JSON, one
line per class) and replayed by `pn.compile(y, schedule=s)` (panamera/dynamic.py validates it
against the program: statements, forms, vector widths the class proves).

>>> SymbolicSchedule.from_json(SymbolicSchedule("H100", False, ()).to_json()).gpu
'H100'
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from ..errors import ScheduleError
from ..model.gpu import GPUSpec
from ..model.kernel_cost import chain_s
from ..poly.params import PStatement
from . import replay
from .bound import as_decision, bound
from .param_mapping import ParamDecision
from .size_class import SizeClass

FORMAT = "panamera-symbolic-schedule/1"


@dataclass(frozen=True)
class ClassPlan:
    """Every decision for one size class: per statement its mapping, and the index type."""

    cls: SizeClass
    decisions: tuple[ParamDecision, ...]
    index_type: str  # int while every index of every size of the class fits

    def modeled_us(self, gpu: GPUSpec) -> float:
        """Modeled at the class's representative size on `gpu`: the kernels back to back, each
        after the first paying only the queued-launch gap, as a static plan is modeled
        (model/kernel_cost.py `sequence_s`, applied to each kernel's single-launch figure by `chain_s`).

        >>> from panamera.model.gpu import H100
        >>> from panamera.schedule.decision import MergeMode
        >>> d = ParamDecision("S0", "ROW", 32, 1, 1, 1, MergeMode.STORE, modeled_us=5.0)
        >>> p = ClassPlan(SizeClass.of({"B": 3}, frozenset()), (d, d), "int")
        >>> round(p.modeled_us(H100), 3) == round(10.0 - (H100.launch_s - H100.queued_s) * 1e6, 3)
        True
        """
        return chain_s([d.modeled_us * 1e-6 for d in self.decisions], gpu) * 1e6

    def describe(self, gpu: GPUSpec) -> str:
        rep = ", ".join(f"{k}={v}" for k, v in self.cls.representative().items())
        kernels = "; ".join(f"{d.statement}: {d.describe()}" for d in self.decisions)
        return f"class {self.cls.describe()} (planned at {rep}, {self.modeled_us(gpu):.2f} us modeled): {kernels}"

    def to_dict(self) -> dict:
        return {"class": self.cls.key(), "index": self.index_type, "kernels": [d.to_dict() for d in self.decisions]}

    @staticmethod
    def from_dict(d: dict) -> ClassPlan:
        return ClassPlan(
            SizeClass.from_key(str(d["class"])),
            tuple(ParamDecision.from_dict(k) for k in d["kernels"]),
            str(d["index"]),
        )


def check_bound(
    members: tuple[PStatement, ...], d: ParamDecision, kind: str, sizes: dict[str, int], gpu: GPUSpec,
    deterministic: bool, at: str,
) -> None:  # fmt: skip
    """Class decision `d` of one kernel held to schedule/replay.py's rules at `sizes`, by replay's
    own code on the kernel's static view (schedule/bound.py): launch (rule 2), vector bytes (3),
    cover (4), merges (5), unroll (7) and vector atomics (8); a ScheduleError naming `at` and the rule.
    The rules that read isl domains (access kinds, stitching levels) have their class forms in
    panamera/dynamic.py `check_plan` (the vector proof) and poly/param_stitch.py.

    >>> import panamera as pn
    >>> from panamera.model.gpu import H100
    >>> from panamera.poly.params import build
    >>> from panamera.schedule.decision import MergeMode
    >>> s = build((pn.sum(pn.placeholder(("B", 768), name="x"), axis=1),)).statements[0]
    >>> d = ParamDecision("S0", "ROW", 32, 1, 2, 4, MergeMode.STORE)
    >>> check_bound((s,), d, "single", {"B": 8}, H100, False, "kernel S0")
    Traceback (most recent call last):
    panamera.errors.ScheduleError: kernel S0: merge modes ['store'] are not legal here (legal: ['atomic_ws'])
    """
    view = bound(members, kind, sizes)
    dec = dataclasses.replace(  # the plan's own unroll (unclamped) and vector atomics (its kernel's reduction's)
        as_decision(view, members, d, kind), unroll=d.unroll, atomic_vec=(d.atomic_vec,) + (1,) * (len(members) - 1)
    )
    replay.check_launch(view, dec, gpu, at)
    replay.check_vector_bytes(view, dec, at)
    replay.check_cover(dec, at)
    replay.check_merges(view, dec, deterministic, at)
    replay.check_unroll(dec, at)
    replay.check_atomics(view, dec, gpu, at)


@dataclass(frozen=True)
class AttentionClassDecision:
    """One size class of a symbolic fused attention (schedule/param_attention.py): its key split
    and merge (the block shape follows from the static extents); validated on replay by
    panamera/dynamic_attention.py."""

    cls: SizeClass
    split: int
    launches: int

    def describe(self) -> str:
        return f"class {self.cls.describe()}: fused attention split={self.split} launches={self.launches}"

    def to_dict(self) -> dict:
        return {"class": self.cls.key(), "attention": {"split": self.split, "launches": self.launches}}

    @staticmethod
    def from_dict(d: dict) -> AttentionClassDecision:
        a = d["attention"]
        return AttentionClassDecision(SizeClass.from_key(str(d["class"])), int(a["split"]), int(a["launches"]))


def _class_from_dict(d: dict) -> ClassPlan | AttentionClassDecision:
    return AttentionClassDecision.from_dict(d) if "attention" in d else ClassPlan.from_dict(d)


@dataclass(frozen=True)
class SymbolicSchedule:
    """The class plans of a symbolic program, serialized; `pn.compile(y, schedule=s)` replays them.

    >>> SymbolicSchedule.from_json(SymbolicSchedule("H100", False, ()).to_json()).gpu
    'H100'
    """

    gpu: str
    deterministic: bool
    classes: tuple[ClassPlan | AttentionClassDecision, ...]  # the latter for a fused attention's program
    formulations: tuple[str, ...] = ()
    subgraph: str = ""  # the program's signature where the entry is in the schedule database (schedule/database.py)

    def to_json(self) -> str:
        head = {"format": FORMAT, "gpu": self.gpu, "deterministic": self.deterministic,
                "formulations": list(self.formulations), "subgraph": self.subgraph}  # fmt: skip
        lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
        classes = ",\n".join(f"    {json.dumps(c.to_dict())}" for c in self.classes)
        return "{\n" + "\n".join(lines) + '\n  "classes": [\n' + classes + ("\n" if classes else "") + "  ]\n}\n"

    @staticmethod
    def from_json(text: str, where: str = "schedule") -> SymbolicSchedule:
        try:
            doc = json.loads(text)
            if doc.get("format") != FORMAT:
                raise ScheduleError(f"{where}: format {doc.get('format')!r} is not {FORMAT!r}")
            return SymbolicSchedule(
                str(doc["gpu"]), bool(doc["deterministic"]), tuple(_class_from_dict(c) for c in doc["classes"]),
                tuple(str(f) for f in doc.get("formulations", ())), str(doc.get("subgraph", "")),
            )  # fmt: skip
        except ScheduleError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ScheduleError(f"{where}: not a readable symbolic schedule ({type(e).__name__}: {e})") from None
