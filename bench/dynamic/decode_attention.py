"""A 256-token decode loop of fused attention over a growing KV cache (issue 22, item 4).

One symbolic program `pn.nn.attention(q, k, v)` with k, v of shape (1, 12, T, 64) (GPT-2 small's
heads), called at T = 1 ... 256 on the emulator: every result checked against numpy float64; the
size classes met, the classes planned and compiled (one per class), the distinct kernel sources
built (classes with the same split and merge share one), and each class's split, merge and worst
modeled ratio to the static plan over the class (H100 spec; modeled, nothing launched on a GPU).

    PYTHONPATH=. python bench/dynamic/decode_attention.py [tokens]
"""

from __future__ import annotations

import sys
import time

import numpy as np

import panamera as pn
from panamera.runtime import emulator


def main(tokens: int = 256, heads: int = 12, d: int = 64) -> None:
    rng = np.random.default_rng(0)
    q = pn.placeholder((1, heads, 1, d), name="q")
    kv = [pn.placeholder((1, heads, "T", d), name=n) for n in ("k", "v")]
    k = pn.compile(pn.nn.attention(q, *kv), target="emulator", cache=False)
    cache = rng.standard_normal((2, 1, heads, tokens, d)).astype(np.float32)
    worst, t0 = 0.0, time.perf_counter()
    builds0 = len(emulator._by_source)
    for t in range(1, tokens + 1):
        a = rng.standard_normal((1, heads, 1, d)).astype(np.float32)
        kk, vv = np.ascontiguousarray(cache[0, :, :, :t]), np.ascontiguousarray(cache[1, :, :, :t])
        s = a.astype(np.float64) @ kk.transpose(0, 1, 3, 2) / np.sqrt(d)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = (p / p.sum(-1, keepdims=True)) @ vv
        worst = max(worst, float(np.abs(k(a, kk, vv) - want).max()))
    wall = time.perf_counter() - t0
    st = k.stats()
    print(f"decode loop: {tokens} tokens, {heads} heads, d {d}, formulation {k.program.formulations}")
    print(f"programs compiled {st['programs_compiled']}, classes planned {st['classes_planned']}, "
          f"classes compiled {st['classes_compiled']}, kernel sources built {len(emulator._by_source) - builds0}, "
          f"calls {st['calls']}")  # fmt: skip
    print(f"max abs error vs numpy float64: {worst:.2e}; emulator wall {wall:.1f} s (compiles included)")
    print(k.explain())


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
