"""A deployable optimized model: what `optimize --out DIR` writes and `load_optimized(DIR)` (or
`panamera run DIR`) runs without partitioning or searching again.

DIR holds
- manifest.json: the format, the GPU and the run order: each unit a subgraph (its node numbers,
  schedule and CUDA file) or a library node (with its reason), every value's shape and type,
  and the SHA-256 of every other file (`files`);
- graph.onnx: the folded model's live nodes, without weights;
- weights.npz: every folded constant (arrays named w0, w1, ...; the manifest maps them back, and
  names that share one array in `shared`, so that they stay one kernel input);
- schedules/sgK.json: each subgraph's Schedule (schedule/saved.py);
- kernels/LABEL.cu: each subgraph's CUDA source, as compiled.

Loading first checks the folder (subgraph/folder.py): the manifest's fields and types, every
path it names inside DIR, every file's SHA-256. It then rebuilds each subgraph's Panamera
program from its nodes and replays its schedule (`pn.compile(..., schedule=)`: validated, never
searched), and checks that the replayed CUDA is byte for byte the saved one. Weights are read
with `allow_pickle=False`; nothing in the folder is executed.

>>> import tempfile
>>> from onnx import helper, TensorProto
>>> from panamera.subgraph import optimize
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "g", [v("x", [2, 8])], [v("y", [2, 8])])
>>> opt = optimize(helper.make_model(g), target="emulator")
>>> d = tempfile.mkdtemp()
>>> _ = write_deployable(opt, d)
>>> load_optimized(d, target="emulator").units[0].compiled.source == opt.units[0].compiled.source
True
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import onnx

from .. import logs
from ..errors import ModelError, PanameraError, ScheduleError
from ..model.gpu import GPUS
from ..schedule.saved import Schedule
from . import folder
from .library import LibraryNode
from .model import Node, OnnxModel, Value, _node_attrs
from .optimizer import OptimizedModel, Subgraph, compile_subgraph
from .weights import initializer, npz_members, without_initializers

FORMAT = "panamera-optimized/2"  # /2: files and their SHA-256, shared weights
MANIFEST = "manifest.json"


def _gpu_key(name: str, where: str) -> str:
    for k, g in GPUS.items():
        if g.name == name:
            return k
    raise ModelError(f"{where}: GPU {name!r} is not one of {[g.name for g in GPUS.values()]}")


def _storable(a: np.ndarray) -> tuple[np.ndarray, str]:
    """(an array np.savez stores without pickling, the dtype to view it back as), of the same
    shape: a 0-d constant stays 0-d (np.ascontiguousarray would make it (1,))."""
    a = np.asarray(a, order="C")
    if a.dtype.kind in "biufc" and a.dtype.name in np.sctypeDict:
        return a, a.dtype.name
    if a.dtype == object:
        raise ModelError(f"constant of dtype {a.dtype} cannot be stored")
    return a.view(f"u{a.dtype.itemsize}"), a.dtype.name  # bfloat16, float8: their bits


def write_deployable(opt: OptimizedModel, out: str, cu_paths: dict | None = None) -> dict:
    """Write the manifest, graph, weights, schedules and kernels of `opt` under `out` (which
    must exist). `cu_paths` maps subgraph ids to kernel files already written. Returns the manifest."""
    model = opt.model
    for sub in ("kernels", "schedules"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    cu_paths = dict(cu_paths or {})
    units = []
    for u in opt.units:
        if isinstance(u, Subgraph):
            if u.id not in cu_paths:
                cu_paths[u.id] = f"kernels/{u.label}.cu"
                with open(os.path.join(out, cu_paths[u.id]), "w") as f:
                    f.write(u.compiled.source)
            sched = f"schedules/sg{u.id}.json"
            with open(os.path.join(out, sched), "w") as f:
                f.write(dataclasses.replace(u.compiled.schedule, subgraph=u.signature).to_json())
            units.append(
                {"subgraph": u.id, "nodes": [n.index for n in u.nodes], "schedule": sched, "cuda": cu_paths[u.id]}
            )
        else:
            units.append({"library": u.node.index, "reason": u.reason})
    weights, names, shared, first = {}, {}, {}, {}
    for k, (name, a) in enumerate(model.constants.items()):
        if id(a) in first:  # one array under two names is one kernel input: kept shared at reload
            shared[name] = first[id(a)]
            continue
        first[id(a)] = name
        stored, dtype = _storable(np.asarray(a))
        weights[f"w{k}"] = stored
        names[f"w{k}"] = [name, dtype]
    np.savez(os.path.join(out, "weights.npz"), **weights)
    graph = without_initializers(model.proto)
    onnx.save_model(graph, os.path.join(out, "graph.onnx"))
    manifest = {
        "format": FORMAT,
        "model": model.path,
        "gpu": opt.gpu.name,
        "opset": model.opset,
        "inputs": list(model.inputs),
        "outputs": list(model.outputs),
        "specialized": {k: v.tolist() for k, v in model.specialized.items()},
        "weights": names,
        "shared": shared,
        "values": {k: [list(v.shape) if v.shape is not None else None, v.elem] for k, v in model.values.items()},
        "units": units,
        "files": folder.checksums(
            out, ["graph.onnx", "weights.npz", *(u[k] for u in units if "subgraph" in u for k in ("schedule", "cuda"))]
        ),
    }
    with open(os.path.join(out, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def _read(path: str, what: str):
    if not os.path.isfile(path):
        raise ModelError(f"{path}: missing ({what}); write the directory with `panamera optimize MODEL --out DIR`")
    return path


def _view(a: np.ndarray, dtype: str, where: str) -> np.ndarray:
    """A stored array viewed back as the dtype the manifest names (bfloat16, float8: their bits)."""
    if a.dtype.name == dtype:
        return a
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.hasobject or dt.itemsize != a.dtype.itemsize or a.dtype.kind != "u":
        raise ModelError(f"{where}: dtype {dtype!r} does not fit the stored {a.dtype} array")
    return a.view(dt)


def _manifest(d: str) -> tuple[str, dict]:
    """(its path, the manifest of folder `d`), checked field by field, with every file it
    names confined to `d` and matching its recorded SHA-256 (subgraph/folder.py)."""
    mpath = _read(os.path.join(d, MANIFEST), "the manifest")
    try:
        with open(mpath, encoding="utf-8") as f:
            man = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise ModelError(f"{mpath}: not a readable manifest ({type(e).__name__}: {e})") from None
    folder.check_manifest(man, mpath, FORMAT)
    named = ["graph.onnx", "weights.npz"] + [
        u[k] for u in man["units"] if "subgraph" in u for k in ("schedule", "cuda")
    ]
    for rel in named:
        folder.inside(d, rel, f"{mpath}: file")
        if rel not in man["files"]:
            raise ModelError(f"{mpath}: {rel!r} is used but not listed with a checksum in 'files'")
    folder.verify_files(d, man["files"], mpath)
    return mpath, man


def load_optimized(directory: str | os.PathLike, target: str = "auto") -> OptimizedModel:
    """The OptimizedModel saved in `directory` by `optimize --out` (or `write_deployable`), its
    subgraphs replayed from their schedules on `target`: no partitioning, no search.

    Raises ModelError naming the file or field when the directory is incomplete, was written by
    another format, names a path outside itself, holds a file whose SHA-256 differs from the
    manifest's, or when a replayed kernel differs from the saved one."""
    d = os.fspath(directory)
    if not os.path.isdir(d):
        raise ModelError(f"{d}: no such directory")
    mpath, man = _manifest(d)
    try:
        return _load(d, mpath, man, target)
    except PanameraError:
        raise
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise ModelError(f"{mpath}: does not describe a loadable model ({type(e).__name__}: {e})") from None


def _load(d: str, mpath: str, man: dict, target: str) -> OptimizedModel:
    gpu = GPUS[_gpu_key(man["gpu"], mpath)]
    gpath = os.path.join(d, "graph.onnx")
    try:
        graph = onnx.load_model(gpath)
    except Exception as e:  # protobuf's DecodeError and friends: the file is not a model
        raise ModelError(f"{gpath}: not a readable ONNX graph ({type(e).__name__})") from None
    wpath = os.path.join(d, "weights.npz")
    try:
        mapped = npz_members(wpath)  # memory-mapped, not read (weights.py)
        with np.load(wpath, allow_pickle=False) as z:
            stored = {key: mapped[key] if key in mapped else z[key] for key in man["weights"] if key in z.files}
    except Exception as e:  # zipfile's BadZipFile, EOFError, a pickled array refused: not our weights
        raise ModelError(f"{wpath}: not a readable weights file ({type(e).__name__}: {e})") from None
    constants = {}
    for key, (name, dtype) in man["weights"].items():
        if key not in stored:
            raise ModelError(f"{wpath}: no array {key!r} (the weights of {name!r} in {mpath})")
        constants[name] = _view(stored[key], dtype, f"{mpath}: weights {key!r}")
    for name, first in man["shared"].items():
        if first not in constants:
            raise ModelError(f"{mpath}: shared weights {name!r} name {first!r}, which is not among the weights")
        constants[name] = constants[first]
    values = {k: Value(k, tuple(s) if s is not None else None, int(e)) for k, (s, e) in man["values"].items()}
    used = {i for n in graph.graph.node for i in n.input} | set(man["outputs"])
    graph.graph.initializer.extend(initializer(k, v) for k, v in constants.items() if k in used)
    opset = man["opset"]
    nodes = tuple(
        Node(k, n.name, n.op_type, n.domain, tuple(n.input), tuple(n.output), _node_attrs(n), opset)
        for k, n in enumerate(graph.graph.node)
    )
    for u in man["units"]:
        for i in [u["library"]] if "library" in u else u["nodes"]:
            if not 0 <= i < len(nodes):
                raise ModelError(f"{mpath}: unit names node {i}; {gpath} has {len(nodes)}")
    spec = {k: np.asarray(v) for k, v in man["specialized"].items()}
    for k, v in spec.items():
        spec[k] = v.astype(constants[k].dtype) if k in constants else v
    model = OnnxModel(
        d, graph, nodes, constants, values, tuple(man["inputs"]), tuple(man["outputs"]), opset, spec
    )  # fmt: skip
    units: list[Subgraph | LibraryNode] = []
    for u in logs.each(man["units"], "loading unit", logs.get("onnx"), lambda u: f"subgraph {u.get('subgraph', '-')}"):
        if "library" in u:
            units.append(LibraryNode(nodes[u["library"]], u["reason"]))
            continue
        spath, cpath = os.path.join(d, u["schedule"]), os.path.join(d, u["cuda"])
        with open(spath, encoding="utf-8") as f:
            saved = Schedule.from_json(f.read(), spath)

        def schedule(k: int, signature: str, saved=saved, spath=spath) -> Schedule:
            if saved.subgraph != signature:
                raise ScheduleError(f"{spath}: saved for {saved.subgraph!r}, but the subgraph is {signature!r}")
            return saved

        sg = compile_subgraph(model, u["subgraph"], [nodes[i] for i in u["nodes"]], target, gpu, schedule)
        with open(cpath, encoding="utf-8") as f:
            if f.read() != sg.compiled.source:
                raise ModelError(f"{cpath}: the replayed kernel differs from the saved one (another Panamera version?)")
        units.append(sg)
    return OptimizedModel(model, tuple(units), target, gpu)
