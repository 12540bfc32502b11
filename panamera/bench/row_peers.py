"""The fastest published row kernels as peers: QuACK and Liger-Kernel, each planned from its own
source's rules and modeled by the same model as Panamera (peers.py beside it explains peers).

- **QuACK** (repository Dao-AILab/quack, `quack/reduction_base.py` `ReductionBase._get_tv_layout`,
  `_get_num_threads`; `quack/rmsnorm.py`, `softmax.py`, `cross_entropy.py`
  `_calculate_threads_per_row`, `_set_cluster_n`): 128-bit vector copies; 8, 16, 32, 64, 128 or 256
  threads per row for rows up to 64, 128, 3072, 6144, 16384 elements and beyond; 128 threads per
  block up to 16384 elements, else 256; a 16-bit row longer than 16K elements is split over a
  thread-block cluster of 2, 4, 8 or 16 blocks (up to 32K, 64K, 128K, longer) that reduce through
  distributed shared memory. Every thread loads its whole share of the row before reducing (the row
  stays in registers and shared memory), so the row is read from DRAM once and written once. Its
  registers per thread are not known (its CuTe-DSL kernels were not compiled here): its residency is
  bound by threads and the staged rows' shared memory alone.
- **Liger-Kernel** (repository linkedin/Liger-Kernel, `src/liger_kernel/ops/utils.py`
  `calculate_settings`; `ops/rms_norm.py`, `ops/layer_norm.py`, `ops/softmax.py` forward kernels):
  one Triton program per row, BLOCK_SIZE = next_power_of_2(n_cols) (at most 65536), num_warps 4,
  then 8 from 2048, 16 from 8192 and 32 from 32768; the row is held in registers across the
  reductions (one DRAM read), the normalized row written once with the per-row statistics
  (RMSNorm: rstd; LayerNorm: mean and rstd, fp32). Where the row outgrows the registers the
  compiler spills: `LIGER_SPILLS`, model/spill.py.

Neither peer has a kernel for other patterns (None: nothing is invented for it).
"""

from __future__ import annotations

from ..model.gpu import GPUSpec
from ..model.spill import Spill
from ..schedule.cluster import MBARRIER_INIT_CYCLES, reduce_cycles
from .peer_plan import PeerPlan, _plan, cdiv, kernel, next_pow2
from .peer_work import Work

ROW_PATTERNS = ("rms_norm", "softmax", "cross_entropy", "layer_norm")


def quack_config(N: int, elem: int) -> dict:
    """QuACK's launch of one row kernel over rows of N elements of `elem` bytes."""
    tpr = 8 if N <= 64 else 16 if N <= 128 else 32 if N <= 3072 else 64 if N <= 6144 else 128 if N <= 16384 else 256
    threads = 128 if N <= 16384 else 256
    row_kb = N * elem / 1024  # the 16-bit thresholds (16K, 32K, 64K, 128K elements) as row bytes
    cluster = 1 if row_kb <= 32 else 2 if row_kb <= 64 else 4 if row_kb <= 128 else 8 if row_kb <= 256 else 16
    vec = 16 // elem
    per_thread = max(vec, cdiv(N, tpr * cluster))  # elements each thread holds
    return {"threads_per_row": tpr, "threads": threads, "rows_per_block": max(1, threads // tpr),
            "cluster_n": cluster, "vec": vec, "per_thread": per_thread}  # fmt: skip


def quack(w: Work, gpu: GPUSpec) -> PeerPlan | None:
    if w.pattern not in ("rms_norm", "softmax", "cross_entropy") or w.N % max(1, 16 // w.in_bytes):
        return None
    M, N, e = w.M, w.N, w.in_bytes
    c = quack_config(N, e)
    params = N * e if w.pattern == "rms_norm" else 0
    written = M * N * w.out_bytes if w.pattern != "cross_entropy" else M * (w.out_bytes + 4)  # loss, lse
    blocks = cdiv(M, c["rows_per_block"]) * c["cluster_n"]
    # the block reduction, plus the cluster's exchange through distributed shared memory: the warps'
    # partials pushed into every block, completed by an mbarrier (quack/reduce.py cluster_reduce),
    # and its set-up once, as Panamera's (quack/reduction_base.py `_initialize_cluster`: mbarrier_init,
    # mbarrier_init_fence, arrive_and_expect_tx, then the relaxed cluster arrive)
    epilogue = 400 + (reduce_cycles(barrier=False) + MBARRIER_INIT_CYCLES if c["cluster_n"] > 1 else 0)
    ln = kernel(f"quack_{w.pattern}", read=M * N * e + params, written=written, blocks=blocks, threads=c["threads"],
                in_flight=c["per_thread"] * e, epilogue=epilogue, sfu=M * N if w.pattern != "rms_norm" else 0.0,
                round_trips=2 if w.pattern == "cross_entropy" else 1,  # the target's index, then its logit
                # sX: the block's rows staged by cp.async (quack/*.py `smem.allocate_tensor(.., tiler_mn)`)
                shared=c["rows_per_block"] * cdiv(N, c["cluster_n"]) * e)  # fmt: skip
    what = (f"QuACK {w.pattern}: {c['threads_per_row']} threads per row, {c['rows_per_block']} rows per block, "
            f"cluster {c['cluster_n']}, row kept on chip")  # fmt: skip
    return _plan("quack", [ln], what, **c)


def liger_settings(n: int) -> tuple[int, int] | None:
    """calculate_settings: (BLOCK_SIZE, num_warps); None above its 65536-element limit."""
    block = next_pow2(n)
    if block > 65536:
        return None
    warps = 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4
    return block, warps


# ptxas -v of Liger's forward kernels for sm_90a (Triton 3.3.1, PyTorch 2.7.1's, as in the QuACK blog's runs;
# rms_norm from v0.5.10 in its default llama casting mode, softmax's single-block kernel), compiled here with
# `calculate_settings`' BLOCK_SIZE and num_warps. Registers per thread by (pattern, BLOCK_SIZE, element bytes):
# Triton declares .maxntid (num_warps x 32), so 1024 threads get at most 64; 16 warps at 16384 take 80 (softmax)
# and 124 (RMSNorm), one block per SM.
LIGER_REGISTERS = {
    ("softmax", 256, 2): 17, ("softmax", 512, 2): 19, ("softmax", 1024, 2): 28, ("softmax", 2048, 2): 28,
    ("softmax", 4096, 2): 47, ("softmax", 8192, 2): 40, ("softmax", 16384, 2): 80, ("softmax", 32768, 2): 53,
    ("softmax", 65536, 2): 64,
    ("softmax", 256, 4): 16, ("softmax", 512, 4): 19, ("softmax", 1024, 4): 27, ("softmax", 2048, 4): 28,
    ("softmax", 4096, 4): 47, ("softmax", 8192, 4): 40, ("softmax", 16384, 4): 79, ("softmax", 32768, 4): 64,
    ("softmax", 65536, 4): 64,
    ("rms_norm", 256, 2): 18, ("rms_norm", 512, 2): 22, ("rms_norm", 1024, 2): 31, ("rms_norm", 2048, 2): 32,
    ("rms_norm", 4096, 2): 58, ("rms_norm", 8192, 2): 59, ("rms_norm", 16384, 2): 124, ("rms_norm", 32768, 2): 64,
    ("rms_norm", 65536, 2): 64,
    ("rms_norm", 256, 4): 18, ("rms_norm", 512, 4): 23, ("rms_norm", 1024, 4): 31, ("rms_norm", 2048, 4): 32,
    ("rms_norm", 4096, 4): 60, ("rms_norm", 8192, 4): 61, ("rms_norm", 16384, 4): 124, ("rms_norm", 32768, 4): 64,
    ("rms_norm", 65536, 4): 64,
}  # fmt: skip
# Their spills per thread (model/spill.py); every other bf16 or fp32 configuration of 256-65536 elements compiles
# without. At 65536 each of the 1024 threads holds 64 values of the row while the register file allows it 64.
LIGER_SPILLS = {
    ("softmax", 8192, 2): Spill(8, 8, 8),
    ("softmax", 65536, 2): Spill(390, 416, 336),
    ("rms_norm", 32768, 2): Spill(44, 44, 48),
    ("rms_norm", 65536, 2): Spill(702, 720, 688),
    ("softmax", 8192, 4): Spill(4, 4, 8),
    ("softmax", 65536, 4): Spill(248, 296, 224),
    ("rms_norm", 32768, 4): Spill(48, 48, 48),
    ("rms_norm", 65536, 4): Spill(612, 640, 592),
}


def liger(w: Work, gpu: GPUSpec) -> PeerPlan | None:
    if w.pattern not in ("rms_norm", "layer_norm", "softmax", "cross_entropy"):
        return None
    s = liger_settings(w.N)
    if s is None:
        return None
    M, N, e = w.M, w.N, w.in_bytes
    block, warps = s
    if w.pattern == "cross_entropy":  # ops/cross_entropy.py: two passes over the row (online max/sum, then
        # the gradient written in place), BLOCK_SIZE min(65536 // 2, next_pow2(V)), 32 warps
        block, warps = min(32768, next_pow2(N)), 32
        ln = kernel("liger_cross_entropy_kernel", read=M * N * e, written=M * N * e + M * 4, blocks=M,
                    threads=32 * warps, in_flight=max(1, block // (32 * warps)) * e, l2=M * N * e, sfu=2 * M * N)  # fmt: skip
        return _plan("liger", [ln], f"Liger cross_entropy: one program per row, BLOCK_SIZE {block}, {warps} warps",
                     block_size=block, num_warps=warps)  # fmt: skip
    params = {"rms_norm": N * e, "layer_norm": 2 * N * e}.get(w.pattern, 0)
    stats = {"rms_norm": 4, "layer_norm": 8}.get(w.pattern, 0) * M
    # ops/rms_norm.py: short rows (BLOCK_SIZE <= 256) of many (>= 32K) go BLOCK_ROW = 16 per program
    rows = 16 if w.pattern == "rms_norm" and block <= 256 and M >= 4096 * 8 else 1
    ln = kernel(f"liger_{w.pattern}_forward", read=M * N * e + params, written=M * N * w.out_bytes + stats,
                blocks=cdiv(M, rows), threads=32 * warps, in_flight=max(1, rows * block // (32 * warps)) * e,
                sfu=M * N if w.pattern == "softmax" else 0.0,
                spill=LIGER_SPILLS.get((w.pattern, block, e)) if rows == 1 else None,
                registers=LIGER_REGISTERS.get((w.pattern, block, e), 0) if rows == 1 else 0)  # fmt: skip
    per = "one program per row" if rows == 1 else f"{rows} rows per program"
    return _plan("liger", [ln], f"Liger {w.pattern}: {per}, BLOCK_SIZE {block}, {warps} warps",
                 block_size=block, num_warps=warps, rows_per_program=rows)  # fmt: skip


ROW_PEERS = {"quack": quack, "liger": liger}
