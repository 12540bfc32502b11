"""A schedule as data: the decisions the planner and mapper made for one program on one GPU.

`pn.compile(..., schedule=s)` replays them instead of asking the model, so a schedule saved by
`panamera optimize --save-schedules` reproduces the same kernels. Replaying checks that the
schedule still fits: the same GPU, legal stitching choices, and kernel groups of the same
canonical form and extents; anything else is a ScheduleError that says what changed.

>>> s = Schedule("H100", (("S1", "S2"),), (KernelChoice("ROW", 4, 128, 1),))
>>> Schedule.from_json(s.to_json()) == s
True
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import ScheduleError

FORMAT = "panamera-schedule/1"


@dataclass(frozen=True)
class KernelChoice:
    """One kernel group: its canonical form and extents (to check the fit), the split and the
    threads per block."""

    form: str
    M: int
    N: int
    split: int
    threads: int = 256


@dataclass(frozen=True)
class Schedule:
    gpu: str
    stitched: tuple[tuple[str, ...], ...]  # statement names of each stitched group chosen
    kernels: tuple[KernelChoice, ...]  # in launch order
    subgraph: str = ""  # what it was made for (the optimizer's subgraph signature), checked on load

    def to_json(self) -> str:
        doc = {
            "format": FORMAT,
            "subgraph": self.subgraph,
            "gpu": self.gpu,
            "stitched": ["+".join(g) for g in self.stitched],
            "kernels": [
                {"form": k.form, "M": k.M, "N": k.N, "split": k.split, "threads": k.threads} for k in self.kernels
            ],
        }
        return json.dumps(doc, indent=2) + "\n"

    @staticmethod
    def from_json(text: str, where: str = "schedule") -> Schedule:
        try:
            doc = json.loads(text)
            if doc.get("format") != FORMAT:
                raise ScheduleError(f"{where}: format {doc.get('format')!r} is not {FORMAT!r}")
            kernels = tuple(
                KernelChoice(str(k["form"]), int(k["M"]), int(k["N"]), int(k["split"]), int(k["threads"]))
                for k in doc["kernels"]
            )
            stitched = tuple(tuple(str(g).split("+")) for g in doc["stitched"])
            return Schedule(str(doc["gpu"]), stitched, kernels, str(doc.get("subgraph", "")))
        except ScheduleError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ScheduleError(f"{where}: not a readable schedule ({type(e).__name__}: {e})") from None

    def check_kernel(self, k: int, form: str, M: int, N: int) -> KernelChoice:
        if k >= len(self.kernels):
            raise ScheduleError(f"schedule has {len(self.kernels)} kernel(s); the program needs more ({form} {M}x{N})")
        c = self.kernels[k]
        if (c.form, c.M, c.N) != (form, M, N):
            raise ScheduleError(
                f"schedule kernel {k} is {c.form} {c.M}x{c.N}, the program's is {form} {M}x{N}: "
                "the subgraph changed since the schedule was saved"
            )
        return c
