"""Where a split's workspace traffic goes: one rule for every plan that merges through memory.

A split reduction writes a workspace (each block's partials, or the words its atomics merge into)
that a later block or kernel reads back. Its lines are written once: their write-back is DRAM
traffic (`write_bytes`), whenever it happens. The read-back follows the write closely (the last
block of the same kernel, or the next kernel), so it hits in L2 where the whole workspace fits in
half of it (the half an SM's requests reach: the rule of the column partials and the stitched
re-reads, schedule/cost.py); beyond, it comes from DRAM again. A reader that discards the lines it
has read (discard.global.L2) saves the write-back where the workspace fits. Panamera's own plans
(schedule/cost.py, schedule/tc_tiling.py) and the peers' (bench/) all take it from here.

>>> from panamera.model import H100
>>> workspace_traffic(H100, 4 * 2**20)  # 4 MiB of split-K partials: written back, read from L2
{'dram_bytes': 4194304.0, 'write_bytes': 4194304.0, 'l2_bytes': 4194304.0}
>>> workspace_traffic(H100, 32 * 2**20)["dram_bytes"] == 64 * 2**20  # beyond half of L2: both from DRAM
True
"""

from __future__ import annotations

from .gpu import GPUSpec


def workspace_fits(gpu: GPUSpec, nbytes: float) -> bool:
    """Whether a workspace of `nbytes` is read back from L2: it fits in half of it (`GPUSpec.l2_reach`).

    >>> from panamera.model import H100
    >>> workspace_fits(H100, 25 * 2**20), workspace_fits(H100, 25 * 2**20 + 1)
    (True, False)
    """
    return nbytes <= gpu.l2_reach


def workspace_traffic(gpu: GPUSpec, nbytes: float, discarded: bool = False) -> dict[str, float]:
    """kernel_time's byte features of a workspace of `nbytes` written once and read back once:
    `dram_bytes` (the write-back, plus the read where it does not fit), the part of it written
    (`write_bytes`) and the read from L2 (`l2_bytes`). Add them to a kernel's own.

    `discarded`: the reader drops the lines it has read without a write-back (discard.global.L2,
    sm_80+; codegen/tc_partials.py `discard_partials`): where the workspace fits, it never reaches
    DRAM; where it does not, its lines were evicted (written back) before the read.

    >>> from panamera.model import H100
    >>> workspace_traffic(H100, 4 * 2**20, discarded=True)["dram_bytes"]
    0.0
    """
    nbytes = float(nbytes)
    if not nbytes:
        return {"dram_bytes": 0.0, "write_bytes": 0.0, "l2_bytes": 0.0}
    if workspace_fits(gpu, nbytes):
        kept = 0.0 if discarded else nbytes
        return {"dram_bytes": kept, "write_bytes": kept, "l2_bytes": nbytes}
    return {"dram_bytes": 2 * nbytes, "write_bytes": nbytes, "l2_bytes": 0.0}
