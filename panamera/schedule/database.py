"""The schedule database: `panamera/schedules/`, package data shipped in the wheel, consulted by `pn.compile`.

One readable JSON file per workload and GPU (`schedules/<gpu>/<suite>--<workload>.json`): a saved
`Schedule` (schedule/saved.py) whose `subgraph` field is the *signature* of the program it was
made for. `pn.compile` (and so `panamera optimize`) computes the signature of what it is asked
to compile, looks it up for its GPU, and replays the entry when it fits; `explain()` says "from
schedules/NAME" or "chosen by the model". A stale entry (an old format, or decisions that no
longer validate against the program) is never a wrong kernel: it is skipped with a one-line
`StaleScheduleWarning` and the model plans instead.

Entries are made by `panamera schedules` (`make schedules`): every workload of docs/WORKLOADS.md
(A1, A2, B) planned by the model for each GPU, and the symbolic workloads of
panamera/bench/symbolic_suite.py (issue 22: a `SymbolicSchedule` whose `subgraph` is the signature of the
symbolic program, a symbolic extent written by its symbols; its class plans are replayed and
validated by panamera/dynamic.py, a stale one skipped with the same warning). The database answers only plain compiles (no
`split`, not `deterministic`, no explicit `schedule`); `PANAMERA_SCHEDULES` names another
directory, or `off`. The shipped directory is found with `importlib.resources`, so an installed
package and a source tree consult the same entries.

>>> import panamera as pn
>>> x = pn.placeholder((4, 8), "float32", name="x")
>>> signature((pn.sum(x, axis=1),)) == signature((pn.sum(pn.placeholder((4, 8), name="y"), axis=1),))
True
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

from ..algebra import Combiner, Finish
from ..dtypes import DType
from ..errors import ScheduleError, StaleScheduleWarning
from ..frontend.tensor import Tensor, topological
from .param_schedule import FORMAT as SYMBOLIC_FORMAT
from .param_schedule import SymbolicSchedule
from .saved import Schedule

ENV = "PANAMERA_SCHEDULES"
# Package data (pyproject.toml's package-data): a directory wherever the package is installed.
PACKAGE_DIR = Path(str(resources.files("panamera") / "schedules"))


def _canonical(value):
    """A JSON-able, process-independent form of a tensor attribute."""
    if isinstance(value, Combiner):
        return ["combiner", value.name]
    if isinstance(value, Finish):
        return ["finish", str(value.kind), value.ddof, value.last_index]
    if isinstance(value, DType):
        return ["dtype", value.name]
    if isinstance(value, np.ndarray | np.generic):
        a = np.ascontiguousarray(value)
        return ["array", str(a.dtype), list(a.shape), hashlib.sha256(a.tobytes()).hexdigest()[:16]]
    if isinstance(value, tuple | list):
        return [_canonical(v) for v in value]
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return repr(value)
    return repr(value)


def signature(outputs: tuple[Tensor, ...]) -> str:
    """What a program computes, independent of tensor names and of the process: ops, shapes,
    dtypes, attributes and the edges between them, hashed. Two graphs with one signature get
    the same statements, hence the same decisions."""
    index: dict[int, int] = {}
    nodes = []
    for t in topological(outputs):  # numbered in post order
        attrs = [[k, _canonical(v)] for k, v in t.attrs]
        shape = [e if isinstance(e, int) else str(e) for e in t.shape]  # a symbolic extent by its symbols: "2*B*S"
        nodes.append([t.op, shape, t.dtype.name, attrs, [index[i.uid] for i in t.inputs]])
        index[t.uid] = len(nodes) - 1
    roots = [index[o.uid] for o in outputs]
    text = json.dumps([nodes, roots], separators=(",", ":"))
    return "pn-" + hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Entry:
    name: str  # relative to the database directory, e.g. "h100/single--sum-all-128-float32.json"
    schedule: Schedule | SymbolicSchedule  # a symbolic program's (issue 22): its class plans


def directory() -> Path | None:
    """The database in use: $PANAMERA_SCHEDULES, else the package's schedules/ (None: off)."""
    env = os.environ.get(ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    return PACKAGE_DIR if PACKAGE_DIR.is_dir() else None


@cache
def _index(root: Path) -> dict[tuple[str, str], Entry]:
    """(signature, GPU name) -> entry, for every readable entry under `root`; a file that is not
    one (unreadable, not UTF-8, not JSON, a stale format, a garbled field) is skipped with a
    one-line `StaleScheduleWarning`, never an error of the compile that consulted the database."""
    out = {}
    for path in sorted(root.rglob("*.json")):
        name = path.relative_to(root).as_posix()
        s = _read_entry(path, f"schedules/{name}")
        if s is not None:
            out[(s.subgraph, s.gpu)] = Entry(name, s)
    return out


def _read_entry(path: Path, where: str) -> Schedule | SymbolicSchedule | None:
    """The schedule in `path` (a static or a symbolic one, by its format), or None (with a
    notice) when the file is not a readable one."""
    try:
        text = path.read_bytes().decode("utf-8")
        if _format_of(text) == SYMBOLIC_FORMAT:
            return SymbolicSchedule.from_json(text, where)
        return Schedule.from_json(text, where)
    except UnicodeDecodeError as e:
        why = f"{where}: not UTF-8 text (byte {e.start})"
    except OSError as e:
        why = f"{where}: unreadable ({e.strerror or type(e).__name__})"
    except RecursionError:
        why = f"{where}: JSON nested too deeply"
    except ScheduleError as e:
        why = str(e)
    why = why.splitlines()[0] if why else where
    warnings.warn(f"schedule database: skipped ({why})", StaleScheduleWarning, stacklevel=4)
    return None


def _format_of(text: str):
    """The "format" field of a JSON object, or None (Schedule.from_json then says what is wrong)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc.get("format") if isinstance(doc, dict) else None


def lookup(sig: str, gpu: str) -> Entry | None:
    root = directory()
    return None if root is None else _index(root.resolve()).get((sig, gpu))


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()
