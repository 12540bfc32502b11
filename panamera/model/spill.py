"""Register spills: what a kernel whose compiler spilled pays for its local-memory traffic.

ptxas reports, per thread, the bytes of spill stores and spill loads and the stack frame they
live in (`-v`: "N bytes stack frame, S bytes spill stores, L bytes spill loads"); for
straight-line code (one row per thread block, no loop) those are the bytes every thread moves.
Where they go [derived from the figures named; docs/GPU_MODEL.md "Register spills"]:

- L1 (`GPUSpec.l1_per_sm`, the combined L1 / shared memory less the block's shared memory)
  serves the spill loads for the part of the SM's frame (frame per thread x resident threads)
  it holds; the rest, and every spill store (L1 writes through, [assumed] for local memory as
  for global), go to L2 at `l2_bw`.
- The part of the chip's frame (SMs x frame per SM) beyond the L2 (`l2_size`) is written back
  to DRAM and read from it again: those bytes also stream at `eta_write` / `eta` of peak (the
  QuACK blog's NCU profile of Liger's softmax at 65536 elements: "cascading write back to HBM").
- The time adds to the kernel's (`KernelCost.spill_s`): a kernel that spills is register-bound
  at one block per SM, so the spill traffic between a row's load and its store overlaps no
  other block's stream.

>>> from panamera.model import H100
>>> round(spill_s(H100, stores=2**30, loads=2**30, frame_per_sm=64 * 1024, shared=0) * 1e6, 1)  # L1 holds the loads
107.4
>>> spill_s(H100, stores=0, loads=0, frame_per_sm=0, shared=0)
0.0
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpu import GPUSpec


@dataclass(frozen=True)
class Spill:
    """A kernel's register spills per thread, as `ptxas -v` reports them: "`frame` bytes stack
    frame, `stores` bytes spill stores, `loads` bytes spill loads".

    >>> Spill(stores=390, loads=416, frame=336).loads
    416
    """

    stores: int
    loads: int
    frame: int


def spill_s(gpu: GPUSpec, *, stores: float, loads: float, frame_per_sm: float, shared: int = 0) -> float:
    """Seconds of `stores` and `loads` spill bytes (the whole kernel's) whose frame takes
    `frame_per_sm` bytes on each SM, beside `shared` bytes of the block's shared memory."""
    if not (stores or loads):
        return 0.0
    l1 = max(gpu.l1_per_sm - shared, 0)
    held = min(1.0, l1 / frame_per_sm) if frame_per_sm else 1.0
    l2_stores, l2_loads = stores, loads * (1.0 - held)
    chip = gpu.sms * frame_per_sm
    beyond = max(0.0, 1.0 - gpu.l2_size / chip) if chip else 0.0
    dram = beyond * (l2_stores / gpu.write_bw + l2_loads / gpu.achievable_bw)
    return (l2_stores + l2_loads) / gpu.l2_bw + dram
