"""Scale benchmark (issue 20, item 4): `panamera optimize` on a full-size transformer built from its
config (random weights, no download): wall time and peak memory (/usr/bin/time -v's maximum
resident set), against the model's weight bytes. Not a test: figures go to bench/scale/README.md.

    python bench/scale/run.py [--family gpt2|llama] [--layers 12 --hidden 768 --heads 12 --seq 128]
                              [--kv-heads 4 --ffn 5632] [--deploy] [--work /tmp/panamera-scale]

GPT-2 small by default (12 layers, 768 wide, sequence 128: 124 M parameters, 0.5 GB in float32);
`--family llama --layers 22 --hidden 2048 --heads 32` is a 1B-parameter LLaMA-like config (4 GB:
external data). `--deploy` also writes the deployable folder and times loading it in a fresh
process. Needs torch and transformers (the dev extra) to export the model once (TorchScript exporter).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def export_gpt2(path: str, layers: int, hidden: int, heads: int, seq: int) -> None:
    import warnings

    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=max(seq, 1024), use_cache=False)
    model = tf.GPT2Model(cfg).eval()

    class Last(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask, return_dict=True).last_hidden_state

    ids = torch.randint(0, cfg.vocab_size, (1, seq))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Last(model), (ids, torch.ones_like(ids)), path, input_names=["input_ids", "attention_mask"],
                          output_names=["out"], opset_version=18, dynamo=False)  # fmt: skip


def export_llama(path: str, layers: int, hidden: int, heads: int, seq: int, kv_heads: int, ffn: int) -> None:
    """A LLaMA-like decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) with random weights;
    models over 2 GB are written with external data (a `.data` file beside the .onnx)."""
    import warnings

    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max(seq, 2048),
                         use_cache=False)  # fmt: skip
    model = tf.LlamaModel(cfg).eval()

    class Last(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask, return_dict=True).last_hidden_state

    ids = torch.randint(0, cfg.vocab_size, (1, seq))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Last(model), (ids, torch.ones_like(ids)), path, input_names=["input_ids", "attention_mask"],
                          output_names=["out"], opset_version=18, dynamo=False)  # fmt: skip


def timed(cmd: list[str]) -> tuple[float, float, int, str]:
    """(wall s, peak RSS GB, exit status, tail of the output) of `cmd` under /usr/bin/time -v."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    return wall, int(rss.group(1)) / 2**20 if rss else float("nan"), p.returncode, (p.stdout + p.stderr)[-2000:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--export-only", action="store_true")
    ap.add_argument("--deploy", action="store_true", help="optimize --out a folder, then time loading it afresh")
    ap.add_argument("--family", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--kv-heads", type=int, default=4, help="llama: key/value heads (grouped-query attention)")
    ap.add_argument("--ffn", type=int, default=5632, help="llama: the MLP's intermediate size")
    ap.add_argument("--work", default="/tmp/panamera-scale")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    where = os.path.join(a.work, f"{a.family}-{a.layers}x{a.hidden}-s{a.seq}")  # with its external data, if any
    path = os.path.join(where, "model.onnx")
    os.makedirs(where, exist_ok=True)
    if not os.path.exists(path):
        t0 = time.perf_counter()
        if a.family == "gpt2":
            export_gpt2(path, a.layers, a.hidden, a.heads, a.seq)
        else:
            export_llama(path, a.layers, a.hidden, a.heads, a.seq, a.kv_heads, a.ffn)
        print(f"exported {path} in {time.perf_counter() - t0:.0f} s", flush=True)
    if a.export_only:
        return 0
    gb = sum(os.path.getsize(os.path.join(where, f)) for f in os.listdir(where)) / 2**30
    py = sys.executable
    print(f"model {path}: {gb:.2f} GB on disk", flush=True)
    cmd = [py, "-m", "panamera.cli", "optimize", path, "--target", "emulator"]
    if a.deploy:
        out = os.path.join(where, "deployable")
        cmd += ["--out", out, "--force"]
    wall, rss, rc, tail = timed(cmd)
    print(f"{' '.join(cmd[3:])}: {wall:.1f} s wall, peak RSS {rss:.2f} GB ({rss / gb:.2f}x the weights), exit {rc}")
    print("  " + next((ln for ln in tail.splitlines() if ln.startswith("Whole model")), tail[-300:]), flush=True)
    if rc or not a.deploy:
        return rc
    load = f"from panamera.subgraph import load_optimized; load_optimized({out!r}, target='emulator')"
    wall, rss, rc, tail = timed([py, "-c", load])
    print(f"load_optimized(folder) in a fresh process: {wall:.1f} s wall, peak RSS {rss:.2f} GB, exit {rc}")
    if rc:
        print(tail)
    return rc


if __name__ == "__main__":
    sys.exit(main())
