"""A decode loop of whole models through `torch.compile(backend="panamera")` (issue 22, the decode target):
small GPT-2 and LLaMA-like models from transformers (`GPT2Config` / `LlamaConfig`, random weights,
a few layers, small hidden so the emulator copes), a KV cache (transformers' `DynamicCache`) that
grows by one each token. Per token: dynamo's graphs (and its guard failures: why it recompiled),
Panamera's new programs and the size classes they compiled, and the logits against the model in
float64 (every token checked; tolerance derived below). Greedy decoding driven by the float64
model, so both see the same tokens.

Tolerance per token: Panamera's max |logit - float64| no more than twice eager float32's plus one
float32 reduction's tolerance over the longest reduction (hidden size or the KV length):
2 * eager_err + (2 eps + 8 eps sqrt(n)) * max(1, |logits|), eps = 2^-23 (as tests/conftest.py).

CPU tensors, target "emulator": the kernels run on Panamera's emulator (g++), so wall times are
measured on this CPU and say nothing of a GPU; the compile counts are what a GPU run does too.

    PYTHONPATH=. python bench/dynamic/decode_hf.py --model gpt2 --tokens 256     # writes decode_gpt2.json
    PYTHONPATH=. python bench/dynamic/decode_hf.py --model llama --tokens 256    # writes decode_llama.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import re
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import torch

import panamera as pn
import panamera.torch_backend as tb

EPS = 2.0**-23


def build(kind: str, layers: int, hidden: int, heads: int):
    """A small causal LM with random weights (seeded), eager attention, and its config."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    common = {"vocab_size": 256, "attn_implementation": "eager"}
    if kind == "gpt2":
        cfg = GPT2Config(n_positions=1024, n_embd=hidden, n_layer=layers, n_head=heads, bos_token_id=0,
                         eos_token_id=0, **common)  # fmt: skip
        return GPT2LMHeadModel(cfg).eval(), cfg
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=1024,
                      bos_token_id=0, eos_token_id=0, **common)  # fmt: skip
    return LlamaForCausalLM(cfg).eval(), cfg


def guard_failures() -> list[str]:
    """dynamo's recorded guard failures (why it recompiled a frame), as text."""
    from torch._dynamo.utils import guard_failures as failures

    return [str(r) for reasons in failures.values() for r in reasons]


def run(kind: str, tokens: int, prompt: int, layers: int, hidden: int, heads: int) -> dict:
    from transformers import DynamicCache

    torch.manual_seed(0)
    torch._dynamo.reset()
    tb.reset_stats()
    model, cfg = build(kind, layers, hidden, heads)
    ref = copy.deepcopy(model).double()
    f = torch.compile(model, backend="panamera", options={"target": "emulator"})
    caches = [DynamicCache(config=cfg) for _ in range(3)]  # panamera, eager float32, float64
    ids = torch.randint(0, cfg.vocab_size, (1, prompt))
    rows = []
    with torch.no_grad():
        for step in range(tokens + 1):  # the prompt (prefill), then `tokens` decode steps
            s0 = tb.stats()
            before = (s0.graphs, s0.programs, s0.size_classes, len(s0.specializations))
            t0 = time.perf_counter()
            got = f(input_ids=ids, past_key_values=caches[0], use_cache=True).logits
            wall = time.perf_counter() - t0
            eager = model(input_ids=ids, past_key_values=caches[1], use_cache=True).logits
            want = ref(input_ids=ids, past_key_values=caches[2], use_cache=True).logits
            kv = caches[2].get_seq_length()
            scale = max(1.0, want.abs().max().item())
            err = (got.double() - want).abs().max().item() / scale
            eager_err = (eager.double() - want).abs().max().item() / scale
            tol = 2 * eager_err + 2 * EPS + 8 * EPS * max(hidden, kv) ** 0.5
            s = tb.stats()
            rows.append({
                "step": step, "kv_length": kv, "wall_s": round(wall, 4),
                "dynamo_graphs": s.graphs - before[0], "panamera_programs": s.programs - before[1],
                "size_classes": s.size_classes - before[2], "per_shape": len(s.specializations) - before[3],
                "rel_err": err, "eager_rel_err": eager_err, "tol": tol, "ok": err <= tol,
            })  # fmt: skip
            ids = want[:, -1:].argmax(-1)
    s = tb.stats()
    last_program = max((r["step"] for r in rows if r["panamera_programs"] or r["dynamo_graphs"]), default=None)
    warm = sorted(r["wall_s"] for r in rows if not (r["size_classes"] or r["dynamo_graphs"] or r["per_shape"]))
    return {
        "model": kind, "layers": layers, "hidden": hidden, "heads": heads, "prompt": prompt, "tokens": tokens,
        "machine": f"{platform.machine()} {platform.processor() or ''} (CPU, emulator; shared, loaded)".strip(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "dynamo_graphs": s.graphs, "dynamo_recompiles": s.recompiles, "guard_failures": guard_failures(),
        "graph_modes": [[r.compile_id, [sub.mode for sub in r.subgraphs]] for r in s.reports],
        "panamera_programs": s.programs, "symbolic_programs": s.symbolic_programs, "size_classes": s.size_classes,
        "per_shape": [[name, str(shapes), why] for name, shapes, why in s.specializations],
        "eager_ops": sorted({op for op, _ in s.eager}),
        "last_step_with_a_new_program": last_program,
        "steps_that_compiled_a_class": [r["step"] for r in rows if r["size_classes"]],
        "all_tokens_right": all(r["ok"] for r in rows), "max_rel_err": max(r["rel_err"] for r in rows),
        "max_err_over_tol": max(r["rel_err"] / r["tol"] for r in rows),
        "warm_step_wall_s_median": warm[len(warm) // 2] if warm else None,
        "describe": s.describe().splitlines(), "steps": rows,
    }  # fmt: skip


def compact(text: str) -> str:
    """JSON text with each innermost object (a row) on one line."""
    return re.sub(r"\{[^{}\[\]\"]*(?:\"[^\"]*\"[^{}\[\]\"]*)*\}", lambda m: " ".join(m.group(0).split()), text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    warnings.simplefilter("ignore", pn.EmulatorWarning)
    import transformers

    transformers.logging.set_verbosity_error()
    out = run(args.model, args.tokens, args.prompt, args.layers, args.hidden, args.heads)
    for key, value in out.items():
        if key not in ("describe", "steps"):
            print(f"{key}: {value}")
    path = Path(args.out or Path(__file__).with_name(f"decode_{args.model}.json"))
    path.write_text(compact(json.dumps(out, indent=1)) + "\n")
    return 0 if out["all_tokens_right"] and out["per_shape"] == [] else 1


if __name__ == "__main__":
    sys.exit(main())
