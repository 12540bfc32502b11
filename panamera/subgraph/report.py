"""The optimizer's report: every subgraph (ops, kernels, plan, modeled time against the unfused
baseline, its .cu file) and every node left to the array library, as JSON and markdown."""

from __future__ import annotations

import json
import os

from .optimizer import OptimizedModel, Subgraph, unfused_baseline


def _subgraph_record(opt: OptimizedModel, sg: Subgraph, cu_path: str | None) -> dict:
    plan = sg.compiled.plan
    unfused_us, unfused_launches = unfused_baseline(opt.model, sg, opt.gpu)
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
    }


def build_report(opt: OptimizedModel, cu_paths: dict | None = None) -> dict:
    cu_paths = cu_paths or {}
    subgraphs = [_subgraph_record(opt, sg, cu_paths.get(sg.id)) for sg in opt.subgraphs]
    return {
        "model": opt.model.path,
        "gpu": opt.gpu.name,
        "target": opt.target,
        "times": "modeled (shared/GPU_MODEL.md), not measured",
        "subgraphs": subgraphs,
        "library": [{"name": u.node.label, "op": u.node.op_type, "reason": u.reason} for u in opt.library],
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
    lines += [
        "",
        f"Total: {t['subgraphs']} subgraphs, {t['launches']} launches, {t['modeled_us']:.1f} us modeled "
        f"(unfused: {t['unfused_launches']} launches, {t['unfused_modeled_us']:.1f} us).",
        "",
        "## Left to the array library",
        "",
        "| node | op | reason |",
        "|---|---|---|",
    ]
    lines += [f"| {_md_cell(n['name'])} | {n['op']} | {_md_cell(n['reason'])} |" for n in report["library"]]
    return "\n".join(lines) + "\n"


def write_outputs(opt: OptimizedModel, out: str) -> dict:
    """Write kernels/<subgraph>.cu, report.json and report.md under `out` (which must exist)."""
    kdir = os.path.join(out, "kernels")
    os.makedirs(kdir, exist_ok=True)
    cu_paths = {}
    for sg in opt.subgraphs:
        path = os.path.join("kernels", f"{sg.label}.cu")
        with open(os.path.join(out, path), "w") as f:
            f.write(sg.compiled.source)
        cu_paths[sg.id] = path
    report = build_report(opt, cu_paths)
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(report))
    return report
