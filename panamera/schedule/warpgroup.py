"""Hopper's warpgroup MMAs (wgmma.mma_async, sm_90a) as a tensor-core tile kind: which tiles
schedule/tc_tiling.py may offer and replay may accept (`wgmma_error`'s numbered preconditions).

A warpgroup is 4 warps; each of a block's 1-2 warpgroups owns 64 rows x N columns of the block's
outputs and issues BK / k MMAs per K slab, A and B read from shared memory through matrix
descriptors (codegen/wgmma_kernel.py `wgmma_slab`, runtime/wgmma_emulation.h): m64nNk16 with f32
accumulators for f16 / bf16 operands, m64nNk32 with s32 accumulators for s8 x s8 (`WGMMA_K`: 32
bytes of K either way). mma.sync reaches about half of Hopper's tensor-core peak; wgmma issues at
the full rate (model/library.py).

>>> from panamera.model import A100, H100
>>> wgmma_error(H100, Mma.BF16, (4, 2, 64, 1, 4), 8) is None, wgmma_error(A100, Mma.BF16, (4, 2, 64, 1, 4), 8)[:2]
(True, '1:')
"""

from __future__ import annotations

import math

from ..model.gpu import GPUSpec
from .decision import MmaOp  # the tile kinds, owned by the Decision that carries them
from .tensor_core import FRAG, Mma, Operands

WGMMA_N = (32, 64, 128)  # a warpgroup's columns (wgmma's N): N / 2 accumulators per thread
WARPGROUPS = (1, 2)  # warpgroups per block, side by side along the columns (each its own N)
CORE_ROW_BYTES = 16  # a core matrix is 8 rows of 16 bytes: 8 k of a 16-bit operand, 16 of s8
WGMMA_K = {Mma.F16: 16, Mma.BF16: 16, Mma.S8: 32}  # each kind's MMA K (m64nNk16, m64nNk32): 32 bytes


def wgmma_vec(kind: Mma) -> int:
    """The most lanes a staging step may take: one row of a core matrix (8 for 16-bit, 16 for s8)."""
    return CORE_ROW_BYTES // kind.itemsize


def warpgroup_tiles(ops: Operands, gpu: GPUSpec, vec: int) -> list[tuple[int, int, int, int, MmaOp]]:
    """(4, G, 1, N / 16, wgmma): G warpgroups (`WARPGROUPS`) of 64 rows x N columns each
    (`WGMMA_N`), the block's G x N columns no wider than the first that covers the operand's,
    where `wgmma_error`'s preconditions hold."""
    cols = math.ceil(ops.cols / FRAG) * FRAG
    out = []
    for g in WARPGROUPS:
        for n in WGMMA_N:
            if g * n > WGMMA_N[0] and g * n // 2 >= cols:  # a narrower block covers the columns already
                continue
            if wgmma_error(gpu, ops.kind, (4, g, 32, 1, n // FRAG), vec) is None:
                out.append((4, g, 1, n // FRAG, MmaOp.WGMMA))
    return out


def wgmma_error(gpu: GPUSpec, kind: Mma, tile: tuple[int, ...], vec: int) -> str | None:
    """Why a warpgroup-MMA tile (`Decision.mma_tile`, staged `vec` lanes a step) cannot run, as
    "N: why", or None (one negative test each in tests/test_wgmma.py):
      1. the GPU has warpgroup MMAs (`GPUSpec.warpgroup_mma`: sm_90a);
      2. the operands are a kind wgmma reads from shared memory here (`WGMMA_K`: f16, bf16, s8);
      3. the tile is warpgroups side by side: mma_tile (4, G, K slab, 1, N / 16), G one of
         `WARPGROUPS`, N one of `WGMMA_N`, the K slab a multiple of the MMA's K (16, s8's 32);
      4. a staging step's `vec` lanes stay in one row of a core matrix (at most `wgmma_vec`)."""
    if not gpu.warpgroup_mma:
        return f"1: {gpu.name} has no warpgroup MMAs (wgmma is sm_90a's)"
    if kind not in WGMMA_K:
        return f"2: {kind} operands (warpgroup tiles take {', '.join(map(str, WGMMA_K))})"
    t = tile
    if len(t) != 5 or t[0] != 4 or t[1] not in WARPGROUPS or t[3] != 1 or FRAG * t[4] not in WGMMA_N:
        return f"3: mma_tile {t} is not (4, warpgroups {WARPGROUPS}, K slab, 1, N / 16) with N in {WGMMA_N}"
    if t[2] < WGMMA_K[kind] or t[2] % WGMMA_K[kind]:
        return f"3: a K slab of {t[2]} is not a multiple of {kind}'s MMA K {WGMMA_K[kind]}"
    if vec > wgmma_vec(kind):
        return f"4: {vec} lanes per staging step cross a core matrix's row of {wgmma_vec(kind)}"
    return None


# registers per thread of a warpgroup-MMA block [fitted]: least squares over 48 ptxas -v reports
# (nvcc, sm_90a; fp16, int8 and int4 weights; G 1-2, N 32-128, K slab 32-128, split 1-2; 0 spills):
# rms 8, worst 33 under and 17 over. The accumulators (N / 2 fp32 per thread) and the K slab's
# staging dominate: 16-bit operands copied raw hold more per slab than weights loaded first
# (tc_tiling.loads_first: int8 / int4, dequantized in registers); a split adds its partials' merge.
# s8 x s8 copied raw holds half the bytes of 16-bit operands per 16 of K: its raw term is halved
# [assumed: the copies' registers scale with their bytes]; against 20 ptxas -v reports of s8 tiles
# (64 x 4096 x 4096, sm_90a, G 1-2, N 32-128, slab 32-128, split 1-2) it is rms 15 registers, 7 under
# to 31 over (not halved: rms 27, 1 under to 43 over): s8 tiles are rated conservatively.
REG_BASE, REG_PER_ACC, REG_SPLIT = 19.0, 1.6, 15.0
REG_PER_K16 = {False: 5.3, True: 2.6}  # per 16 of the K slab: raw 16-bit copies, or weights loaded first


def registers(tile: tuple[int, ...], split: int, loads_first: bool, kind: Mma = Mma.F16) -> int:
    """Estimated registers per thread of a warpgroup-MMA block (`REG_*`, fitted): what bounds how
    many such blocks an SM holds beside their threads and shared memory (GPUSpec.resident_blocks).
    Operands of `kind` copied raw (not `loads_first`) count by their bytes.

    >>> registers((4, 2, 128, 1, 2), 2, True), registers((4, 1, 32, 1, 8), 1, False)  # ptxas: 72, 128
    (81, 132)
    >>> registers((4, 1, 128, 1, 4), 1, False, Mma.S8)  # ptxas: 70
    92
    """
    n = tile[4] * FRAG
    per_k = REG_PER_K16[loads_first] * tile[2] / FRAG * (1.0 if loads_first else kind.itemsize / 2)
    return min(255, math.ceil(REG_BASE + REG_PER_ACC * n / 2 + per_k + (REG_SPLIT if split > 1 else 0.0)))
