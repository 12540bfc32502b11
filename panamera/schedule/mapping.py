"""The mapper: which block and thread own which iterations of a kernel group, as one value.

A `Mapping` is the complete decision for one kernel group: codegen and the executor read it and
the program, nothing else. It binds the canonical loops (poly/program.py) to the GPU:

  ROW / ALL   i (rows)     -> blockIdx.x * ty + threadIdx.y
              g (j / vec)  -> blockIdx.y * chunk + k * tx + threadIdx.x      k: serial loop
  COLUMN      g (i / vec)  -> blockIdx.x * tx + threadIdx.x
              j (reduced)  -> blockIdx.y * chunk + k * ty + threadIdx.y
  MAP         i / vec      -> (k * gridDim.x + blockIdx.x) * tx + threadIdx.x

`split = gridDim.y` is the number of blocks that share one reduction (multi-block binding): each
block reduces its `chunk` in registers, warps and shared memory, then merges one partial per
output as its `MergeMode` says. A stitched group split across blocks (rows too few to fill the
GPU) is a cooperative launch: every block is resident at once (`co_resident`), and the blocks
of a row exchange their partials after each pass through a grid-wide wait
(codegen/stitched_kernel.py). The split, the threads per block and the vector width are chosen
by the performance model (model/gpu.py), not by constants: the candidate with the least modeled
time. The serial loop k is unrolled `unroll` times (codegen/islast.py), so each thread keeps that
many vector loads in flight.

The mapper is four modules whose imports run one way: decision.py (the value and its
serialization) <- derived.py (what the group fixes) <- cost.py (the model's cost of a decision)
<- search.py (`map_group`) and replay.py (`replay`: a saved `Decision` validated and completed).
This module re-exports their public names.
"""

from .cost import Arithmetic, arithmetic, streamed_bytes_per_iteration
from .decision import Decision, Mapping, MergeMode, covers
from .derived import co_resident, exchanges, kernel_buffers, passes
from .replay import replay
from .search import map_group

__all__ = [
    "Arithmetic",
    "Decision",
    "Mapping",
    "MergeMode",
    "arithmetic",
    "co_resident",
    "covers",
    "exchanges",
    "kernel_buffers",
    "map_group",
    "passes",
    "replay",
    "streamed_bytes_per_iteration",
]
