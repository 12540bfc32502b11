"""The `panamera` command. `panamera demo` compiles the paper's single-reduction suite (WORKLOADS.md
A1) at emulator-friendly sizes, checks each result against numpy and prints the plans."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import compile as pn_compile
from .frontend import ops, placeholder

# (name, form, shape, axes): A1 shapes scaled down so that the emulator runs them in seconds.
DEMO_SUITE = [
    ("all-128", "ALL", (128,), None),
    ("all-65536", "ALL", (65536,), None),
    ("all-1024x1024/16", "ALL", (256, 256), None),
    ("row-768x768/4", "ROW", (192, 768), (1,)),
    ("row-768x21128/16", "ROW", (48, 21128), (1,)),
    ("row-nchw", "ROW", (4, 16, 14, 14), (0, 2, 3)),
    ("col-768x768/4", "COLUMN", (768, 192), (0,)),
    ("col-21128x768/16", "COLUMN", (21128, 48), (0,)),
    ("col-nhwc", "COLUMN", (4, 14, 14, 16), (0, 1, 2)),
]


def demo(args) -> int:
    rng = np.random.default_rng(0)
    rows = []
    failed = 0
    for name, form, shape, axes in DEMO_SUITE:
        for op in ("sum", "max", "all"):
            dtype = "bool" if op == "all" else "float32"
            x = placeholder(shape, dtype, name="x")
            y = getattr(ops, op)(x, axis=axes)
            t0 = time.perf_counter()
            k = pn_compile(y, target="emulator")
            ct = time.perf_counter() - t0
            a = rng.random(shape) > 0.001 if dtype == "bool" else rng.standard_normal(shape).astype(np.float32)
            out = k(a)
            ref = getattr(np, op)(a.astype(np.float64) if dtype != "bool" else a, axis=axes)
            ok = np.allclose(out, ref, rtol=1e-4, atol=1e-3)
            failed += not ok
            ln = k.plan.kernels[0]
            m = k.mappings[0]
            rows.append(
                (
                    f"{op} {name}",
                    form,
                    f"{m.M}x{m.N}",
                    str(ln.grid[:2]),
                    str(ln.block[:2]),
                    m.vec,
                    ln.blocks_per_reduction,
                    ",".join(ln.modes),
                    len(k.plan.launches),
                    f"{k.plan.modeled_us:.1f}",
                    f"{ct * 1e3:.0f}",
                    "ok" if ok else "WRONG",
                )
            )
    head = (
        "workload",
        "form",
        "MxN",
        "grid",
        "block",
        "vec",
        "split",
        "combine",
        "launches",
        "H100 us (modeled, plan)",
        "compile ms",
        "vs numpy",
    )
    widths = [max(len(str(r[c])) for r in rows + [head]) for c in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    print(f"\n{len(rows) - failed}/{len(rows)} results match numpy (emulator backend; times modeled for H100).")
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="panamera", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("demo", help="compile, run and check the single-reduction suite; print the plans")
    args = p.parse_args(argv)
    if args.cmd == "demo":
        return demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
