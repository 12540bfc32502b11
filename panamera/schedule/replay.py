"""Replay: a saved `Decision` (schedule/saved.py) validated against the program and completed
without searching."""

from __future__ import annotations

from ..errors import ScheduleError
from ..model.gpu import GPUSpec
from ..poly.access import too_wide
from ..poly.program import KernelGroup
from .bound import BoundStatement
from .cluster import check as check_cluster
from .cost import complete
from .decision import MAX_GRID_X, MAX_GRID_Y, MAX_THREADS, MAX_UNROLL, Decision, Mapping, MergeMode, covers, is_pow2
from .derived import (
    access_for,
    along,
    atomic_vec_for,
    co_resident,
    levels_for,
    merges_for,
    struct_accumulators,
    vector_extent,
)
from .dynsmem import check as check_dynamic
from .onchip import block_shared_bytes
from .onchip import check as check_onchip
from .persistent import check as check_columns
from .persistent import check_rows
from .pipeline import check as check_pipeline
from .rtile import check as check_tile
from .tc_tiling import check as check_tensor_core


def replay(
    group: KernelGroup, d: Decision, gpu: GPUSpec, name: str, deterministic: bool = False, where: str = ""
) -> Mapping:
    """Complete a saved decision for `group` without searching, after checking that it fits:

    1. it maps the same statements, with the same canonical form and extents;
    2. launch limits: tx and ty powers of two, at most 1024 threads per block, grid within
       CUDA's limits, split = gridDim.y, and a cooperative group's blocks all co-resident;
    3. the vector width divides the contiguous extent, loads at most 16 bytes of any input (a read
       isl finds UNIFORM along the vector is one scalar: poly/access.py `loads_fit`), and
       every read has the access kind isl finds at that width (a read saved as contiguous must be
       aligned for it);
    4. the task mappings own every iteration of the canonical domain (isl checks the cover);
    5. merge modes: store without a split, never store a split reduction, no atomic merge of a
       struct accumulator or under `deterministic`;
    6. the stitching levels are the ones the stitched group's dependences give;
    7. the unroll factor is from 1 to MAX_UNROLL (unroll_for's 4 at most, with room);
    8. vector atomics only where `atomic_vec_for` allows them on this GPU (float32 sums of a COLUMN
       tile, vec dividing M, sm_90);
    9. a register tile only as schedule/rtile.py's preconditions allow (ROW/ALL, unstitched,
       power-of-two rows, a row stride of the group, exactly the shared reads isl finds);
    10. a pipeline only as schedule/pipeline.py's preconditions allow (stages 1, 2 or 4; a read
       the block's rows share, aligned copies, a block-uniform step count around the barriers);
    11. a persistent grid only for stitched rows (with or without column partials), as
       schedule/persistent.py's preconditions allow;
    12. tensor cores only as schedule/tensor_core.py's preconditions and tc_tiling.py's `check` allow;
    13. rows kept on chip only as schedule/onchip.py's preconditions allow;
    14. a thread-block cluster only as schedule/cluster.py's preconditions allow (every block of
       a split stitched row, a cluster size the GPU has);
    15. dynamic shared memory only as schedule/dynsmem.py's preconditions allow: exactly the bytes
       the plan's stages carve (the held tiles of a column stitch, 11), within the opt-in maximum.
    Anything else is a ScheduleError naming the kernel and the rule.
    """
    at = f"{where}kernel {name or '?'}"
    check_statements(group, d, at)
    check_launch(group, d, gpu, at)
    if d.vec not in (1, 2, 4, 8, 16) or vector_extent(group) % d.vec:
        raise ScheduleError(f"{at}: vector width {d.vec} does not divide the contiguous extent {vector_extent(group)}")
    check_vector_bytes(group, d, at)
    if d.access != access_for(group, d.vec):
        raise ScheduleError(
            f"{at}: access kinds {d.to_dict()['access']} are not what isl finds at vector width {d.vec}"
        )
    check_cover(d, at)
    if group.columns:  # column partials: schedule/persistent.py's preconditions
        check_columns(group, d, gpu, deterministic, at)
    elif d.persistent or d.per_sm:  # a persistent row loop: schedule/persistent.py `check_rows`
        check_rows(group, d, gpu, at)
    if not group.columns:  # no stage of these plans carves dynamic shared memory (a column stitch's: 11)
        check_dynamic(gpu, d, 0, 0, at)
    check_merges(group, d, deterministic, at)
    if d.levels != levels_for(group):
        raise ScheduleError(f"{at}: stitching levels {list(d.levels)} are not the group's {list(levels_for(group))}")
    check_unroll(d, at)
    check_atomics(group, d, gpu, at)
    check_tile(group, d, at)
    check_pipeline(group, d, at)
    check_tensor_core(group, d, gpu, at)
    check_onchip(group, d, gpu, at)
    check_cluster(group, d, gpu, at)
    return complete(group, d, gpu, name)


# -- the rules that read only the group's statements (names, forms, extents, dtypes, combiners)
# and the decision: a parametric kernel's view at bound sizes (schedule/bound.py) has them too, so
# a symbolic class plan is held to them by the same code (panamera/dynamic.py `check_plan`).


def check_statements(group: KernelGroup, d: Decision, at: str) -> None:
    """Rule 1: the decision maps the group's statements, canonical form, extents and epilogue."""
    if d.statements != group.names:
        raise ScheduleError(
            f"{at} computes {'+'.join(d.statements)}, the program's {'+'.join(group.names)}: "
            "the subgraph changed since the schedule was saved"
        )
    if (d.form, d.M, d.N, d.stitched) != (group.form, group.M, group.N, group.stitched):
        raise ScheduleError(
            f"{at} is {d.form} {d.M}x{d.N}, the program's is {group.form} {group.M}x{group.N}: "
            "the subgraph changed since the schedule was saved"
        )
    if d.epilogue != group.epilogue:
        raise ScheduleError(
            f"{at}: the schedule {'applies' if d.epilogue else 'does not apply'} an epilogue in the reduction's "
            f"last block, the program's group {'does' if group.epilogue else 'does not'}"
        )


def check_launch(group: KernelGroup, d: Decision, gpu: GPUSpec, at: str) -> None:
    """Rule 2: a power-of-two block of at most MAX_THREADS threads, a grid within CUDA's limits
    whose y is the split, and a split stitched group's blocks all co-resident outside a cluster."""
    if not (is_pow2(d.tx) and is_pow2(d.ty) and d.threads <= MAX_THREADS):
        raise ScheduleError(
            f"{at}: block ({d.tx}, {d.ty}) is not a power-of-two block of at most {MAX_THREADS} threads"
        )
    if not (1 <= d.grid[0] <= MAX_GRID_X and 1 <= d.grid[1] <= MAX_GRID_Y) or d.split != d.grid[1]:
        raise ScheduleError(
            f"{at}: grid {d.grid} with split {d.split} exceeds CUDA's limits or disagrees with the split"
        )
    # split rows outside a cluster wait for each other (column partials' grid-wide wait: rule 11)
    at_once = co_resident(gpu, d.threads, block_shared_bytes(group, d), d.min_blocks)
    if d.stitched and d.split > 1 and d.cluster == 1 and d.blocks > at_once:
        raise ScheduleError(
            f"{at}: a split stitched group's {d.blocks} blocks of {d.threads} threads are not all "
            f"co-resident on {gpu.name} (at most {at_once}): its blocks wait for each other"
        )


def check_vector_bytes(group: KernelGroup, d: Decision, at: str) -> None:
    """Rule 3, its width part: a vector of 1, 2, 4, 8 or 16 elements loads at most 16 bytes of any
    input that is not UNIFORM along the vector (poly/access.py `too_wide`: a uniform read is one
    scalar per row). A parametric kernel's view (schedule/bound.py) has no isl domains to prove a
    read uniform, and its planner caps the vector by every read: there every input counts."""
    if d.vec not in (1, 2, 4, 8, 16):
        raise ScheduleError(f"{at}: vector width {d.vec} is not 1, 2, 4, 8 or 16")
    if any(isinstance(s, BoundStatement) for s in group.statements):
        wide = tuple(r for s in group.statements for r in s.reads if r.memory and d.vec * r.tensor.dtype.itemsize > 16)
    else:
        wide = too_wide(group.statements, along(group), d.vec)
    if wide:
        t = wide[0].tensor
        what = f"input {t.name!r} ({t.dtype.name})" if hasattr(t, "name") else f"a {t.dtype.name} input"
        raise ScheduleError(
            f"{at}: vector width {d.vec} loads more than 16 bytes of {what}, which is not uniform along the vector"
        )


def check_cover(d: Decision, at: str) -> None:
    """Rule 4: the task mappings own every iteration of the canonical domain."""
    if not covers(d):
        raise ScheduleError(f"{at}: the task mappings {d.describe()} do not cover the domain")


def check_merges(group: KernelGroup, d: Decision, deterministic: bool, at: str) -> None:
    """Rule 5: store without a split, never store a split reduction, no atomic merge of a struct
    accumulator, of a stitched group's rows or under `deterministic`."""
    partials = deterministic or struct_accumulators(group) or (group.stitched and not group.columns)
    want = merges_for(group, d.split // max(1, d.cluster), partials)
    if len(d.merges) != len(want) or any(
        (w == MergeMode.STORE) != (m == MergeMode.STORE) or (partials and m == MergeMode.ATOMIC_WS)
        for w, m in zip(want, d.merges)
    ):
        raise ScheduleError(
            f"{at}: merge modes {[str(m) for m in d.merges]} are not legal here (legal: {[str(w) for w in want]})"
        )


def check_unroll(d: Decision, at: str) -> None:
    """Rule 7: an unroll factor from 1 to MAX_UNROLL and a chunk of at least 1."""
    if not 1 <= d.unroll <= MAX_UNROLL or d.chunk < 1:
        raise ScheduleError(f"{at}: unroll {d.unroll} must be 1 to {MAX_UNROLL} and chunk {d.chunk} at least 1")


def check_atomics(group: KernelGroup, d: Decision, gpu: GPUSpec, at: str) -> None:
    """Rule 8: vector atomics only where `atomic_vec_for` allows them on `gpu`."""
    legal_vec = atomic_vec_for(group, gpu, d.vec, d.merges)
    if len(d.atomic_vec) != len(legal_vec) or any(v not in (1, w) for v, w in zip(d.atomic_vec, legal_vec)):
        raise ScheduleError(
            f"{at}: vector atomics {list(d.atomic_vec)} are not legal here (at most {list(legal_vec)} on {gpu.name})"
        )
