"""Symbolic workloads of the schedule database (issue 22): one entry per program and GPU.

Each workload is a symbolic program (extents named "B", "S"; "T" the key length of decode
attention, planned by its fused plan: panamera/dynamic_attention.py) with the sizes whose classes the
entry pre-plans (the sweep of issue 22: sequence lengths 1 ... 8192, batch 1 ... 64, powers of
two). `write_symbolic` plans those classes with the model (no kernel built) and writes the
program's `SymbolicSchedule` as `<root>/<gpu>/symbolic--<name>.json`, its `subgraph` field the
program's signature (schedule/database.py); `pn.compile` of the same symbolic program replays
it, a class it does not hold being planned by the model on first use. `panamera schedules` runs
it after the static workloads (panamera/bench/schedules.py).

>>> [w.name for w in SYMBOLIC]
['rowsum-768', 'softmax-1024', 'layer-norm-768', 'decode-attention-12x64']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import nn
from ..compiler import compile as pn_compile
from ..frontend import ops
from ..frontend.tensor import placeholder as P
from ..model.gpu import GPUSpec
from ..schedule.database import signature, slug

SIZES = tuple({"B": b, "S": s} for b in (1, 8, 64) for s in (1, 16, 128, 1024, 8192))


@dataclass(frozen=True)
class SymbolicWorkload:
    name: str
    build: Callable  # () -> list of output tensors over symbols (fresh placeholders each call)
    sizes: tuple[dict[str, int], ...] = SIZES


def _layer_norm():
    x, g, b = P(("B", "S", 768), name="x"), P((768,), name="g"), P((768,), name="b")
    return [nn.layer_norm(x, g, b)]


def _decode_attention():
    q = P((1, 12, 1, 64), name="q")
    k, v = (P((1, 12, "T", 64), name=n) for n in ("k", "v"))
    return [nn.attention(q, k, v)]


SYMBOLIC = [
    SymbolicWorkload("rowsum-768", lambda: [ops.sum(P(("B", "S", 768), name="x"), axis=-1)]),
    SymbolicWorkload("softmax-1024", lambda: [nn.softmax(P(("B", "S", 1024), name="x"))]),
    SymbolicWorkload("layer-norm-768", _layer_norm),
    SymbolicWorkload("decode-attention-12x64", _decode_attention, tuple({"T": 2**e} for e in range(14))),
]


def entry_name(w: SymbolicWorkload, gpu: GPUSpec) -> str:
    return f"{slug(gpu.name)}/symbolic--{slug(w.name)}.json"


def write_symbolic(root: str | Path, gpus: list[GPUSpec], workloads=tuple(SYMBOLIC)) -> list[Path]:
    """Plan every workload's classes on every GPU with the model and write its entry."""
    root, written = Path(root), []
    for w in workloads:
        for gpu in gpus:
            outs = tuple(w.build())
            k = pn_compile(list(outs), target="emulator", gpu=gpu, use_database=False, cache=False)
            for sizes in w.sizes:
                k.plan(k.size_class(sizes))
            path = root / entry_name(w, gpu)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dataclasses.replace(k.schedule, subgraph=signature(outs)).to_json())
            written.append(path)
    return written
