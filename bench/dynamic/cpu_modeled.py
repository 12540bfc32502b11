"""Symbolic CPU class plans against the static CPU plans, modeled (the CPU model of this machine).

For each workload and size, the class plan a symbolic CPU program uses at that size (its split
decided once per power-of-two class, schedule/cpu_param_mapping.py) is evaluated by the CPU model
at the actual size, beside the static CPU program compiled at that size (`CpuCompiled.modeled()`,
whose split is decided for that size). Ratio: class plan / static plan (issue 22's target: <= 1.05).
Also the classes and the g++ builds the symbolic program needed for the sweep.

    PYTHONPATH=. python bench/dynamic/cpu_modeled.py
"""

from __future__ import annotations

import panamera as pn
from panamera.dynamic import members, specialize
from panamera.model.cpu import call_us
from panamera.schedule.cpu_param_mapping import time_at

SIZES = (1, 2, 3, 7, 16, 61, 128, 509, 1024, 4093, 8192)


def workloads():
    return {
        "row sum (B, 768)": (lambda: (pn.sum(pn.placeholder(("B", 768), name="x"), axis=1),), "B"),
        "all sum (N, 768)": (lambda: (pn.sum(pn.placeholder(("N", 768), name="x")),), "N"),
        "softmax (B, 1024)": (lambda: (pn.nn.softmax(pn.placeholder(("B", 1024), name="x")),), "B"),
        "layer_norm (B, 768)": (lambda: (pn.nn.layer_norm(pn.placeholder(("B", 768), name="x")),), "B"),
        "column sum (N, 768)": (lambda: (pn.sum(pn.placeholder(("N", 768), name="x"), axis=0),), "N"),
        "row sum (8, S)": (lambda: (pn.sum(pn.placeholder((8, "S"), name="x"), axis=1),), "S"),
    }


def main() -> None:
    print(
        f"{'workload':22} {'worst':>6} {'at':>6} {'classes':>7}  ratios (class plan / static plan, modeled) at {SIZES}"
    )
    for name, (build, sym) in workloads().items():
        outs = build()
        k = pn.compile(outs[0], target="cpu", cache=False)
        ratios = []
        for n in SIZES:
            sizes = {sym: n}
            plan = k.plan(k.size_class(sizes))
            mine = call_us(len(outs)) + sum(
                time_at(g, d.kind, sizes, d.split, d.block, d.lanes, k.model).total_us
                for g, d in zip(members(k.program), plan.decisions)
            )
            static = pn.compile(specialize(outs, sizes)[0], target="cpu").modeled().total_us
            ratios.append(mine / static)
        worst = max(ratios)
        at = SIZES[ratios.index(worst)]
        print(f"{name:22} {worst:6.3f} {at:>6} {len(k._plans):>7}  " + " ".join(f"{r:.2f}" for r in ratios))


if __name__ == "__main__":
    main()
