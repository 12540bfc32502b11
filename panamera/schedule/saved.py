"""A schedule as data: every decision the planner and mapper made for one program on one GPU.

A `Schedule` is the versioned serialization of the formulation choices, the stitching and
epilogue choices and the mapping `Decision` of every kernel (schedule/mapping.py).
`pn.compile(..., schedule=s)` replays it: nothing is searched again, each decision is validated against the program
(`mapping.replay`, `planner.plan_groups`) and completed, so the replay reproduces the CUDA source
and the launch plan byte for byte. A schedule that no longer fits is a ScheduleError that says
what changed, never a different kernel.

>>> s = Schedule("H100", (("S1", "S2"),), ())
>>> Schedule.from_json(s.to_json()) == s
True
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import ScheduleError
from .decision import Decision

FORMAT = "panamera-schedule/3"
# Readable formats: /2 predates register tiles (its kernels load with rtile = 1, replayed as saved);
# a /3 kernel without `stages` loads directly (stages = 1, schedule/pipeline.py).
READABLE = ("panamera-schedule/2", FORMAT)


@dataclass(frozen=True)
class Schedule:
    gpu: str
    stitched: tuple[tuple[str, ...], ...]  # statement names of each stitched group chosen
    kernels: tuple[Decision, ...]  # in launch order
    subgraph: str = ""  # what it was made for (the program's signature), checked on load
    formulations: tuple[str, ...] = ()  # "op=choice" per formulation choice, in graph order
    epilogues: tuple[tuple[str, ...], ...] = ()  # statement names of each epilogue group chosen

    def to_json(self) -> str:
        """Readable JSON: one line per field, one line per kernel."""
        head = {
            "format": FORMAT,
            "subgraph": self.subgraph,
            "gpu": self.gpu,
            "formulations": list(self.formulations),
            "stitched": ["+".join(g) for g in self.stitched],
        }
        if self.epilogues:  # written only when there are some: older schedules read the same
            head["epilogues"] = ["+".join(g) for g in self.epilogues]
        lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
        kernels = ",\n".join(f"    {json.dumps(k.to_dict())}" for k in self.kernels)
        return "{\n" + "\n".join(lines) + '\n  "kernels": [\n' + kernels + ("\n" if kernels else "") + "  ]\n}\n"

    @staticmethod
    def from_json(text: str, where: str = "schedule") -> Schedule:
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict):
                raise TypeError(f"a JSON {type(doc).__name__}, not an object")
            if doc.get("format") not in READABLE:
                raise ScheduleError(f"{where}: format {doc.get('format')!r} is not one of {list(READABLE)}")
            return Schedule(
                str(doc["gpu"]),
                tuple(tuple(str(g).split("+")) for g in doc["stitched"]),
                tuple(Decision.from_dict(k) for k in doc["kernels"]),
                str(doc.get("subgraph", "")),
                tuple(str(f) for f in doc.get("formulations", ())),
                tuple(tuple(str(g).split("+")) for g in doc.get("epilogues", ())),
            )
        except ScheduleError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            raise ScheduleError(f"{where}: not a readable schedule ({type(e).__name__}: {e})") from None

    def kernel(self, k: int, what: str) -> Decision:
        """The decision of the k-th kernel; `what` describes the program's kernel for the error."""
        if k >= len(self.kernels):
            raise ScheduleError(f"schedule has {len(self.kernels)} kernel(s); the program needs more ({what})")
        return self.kernels[k]
