"""A deployable optimized model: what `optimize --out DIR` writes and `load_optimized(DIR)` (or
`panamera run DIR`) runs without partitioning or searching again.

DIR holds
- manifest.json: the format, the GPU and the run order: each unit a subgraph (its node numbers,
  schedule and CUDA file) or a library node (with its reason), and every value's shape and type;
- graph.onnx: the folded model's live nodes, without weights;
- weights.npz: every folded constant (arrays named w0, w1, ...; the manifest maps them back);
- schedules/sgK.json: each subgraph's Schedule (schedule/saved.py);
- kernels/LABEL.cu: each subgraph's CUDA source, as compiled.

Loading rebuilds each subgraph's Panamera program from its nodes and replays its schedule
(`pn.compile(..., schedule=)`: validated, never searched), then checks that the replayed CUDA is
byte for byte the saved one.

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
from onnx import numpy_helper

from .. import logs
from ..errors import ModelError, ScheduleError
from ..model.gpu import GPUS
from ..schedule.saved import Schedule
from .library import LibraryNode
from .model import Node, OnnxModel, Value, _node_attrs
from .optimizer import OptimizedModel, Subgraph, compile_subgraph

FORMAT = "panamera-optimized/1"
MANIFEST = "manifest.json"


def _gpu_key(name: str, where: str) -> str:
    for k, g in GPUS.items():
        if g.name == name:
            return k
    raise ModelError(f"{where}: GPU {name!r} is not one of {[g.name for g in GPUS.values()]}")


def _storable(a: np.ndarray) -> tuple[np.ndarray, str]:
    """(an array np.savez stores without pickling, the dtype to view it back as)."""
    a = np.ascontiguousarray(a)
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
                cu_paths[u.id] = os.path.join("kernels", f"{u.label}.cu")
                with open(os.path.join(out, cu_paths[u.id]), "w") as f:
                    f.write(u.compiled.source)
            sched = os.path.join("schedules", f"sg{u.id}.json")
            with open(os.path.join(out, sched), "w") as f:
                f.write(dataclasses.replace(u.compiled.schedule, subgraph=u.signature).to_json())
            units.append(
                {"subgraph": u.id, "nodes": [n.index for n in u.nodes], "schedule": sched, "cuda": cu_paths[u.id]}
            )
        else:
            units.append({"library": u.node.index, "reason": u.reason})
    weights, names = {}, {}
    for k, (name, a) in enumerate(model.constants.items()):
        stored, dtype = _storable(np.asarray(a))
        weights[f"w{k}"] = stored
        names[f"w{k}"] = [name, dtype]
    np.savez(os.path.join(out, "weights.npz"), **weights)
    graph = onnx.ModelProto.FromString(model.proto.SerializeToString())
    del graph.graph.initializer[:]
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
        "values": {k: [list(v.shape) if v.shape is not None else None, v.elem] for k, v in model.values.items()},
        "units": units,
    }
    with open(os.path.join(out, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def _read(path: str, what: str):
    if not os.path.isfile(path):
        raise ModelError(f"{path}: missing ({what}); write the directory with `panamera optimize MODEL --out DIR`")
    return path


def load_optimized(directory: str | os.PathLike, target: str = "auto") -> OptimizedModel:
    """The OptimizedModel saved in `directory` by `optimize --out` (or `write_deployable`), its
    subgraphs replayed from their schedules on `target`: no partitioning, no search.

    Raises ModelError naming the file when the directory is incomplete or was written by
    another format, and when a replayed kernel differs from the saved one."""
    d = os.fspath(directory)
    if not os.path.isdir(d):
        raise ModelError(f"{d}: no such directory")
    mpath = _read(os.path.join(d, MANIFEST), "the manifest")
    try:
        with open(mpath) as f:
            man = json.load(f)
        if man.get("format") != FORMAT:
            raise ModelError(f"{mpath}: format {man.get('format')!r} is not {FORMAT!r}")
        gpu = GPUS[_gpu_key(man["gpu"], mpath)]
        graph = onnx.load_model(_read(os.path.join(d, "graph.onnx"), "the graph"))
        with np.load(_read(os.path.join(d, "weights.npz"), "the weights"), allow_pickle=False) as z:
            constants = {}
            for key, (name, dtype) in man["weights"].items():
                a = z[key]
                constants[name] = a if a.dtype.name == dtype else a.view(np.dtype(dtype))
        values = {k: Value(k, tuple(s) if s is not None else None, int(e)) for k, (s, e) in man["values"].items()}
        units_doc = man["units"]
    except ModelError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{d}: not a readable optimized model ({type(e).__name__}: {e})") from None
    used = {i for n in graph.graph.node for i in n.input} | set(man["outputs"])
    graph.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in constants.items() if k in used)
    opset = int(man["opset"])
    nodes = tuple(
        Node(k, n.name, n.op_type, n.domain, tuple(n.input), tuple(n.output), _node_attrs(n), opset)
        for k, n in enumerate(graph.graph.node)
    )
    spec = {k: np.asarray(v) for k, v in man["specialized"].items()}
    for k, v in spec.items():
        spec[k] = v.astype(constants[k].dtype) if k in constants else v
    model = OnnxModel(
        d, graph, nodes, constants, values, tuple(man["inputs"]), tuple(man["outputs"]), opset, spec
    )  # fmt: skip
    units: list[Subgraph | LibraryNode] = []
    for u in logs.each(units_doc, "loading unit", logs.get("onnx"), lambda u: f"subgraph {u.get('subgraph', '-')}"):
        if "library" in u:
            units.append(LibraryNode(nodes[u["library"]], u["reason"]))
            continue
        spath = _read(os.path.join(d, u["schedule"]), f"subgraph {u['subgraph']}'s schedule")
        cpath = _read(os.path.join(d, u["cuda"]), f"subgraph {u['subgraph']}'s CUDA")
        with open(spath) as f:
            saved = Schedule.from_json(f.read(), spath)

        def schedule(k: int, signature: str, saved=saved, spath=spath) -> Schedule:
            if saved.subgraph != signature:
                raise ScheduleError(f"{spath}: saved for {saved.subgraph!r}, but the subgraph is {signature!r}")
            return saved

        sg = compile_subgraph(model, u["subgraph"], [nodes[i] for i in u["nodes"]], target, gpu, schedule)
        with open(cpath) as f:
            if f.read() != sg.compiled.source:
                raise ModelError(f"{cpath}: the replayed kernel differs from the saved one (another Panamera version?)")
        units.append(sg)
    return OptimizedModel(model, tuple(units), target, gpu)
