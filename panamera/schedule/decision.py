"""The mapper's decision for one kernel group, as one immutable value, and its serialization.

A `Decision` is what the mapper decides and a schedule saves (schedule/saved.py); a `Mapping`
completes it with the kernel's name, buffers and modeled cost for codegen and the executor.
schedule/mapping.py describes the binding it encodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..enums import StrEnum
from ..model.kernel_cost import KernelCost
from ..poly.access import AccessKind
from ..poly.statement import Form
from ..runtime.plan import BufferSpec
from .task import TaskMapping, serial, spatial

MAX_GRID_Y = 65535
MAX_GRID_X = 2**31 - 1
MAX_THREADS = 1024
MAX_UNROLL = 32  # loop copies per step a saved decision may ask (derived.unroll_for chooses at most 4)


class MergeMode(StrEnum):
    """How the blocks that share one reduction combine their partials into the output."""

    STORE = "store"  # one block per output: it stores the result
    ATOMIC_WS = "atomic_ws"  # one atomic per block into a resident workspace; the last block stores and resets it
    PARTIALS = "partials"  # each block writes its partial; the last block combines them in a fixed order
    # each block writes its partial; after a grid-wide wait (every block resident: a cooperative
    # launch) every block combines its share of the outputs in a fixed order (column partials)
    PARTIALS_GRID = "partials_grid"
    # one atomic per block into a resident workspace; after a grid-wide wait (a cooperative launch)
    # every block reads the merged values (columns read in their kernel, poly/column_stitch.py)
    ATOMIC_GRID = "atomic_grid"


class Residence(StrEnum):
    """Where a stitched block keeps the row values it loaded in pass 0 (schedule/onchip.py)."""

    MEMORY = "memory"  # nowhere: later passes re-read them
    REGISTERS = "registers"
    SHARED = "shared"


class MmaOp(StrEnum):
    """The tensor-core instruction of a tile (`Decision.mma_op`; schedule/warpgroup.py offers the
    warpgroup tiles)."""

    MMA_SYNC = ""  # nvcuda::wmma (mma.sync): a warp's 16 x 16 fragments, every GPU with tensor cores
    WGMMA = "wgmma"  # wgmma.mma_async (sm_90a): a warpgroup's 64 x N tile, at the tensor cores' full rate


class Completion(StrEnum):
    """How a cluster's exchange knows every peer's partial has landed (`Decision.completion`,
    schedule/cluster.py): a stitched row's exchanges, or a reduce kernel's combine in rank 0."""

    BARRIER = "barrier"  # the cluster barrier (barrier.cluster arrive + wait)
    MBARRIER = "mbarrier"  # each block's own mbarrier counting the bytes its peers' st.async deliver (QuACK)


REGISTER_VALUES = 48  # row values one thread keeps in registers (80 more registers for everything else)
REGISTER_OTHERS = 80  # registers a thread keeping its row needs besides (ptxas: 64 spilled a cross-entropy)
REGISTER_FILE = 65536  # 32-bit registers per SM (sm_80, sm_90)
# registers a warpgroup-MMA thread needs besides its N / 2 accumulators (ptxas, sm_90a: 72 in all for
# m64n32 with 16 accumulators, 119 for m64n128 with 64: 56 others; 64 leaves a margin)
WGMMA_OTHERS = 64
BOUNDS_THREADS = 1024  # threads per SM a kernel's __launch_bounds__ leave room for by default (64 registers each)


def bounds_blocks(threads: int) -> int:
    """Blocks per SM a kernel's __launch_bounds__ ask room for unless its plan asks otherwise
    (`Decision.min_blocks`): BOUNDS_THREADS threads' worth.

    >>> bounds_blocks(256), bounds_blocks(1024)
    (4, 1)
    """
    return max(1, BOUNDS_THREADS // max(threads, 1))


@dataclass(frozen=True)
class Decision:
    """What the mapper decides for one kernel group: what a schedule saves and replays.

    `access[k][r]` is how statement k loads its read r; `levels[k]` the pass of a stitched
    group statement k runs in (poly/stitch.py; 0 outside stitched groups)."""

    statements: tuple[str, ...]
    form: Form
    M: int
    N: int
    stitched: bool
    vec: int
    tx: int
    ty: int
    split: int
    chunk: int  # serial-loop iterations per block, in units of the split dimension
    grid: tuple[int, int]
    unroll: int  # copies of the innermost loop body per step: loads in flight per thread
    merges: tuple[MergeMode, ...]
    access: tuple[tuple[AccessKind, ...], ...]
    levels: tuple[int, ...]
    atomic_vec: tuple[int, ...] = ()  # per statement: outputs per atomic (2 or 4: one float2/float4 add)
    rtile: int = 1  # register tile: rows per thread, i, i + rstride, ..., i + (rtile - 1) rstride
    rstride: int = 1  # distance between the rows of a register tile (divides M)
    rshared: tuple[tuple[bool, ...], ...] = ()  # [k][r]: read r of statement k shared along the rtile rows
    ctile: int = 1  # and ctile consecutive rows per thread (schedule/rtile.py)
    cshared: tuple[tuple[bool, ...], ...] = ()  # [k][r]: shared along the ctile consecutive rows
    stages: int = 1  # K slabs of the block-shared operand in flight (schedule/pipeline.py; 1: direct loads)
    mma: str = ""  # tensor cores' operand type (schedule/tensor_core.py's Mma); "": CUDA cores
    mma_tile: tuple[
        int, ...
    ] = ()  # tensor cores: (warps along rows, along columns, K slab[, fragments per warp: rows, columns])
    # tensor cores: the split's partials landed in shared memory (blocks, held, bytes, copy: schedule/
    # tc_tiling.py's Landing); (): merged without (register batches, atomics, or no split)
    mma_land: tuple[int, ...] = ()
    # tensor cores: the MMA instruction (MmaOp): MMA_SYNC mma.sync (wmma), WGMMA Hopper's
    # warpgroup MMA (sm_90a), its mma_tile (4, G, K slab, 1, N / 16): G warpgroups of 64 x N outputs each
    mma_op: MmaOp = MmaOp.MMA_SYNC

    @property
    def tile_rows(self) -> int:
        """Rows of the i loop the threads scan: M, or with a register tile one per tile
        (schedule/rtile.py: t = q * (rstride / ctile) + p owns the rows
        (q * rtile + r) * rstride + p * ctile + c)."""
        if self.rtile == 1 and self.ctile == 1:
            return self.M
        return math.ceil(self.M // self.rstride / self.rtile) * (self.rstride // self.ctile)

    @property
    def min_blocks(self) -> int:
        """Blocks per SM the kernel's __launch_bounds__ asks ptxas to leave room for: 1024
        threads' worth (64 registers each), halved per doubling of a register tile beyond 2
        (its accumulators and per-row loads need the registers); a row kept in registers asks
        for REGISTER_VALUES + REGISTER_OTHERS registers per thread; a persistent grid asks for
        exactly its blocks per SM."""
        if self.per_sm:  # a persistent grid: exactly its blocks per SM
            return self.per_sm
        if self.onchip == Residence.REGISTERS:
            return max(1, REGISTER_FILE // (self.threads * (REGISTER_VALUES + REGISTER_OTHERS)))
        if self.mma_op == MmaOp.WGMMA:  # its accumulators (N / 2 per thread) beside the staging and addresses
            return max(1, REGISTER_FILE // (self.threads * (8 * self.mma_tile[4] + WGMMA_OTHERS)))
        return max(1, bounds_blocks(self.threads) // max(1, self.rtile * self.ctile // 2))

    epilogue: bool = False  # an epilogue group (poly/epilogue.py): whoever finishes output o applies its MAP statements
    # A persistent row loop (a stitched group with column partials, schedule/persistent.py): the
    # blocks launched, each looping over the row tiles bx, bx + persistent, ... of the logical
    # `grid`; 0: one block per row tile.
    persistent: int = 0
    per_sm: int = 0  # the persistent grid's blocks per SM: the launch bounds leave registers for that many
    onchip: Residence = Residence.MEMORY  # where a stitched block keeps pass 0's row values (schedule/onchip.py)
    cluster: int = 1  # blocks along y per thread-block cluster: a split row's blocks (schedule/cluster.py; 1: none)
    # column groups a joined group whose own statements read its columns (poly/column_stitch.py) runs in
    # turn, each over every row tile: its columns' pass, the merge, the consumers' pass (schedule/persistent.py)
    cgroups: int = 1
    completion: Completion = Completion.BARRIER  # a cluster's exchanges completed by (schedule/cluster.py)
    # row tiles of each column group a joined column stitch's block keeps in shared memory from the columns'
    # pass, its first `hold` (schedule/persistent.py precondition 7): the consumers' pass reads them from chip
    hold: int = 0
    # bytes of dynamic shared memory a block asks for at launch, beyond its static arrays (schedule/dynsmem.py):
    # stated by the stage that carves it (the held tiles), counted by residency, passed at launch
    dynamic_smem: int = 0

    @property
    def threads(self) -> int:
        return self.tx * self.ty

    @property
    def launch_grid(self) -> tuple[int, int]:
        """The grid launched: `grid`, or the persistent blocks that loop over its row tiles."""
        return (self.persistent or self.grid[0], self.grid[1])

    @property
    def blocks(self) -> int:
        """Blocks launched."""
        return self.launch_grid[0] * self.launch_grid[1]

    @property
    def loops(self) -> tuple[str, str]:
        """The canonical loops as the codegen scans them: ("i", "g") for ROW/ALL (g = j / vec),
        ("g", "j") for COLUMN (g = i / vec), ("i", "g") for MAP (g = 0)."""
        return ("g", "j") if self.form == Form.COLUMN else ("i", "g")

    @property
    def cooperative(self) -> bool:
        """A stitched group split across blocks: its blocks wait for each other, so all of them
        must be resident at once (a cooperative launch), unless they are one thread-block
        cluster; so must the blocks of column partials merged after a grid-wide wait."""
        grid = MergeMode.PARTIALS_GRID in self.merges or MergeMode.ATOMIC_GRID in self.merges
        return self.stitched and ((self.split > 1 and self.cluster == 1) or grid)

    @property
    def needs_last_block(self) -> bool:
        """Blocks count their arrivals, and the last one finishes the merge."""
        return any(m != MergeMode.STORE for m in self.merges)

    @property
    def tasks(self) -> dict[str, TaskMapping]:
        """Task mapping per canonical loop (see schedule/task.py)."""
        gx, s = self.grid
        if self.form == Form.MAP:
            return {"i": serial("k", self.chunk) * spatial("bx", gx) * spatial("tx", self.tx), "g": serial("k0", 1)}
        if self.form == Form.COLUMN:
            return {
                "g": spatial("bx", gx) * spatial("tx", self.tx),
                "j": spatial("by", s) * serial("k", self.chunk // self.ty) * spatial("ty", self.ty),
            }
        g = spatial("by", s) * serial("k", self.chunk // self.tx) * spatial("tx", self.tx)
        if self.cgroups > 1:  # the column groups in turn: g = cg * (N / cgroups / vec) + the group's own
            g = serial("cg", self.cgroups) * g
        return {"i": spatial("bx", gx) * spatial("ty", self.ty), "g": g}

    @property
    def extents(self) -> tuple[int, int]:
        """Extents of the two scanned loops (`loops`)."""
        return {
            Form.ROW: (self.tile_rows, self.N // self.vec),
            Form.ALL: (self.tile_rows, self.N // self.vec),
            Form.COLUMN: (self.M // self.vec, self.N),
            Form.MAP: (self.M // self.vec, 1),
        }[self.form]

    def describe(self) -> str:
        return (
            f"{self.form} M={self.M} N={self.N} vec={self.vec} block=({self.tx},{self.ty}) "
            f"grid=({self.grid[0]},{self.grid[1]}) split={self.split}"
            + (f" rtile={self.rtile}x{self.ctile} stride={self.rstride}" if self.rtile * self.ctile > 1 else "")
            + (f" stages={self.stages}" if self.stages > 1 else "")
            + (f" rows in {self.onchip}" if self.onchip != Residence.MEMORY else "")
            + (" cooperative" if self.cooperative else "")
            + (f" persistent={self.persistent}" if self.persistent else "")
            + (f" column-groups={self.cgroups}" if self.cgroups > 1 else "")
            + (f" hold={self.hold}" if self.hold else "")
            + (f" dynamic-smem={self.dynamic_smem}" if self.dynamic_smem else "")
            + (
                f" tensor-cores={self.mma}{'/' + self.mma_op if self.mma_op else ''} warps={self.mma_tile[0]}x{self.mma_tile[1]} bk={self.mma_tile[2]}"
                + (f" frags={self.mma_tile[3]}x{self.mma_tile[4]}" if len(self.mma_tile) == 5 else "")
                if self.mma
                else ""
            )
            + (f" cluster={self.cluster}" if self.cluster > 1 else "")
            + (f" completion={self.completion}" if self.completion != Completion.BARRIER else "")
        )

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(Decision)}
        d["statements"], d["grid"], d["merges"] = list(self.statements), list(self.grid), [str(m) for m in self.merges]
        d["atomic_vec"] = list(self.atomic_vec)
        d["rshared"] = [[int(b) for b in a] for a in self.rshared]
        d["cshared"] = [[int(b) for b in a] for a in self.cshared]
        if not self.epilogue:  # saved only when set: schedules written before it read the same
            del d["epilogue"]
        if not self.persistent:
            del d["persistent"], d["per_sm"]
        if self.mma:
            d["mma_tile"] = list(self.mma_tile)
        else:  # likewise: CUDA cores
            del d["mma"], d["mma_tile"]
        if self.mma_land:
            d["mma_land"] = list(self.mma_land)
        else:  # likewise: nothing landed
            del d["mma_land"]
        if self.mma_op == MmaOp.MMA_SYNC:  # likewise: mma.sync
            del d["mma_op"]
        else:
            d["mma_op"] = str(self.mma_op)
        if self.onchip == Residence.MEMORY:  # likewise: schedules without rows on chip read the same
            del d["onchip"]
        else:
            d["onchip"] = str(self.onchip)
        if self.cluster == 1:
            del d["cluster"]
        if self.cgroups == 1:  # likewise: every column at once
            del d["cgroups"]
        if self.completion == Completion.BARRIER:  # likewise: schedules before mbarriers read the same
            del d["completion"]
        else:
            d["completion"] = str(self.completion)
        if self.hold == 0:  # likewise: nothing held on chip
            del d["hold"]
        if self.dynamic_smem == 0:  # likewise: static shared memory only
            del d["dynamic_smem"]
        d["form"], d["access"], d["levels"] = (
            str(self.form),
            [[str(k) for k in a] for a in self.access],
            list(self.levels),
        )
        return d

    @staticmethod
    def from_dict(d: dict) -> Decision:
        """Raises KeyError, TypeError or ValueError on a malformed dict (saved.py reports them)."""
        return Decision(
            statements=tuple(str(s) for s in d["statements"]),
            form=Form(d["form"]),
            M=int(d["M"]),
            N=int(d["N"]),
            stitched=bool(d["stitched"]),
            vec=int(d["vec"]),
            tx=int(d["tx"]),
            ty=int(d["ty"]),
            split=int(d["split"]),
            chunk=int(d["chunk"]),
            grid=(int(d["grid"][0]), int(d["grid"][1])),
            unroll=int(d["unroll"]),
            merges=tuple(MergeMode(m) for m in d["merges"]),
            access=tuple(tuple(AccessKind(k) for k in a) for a in d["access"]),
            levels=tuple(int(v) for v in d["levels"]),
            atomic_vec=tuple(int(v) for v in d.get("atomic_vec", [1] * len(d["statements"]))),
            rtile=int(d.get("rtile", 1)),  # absent in schedules before register tiles: none
            rstride=int(d.get("rstride", 1)),
            rshared=tuple(tuple(bool(int(b)) for b in a) for a in d.get("rshared", ())),
            ctile=int(d.get("ctile", 1)),
            cshared=tuple(tuple(bool(int(b)) for b in a) for a in d.get("cshared", ())),
            stages=int(d.get("stages", 1)),  # absent before pipelines: direct loads
            epilogue=bool(d.get("epilogue", False)),
            persistent=int(d.get("persistent", 0)),
            per_sm=int(d.get("per_sm", 0)),
            mma=str(d.get("mma", "")),  # absent before tensor cores: CUDA cores
            mma_tile=tuple(int(v) for v in d.get("mma_tile", ())),
            mma_land=tuple(int(v) for v in d.get("mma_land", ())),  # absent before it was carried: not landed
            mma_op=MmaOp(d.get("mma_op", "")),  # absent before warpgroup MMAs: mma.sync
            onchip=Residence(d.get("onchip", "memory")),
            cluster=int(d.get("cluster", 1)),
            cgroups=int(d.get("cgroups", 1)),
            completion=Completion(d.get("completion", "barrier")),
            hold=int(d.get("hold", 0)),
            dynamic_smem=int(d.get("dynamic_smem", 0)),
        )


@dataclass(frozen=True)
class Mapping(Decision):
    """A `Decision` completed for codegen and the executor: the kernel's name, its buffers (its
    parameters, in order, with their roles) and the model's cost of it."""

    name: str = ""
    buffers: tuple[BufferSpec, ...] = ()
    cost: KernelCost | None = None

    @property
    def decision(self) -> Decision:
        return Decision(**{f.name: getattr(self, f.name) for f in fields(Decision)})


def pow2ceil(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def covers(d: Decision) -> bool:
    """Every iteration of the canonical domain has an owner (block, thread, serial step).

    A task mapping is a mixed-radix product of bounded factors, so it owns exactly the tasks
    [0, extent) once each (schedule/task.py): it covers its loop when its extent reaches the
    loop's. (tests/test_schedule.py checks this against isl's image of the mapping.)"""
    if d.mma:  # tensor-core tiles own the outputs (schedule/tc_tiling.py's check covers them)
        return True
    tasks = d.tasks
    return all(tasks[loop].extent >= e for loop, e in zip(d.loops, d.extents))
