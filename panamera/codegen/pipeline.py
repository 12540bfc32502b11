"""The printed pipeline of a ROW/ALL contraction's K loop (schedule/pipeline.py decides it).

The block's step loop replaces isl's per-thread scan: every thread runs the chunk / tx steps
(block-uniform, so the barriers are reached by all), the stage buffers of each read the block's
rows share are filled by `__pipeline_memcpy_async` (16-, 8- or 4-byte copies spread over all
the block's threads), the prologue fills stages - 1 slabs, each step issues the slab stages - 1
ahead, waits for its own (`__pipeline_wait_prior(stages - 1)` + `__syncthreads()`), runs the
thread's iteration where isl's bounds own it, and ends with a barrier before the slab is
refilled (the WAR hazard); the drain waits for every copy. The emulator runs the copies lazily
(runtime/cuda_emulation.h), so a missing wait or barrier reads stale shared memory.

>>> INCLUDE[1]
'#include <cuda_pipeline.h>'
"""

from __future__ import annotations

from ..schedule.pipeline import copy_bytes, staged_reads
from .thread_loop import ThreadLoop

INCLUDE = ("#ifndef PANAMERA_EMULATOR", "#include <cuda_pipeline.h>", "#endif")


def emit_pipeline(loop: ThreadLoop, here: list[int]) -> list[str]:
    """The thread's loop nest for the statements `here`, staged through `m.stages` slabs."""
    g, m = loop.g, loop.m
    S, V, T = m.stages, m.vec, m.tx
    steps = m.chunk // m.tx
    rows, G = m.extents
    fi, fg = m.tasks["i"].formula(), m.tasks["g"].formula()
    out = [f"  // pipeline: {S} stages of the block-shared slab, {steps} block-uniform steps"]
    copies: list[tuple[str, str, str, int, int]] = []  # (stage, input, address, bytes per copy, copies)
    seen: dict[tuple[int, str], str] = {}
    for k, ri in staged_reads(g, m):
        r = g.statements[k].reads[ri]
        addr = loop.address(r.addr)
        key = (r.tensor.uid, addr)
        if key not in seen:
            seen[key] = name = f"pn_stage{len(seen)}"
            b = copy_bytes(g, m, k, ri)
            out.append(f"  __shared__ __align__(16) {r.tensor.dtype.c_type} {name}[{S}][{T * V}];")
            copies.append((name, loop.in_name[r.tensor.uid], addr, b, T * V * r.tensor.dtype.itemsize // b))
        loop.staged[(k, ri)] = f"(&{seen[key]}[pn_k % {S}][tx * {V}])"

    def produce(step: str) -> list[str]:
        """Copy slab `step` (if the block has it) into its stage, then close the batch."""
        body = [f"  if ({step} < {steps}) {{"]
        for name, src, addr, b, n in copies:
            e = T * V // n  # elements per copy
            body += [
                f"    for (int pn_c = ty * {T} + tx; pn_c < {n}; pn_c += {m.threads}) {{",
                f"      const pn_idx pn_s = {step}, pn_e = pn_c * {e};",
                "      pn_idx pn_g0, pn_i0;",
                f"      {{ const pn_idx k = pn_s, tx = 0, ty = 0; pn_g0 = {fg}; pn_i0 = {fi}; }}",
                f"      const pn_idx i = pn_i0, j = pn_g0 * {V} + pn_e;",
                f"      if (j < {G * V}) __pipeline_memcpy_async(&{name}[pn_s % {S}][pn_e], &{src}[{addr}], {b});",
                "    }",
            ]
        return body + ["  }", "  __pipeline_commit();"]

    for s in range(S - 1):  # prologue
        out += produce(str(s))
    out.append(f"  for (int pn_k = 0; pn_k < {steps}; ++pn_k) {{")
    out += ["  " + ln for ln in produce(f"(pn_k + {S - 1})")]
    out += [
        f"    __pipeline_wait_prior({S - 1});  // slab pn_k has landed",
        "    __syncthreads();  // ... for every thread's copies",
        f"    {{ const pn_idx k = pn_k; const pn_idx pn_i = {fi}, pn_g = {fg};",
        f"    if (pn_i < {rows} && pn_g < {G}) {{",
    ]
    out += ["      " + ln for ln in loop.iteration_at("pn_i", "pn_g", here)]
    out += ["    } }", "    __syncthreads();  // the stage is refilled next step (WAR)", "  }"]
    out.append("  __pipeline_wait_prior(0);  // drain")
    return out
