"""A decode loop through `torch.compile(backend="panamera")` (issue 22, item 4): compilations per
token, Panamera programs against dynamo's own recompilations (with their guards), and the host
cost per call of a symbolic program (binding the symbols, picking the size class) measured.

One attention step per token over a KV cache whose length T grows by one each token (GPT-2-small
heads: 12 x 64, or --heads/--dim): scores = q k^T * scale, softmax over T (a Panamera subgraph
over dynamo's symbol for T), p v, then a layer norm. The contractions run in eager PyTorch (the
backend takes reductions and their neighbours). CPU tensors: the kernels run on the emulator, so
wall times here are the emulator's (a correctness tool); the compile counts are what a GPU run
does too.

    PYTHONPATH=. python bench/dynamic/decode_torch.py --tokens 256      # prints a table, writes decode_torch.json
"""

from __future__ import annotations

import argparse
import json
import time
import timeit
import warnings
from pathlib import Path

import torch

import panamera as pn
import panamera.torch_backend as tb
from panamera.frontend.symbolic import evaluate


class Step(torch.nn.Module):
    def __init__(self, heads: int, dim: int):
        super().__init__()
        self.scale = dim**-0.5
        self.norm = torch.nn.LayerNorm(heads * dim)

    def forward(self, q, k, v):
        p = torch.softmax((q @ k.transpose(-1, -2)) * self.scale, dim=-1)
        return self.norm((p @ v).reshape(1, -1))


def guard_failures() -> list[str]:
    """dynamo's recorded guard failures (why it recompiled), as text."""
    from torch._dynamo.utils import guard_failures as failures

    return [str(r) for reasons in failures.values() for r in reasons]


def host_cost(k, arrays, number: int = 2000) -> dict:
    """µs per call of binding the symbols and of picking the size class (no launch)."""
    bind = timeit.timeit(lambda: k.bind_sizes(arrays), number=number) / number * 1e6
    sizes = k.bind_sizes(arrays)
    pick = timeit.timeit(lambda: k.size_class(sizes), number=number) / number * 1e6
    return {"bind_us": bind, "class_us": pick}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--out", default=str(Path(__file__).with_name("decode_torch.json")))
    args = ap.parse_args()
    warnings.simplefilter("ignore", pn.EmulatorWarning)
    torch.manual_seed(0)
    torch._dynamo.reset()
    tb.reset_stats()
    model = Step(args.heads, args.dim).eval()
    f = torch.compile(model, backend="panamera", options={"target": "emulator"})
    H, D = args.heads, args.dim  # noqa: N806
    k_cache, v_cache = torch.randn(1, H, args.tokens, D), torch.randn(1, H, args.tokens, D)
    rows, worst = [], 0.0
    with torch.no_grad():
        for t in range(1, args.tokens + 1):
            q = torch.randn(1, H, 1, D)
            k, v = k_cache[:, :, :t].contiguous(), v_cache[:, :, :t].contiguous()
            before = (tb.stats().graphs, tb.stats().programs, tb.stats().size_classes)
            t0 = time.perf_counter()
            got = f(q, k, v)
            wall = time.perf_counter() - t0
            ref = model(q, k, v)
            worst = max(worst, (got - ref).abs().max().item())
            s = tb.stats()
            rows.append({
                "token": t, "wall_s": wall, "dynamo_compiles": s.graphs - before[0],
                "panamera_programs": s.programs - before[1], "size_classes": s.size_classes - before[2],
            })  # fmt: skip
    s = tb.stats()
    programs = [sub.program for r in s.reports for sub in r.subgraphs if sub.program is not None]
    cost = {}
    if programs:  # the last token's arguments, at the program's own placeholder shapes
        k = programs[-1]
        xs = [torch.randn(evaluate(t.shape, {name: args.tokens for name in k.symbols})) for t in k.inputs]
        cost = host_cost(k, xs)
        k(*xs)  # the per-call wall of a warm token: bind, class pick, launch and the emulator's run
        n = 20
        cost["call_emulator_us"] = timeit.timeit(lambda: k(*xs), number=n) / n * 1e6
    summary = {
        "tokens": args.tokens, "heads": H, "dim": D,
        "dynamo_graphs": s.graphs, "dynamo_recompiles": s.recompiles, "guard_failures": guard_failures(),
        "panamera_programs": s.programs, "symbolic_programs": s.symbolic_programs, "size_classes": s.size_classes,
        "per_shape": [[name, str(shapes), why] for name, shapes, why in s.specializations],
        "tokens_that_compiled": [r["token"] for r in rows if r["dynamo_compiles"] or r["panamera_programs"] or r["size_classes"]],
        "max_abs_error_vs_eager": worst, "host_cost_per_call": cost,
        "warm_token_wall_s_median": sorted(r["wall_s"] for r in rows if not r["size_classes"] and not r["dynamo_compiles"])[
            len([r for r in rows if not r["size_classes"] and not r["dynamo_compiles"]]) // 2] if rows else None,
    }  # fmt: skip
    print(s.describe())
    for key, value in summary.items():
        print(f"{key}: {value}")
    Path(args.out).write_text(json.dumps({"summary": summary, "tokens": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
