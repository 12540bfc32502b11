"""The optimizer's report: every subgraph (ops, kernels, plan, modeled time against the unfused
baseline, its .cu file), every node left to the array library, and the whole model's modeled
time against the same model run one kernel per ONNX node, as JSON and markdown.

The whole-model figure prices every node: Panamera subgraphs by their plans (gpu.py's model),
the library's nodes on a roofline of their FLOPs and DRAM bytes,

    T = T_launch + max(bytes / (eta * BW_peak), FLOPs / (SMs * FP32 lanes per SM * 2 * clock))

(views move nothing and cost nothing). The baseline runs each of Panamera's nodes as a kernel of
its own and the library's nodes as they are, so the speedup counts the library's share too.

>>> from panamera.model.gpu import H100
>>> round(peak_flops(H100) / 1e12, 1)  # the datasheet's 67 TFLOPS FP32
66.9
"""

from __future__ import annotations

import json
import math
import os

from onnx import helper

from .. import logs
from ..model.gpu import GPUSpec
from .convert import VIEWS
from .deploy import write_deployable
from .library import LibraryNode
from .model import Node, OnnxModel
from .optimizer import OptimizedModel, Subgraph, unfused_baseline
from .plans import Plans

# FP32 lanes per SM [spec]: NVIDIA's Hopper (H100 SXM5), Ampere GA100 and Volta V100 whitepapers.
FP32_LANES_PER_SM = {"H100-SXM5": 128, "A100-SXM4-80GB": 64, "V100-SXM2": 64}


def peak_flops(gpu: GPUSpec) -> float:
    """Peak FP32 FLOP/s (an FMA is two): SMs * lanes per SM * 2 * clock."""
    return gpu.sms * FP32_LANES_PER_SM.get(gpu.name, 64) * 2 * gpu.clock_hz


def _size(model: OnnxModel, name: str) -> tuple[int, int]:
    """(elements, bytes) of a value; (0, 0) where its shape is unknown."""
    v = model.values.get(name)
    if v is None or v.shape is None or not v.elem:
        return 0, 0
    n = math.prod(v.shape)
    try:
        item = helper.tensor_dtype_to_np_dtype(v.elem).itemsize
    except Exception:  # strings and other element types without a fixed size
        item = 8
    return n, n * item


def library_us(opt: OptimizedModel, node: Node) -> tuple[float, int]:
    """(modeled us, launches) of one library node: a routed contraction at the figure its route
    was decided on (cuBLAS's tensor-core roofline, route.py), any other on `roofline_us`."""
    route = opt.partition.route(node) if opt.partition else None
    if route is not None:
        return route.library_us, 1
    return roofline_us(opt.model, node, opt.gpu)


def roofline_us(model: OnnxModel, node: Node, gpu: GPUSpec) -> tuple[float, int]:
    """(modeled us, launches) of one library node on `gpu`'s roofline; a view is free."""
    if node.op_type in VIEWS:
        return 0.0, 0
    bytes_ = sum(_size(model, i)[1] for i in node.inputs + node.outputs if i)
    out = sum(_size(model, o)[0] for o in node.outputs if o)
    flops = float(out)
    a = model.values.get(node.inputs[0]) if node.inputs and node.inputs[0] else None
    if node.op_type in ("MatMul", "Gemm") and a is not None and a.shape:
        k = a.shape[0] if node.op_type == "Gemm" and node.attrs.get("transA", 0) else a.shape[-1]
        flops = 2.0 * out * k
    elif node.op_type in ("Conv", "ConvTranspose") and len(node.inputs) > 1:
        w = model.values.get(node.inputs[1])
        if w is not None and w.shape:
            flops = 2.0 * out * math.prod(w.shape[1:])
    t = gpu.launch_s + max(bytes_ / gpu.achievable_bw, flops / peak_flops(gpu))
    return t * 1e6, 1


def _plans(opt: OptimizedModel) -> Plans | None:
    """The router's plans (the partition's memo), which the per-node baseline reuses."""
    return opt.partition.plans if opt.partition is not None else None


def whole_model(opt: OptimizedModel, unfused: dict | None = None) -> dict:
    """The whole model's modeled time and launches, Panamera's plan against one kernel per ONNX
    node (`unfused`: subgraph id -> (us, launches), computed here if not given)."""
    fused_us = base_us = lib_us = 0.0
    launches = base_launches = 0
    for u in opt.units:
        if isinstance(u, Subgraph):
            us, n = (
                unfused[u.id] if unfused and u.id in unfused else unfused_baseline(opt.model, u, opt.gpu, _plans(opt))
            )
            fused_us += u.compiled.plan.modeled_us
            launches += len(u.compiled.plan.per_call)
            base_us += us
            base_launches += n
        elif isinstance(u, LibraryNode):
            us, n = library_us(opt, u.node)
            lib_us += us
            fused_us += us
            base_us += us
            launches += n
            base_launches += n
    return {
        "modeled_us": round(fused_us, 3),
        "launches": launches,
        "library_modeled_us": round(lib_us, 3),
        "per_node_modeled_us": round(base_us, 3),
        "per_node_launches": base_launches,
        "speedup_vs_per_node": round(base_us / fused_us, 3) if fused_us else None,
    }


def why_alone(opt: OptimizedModel, sg: Subgraph) -> str:
    """Why a subgraph that is one kernel holding one data-moving ONNX node is alone, as the
    partitioner decided it ("" for any other subgraph)."""
    part = opt.partition
    if part is None or len(sg.compiled.plan.kernels) != 1 or sg.id >= len(part.alone):
        return ""
    return part.alone[sg.id]


def _subgraph_record(opt: OptimizedModel, sg: Subgraph, cu_path: str | None, unfused: tuple[float, int]) -> dict:
    plan = sg.compiled.plan
    unfused_us, unfused_launches = unfused
    routes = [(n, opt.partition.route(n)) for n in sg.nodes] if opt.partition else []
    return {
        "id": sg.id,
        "label": sg.label,
        "nodes": [{"name": n.label, "op": n.op_type} for n in sg.nodes],
        "inputs": list(sg.inputs) + list(sg.weights),
        "outputs": list(sg.outputs),
        "kernels": [
            {
                "name": ln.kernel,
                "role": ln.role,
                "form": ln.form,
                "grid": list(ln.grid),
                "block": list(ln.block),
                "blocks_per_reduction": ln.blocks_per_reduction,
                "modes": list(ln.modes),
                "modeled_us": round(ln.modeled_us, 3),
            }
            for ln in plan.per_call
        ],
        "launches": len(plan.per_call),
        "dram_bytes": sum(ln.bytes_read + ln.bytes_written for ln in plan.per_call),
        "modeled_us": round(plan.modeled_us, 3),
        "unfused_modeled_us": round(unfused_us, 3),
        "unfused_launches": unfused_launches,
        "speedup_vs_unfused": round(unfused_us / plan.modeled_us, 3) if plan.modeled_us else None,
        "compile_s": round(sg.compile_s, 4),
        "cuda_file": cu_path,
        "alone": why_alone(opt, sg),
        "routed": [{"name": n.label, "op": n.op_type, "reason": r.reason} for n, r in routes if r is not None],
        "runs_on": "cpu" if sg.on_cpu else sg.compiled.target,  # cpu: the CPU target's kernels (the plan is the GPU's)
    }


def build_report(opt: OptimizedModel, cu_paths: dict | None = None) -> dict:
    """The report of `opt` as a JSON-able dict (`cu_paths`: subgraph id -> its kernel file)."""
    cu_paths = cu_paths or {}
    todo = logs.each(opt.subgraphs, "unfused baseline", logs.get("onnx"), lambda sg: sg.label)
    plans = _plans(opt)
    unfused = {sg.id: unfused_baseline(opt.model, sg, opt.gpu, plans) for sg in todo}
    subgraphs = [_subgraph_record(opt, sg, cu_paths.get(sg.id), unfused[sg.id]) for sg in opt.subgraphs]
    return {
        "model": opt.model.path,
        "gpu": opt.gpu.name,
        "target": opt.target,
        "times": "modeled (docs/GPU_MODEL.md), not measured",
        "subgraphs": subgraphs,
        "library": [
            {
                "name": u.node.label,
                "op": u.node.op_type,
                "reason": u.reason,
                "modeled_us": round(library_us(opt, u.node)[0], 3),
            }
            for u in opt.library
        ],
        "whole_model": whole_model(opt, unfused),
        "totals": {
            "subgraphs": len(subgraphs),
            "library_nodes": len(opt.library),
            "modeled_us": round(sum(s["modeled_us"] for s in subgraphs), 3),
            "unfused_modeled_us": round(sum(s["unfused_modeled_us"] for s in subgraphs), 3),
            "launches": sum(s["launches"] for s in subgraphs),
            "unfused_launches": sum(s["unfused_launches"] for s in subgraphs),
        },
    }


def _md_cell(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def whole_model_line(w: dict) -> str:
    """One sentence on the whole model's modeled time against one kernel per ONNX node."""
    sp = f"{w['speedup_vs_per_node']:.2f}x" if w["speedup_vs_per_node"] else "-"
    return (
        f"Whole model: {w['modeled_us']:.1f} us modeled in {w['launches']} launches "
        f"(library nodes {w['library_modeled_us']:.1f} us on a roofline) against {w['per_node_modeled_us']:.1f} us "
        f"in {w['per_node_launches']} launches one kernel per ONNX node: {sp}."
    )


def markdown(report: dict) -> str:
    t = report["totals"]
    lines = [
        f"# Panamera report: {_md_cell(os.path.basename(report['model']))}",
        "",
        f"GPU {report['gpu']}; times are {report['times']}. Baseline: the same nodes, one kernel per ONNX node.",
        "",
        "| subgraph | ops | kernels | modeled us | unfused us (kernels) | speedup | compile ms | CUDA |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in report["subgraphs"]:
        ops = " ".join(n["op"] for n in s["nodes"])
        sp = f"{s['speedup_vs_unfused']:.2f}x" if s["speedup_vs_unfused"] else "-"
        lines.append(
            f"| {s['label']} | {_md_cell(ops)} | {s['launches']} | {s['modeled_us']:.1f} | "
            f"{s['unfused_modeled_us']:.1f} ({s['unfused_launches']}) | {sp} | {s['compile_s'] * 1e3:.0f} | "
            f"{_md_cell(s['cuda_file'] or '-')} |"
        )
    notes = [(s["label"], f"alone: {s['alone']}") for s in report["subgraphs"] if s.get("alone")]
    notes += [
        (s["label"], f"{r['op']} {r['name']} routed to Panamera: {r['reason']}")
        for s in report["subgraphs"]
        for r in s.get("routed", ())
    ]
    if notes:
        lines += ["", "| subgraph | why |", "|---|---|"]
        lines += [f"| {label} | {_md_cell(why)} |" for label, why in notes]
    lines += [
        "",
        f"Total: {t['subgraphs']} subgraphs, {t['launches']} launches, {t['modeled_us']:.1f} us modeled "
        f"(unfused: {t['unfused_launches']} launches, {t['unfused_modeled_us']:.1f} us).",
        "",
        "",
        whole_model_line(report["whole_model"]),
        "",
        "## Left to the array library",
        "",
        "| node | op | reason | modeled us (roofline) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {_md_cell(n['name'])} | {n['op']} | {_md_cell(n['reason'])} | {n['modeled_us']:.1f} |"
        for n in report["library"]
    ]
    return "\n".join(lines) + "\n"


def write_outputs(opt: OptimizedModel, out: str) -> dict:
    """Write kernels/<subgraph>.cu, report.json and report.md under `out` (which must exist),
    and the deployable model (deploy.py: manifest, graph, weights, schedules) beside them."""
    kdir = os.path.join(out, "kernels")
    os.makedirs(kdir, exist_ok=True)
    cu_paths = {}
    for sg in opt.subgraphs:
        path = os.path.join("kernels", f"{sg.label}.cu")
        with open(os.path.join(out, path), "w") as f:
            f.write(sg.compiled.source)
        cu_paths[sg.id] = path
    write_deployable(opt, out, cu_paths)
    report = build_report(opt, cu_paths)
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(report))
    return report
