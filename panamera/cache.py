"""The caches a user can see: compiled programs in memory, compiled kernels on disk.

**In memory.** `pn.compile` keys every program by its signature: the graph (ops, shapes, dtypes,
attributes, the names of computed tensors, the creation order of the placeholders, not their
names), the options (target, deterministic, GPU, split, schedule) and the schedule database in
use. Compiling a program seen before returns a new `Compiled` (its own resident workspaces,
inputs named as in the new graph) from the stored stages, without planning: well under a
millisecond. `info()` counts hits and misses; `clear()` empties it; `pn.compile(..., cache=False)`
bypasses it.

**On disk.** The emulator's shared libraries (g++ builds of the generated CUDA C, one per
source), the CPU target's and the cuda backend's sm_90a cubins (runtime/cuda.py) live in
`$PANAMERA_CACHE`, default `~/.cache/panamera`; `PANAMERA_CACHE=off` builds into a temporary
directory instead. The directory must be private (runtime/diskcache.py: mode
0700, owned by the user; otherwise a warning and a temporary directory) and each library is
loaded only when it matches the SHA-256 recorded when it was built. `panamera cache info` and `panamera cache clear` show and
empty it (`disk_info()`, `disk_clear()`).

>>> import panamera as pn
>>> x = pn.placeholder((4, 8), name="x")
>>> k1 = pn.compile(pn.sum(x, axis=1), target="emulator")
>>> before = info().hits
>>> k2 = pn.compile(pn.sum(x, axis=1), target="emulator")
>>> info().hits - before, k2.source == k1.source, k2 is k1
(1, True, False)
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from .frontend.tensor import Tensor
from .runtime import diskcache, emulator
from .schedule import database

MAX_ENTRIES = 256


@dataclass(frozen=True)
class CacheInfo:
    """Counters of the in-memory compile cache."""

    hits: int
    misses: int
    size: int
    max_size: int


def placeholders(outputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """The placeholders of a graph in creation order (the order of `Compiled.inputs`)."""
    seen, stack, found = set(), list(outputs), []
    while stack:
        t = stack.pop()
        if t.uid in seen:
            continue
        seen.add(t.uid)
        if t.op == "placeholder":
            found.append(t)
        stack.extend(t.inputs)
    return tuple(sorted(found, key=lambda t: t.uid))


def graph_key(outputs: tuple[Tensor, ...]) -> str:
    """The graph part of the key: every node's op, shape, dtype, attributes and input edges,
    the names of computed tensors (they name kernels) and the placeholders' creation order."""
    from .frontend.walk import postorder  # iterative: graphs of any depth

    index: dict[int, int] = {}
    nodes: list = []
    holders: list[int] = []
    for t in postorder(outputs, lambda t: t.inputs, key=lambda t: t.uid):  # numbered in post order
        attrs = [[k, database._canonical(v)] for k, v in t.attrs]
        name = "" if t.op == "placeholder" else t.name
        shape = [s if isinstance(s, int) else str(s) for s in t.shape]  # a symbolic Dim by its name
        nodes.append([t.op, shape, t.dtype.name, attrs, [index[i.uid] for i in t.inputs], name])
        index[t.uid] = len(nodes) - 1
        if t.op == "placeholder":
            holders.append(t.uid)
    roots = [index[t.uid] for t in outputs]
    order = sorted(range(len(holders)), key=lambda k: holders[k])
    return json.dumps([nodes, roots, order], separators=(",", ":"))


class CompileCache:
    """A bounded LRU map from a program's key to what compiling it produced."""

    def __init__(self, max_size: int = MAX_ENTRIES):
        self.max_size = max_size
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key):
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key, value) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def info(self) -> CacheInfo:
        return CacheInfo(self.hits, self.misses, len(self._entries), self.max_size)


COMPILED = CompileCache()


def info() -> CacheInfo:
    """Hits, misses and size of the in-memory compile cache."""
    return COMPILED.info()


def clear() -> None:
    """Empty the in-memory compile cache (and reset its counters)."""
    COMPILED.clear()


def options_key(options, use_database: bool) -> tuple:
    """The options part of the key; the database in use counts only where it is consulted."""
    sched = options.schedule.to_json() if options.schedule is not None else None
    db = os.environ.get(database.ENV) if use_database else None
    return (str(options.target), options.deterministic, repr(options.gpu), options.split, sched, use_database, db)


# -- on disk ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DiskInfo:
    """The on-disk kernel cache: where it is, how many libraries it holds and their size."""

    path: Path | None  # None: disabled (PANAMERA_CACHE=off)
    files: int
    bytes: int

    def describe(self) -> str:
        if self.path is None:
            return f"kernel cache: disabled ({emulator.CACHE_ENV}=off)"
        return f"kernel cache: {self.path} ({self.files} file(s), {self.bytes / 2**20:.1f} MiB; {emulator.CACHE_ENV} moves it)"


def disk_info() -> DiskInfo:
    """The on-disk cache's location and contents (libraries counted; their sidecars sized too)."""
    d = emulator.cache_location()
    if d is None:
        return DiskInfo(None, 0, 0)
    files = diskcache.entries(d)
    return DiskInfo(d, sum(p.suffix in diskcache.SUFFIXES for p in files), sum(p.stat().st_size for p in files))


def disk_clear() -> int:
    """Delete every cached library (with its sidecar); returns how many libraries were removed."""
    d = emulator.cache_location()
    if d is None:
        return 0
    files = diskcache.entries(d)
    for p in files:
        p.unlink(missing_ok=True)
    return sum(p.suffix in diskcache.SUFFIXES for p in files)
