"""Fill the schedule database (panamera/schedules/, see panamera/schedule/database.py) from the workloads.

Every workload of docs/WORKLOADS.md (suites single = A1, subgraphs = A2, norms = B, training = D, ...) is planned by
the model for each GPU, and its schedule is written as `<root>/<gpu>/<suite>--<workload>.json`,
its `subgraph` field the program's signature; then the symbolic workloads (panamera/bench/symbolic_suite.py).
`panamera schedules` (`make schedules`) runs it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .. import logs
from ..compiler import compile as pn_compile
from ..errors import Unsupported
from ..model.gpu import GPUSpec
from ..schedule.database import signature, slug
from .suites import SUITES, Workload


def entry_name(w: Workload, gpu: GPUSpec) -> str:
    return f"{slug(gpu.name)}/{w.suite}--{slug(f'{w.name} {w.dtype}')}.json"


def write_database(root: str | Path, gpus: list[GPUSpec], suites=tuple(SUITES), symbolic: bool = True) -> list[Path]:
    """Plan every workload of `suites` (and the symbolic ones) on every GPU with the model and write its entry."""
    root, written = Path(root), []
    todo = [(w, gpu) for suite in suites for w in SUITES[suite]() for gpu in gpus]
    with logs.steps("schedule", len(todo), logs.get("bench")) as bar:
        for w, gpu in todo:
            bar.step(f"{gpu.name} {w.suite} {w.name} {w.dtype}")
            try:
                outs = tuple(w.build())
            except Unsupported as e:  # a workload Panamera refuses by name (bench lists it as not planned)
                logs.get("bench").warning("%s %s: no schedule: %s", w.suite, w.name, e)
                continue
            c = pn_compile(list(outs), target="emulator", gpu=gpu, use_database=False)
            s = dataclasses.replace(c.schedule, subgraph=signature(outs))
            path = root / entry_name(w, gpu)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(s.to_json())
            written.append(path)
    from .symbolic_suite import write_symbolic  # issue 22: symbolic programs' class plans

    return written + (write_symbolic(root, gpus) if symbolic else [])
