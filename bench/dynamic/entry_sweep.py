"""Sizes 1…8192 (sequence) × 1…64 (batch) through the three entry points (issue 22, the sweep target):
`pn.compile` over symbolic placeholders, `torch.compile(backend="panamera", dynamic=True)` and an
ONNX model with dim_params ("batch", "seq") optimized without --shape. One workload, the tail
of an encoder block: x (B, S, 64) -> LayerNorm over 64 -> sum over 64 -> softmax over S.

Per entry point:
- results: run on the emulator at the small sizes (B*S <= RUN_LIMIT), each against numpy
  float64; tolerance derived: the logits (a layer norm and a sum of 64) carry
  (2 eps + 8 eps sqrt(64)) * 64 * max(1, |logit|) absolute error, which the softmax turns into that
  much relative error, plus one float32 reduction's over S (eps = 2^-23);
- compilations: size classes compiled against the distinct classes the run sizes fall in (at
  most one each);
- host cost per call (measured, CPU): binding the symbols and picking the class, median over sizes;
- modeled: at every size, the symbolic program's figure (`DynamicCompiled.modeled_us`, the
  class plan costed at that size) against the static plan a compile at that size chooses
  (compiler.lower, nothing built), modeled on the H100 spec. torch: dynamo specializes extents
  of 1 (its 0/1 rule: a separate static graph), so its symbolic program covers B, S >= 2.

    PYTHONPATH=. python bench/dynamic/entry_sweep.py       # prints a table, writes entry_sweep.json
"""

from __future__ import annotations

import json
import platform
import re
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import panamera as pn
from panamera.compiler import lower
from panamera.dynamic import specialize

H = 64
BATCHES = (1, 2, 5, 10, 20, 64)
SEQS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 8192)
RUN_LIMIT = 1000  # B*S at most this runs on the emulator
EPS = 2.0**-23
rng = np.random.default_rng(0)
G, BETA = rng.standard_normal(H).astype(np.float32), rng.standard_normal(H).astype(np.float32)


def reference(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * G + BETA
    s = y.sum(-1)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def tolerance(x: np.ndarray) -> float:
    logits = np.abs(reference_logits(x)).max() if x.size else 1.0
    return (2 * EPS + 8 * EPS * H**0.5) * H * max(1.0, logits) + 2 * EPS + 8 * EPS * max(x.shape[1], 1) ** 0.5


def reference_logits(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return ((x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * G + BETA).sum(-1)


def sizes() -> list[dict[str, int]]:
    return [{"B": b, "S": s} for b in BATCHES for s in SEQS]


# -- the three entry points: each returns (run(x) -> y, programs with their symbol for B and S) --
def panamera_entry():
    x, g, b = pn.placeholder(("B", "S", H), name="x"), pn.placeholder((H,), name="g"), pn.placeholder((H,), name="b")
    k = pn.compile(pn.nn.softmax(pn.sum(pn.nn.layer_norm(x, g, b), axis=-1)), target="emulator")
    return (lambda a: np.asarray(k(a, G, BETA))), [(k, {"B": "B", "S": "S"})], lambda: {}


def torch_entry():
    import torch

    import panamera.torch_backend as tb

    class Tail(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(H)
            with torch.no_grad():
                self.norm.weight.copy_(torch.from_numpy(G))
                self.norm.bias.copy_(torch.from_numpy(BETA))

        def forward(self, x):
            return torch.softmax(self.norm(x).sum(-1), -1)

    torch._dynamo.reset()
    tb.reset_stats()
    f = torch.compile(Tail().eval(), backend="panamera", options={"target": "emulator"}, dynamic=True)

    def run(a):
        with torch.no_grad():
            return f(torch.from_numpy(a)).numpy()

    def programs():
        out = []
        for r in tb.stats().reports:
            for sub in r.subgraphs:
                if sub.program is not None and len(sub.program.symbols) == 2:
                    x = max(sub.program.inputs, key=lambda t: len(t.shape))  # (sB, sS, 64)
                    names = [str(e) for e in x.shape if not isinstance(e, int)]
                    out.append((sub.program, {"B": names[0], "S": names[1]}))
        return out

    def dynamo():
        from torch._dynamo.utils import guard_failures

        s = tb.stats()
        return {"dynamo_graphs": s.graphs, "panamera_programs": s.programs, "symbolic_programs": s.symbolic_programs,
                "guard_failures": [str(r) for rs in guard_failures.values() for r in rs]}  # fmt: skip

    return run, programs, dynamo


def onnx_entry():
    from onnx import TensorProto, helper, numpy_helper

    from panamera.subgraph.dynamic_model import optimize_dynamic

    f32 = TensorProto.FLOAT
    inits = [numpy_helper.from_array(G, "g"), numpy_helper.from_array(BETA, "b"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]  # fmt: skip
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1),
        helper.make_node("ReduceSum", ["ln", "axes"], ["s"], keepdims=0),
        helper.make_node("Softmax", ["s"], ["y"], axis=-1),
    ]
    g = helper.make_graph(nodes, "tail", [helper.make_tensor_value_info("x", f32, ["batch", "seq", H])],
                          [helper.make_tensor_value_info("y", f32, ["batch", "seq"])], inits)  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    dm = optimize_dynamic(model, target="emulator")
    programs = [(u.compiled, {"B": "batch", "S": "seq"}) for u in dm.units if u.compiled is not None]
    return (lambda a: dm.run({"x": a})["y"]), programs, dm.stats


def host_us(k, bound: dict[str, int], number: int = 200) -> float:
    """Measured µs per call of the host's part of a symbolic call before the launch: binding the
    symbols from the arguments' shapes and picking the size class (arrays of zero stride: no data)."""
    arrays = [np.broadcast_to(np.zeros((), t.dtype.np), [bound.get(str(e), e) if not isinstance(e, int) else e
                                                        for e in t.shape]) for t in k.inputs]  # fmt: skip
    t0 = time.perf_counter()
    for _ in range(number):
        k.size_class(k.bind_sizes(arrays))
    return (time.perf_counter() - t0) / number * 1e6


def sweep(name: str, entry) -> dict:
    t0 = time.perf_counter()
    run, programs, extra = entry()
    runs, classes_met = [], {}
    for at in sizes():
        if at["B"] * at["S"] > RUN_LIMIT:
            continue
        x = rng.standard_normal((at["B"], at["S"], H)).astype(np.float32)
        err = float(np.abs(run(x).astype(np.float64) - reference(x)).max())
        runs.append({**at, "err": err, "tol": tolerance(x), "ok": bool(err <= tolerance(x))})
    progs = programs() if callable(programs) else programs
    modeled = []
    for k, names in progs:
        for at in sizes():
            if name == "torch" and min(at.values()) < 2:
                continue  # dynamo's own static graph for an extent of 1
            bound = {names[key]: n for key, n in at.items()}
            if at["B"] * at["S"] <= RUN_LIMIT:
                classes_met[(id(k), k.size_class(bound).describe())] = True
            dyn = k.modeled_us(**bound)
            static = lower(list(specialize(k.outputs, bound)), target="emulator", gpu="h100").plan.modeled_us
            modeled.append(
                {
                    **at,
                    "class_us": round(dyn, 3),
                    "static_us": round(static, 3),
                    "ratio": round(dyn / static, 4),
                    "host_us": round(host_us(k, bound), 2),
                }  # fmt: skip
            )
    compiled = sum(k.stats()["classes_compiled"] for k, _ in progs)
    out = {
        "entry": name, "programs": len(progs), "run_sizes": len(runs), "all_right": all(r["ok"] for r in runs),
        "max_err_over_tol": max(r["err"] / r["tol"] for r in runs), "classes_compiled": compiled,
        "classes_met_by_runs": len(classes_met), "one_compile_per_class": compiled <= len(classes_met),
        "modeled_sizes": len(modeled), "worst_ratio": max(m["ratio"] for m in modeled),
        "best_ratio": min(m["ratio"] for m in modeled), "wall_s": round(time.perf_counter() - t0, 1),
        "host_us_median": sorted(m["host_us"] for m in modeled)[len(modeled) // 2],
        **(extra() or {}), "runs": runs, "modeled": modeled,
    }  # fmt: skip
    print(f"{name:8s} programs {out['programs']}  {out['run_sizes']} sizes run, all right: {out['all_right']}"
          f"  classes compiled {compiled} (met {len(classes_met)})  class/static over {len(modeled)} sizes: "
          f"{out['best_ratio']:.3f}–{out['worst_ratio']:.3f}  bind+class {out['host_us_median']:.1f} us  ({out['wall_s']} s)")  # fmt: skip
    return out


def compact(text: str) -> str:
    """JSON text with each innermost object (a row) on one line."""
    return re.sub(r"\{[^{}\[\]\"]*(?:\"[^\"]*\"[^{}\[\]\"]*)*\}", lambda m: " ".join(m.group(0).split()), text)


def main() -> int:
    warnings.simplefilter("ignore", pn.EmulatorWarning)
    entries = {"pn": panamera_entry, "torch": torch_entry, "onnx": onnx_entry}
    chosen = sys.argv[1:] or list(entries)
    results = [sweep(n, entries[n]) for n in chosen]
    meta = {"machine": f"{platform.machine()} CPU (emulator), shared and loaded",
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "modeled_on": "H100 spec"}  # fmt: skip
    Path(__file__).with_name("entry_sweep.json").write_text(
        compact(json.dumps({**meta, "entries": results}, indent=1)) + "\n"
    )
    ok = all(r["all_right"] and r["one_compile_per_class"] and r["worst_ratio"] <= 1.05 for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
