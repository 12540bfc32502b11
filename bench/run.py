"""Rerun the paper's experiments and refresh the committed results in bench/results/.

    .venv/bin/python bench/run.py                  # all suites, modeled for an H100, with plots

does what `panamera bench --suite all --gpu h100 --out bench/results --plot` (and `make bench`) does,
through the library in panamera/bench/: every workload of docs/WORKLOADS.md planned as Panamera,
deterministic, single-block and eager, modeled with docs/GPU_MODEL.md (and timed where CuPy sees a
GPU); results.json, summary.md and the PNG charts go to --out. bench/README.md says how long it takes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from panamera.bench import run_bench
from panamera.bench.suites import SUITES, tiny
from panamera.model import GPUS

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", choices=[*SUITES, "all", "tiny"], default="all")
    ap.add_argument("--gpu", choices=sorted(GPUS), default="h100", help="GPU the plans are made and modeled for")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="default: bench/results next to this script")
    ap.add_argument("--no-plot", dest="plot", action="store_false", help="skip the PNG charts (no matplotlib needed)")
    args = ap.parse_args(argv)

    suites = list(SUITES) if args.suite == "all" else [args.suite]
    workloads = tiny() if args.suite == "tiny" else None
    command = "python bench/run.py " + " ".join(sys.argv[1:] if argv is None else argv)
    _, summary = run_bench(
        suites, GPUS[args.gpu], str(args.out), args.plot, workloads=workloads, command=command.strip()
    )
    print(summary)
    print(f"wrote {args.out}/results.json and {args.out}/summary.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
