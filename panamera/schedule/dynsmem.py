"""Dynamic shared memory: the bytes a block asks for at launch, beyond its static `__shared__` arrays.

A kernel's static shared memory is at most 48 KiB (`STATIC_BYTES`). Compute capability 8.0 and 9.0
let a block take more, up to the device's opt-in maximum (`GPUSpec.smem_per_block`: 227 KiB on
an H100, 163 KiB on an A100), only as *dynamic* shared memory [spec: CUDA C Programming Guide,
compute capabilities 8.x and 9.0, "Shared Memory"]. One mechanism, each part owned once:

  - the stage that puts something there states its bytes on the decision (`Decision.dynamic_smem`;
    today the row tiles schedule/hold.py holds), carved in order by `layout`;
  - codegen declares the block's buffer (`PN_DYNAMIC_SHARED`, codegen/header.py: `extern __shared__`)
    and carves it at `layout`'s offsets (codegen/column_stitch.py);
  - the plan carries the bytes (`Launch.dynamic_smem_bytes`); the CUDA backend raises the kernel's
    cudaFuncAttributeMaxDynamicSharedMemorySize to them and passes them at launch
    (runtime/executor.py); the emulator gives each block its own buffer of that size;
  - residency counts them as any shared memory (`derived.resident_per_sm`, through the cost's
    `shared_bytes` and the co-residency checks).

Preconditions (`check`; one negative test each in tests/test_dynsmem.py):
  1. a decision's `dynamic_smem` is exactly the bytes its stages carve (`needed`: 0 for a plan no
     stage puts there);
  2. with the kernel's static shared memory, at most the device's opt-in maximum per block.

>>> layout([40, 8, 16])  # offsets at 16-byte boundaries, and the bytes in all
((0, 48, 64), 80)
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ScheduleError
from ..model.gpu import GPUSpec
from .decision import Decision

STATIC_BYTES = 48 * 1024  # a kernel's static shared memory at most; beyond it only a dynamic opt-in launch
ALIGN = 16  # every region starts at a 16-byte boundary: a float4 / double2 vector's


def layout(sizes: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """The offsets of regions of `sizes` bytes carved from one dynamic buffer in order, each at an
    `ALIGN`-byte boundary, and the buffer's bytes (the last region's end)."""
    offsets, end = [], 0
    for n in sizes:
        at = -(-end // ALIGN) * ALIGN
        offsets.append(at)
        end = at + n
    return tuple(offsets), end


def opt_in(gpu: GPUSpec) -> int:
    """The most shared memory one block can take, static and dynamic together (the device's
    opt-in maximum, cudaDevAttrMaxSharedMemoryPerBlockOptin).

    >>> from panamera.model.gpu import A100, H100
    >>> opt_in(H100) // 1024, opt_in(A100) // 1024
    (227, 163)
    """
    return gpu.smem_per_block


def check(gpu: GPUSpec, d: Decision, needed: int, static: int, at: str) -> None:
    """Preconditions 1 and 2 of `d`'s dynamic shared memory (module docstring): `needed` the bytes
    its stages carve, `static` the kernel's static shared memory; else a ScheduleError naming it."""
    if d.dynamic_smem != needed:
        raise ScheduleError(
            f"{at}: dynamic_smem={d.dynamic_smem} bytes of dynamic shared memory, but the plan's stages carve "
            f"{needed} (1)"
        )
    if static + d.dynamic_smem > opt_in(gpu):
        raise ScheduleError(
            f"{at}: dynamic_smem={d.dynamic_smem} bytes of dynamic shared memory beside {static} static: over the "
            f"{opt_in(gpu)} bytes a block of {gpu.name} can opt in to (2)"
        )
