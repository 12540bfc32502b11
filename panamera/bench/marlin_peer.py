"""Marlin, int4 weights x fp16 activations on tensor cores, planned from its own rules and
modeled by the same model as Panamera (contraction_peers.py registers it as `marlin`).

Source: IST-DASLab/marlin `marlin/marlin_cuda_kernel.cu` (read, nothing copied):
- `marlin_cuda`: a block tile of thread_k x thread_n = 128 x 128 weights when prob_m <= 16, else
  64 x 256; 256 threads (`THREADS`); 4 cp.async stages (`STAGES`); one block per SM (`blocks =
  sms`). Rows go in 16-row m blocks, at most 4 per launch; beyond, `par` 64-row problems side by
  side in one launch (at most `max_par` 16), the rest in further launches. Shapes with N % thread_n
  or K % thread_k have no kernel (ERR_PROB_SHAPE); groups are -1 (per column) or 128.
- `Marlin`: the k_tiles x n_tiles (x par) tiles are cut into stripes of `iters` consecutive tiles,
  k fastest, iters = ceil(tiles / gridDim.x) rounded up to whole scale groups (group_blocks /
  thread_k_blocks); a block with no tile exits. A column slice that several blocks share is
  reduced serially in L2 through the fp16 output (`barrier_acquire` on the slice's lock,
  `global_reduce`, `barrier_release`): per block after the first [derived from the code] one L2
  round trip for the lock, one for reading C, one for the release fence; the first writes only.
- Issue: per 32-bit word of 8 weights `dequant` twice (2 `lop3`, `__hsub2`, `__hfma2`), one shift
  and the group `scale` (2 `__hmul2` per 4 weights and a broadcast): 14 instructions [counted],
  `OPS_PER_WEIGHT`; the MMAs (`mma.sync` m16n8k16) on thread_m_blocks x 16 rows, padded, at
  model/library.py's `mma_sync_peak`, which kernel_time takes as the tensor cores' issue term.

>>> from panamera.bench.contraction_peers import Linear
>>> from panamera.model import H100
>>> marlin_config(Linear(1, 4096, 4096, "int4", group=128), H100)[0]
{'thread_k': 128, 'thread_n': 128, 'm_blocks': 1, 'par': 1, 'iters': 8, 'blocks': 128, 'chain': 4}
"""

from __future__ import annotations

import dataclasses

from ..model.gpu import GPUSpec
from .contraction_peers import ContractionPlan, Linear, _contraction_plan
from .peer_plan import cdiv, kernel

THREADS = 256
STAGES = 4
MAX_PAR = 16
OPS_PER_WEIGHT = 14 / 8  # dequant x 2, a shift and the group scale per word of 8 weights [counted]


def _tile(M: int) -> tuple[int, int]:
    """(thread_k, thread_n): marlin_cuda's default for the whole problem's prob_m."""
    return (128, 128) if M <= 16 else (64, 256)


def _stripes(k_tiles: int, n_tiles: int, par: int, group_step: int, sms: int) -> tuple[int, int, int]:
    """(iters, active blocks, the longest serial reduction chain of a column slice)."""
    tiles = k_tiles * n_tiles * par
    iters = cdiv(tiles, sms)
    iters = group_step * cdiv(iters, group_step)
    blocks = cdiv(tiles, iters)
    per_col: dict[int, int] = {}
    for b in range(blocks):
        first, last = b * iters, min(tiles, (b + 1) * iters) - 1
        for col in range(first // k_tiles, last // k_tiles + 1):
            per_col[col] = per_col.get(col, 0) + 1
    return iters, blocks, max(per_col.values())


def marlin_config(c: Linear, gpu: GPUSpec) -> list[dict] | None:
    """Each launch's tile, m blocks, parallel problems, stripe length, active blocks and serial
    reduction chain; None where Marlin has no kernel for the workload."""
    thread_k, thread_n = _tile(c.M)
    if c.weights != "int4" or c.act != "float16" or c.group not in (128, c.K) or c.N % thread_n or c.K % thread_k:
        return None
    group_step = max(1, 128 // thread_k) if c.group == 128 else 1  # group_blocks / thread_k_blocks
    tot = cdiv(c.M, 16)
    pad = 16 * tot - c.M
    out, i = [], 0
    while i < tot:
        mb, par = tot - i, 1
        if mb > 4:
            par = min(MAX_PAR, (16 * mb - pad) // 64)
            i += 4 * (par - 1)
            mb = 4
        iters, blocks, chain = _stripes(c.K // thread_k, c.N // thread_n, par, group_step, gpu.sms)
        out.append({"thread_k": thread_k, "thread_n": thread_n, "m_blocks": mb, "par": par, "iters": iters,
                    "blocks": blocks, "chain": chain})  # fmt: skip
        i += 4
    return out


def marlin(c, gpu: GPUSpec) -> ContractionPlan | None:
    """Marlin's launches for int4 (group 128 or per column) weights and fp16 activations."""
    cfgs = marlin_config(c, gpu) if isinstance(c, Linear) else None
    if cfgs is None:
        return None
    launches, done = [], 0
    for f in cfgs:
        rows = min(c.M - done, 16 * f["m_blocks"] * f["par"])
        done += rows
        tk, tn, mb = f["thread_k"], f["thread_n"], f["m_blocks"]
        a_bytes, out = rows * c.K * 2, rows * c.N * 2
        n_tiles = c.N // tn
        stage = tk * tn // 2 + 16 * mb * tk * 2 + tn * 2  # weights, activations, a row of scales
        c_tile = 16 * mb * tn * 2
        ln = kernel("Marlin", read=a_bytes + c.weight_bytes + c.scale_bytes, written=out, blocks=f["blocks"],
                    threads=THREADS, in_flight=(STAGES - 1) * stage / THREADS,
                    l2=(n_tiles - 1) * a_bytes + 2 * (f["chain"] - 1) * c_tile * n_tiles * f["par"],
                    epilogue=400 + (3 * f["chain"] - 1) * gpu.l2_latency_cycles if f["chain"] > 1 else 400)  # fmt: skip
        issue = {"fp32_ops": c.N * c.K * f["par"] * OPS_PER_WEIGHT,
                 "mma_flops": 2.0 * 16 * mb * f["par"] * c.N * c.K, "mma_dtype": "float16"}  # fmt: skip
        launches.append(dataclasses.replace(ln, features={**ln.features, **issue}))
    f = cfgs[0]
    what = (f"Marlin {f['thread_k']}x{f['thread_n']} tiles, {f['m_blocks']} m blocks, stripes of {f['iters']} "
            f"tiles on {f['blocks']} blocks, serial L2 reduction of {f['chain']}")  # fmt: skip
    return _contraction_plan("marlin", launches, what, **f)
