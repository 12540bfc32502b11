"""The deployable folder of a model whose dim_params stay symbolic (issue 22, item 4).

`write_dynamic(dm, out)` writes what `optimize --out` writes for the model at its size hints
(report, kernels, manifest: deploy.py) and beside it `dynamic.json` (the dim_params, their hints,
the SHA-256 of `model.onnx`, the model as given, with its dim_params, and each symbolic subgraph's
class plans: `DynamicModel.schedules`). `load_dynamic(out)`
checks that checksum and rebuilds the `DynamicModel` from it, on the manifest's GPU: a fresh
process runs the folder at every size (its symbolic programs compile on load and replay the saved
class plans instead of planning them again; their kernels per size class come from the on-disk
cache when met before).

>>> import os, tempfile
>>> from onnx import helper, TensorProto
>>> from panamera.subgraph.dynamic_model import optimize_dynamic
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "g", [v("x", ["n", 8])], [v("y", ["n", 8])])
>>> d = tempfile.mkdtemp()
>>> _ = write_dynamic(optimize_dynamic(helper.make_model(g), {"n": 2}, target="emulator"), d)
>>> sorted(load_dynamic(d, target="emulator").hints.items())
[('n', 2)]
"""

from __future__ import annotations

import hashlib
import json
import os

from ..errors import ModelError, ScheduleError
from ..model.gpu import GPUS
from ..schedule.param_schedule import SymbolicSchedule
from .deploy import MANIFEST
from .dynamic_model import DynamicModel
from .model import decode
from .report import write_outputs

DYNAMIC = "dynamic.json"
MODEL = "model.onnx"
FORMAT = "panamera-dynamic/1"
EXTRA = (DYNAMIC, MODEL)  # what `folder.clear_out` removes beside the manifest's files


def is_dynamic(directory: str) -> bool:
    """Whether `directory` was written by `write_dynamic`."""
    return os.path.isfile(os.path.join(directory, DYNAMIC))


def write_dynamic(dm: DynamicModel, out: str) -> dict:
    """The hint's report, kernels and deployable model, plus the symbolic model; returns the report."""
    report = write_outputs(dm.hinted, out)
    _, proto = decode(dm.source)
    data = proto.SerializeToString()
    with open(os.path.join(out, MODEL), "wb") as f:
        f.write(data)
    doc = {
        "format": FORMAT,
        "dim_params": {p: [list(w) for w in where] for p, where in dm.params.items()},
        "hints": dm.hints,
        "model": MODEL,
        "sha256": hashlib.sha256(data).hexdigest(),
        # the symbolic subgraphs' class plans (the hints' classes and any planned before): a fresh process replays them
        "schedules": {label: json.loads(s.to_json()) for label, s in dm.schedules().items()},
    }
    with open(os.path.join(out, DYNAMIC), "w") as f:
        json.dump(doc, f, indent=1)
    return report


def load_dynamic(directory: str, target: str = "auto") -> DynamicModel:
    """The DynamicModel of a folder `write_dynamic` wrote; ModelError names the file or field
    that is missing, of another format, or whose checksum differs."""
    path = os.path.join(directory, DYNAMIC)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
            gpu_name = json.load(f)["gpu"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{path}: not a readable dynamic model ({type(e).__name__}: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModelError(f"{path}: format {doc.get('format') if isinstance(doc, dict) else doc!r}, expected {FORMAT}")
    hints = doc.get("hints")
    if doc.get("model") != MODEL or not isinstance(hints, dict) or not all(isinstance(n, int) for n in hints.values()):
        raise ModelError(f"{path}: 'model' must be {MODEL!r} and 'hints' a map of dim_param to size")
    mpath = os.path.join(directory, MODEL)
    try:
        with open(mpath, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelError(f"{mpath}: {e.strerror}") from None
    if hashlib.sha256(data).hexdigest() != doc.get("sha256"):
        raise ModelError(f"{mpath}: its SHA-256 differs from {path}'s")
    gpu = next((g for g in GPUS.values() if g.name == gpu_name), None)
    if gpu is None:
        raise ModelError(f"{directory}/{MANIFEST}: GPU {gpu_name!r} is not one of {[g.name for g in GPUS.values()]}")
    saved = doc.get("schedules", {})  # absent in folders written before schedules were saved
    if not isinstance(saved, dict):
        raise ModelError(f"{path}: 'schedules' must be a map of subgraph label to symbolic schedule")
    try:
        schedules = {k: SymbolicSchedule.from_json(json.dumps(v), f"{path}: schedules.{k}") for k, v in saved.items()}
    except ScheduleError as e:
        raise ModelError(str(e)) from None
    return DynamicModel(data, hints, target, gpu, schedules=schedules)
