"""Dynamic shapes sweep (issue 22), modeled: each size class's plan against the static plan.

For every workload and size, the class plan a symbolic program uses at that size (decided once
per class, robust over the class's sizes, schedule/param_mapping.py; planned by the model, not
read from the schedule database) is costed at the actual size by the static cost model
(schedule/cost.py on the kernel's static view, schedule/bound.py: `DynamicCompiled.modeled_us`),
beside the plan a static compile would choose for that size (compiler.lower, no kernel built). Also: kernels compiled (one per class) and the host cost per call of binding
the symbols and picking the class. Figures are modeled on the H100 spec; nothing is launched.

    PYTHONPATH=. python bench/dynamic/sweep.py            # prints a table, writes sweep.json here
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

import panamera as pn
from panamera.compiler import lower
from panamera.dynamic import specialize
from panamera.model.gpu import H100


def workloads():
    def rowsum():
        return (pn.sum(pn.placeholder(("B", "S", 768), name="x"), axis=-1),)

    def softmax():
        return (pn.nn.softmax(pn.placeholder(("B", "S", 1024), name="x")),)

    def layer_norm():
        x, g, b = (
            pn.placeholder(("B", "S", 768), name="x"),
            pn.placeholder((768,), name="g"),
            pn.placeholder((768,), name="b"),
        )
        return (pn.nn.layer_norm(x, g, b),)

    def colmean():
        return (pn.mean(pn.placeholder(("B", "S", 768), name="x"), axis=(0, 1)),)

    def allsum():
        return (pn.sum(pn.placeholder(("B", "S", 768), name="x")),)

    return {"rowsum": rowsum, "softmax": softmax, "layer_norm": layer_norm, "colmean": colmean, "allsum": allsum}


SIZES = [{"B": b, "S": s} for b in (1, 8, 64) for s in (1, 7, 128, 1000, 8192)]


def main() -> int:
    rows = []
    for name, make in workloads().items():
        outs = make()
        k = pn.compile(list(outs), target="emulator", gpu="h100", cache=False, use_database=False)  # by the model
        for sizes in SIZES:
            plan = k.plan(k.size_class(sizes))
            dyn = k.modeled_us(**sizes)
            static = lower(list(specialize(outs, sizes)), target="emulator", gpu="h100").plan.modeled_us
            arrays = [np.zeros([sizes.get(str(e), e) if not isinstance(e, int) else e for e in t.shape], t.dtype.np)
                      for t in k.inputs]  # fmt: skip
            t0 = time.perf_counter()
            for _ in range(200):
                k.size_class(k.bind_sizes(arrays))
            host_us = (time.perf_counter() - t0) / 200 * 1e6
            rows.append({"workload": name, **sizes, "class": plan.cls.describe(), "dynamic_us": round(dyn, 2),
                         "static_us": round(static, 2), "ratio": round(dyn / static, 3), "bind_us": round(host_us, 1)})  # fmt: skip
            r = rows[-1]
            print(f"{name:11s} B={r['B']:3d} S={r['S']:5d}  class plan {r['dynamic_us']:9.2f} us  static {r['static_us']:9.2f} us"
                  f"  ratio {r['ratio']:5.2f}  bind+class {r['bind_us']:5.1f} us")  # fmt: skip
        print(f"{name}: {k.stats()['classes_planned']} class plan(s) for {len(SIZES)} sizes")
    Path(__file__).with_name("sweep.json").write_text(json.dumps(rows, indent=1) + "\n")
    worst = max(rows, key=lambda r: r["ratio"])
    print(
        f"worst ratio {worst['ratio']} ({worst['workload']} at B={worst['B']} S={worst['S']}), modeled on {H100.name}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
