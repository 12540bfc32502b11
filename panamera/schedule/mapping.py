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

`map_group` searches; `replay` takes a saved `Decision` (schedule/saved.py), validates it
against the program (rules in its docstring) and completes it without searching.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from .. import dtypes
from ..algebra import SUM, AtomicStrategy
from ..enums import StrEnum
from ..errors import ScheduleError
from ..model.gpu import H100, GPUSpec, KernelCost, kernel_time
from ..poly.access import AccessKind, access_kinds, choose_vec
from ..poly.program import KernelGroup
from ..poly.statement import Form, StatementKind
from ..poly.stitch import is_epilogue, levels
from ..runtime.plan import BufferRole, BufferSpec
from .contraction import l2_bytes as contraction_l2_bytes
from .pipeline import check as check_pipeline
from .pipeline import choose as choose_stages
from .registers import fit_unroll
from .rtile import NO_TILE, op_divisors, register_budget, registers, tilings
from .rtile import check as check_tile
from .task import TaskMapping, serial, spatial

MAX_GRID_Y = 65535
MAX_GRID_X = 2**31 - 1
MAX_THREADS = 1024


class MergeMode(StrEnum):
    """How the blocks that share one reduction combine their partials into the output."""

    STORE = "store"  # one block per output: it stores the result
    ATOMIC_WS = "atomic_ws"  # one atomic per block into a resident workspace; the last block stores and resets it
    PARTIALS = "partials"  # each block writes its partial; the last block combines them in a fixed order


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
        (its accumulators and per-row loads need the registers)."""
        base = max(1, 1024 // self.threads)
        return max(1, base // max(1, self.rtile * self.ctile // 2))

    epilogue: bool = False  # an epilogue group (poly/epilogue.py): whoever finishes output o applies its MAP statements

    @property
    def threads(self) -> int:
        return self.tx * self.ty

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def loops(self) -> tuple[str, str]:
        """The canonical loops as the codegen scans them: ("i", "g") for ROW/ALL (g = j / vec),
        ("g", "j") for COLUMN (g = i / vec), ("i", "g") for MAP (g = 0)."""
        return ("g", "j") if self.form == Form.COLUMN else ("i", "g")

    @property
    def cooperative(self) -> bool:
        """A stitched group split across blocks: its blocks wait for each other, so all of them
        must be resident at once (a cooperative launch)."""
        return self.stitched and self.split > 1

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
        return {
            "i": spatial("bx", gx) * spatial("ty", self.ty),
            "g": spatial("by", s) * serial("k", self.chunk // self.tx) * spatial("tx", self.tx),
        }

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
            + (" cooperative" if self.cooperative else "")
        )

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(Decision)}
        d["statements"], d["grid"], d["merges"] = list(self.statements), list(self.grid), [str(m) for m in self.merges]
        d["atomic_vec"] = list(self.atomic_vec)
        d["rshared"] = [[int(b) for b in a] for a in self.rshared]
        d["cshared"] = [[int(b) for b in a] for a in self.cshared]
        if not self.epilogue:  # saved only when set: schedules written before it read the same
            del d["epilogue"]
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


def along(group: KernelGroup) -> str:
    """The canonical loop vectors run along: the contiguous one."""
    return "i" if group.form in (Form.COLUMN, Form.MAP) else "j"


def vector_extent(group: KernelGroup) -> int:
    return group.M if along(group) == "i" else group.N


TRANSCENDENTAL = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "pow", "sin", "cos", "fmod", "mod")


@dataclass(frozen=True)
class Arithmetic:
    """Thread instructions of a kernel group, by the pipe that issues them (the model's issue term)."""

    fp32: float = 0.0
    fp64: float = 0.0
    sfu: float = 0.0

    def features(self) -> dict[str, float]:
        return {"fp32_ops": self.fp32, "fp64_ops": self.fp64, "sfu_ops": self.sfu}


def arithmetic(group: KernelGroup, d: Decision | None = None) -> Arithmetic:
    """Per iteration of each statement: one instruction per operation of its body (in its
    dtype's register precision; a transcendental also occupies the SFU), and one merge into the
    accumulator (the combiner's `merge_instructions` and `merge_transcendentals`, in the
    accumulator's precision: Welford in double costs FP64 issue slots; a sum of products merges
    in the product's multiply-add). Under a register tile
    (`d.rtile`), an operation whose loads are all shared along the tile (a dequantized weight)
    runs once per tile."""
    fp32 = fp64 = sfu = 0.0
    for k, s in enumerate(group.statements):
        if group.accumulator_of[k] != k:
            continue  # its owner's accumulation is the same work
        n = s.M * s.N
        div = op_divisors(s, k, d) if d is not None and d.rtile * d.ctile > 1 else {}
        for e in s.body.walk():
            if e.op in ("load", "const"):
                continue
            w = n / div.get(id(e), 1)
            if e.dtype.compute == "double":
                fp64 += w
            else:
                fp32 += w
            sfu += w if e.op in TRANSCENDENTAL else 0
        if s.combiner is not None:
            acc = s.acc.field if s.acc.is_struct else s.acc
            # a product summed is one fused multiply-add (nvcc contracts acc + a * b by default)
            fma = s.combiner is SUM and s.body.op == "mul" and not acc.is_struct
            merge = 0 if fma else n * s.combiner.merge_instructions
            if acc.compute == "double":
                fp64 += merge
            else:
                fp32 += merge
            sfu += n * s.combiner.merge_transcendentals
    return Arithmetic(fp32, fp64, sfu)


def streamed_bytes_per_iteration(group: KernelGroup) -> int:
    """Input bytes each (i, j) iteration streams from DRAM: the tensors that span the whole
    iteration space. Broadcast parameters (a LayerNorm's gamma) are re-read from cache, and
    values a stitched group keeps in registers are not memory reads at all: neither is a DRAM
    request in flight."""
    members = group.on_chip
    tensors = {
        r.tensor.uid: r.tensor
        for s in group.statements
        for r in s.reads
        if r.memory and r.tensor.uid not in members and r.tensor.size >= group.M * group.N
    }
    return sum(t.dtype.itemsize for t in tensors.values())


def unroll_for(vec: int, iterations: int) -> int:
    """Loop copies per step: 4 vector loads in flight per thread, fewer for wide vectors (at most
    32 registers of lanes per input), never more than the thread's iterations."""
    return max(1, min(4, 32 // vec, iterations))


def _struct(group: KernelGroup) -> bool:
    """A reduction no atomic merges (struct accumulators: Welford, online softmax) always merges
    its block partials through the last block."""
    return any(st.combiner is not None and st.combiner.atomic(st.acc) == AtomicStrategy.NONE for st in group.statements)


def _merges(group: KernelGroup, split: int, partials: bool) -> tuple[MergeMode, ...]:
    """Per statement: STORE without a split; a split reduction merges by atomics or partials (a
    stitched group's split rows always exchange partials, combined by every block in one order)."""
    partials = partials or group.stitched

    def one(st) -> MergeMode:
        if split == 1 or st.kind == StatementKind.MAP:
            return MergeMode.STORE
        return MergeMode.PARTIALS if partials else MergeMode.ATOMIC_WS

    return tuple(one(st) for st in group.statements)


def _atomic_vec(group: KernelGroup, gpu: GPUSpec, vec: int, merges: tuple[MergeMode, ...]) -> tuple[int, ...]:
    """Outputs per atomic merge of each statement: a COLUMN thread's `vec` adjacent float32 sums
    merge as one float2/float4 atomicAdd where the GPU has them (sm_90) and every thread's
    outputs are all in range (vec divides M); everything else merges one output per atomic."""

    def one(k: int, st) -> int:
        ok = (
            gpu.vector_atomics
            and group.form == Form.COLUMN
            and vec in (2, 4)
            and group.M % vec == 0
            and merges[k] == MergeMode.ATOMIC_WS
            and group.accumulator_of[k] == k
            and st.combiner is not None
            and st.combiner.vector_atomic
            and st.acc.name == "float32"
        )
        return vec if ok else 1

    return tuple(one(k, st) for k, st in enumerate(group.statements))


def _access(group: KernelGroup, vec: int) -> tuple[tuple[AccessKind, ...], ...]:
    kinds = access_kinds(group.statements, along(group), vec)
    if not (group.stitched or group.epilogue):
        return kinds
    # A stitched group's row epilogue runs on the row's leader thread, an epilogue group's on the
    # thread that finishes the output: one scalar load per read.
    return tuple(tuple(AccessKind.GATHER for _ in k) if is_epilogue(s) else k for s, k in zip(group.statements, kinds))


def passes(group: KernelGroup, lv: tuple[int, ...]) -> int:
    """Passes over the rows of a stitched group: one per level of its reductions and row-space
    statements (a row epilogue runs after the pass of the values it reads, in no pass of its own)."""
    return max((v for s, v in zip(group.statements, lv) if not is_epilogue(s)), default=0) + 1


def _levels(group: KernelGroup) -> tuple[int, ...]:
    if not group.stitched:
        return tuple(0 for _ in group.statements)
    lv = levels(group.statements)
    return tuple(lv[s.name] for s in group.statements)


def kernel_buffers(group: KernelGroup, name: str, merges, split: int, grid) -> tuple[BufferSpec, ...]:
    """The kernel's parameters: every tensor read, then per statement its output and workspace,
    then the counter of block arrivals (a split stitched group: per row group its arrivals at
    the exchanges, then its departures, 2 x gridDim.x counters)."""
    stmts = group.statements
    inputs = []
    members = group.on_chip
    for s in stmts:
        for r in s.reads:
            if r.tensor.uid in members or not r.memory:  # registers (stitched) or an index (iota)
                continue
            if all(r.tensor is not t for t in inputs):  # identity: Tensor == builds a comparison
                inputs.append(r.tensor)
    # A result of an earlier kernel is read from that kernel's output buffer.
    out = [
        BufferSpec(
            f"in:{t.uid}" if t.op == "placeholder" else f"out:{t.uid}",
            t.dtype.c_type,
            t.dtype,
            t.size,
            BufferRole.INPUT,
            f"in{k}",
            uid=t.uid,
        )
        for k, t in enumerate(inputs)
    ]
    for k, (s, mode) in enumerate(zip(stmts, merges)):
        res = s.result
        on_chip = res.uid in group.on_chip and s.kind == StatementKind.REDUCE and res.uid not in group.external
        if not on_chip:
            out.append(
                BufferSpec(
                    f"out:{res.uid}", res.dtype.c_type, res.dtype, res.size, BufferRole.OUTPUT, f"out{k}", k, res.uid
                )
            )
        if mode != MergeMode.STORE and group.accumulator_of[k] == k:  # a shared accumulator merges once
            partials = mode == MergeMode.PARTIALS
            role = BufferRole.PARTIALS if partials else BufferRole.WORKSPACE
            size = s.M * (split if partials else 1)
            ws = s.acc
            if not partials and s.combiner.atomic(s.acc) == AtomicStrategy.ORDERED:  # integer images
                ws = dtypes.int32 if s.acc.itemsize == 4 else dtypes.int64
            out.append(BufferSpec(f"ws:{name}:{k}", ws.c_type, ws, size, role, f"ws{k}", k))
    if any(m != MergeMode.STORE for m in merges):
        n = grid[0] * (2 if group.stitched else 1)
        out.append(BufferSpec(f"cnt:{name}", "unsigned", None, n, BufferRole.COUNTER, "pn_counter"))
    return tuple(out)


def co_resident(gpu: GPUSpec, threads: int) -> int:
    """Blocks of `threads` threads that are surely resident at once: the kernels carry
    __launch_bounds__(threads, 1024 / threads) (codegen/kernel.py), so ptxas leaves room for that
    many per SM, within the SM's thread and block limits. A cooperative launch of more fails."""
    return gpu.sms * min(gpu.resident_blocks(threads), max(1, 1024 // max(threads, 1)))


def exchanges(group: KernelGroup, lv: tuple[int, ...]) -> int:
    """Grid-wide exchanges of a split stitched group: one after each pass that has reductions."""
    return len({v for s, v in zip(group.statements, lv) if s.kind == StatementKind.REDUCE})


# -- the model of one candidate ----------------------------------------------------------------
def _input_bytes(group: KernelGroup) -> int:
    """Bytes of the distinct tensors the group reads from memory, each once from DRAM (a
    broadcast parameter re-read by every row hits the cache after its first read)."""
    members = group.on_chip
    reads = {
        r.tensor.uid: r.tensor for s in group.statements for r in s.reads if r.memory and r.tensor.uid not in members
    }
    return sum(t.size * t.dtype.itemsize for t in reads.values())


def _in_flight(group: KernelGroup, d: Decision) -> int:
    """Streamed bytes a thread has in flight per loop step: vector width x unrolled loads. Under
    a register tile the stream is the operand its rows share (loaded once per tile)."""
    if d.rshared:
        tensors = {
            r.tensor.uid: r.tensor
            for s, sh in zip(group.statements, d.rshared)
            for r, b in zip(s.reads, sh)
            if b and r.memory
        }
        return max(1, sum(t.dtype.itemsize for t in tensors.values())) * d.vec * d.unroll * d.ctile
    return max(1, streamed_bytes_per_iteration(group)) * d.vec * d.unroll


def _cost(group: KernelGroup, gpu: GPUSpec, d: Decision, partials: bool) -> KernelCost:
    """The model's time of one candidate decision: the same for the search and for a replay."""
    if group.stitched:
        return _stitched_cost(group, gpu, d)
    kept = group.on_chip - group.external  # an epilogue group's reduction nothing else reads
    stored = [s for s in group.statements if s.kind == StatementKind.MAP or s.result.uid not in kept]
    out_bytes = group.M * sum(s.result.dtype.itemsize for s in stored)
    work = arithmetic(group, d).features()
    if d.form == Form.MAP:
        return kernel_time(
            gpu,
            dram_bytes=_input_bytes(group) + out_bytes,
            blocks=d.grid[0],
            threads=d.tx,
            bytes_in_flight_per_thread=_in_flight(group, d),
            **work,
        )
    s_eff = d.split
    blocks = d.grid[0] * s_eff
    is_split = s_eff > 1
    own = group.accumulators  # an epilogue group's element-wise statements have none
    owners = [group.statements[k] for k in own]
    outputs = group.M * len(owners)
    widths = d.atomic_vec or (1,) * len(group.statements)
    merge_atomics = sum(group.M // widths[k] for k in own)
    acc_bytes = max(st.acc.itemsize for st in owners)
    # A split merges into a resident workspace (one atomic per block per output, plus the
    # block's arrival on the counter) that the last block reads, stores and resets; or,
    # partials: every block writes its partials and the last block reads them all.
    merges = s_eff if partials else 2
    ws_bytes = outputs * merges * acc_bytes if is_split else 0
    cas = 0
    if is_split and not partials:
        cas = sum(group.M * s_eff for st in owners if st.combiner.atomic(st.acc) == AtomicStrategy.CAS)
    return kernel_time(
        gpu,
        dram_bytes=_input_bytes(group) + out_bytes + ws_bytes,
        blocks=blocks,
        threads=d.tx * d.ty,
        bytes_in_flight_per_thread=_in_flight(group, d),  # unroll unguarded loads per step
        atomics=(blocks + (0 if partials else merge_atomics * s_eff)) if is_split else 0,
        same_address=s_eff if is_split else 0,
        cas_atomics=cas,
        # the block reduction; a register tile's rows reduce together, a shuffle chain (5 steps of
        # an L1-latency shuffle, ~30 cycles) more per further row
        epilogue_cycles=400
        + 150 * (d.rtile * d.ctile - 1)
        + (_combine_cycles(group, gpu, d) if is_split and partials else 0)
        + _epilogue_cycles(group, gpu),
        l2_bytes=contraction_l2_bytes(group, d),  # a contraction's shared operand, re-read by every row
        **work,
    )


def _epilogue_cycles(group: KernelGroup, gpu: GPUSpec) -> int:
    """An epilogue group's element-wise statements run after the output is final, on the thread
    that finishes it: their loads (issued together, one per read) are one DRAM round trip the
    kernel's tail waits for, counted once per joiner (a joiner may read an earlier one's value)."""
    if not group.epilogue:
        return 0
    joiners = sum(1 for s in group.statements if s.kind == StatementKind.MAP)
    return int(joiners * gpu.dram_latency_s * gpu.clock_hz)


def _combine_cycles(group: KernelGroup, gpu: GPUSpec, d: Decision) -> int:
    """The last block's combine of the partials (codegen/reduce_kernel.py): the threads of each
    output stride over its `split` partials, coalesced, one L2 round trip per step (the loop
    carries its accumulator), then reduce across the block as the main loop does."""
    if group.form == Form.COLUMN:
        steps = math.ceil(d.split / d.ty) * d.vec
    else:
        steps = math.ceil(d.split / d.tx) * d.rtile * d.ctile
    return steps * gpu.l2_latency_cycles * len(set(group.accumulator_of))


def _stitched_cost(group: KernelGroup, gpu: GPUSpec, d: Decision) -> KernelCost:
    """Blocks own whole rows; one pass per level. Passes after the first re-read the inputs, from
    L2 when the rows in flight fit in half of it.

    Split rows (d.split > 1, all blocks resident): every block streams its chunk of the row, and
    after each pass with reductions the row's blocks exchange partials through a grid-wide wait.
    The passes no longer overlap (a pass starts when every block has finished the one before),
    so the L2 re-reads add to the DRAM time (kernel_time's `grid_syncs`), and each exchange costs
    two L2 round trips (the arrival, seen by the poll) plus `_exchange_cycles`. Every row is in
    flight at the first exchange: the re-reads hit in L2 when all the input fits in half of it."""
    M = group.M
    in_bytes = _input_bytes(group)
    out_bytes = sum(
        s.result.size * s.result.dtype.itemsize
        for s in group.statements
        if s.kind == StatementKind.MAP or s.result.uid in group.external
    )
    row_bytes = in_bytes / max(M, 1)
    gx, S = d.grid
    if S > 1:
        resident = gx * d.ty
    else:
        resident = min(gx, gpu.sms * gpu.resident_blocks(d.tx * d.ty)) * d.ty
    n_passes = passes(group, d.levels)
    reread = (n_passes - 1) * in_bytes
    in_l2 = resident * row_bytes <= gpu.l2_size / 2
    n_ex = exchanges(group, d.levels) if S > 1 else 0
    return kernel_time(
        gpu,
        dram_bytes=in_bytes + out_bytes + (0 if in_l2 else reread),
        l2_bytes=(reread if in_l2 else 0) + contraction_l2_bytes(group, d),
        blocks=gx * S,
        threads=d.tx * d.ty,
        bytes_in_flight_per_thread=_in_flight(group, d),
        epilogue_cycles=400 * (1 if S > 1 else n_passes) * d.rtile * d.ctile,  # each tile row's
        grid_syncs=n_ex,
        sync_cycles=n_ex * _exchange_cycles(gpu, d) if n_ex else 0,
        **arithmetic(group, d).features(),
    )


def _exchange_cycles(gpu: GPUSpec, d: Decision) -> int:
    """One exchange of a split row beyond the two L2 round trips kernel_time charges for it: the
    block reductions before it and after it (400 cycles, as a pass of an unsplit row), the S
    arrivals on the row's counter serialized at one per L2 clock, the combine of the S partials
    (ceil(S / tx) loop-carried L2 loads per thread), and the next pass's first load (an L2 hit)."""
    S = d.split
    arrivals = S * gpu.clock_hz / gpu.l2_clock_hz
    return int(400 + arrivals + (math.ceil(S / d.tx) + 1) * gpu.l2_latency_cycles)


def _complete(group: KernelGroup, d: Decision, gpu: GPUSpec, name: str, cost: KernelCost | None = None) -> Mapping:
    partials = any(m == MergeMode.PARTIALS for m in d.merges)
    cost = cost if cost is not None else _cost(group, gpu, d, partials)
    buffers = kernel_buffers(group, name, d.merges, d.split, d.grid)
    return Mapping(**{f.name: getattr(d, f.name) for f in fields(Decision)}, name=name, buffers=buffers, cost=cost)


# -- the search ---------------------------------------------------------------------------------
def map_group(
    group: KernelGroup,
    gpu: GPUSpec = H100,
    split: int | None = None,
    deterministic: bool = False,
    threads: int | None = None,
    name: str = "",
    rtile: int | None = None,
    ctile: int | None = None,
    stages: int | None = None,
) -> Mapping:
    """Choose block/thread binding, vector width and split for a kernel group: the candidate
    with the least modeled time, merging a split by atomics or by partials the last block
    combines, whichever the model prefers (`deterministic` forces partials). `split` and `threads` force those choices (an explicit split alone
    keeps 256 threads per block). `name` names the kernel and its workspaces. `rtile` and
    `ctile` force the rows of a register tile (schedule/rtile.py; 1: none; ignored where the
    group has no tile to share). `stages` forces the pipeline's stages (schedule/pipeline.py;
    else the model's)."""
    if group.stitched:
        return _map_stitched(group, gpu, name, split, rtile, ctile)
    form, M, N = group.form, group.M, group.N
    base = dict(
        statements=group.names, form=form, M=M, N=N, stitched=False, levels=_levels(group), epilogue=group.epilogue
    )
    if form == Form.MAP:
        vec = choose_vec(group.statements, "i", M)
        G = M // vec
        tx = min(256, pow2ceil(G))
        gx = min(math.ceil(G / tx), gpu.sms * 32)
        steps = math.ceil(G / (gx * tx))
        d = Decision(
            **base, vec=vec, tx=tx, ty=1, split=1, chunk=steps, grid=(gx, 1), unroll=unroll_for(vec, steps),
            merges=_merges(group, 1, False), access=_access(group, vec), atomic_vec=(1,) * len(group.statements),
        )  # fmt: skip
        return _complete(group, d, gpu, name)
    vec = choose_vec(group.statements, along(group), vector_extent(group))
    access = _access(group, vec)
    G = N // vec if form in (Form.ROW, Form.ALL) else M // vec
    serial_extent = G if form != Form.COLUMN else N  # iterations along the reduced split dimension
    # Partials or atomics: forced by `deterministic` and struct accumulators, else the model's.
    merge_options = (True,) if deterministic or _struct(group) else (False, True)
    best = None
    # Threads per block: more threads keep more bytes in flight when there are few blocks; the
    # model decides, preferring the smaller block unless the larger is clearly faster.
    if threads is not None:
        options = (threads,)
    else:
        options = (256,) if split is not None else (256, 512, 1024)
    tiles = tilings(group)
    if rtile is not None:
        tiles = [t for t in tiles if t[0] == rtile and t[2] == (ctile or 1)] or [NO_TILE]
    # A register tile also tries blocks of more rows (rows of one block share their other reads).
    shapes = [(b, t, ty) for b in options for t in tiles for ty in ((1, 4, 8) if t[0] > 1 else (1,))]
    for block, (R, stride, C, rshared, cshared), tile_ty in shapes:
        if form in (Form.ROW, Form.ALL):
            rows = Decision(**base, **_DUMMY, rtile=R, rstride=stride, ctile=C).tile_rows
            tx = min(block // tile_ty, pow2ceil(G))
            ty = max(1, min(block // tx, pow2ceil(rows)))
            gx, per_split = math.ceil(rows / ty), tx  # every thread of a split block gets a group
        else:  # COLUMN
            tx = min(32, pow2ceil(G))
            ty = max(1, min(block // tx, pow2ceil(N)))
            gx, per_split = math.ceil(G / tx), ty
        if tx * ty < block and block > 256 and threads is None:
            continue  # the extents do not fill a larger block
        max_split = min(MAX_GRID_Y, max(1, serial_extent // per_split))  # at least one iteration per thread
        candidates = [1 << e for e in range(max_split.bit_length()) if 1 << e <= max_split]
        if split is not None:
            candidates = [max(1, min(split, MAX_GRID_Y))]
        for s in candidates:
            chunk = math.ceil(math.ceil(serial_extent / s) / per_split) * per_split
            s_eff = math.ceil(serial_extent / chunk)
            for partials in merge_options if s_eff > 1 else merge_options[:1]:
                d = Decision(
                    **base, vec=vec, tx=tx, ty=ty, split=s_eff, chunk=chunk, grid=(gx, s_eff),
                    unroll=max(1, unroll_for(vec, chunk // per_split) // (R * C)), merges=_merges(group, s_eff, partials),
                    access=access,
                    atomic_vec=_atomic_vec(group, gpu, vec, _merges(group, s_eff, partials)),
                    rtile=R, rstride=stride, rshared=rshared, ctile=C, cshared=cshared,
                )  # fmt: skip
                if form == Form.COLUMN:
                    d = fit_unroll(group, d)
                if R * C > 1 and rtile is None and registers(group, d) > register_budget(d):
                    continue  # ptxas would spill the tile's accumulators and loads
                cost = _cost(group, gpu, d, partials)
                # fewer blocks and threads, and atomics before partials, unless clearly faster
                if best is None or cost.total_s < best[0].total_s * 0.97:
                    best = (cost, d)
    cost, d = best
    if stages is None:
        stages = choose_stages(
            group, gpu, d, _in_flight(group, d), dict(cost.features).get("dram_bytes", 0.0), cost.total_s
        ).stages
    return _complete(group, replace(d, stages=stages), gpu, name, cost)


_DUMMY = dict(vec=1, tx=1, ty=1, split=1, chunk=1, grid=(1, 1), unroll=1, merges=(), access=())


def _map_stitched(
    group: KernelGroup,
    gpu: GPUSpec,
    name: str,
    split: int | None = None,
    rtile: int | None = None,
    ctile: int | None = None,
) -> Mapping:
    """A stitched group: threads per row and blocks per row (split) chosen by the model. More
    threads keep fewer rows resident, so later passes hit in L2; a split spreads rows too few to
    fill the GPU over more blocks, at the price of a grid-wide exchange per pass with
    reductions, and only while every block of the grid is co-resident (`co_resident`: the
    blocks wait for each other). Splits are powers of two with at least one step per thread;
    `split` forces one (1: whole rows). Unsplit rows may also take a register tile
    (schedule/rtile.py; `rtile` and `ctile` force one), with 32 to 128 threads per row."""
    M, N = group.M, group.N
    vec = choose_vec(group.statements, "j", N)
    G = N // vec
    base = dict(
        statements=group.names, form=group.form, M=M, N=N, stitched=True, vec=vec,
        access=_access(group, vec), levels=_levels(group),
        atomic_vec=(1,) * len(group.statements),
    )  # fmt: skip
    candidates = []  # (tx, ty, gx, split, tile), fewer threads and blocks first
    for tx in sorted({min(t, pow2ceil(G)) for t in (128, 256, 512, 1024)}):
        ty = max(1, min(256 // tx, pow2ceil(M)))
        gx = math.ceil(M / ty)
        max_split = max(1, min(MAX_GRID_Y, G // tx, co_resident(gpu, tx * ty) // gx))
        candidates += [(tx, ty, gx, 1 << e, NO_TILE) for e in range(max_split.bit_length()) if 1 << e <= max_split]
    tiles = tilings(group)[1:]
    if rtile is not None:
        candidates = [] if rtile * (ctile or 1) > 1 else candidates
        tiles = [t for t in tiles if t[0] == rtile and t[2] == (ctile or 1)]
    for t in tiles:  # unsplit tiled rows
        dummy = {k: v for k, v in _DUMMY.items() if k not in base}
        rows = Decision(**base, **dummy, rtile=t[0], rstride=t[1], ctile=t[2]).tile_rows
        for tx in sorted({min(x, pow2ceil(G)) for x in (32, 64, 128)}):
            ty = max(1, min(256 // tx, pow2ceil(rows)))
            candidates.append((tx, ty, math.ceil(rows / ty), 1, t))
    if split is not None:
        candidates = [c for c in candidates if c[3] == split] or [c for c in candidates if c[3] == 1]
    best = None
    for tx, ty, gx, s, (R, stride, C, rshared, cshared) in candidates:
        chunk = math.ceil(math.ceil(G / s) / tx) * tx
        s_eff = math.ceil(G / chunk)
        d = Decision(
            **base, tx=tx, ty=ty, split=s_eff, chunk=chunk, grid=(gx, s_eff),
            unroll=max(1, unroll_for(vec, chunk // tx) // (R * C)), merges=_merges(group, s_eff, True),
            rtile=R, rstride=stride, ctile=C, rshared=rshared, cshared=cshared,
        )  # fmt: skip
        if R * C > 1 and rtile is None and registers(group, d) > register_budget(d):
            continue
        cost = _stitched_cost(group, gpu, d)
        # fewer blocks and threads unless clearly faster
        if best is None or cost.total_s < best[0].total_s * 0.97:
            best = (cost, d)
    return _complete(group, best[1], gpu, name, best[0])


# -- replay -------------------------------------------------------------------------------------
def replay(
    group: KernelGroup, d: Decision, gpu: GPUSpec, name: str, deterministic: bool = False, where: str = ""
) -> Mapping:
    """Complete a saved decision for `group` without searching, after checking that it fits:

    1. it maps the same statements, with the same canonical form and extents;
    2. launch limits: tx and ty powers of two, at most 1024 threads per block, grid within
       CUDA's limits, split = gridDim.y, and a split stitched group's blocks all co-resident;
    3. the vector width divides the contiguous extent, loads at most 16 bytes of any input, and
       every read has the access kind isl finds at that width (a read saved as contiguous must be
       aligned for it);
    4. the task mappings own every iteration of the canonical domain (isl checks the cover);
    5. merge modes: store without a split, never store a split reduction, no atomic merge of a
       struct accumulator or under `deterministic`;
    6. the stitching levels are the ones the stitched group's dependences give;
    7. the unroll factor is at least 1;
    8. vector atomics only where `_atomic_vec` allows them on this GPU (float32 sums of a COLUMN
       tile, vec dividing M, sm_90);
    9. a register tile only as schedule/rtile.py's preconditions allow (ROW/ALL, unstitched,
       power-of-two rows, a row stride of the group, exactly the shared reads isl finds);
    10. a pipeline only as schedule/pipeline.py's preconditions allow (stages 1, 2 or 4; a read
       the block's rows share, aligned copies, a block-uniform step count around the barriers).
    Anything else is a ScheduleError naming the kernel and the rule.
    """
    at = f"{where}kernel {name or '?'}"
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
    if not (is_pow2(d.tx) and is_pow2(d.ty) and d.threads <= MAX_THREADS):
        raise ScheduleError(
            f"{at}: block ({d.tx}, {d.ty}) is not a power-of-two block of at most {MAX_THREADS} threads"
        )
    if not (1 <= d.grid[0] <= MAX_GRID_X and 1 <= d.grid[1] <= MAX_GRID_Y) or d.split != d.grid[1]:
        raise ScheduleError(
            f"{at}: grid {d.grid} with split {d.split} exceeds CUDA's limits or disagrees with the split"
        )
    if d.stitched and d.split > 1 and d.blocks > co_resident(gpu, d.threads):
        raise ScheduleError(
            f"{at}: a split stitched group's {d.blocks} blocks of {d.threads} threads are not all "
            f"co-resident on {gpu.name} (at most {co_resident(gpu, d.threads)}): its blocks wait for each other"
        )
    if d.vec not in (1, 2, 4, 8, 16) or vector_extent(group) % d.vec:
        raise ScheduleError(f"{at}: vector width {d.vec} does not divide the contiguous extent {vector_extent(group)}")
    if any(d.vec * r.tensor.dtype.itemsize > 16 for s in group.statements for r in s.reads if r.memory and d.vec > 1):
        raise ScheduleError(f"{at}: vector width {d.vec} loads more than 16 bytes of an input")
    if d.access != _access(group, d.vec):
        raise ScheduleError(
            f"{at}: access kinds {d.to_dict()['access']} are not what isl finds at vector width {d.vec}"
        )
    if not covers(d):
        raise ScheduleError(f"{at}: the task mappings {d.describe()} do not cover the domain")
    partials = deterministic or _struct(group) or group.stitched
    want = _merges(group, d.split, partials)
    if len(d.merges) != len(want) or any(
        (w == MergeMode.STORE) != (m == MergeMode.STORE) or (partials and m == MergeMode.ATOMIC_WS)
        for w, m in zip(want, d.merges)
    ):
        raise ScheduleError(
            f"{at}: merge modes {[str(m) for m in d.merges]} are not legal here (legal: {[str(w) for w in want]})"
        )
    if d.levels != _levels(group):
        raise ScheduleError(f"{at}: stitching levels {list(d.levels)} are not the group's {list(_levels(group))}")
    if d.unroll < 1 or d.chunk < 1:
        raise ScheduleError(f"{at}: unroll {d.unroll} and chunk {d.chunk} must be at least 1")
    legal_vec = _atomic_vec(group, gpu, d.vec, d.merges)
    if len(d.atomic_vec) != len(legal_vec) or any(v not in (1, w) for v, w in zip(d.atomic_vec, legal_vec)):
        raise ScheduleError(
            f"{at}: vector atomics {list(d.atomic_vec)} are not legal here (at most {list(legal_vec)} on {gpu.name})"
        )
    check_tile(group, d, at)
    check_pipeline(group, d, at)
    return _complete(group, d, gpu, name)


def covers(d: Decision) -> bool:
    """Every iteration of the canonical domain has an owner (block, thread, serial step).

    A task mapping is a mixed-radix product of bounded factors, so it owns exactly the tasks
    [0, extent) once each (schedule/task.py): it covers its loop when its extent reaches the
    loop's. (tests/test_schedule.py checks this against isl's image of the mapping.)"""
    tasks = d.tasks
    return all(tasks[loop].extent >= e for loop, e in zip(d.loops, d.extents))
