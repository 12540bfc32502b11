"""Task mappings and the mapper: which block and thread own which iterations of a kernel group.

A `Mapping` binds the canonical loops of a kernel group (poly/program.py) to the GPU:

  ROW / ALL   i (rows)     -> blockIdx.x * ty + threadIdx.y
              g (j / vec)  -> blockIdx.y * chunk + k * tx + threadIdx.x      k: serial loop
  COLUMN      g (i / vec)  -> blockIdx.x * tx + threadIdx.x
              j (reduced)  -> blockIdx.y * chunk + k * ty + threadIdx.y
  MAP         i / vec      -> (k * gridDim.x + blockIdx.x) * tx + threadIdx.x

`split = gridDim.y` is the number of blocks that share one reduction (multi-block binding): each
block reduces its `chunk` in registers, warps and shared memory, then merges one partial per
output with one atomic into a resident workspace that the last block stores and resets (or,
deterministic, writes its partials for the last block to combine in order). The split, the
threads per block and the vector width are chosen by the performance model (model/gpu.py), not
by constants: the candidate with the least modeled time. The serial loop k is unrolled `unroll`
times (codegen/islast.py), so each thread keeps that many vector loads in flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from ..model.gpu import H100, GPUSpec, KernelCost, kernel_time
from ..poly.program import KernelGroup
from ..poly.statement import Read
from .task import TaskMapping, serial, spatial

MAX_GRID_Y = 65535
MAX_GRID_X = 2**31 - 1


@dataclass(frozen=True)
class Mapping:
    """The binding of one kernel group: task mappings of its two canonical loops and the launch.

    `outer`/`inner` name the canonical loops as the codegen scans them: ("i", "g") for ROW/ALL
    (g = j / vec), ("g", "j") for COLUMN (g = i / vec), ("i", "g") for MAP (g = 0).
    """

    form: str
    M: int
    N: int
    vec: int
    tx: int
    ty: int
    split: int
    chunk: int  # serial-loop iterations per block, in units of the split dimension
    grid: tuple[int, int]
    cost: KernelCost
    unroll: int = 1  # copies of the innermost loop body per step: loads in flight per thread

    @property
    def threads(self) -> int:
        return self.tx * self.ty

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def loops(self) -> tuple[str, str]:
        return ("g", "j") if self.form == "COLUMN" else ("i", "g")

    @property
    def tasks(self) -> dict[str, TaskMapping]:
        """Task mapping per canonical loop (see schedule/task.py)."""
        gx, s = self.grid
        if self.form == "MAP":
            return {"i": serial("k", self.chunk) * spatial("bx", gx) * spatial("tx", self.tx), "g": serial("k0", 1)}
        if self.form == "COLUMN":
            return {
                "g": spatial("bx", gx) * spatial("tx", self.tx),
                "j": spatial("by", s) * serial("k", self.chunk // self.ty) * spatial("ty", self.ty),
            }
        return {
            "i": spatial("bx", gx) * spatial("ty", self.ty),
            "g": spatial("by", s) * serial("k", self.chunk // self.tx) * spatial("tx", self.tx),
        }

    def describe(self) -> str:
        return (
            f"{self.form} M={self.M} N={self.N} vec={self.vec} block=({self.tx},{self.ty}) "
            f"grid=({self.grid[0]},{self.grid[1]}) split={self.split}"
        )


def pow2ceil(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def access_kind(read: Read, along: str, vec: int, domain: isl.Set) -> str:
    """'contig' when groups of `vec` consecutive values of `along` read consecutive, aligned
    elements; 'uniform' when they all read one element; 'gather' otherwise (isl decides)."""
    if vec == 1 or not read.memory:
        return "gather"
    ctx = domain.get_ctx()
    v = isl.make_zero_and_vars(["i", "j"], [], ctx=ctx)
    dom = domain.reset_tuple_id()
    a = read.addr
    shifted = a.pullback_multi_aff(_shift(ctx, along))
    diff = shifted - a
    inner = v[along].mod_val(isl.Val.int_from_si(ctx, vec)).ne_set(v[0] + (vec - 1)) & dom
    if (diff.ne_set(v[0]) & inner).is_empty():
        return "uniform"
    first = v[along].mod_val(isl.Val.int_from_si(ctx, vec)).eq_set(v[0]) & dom
    aligned = (a.mod_val(isl.Val.int_from_si(ctx, vec)).ne_set(v[0]) & first).is_empty()
    if aligned and (diff.ne_set(v[0] + 1) & inner).is_empty():
        return "contig"
    return "gather"


def _shift(ctx, along: str) -> isl.MultiAff:
    sp = isl.Space.create_from_names(ctx, in_=["i", "j"], out=["i", "j"])
    ma = isl.MultiAff.identity(sp)
    pos = 0 if along == "i" else 1
    aff = ma.get_aff(pos).add_constant_val(isl.Val.one(ctx))
    return ma.set_aff(pos, aff)


def choose_vec(group: KernelGroup, along: str, extent: int) -> int:
    """The widest vector (at most 16 bytes of the widest input: 4 floats, 8 halves, 16 bools) that
    divides the extent and keeps every contiguous read aligned."""
    best = 1
    for vec in (16, 8, 4, 2):
        if extent % vec:
            continue
        kinds = [access_kind(r, along, vec, s.domain) for s in group.statements for r in s.reads]
        widths = [r.tensor.dtype.itemsize for s in group.statements for r in s.reads if r.memory]
        if "contig" in kinds and all(vec * w <= 16 for w in widths):
            best = vec
            break
    return best


TRANSCENDENTAL = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "pow")


def sfu_ops(group: KernelGroup) -> float:
    """Transcendental operations of a kernel group: per iteration of each statement body, plus
    the two exps of every online-softmax merge."""
    total = 0.0
    for s in group.statements:
        per = sum(1 for e in s.body.walk() if e.op in TRANSCENDENTAL)
        per += 2 if s.combiner is not None and s.combiner.name == "online_lse" else 0
        total += per * s.M * s.N
    return total


def unroll_for(vec: int, iterations: int) -> int:
    """Loop copies per step: 4 vector loads in flight per thread, fewer for wide vectors (at most
    32 registers of lanes per input), never more than the thread's iterations."""
    return max(1, min(4, 32 // vec, iterations))


def bytes_per_iteration(group: KernelGroup) -> int:
    """DRAM bytes per (i, j) iteration: each input tensor once, however many statements of the
    group read it (they share its load)."""
    tensors = {r.tensor.uid: r.tensor for s in group.statements for r in s.reads if r.memory}
    return sum(t.dtype.itemsize for t in tensors.values())


def map_group(
    group: KernelGroup,
    gpu: GPUSpec = H100,
    split: int | None = None,
    deterministic: bool = False,
    threads: int | None = None,
) -> Mapping:
    """Choose block/thread binding, vector width and split for a kernel group. `deterministic`
    plans for partials merged by the last block instead of atomics. `split` and `threads` force
    those choices (a replayed schedule; an explicit split alone keeps 256 threads per block)."""
    if group.stitched:
        return _map_stitched(group, gpu)
    form, M, N = group.form, group.M, group.N
    elem_bytes = max(1, bytes_per_iteration(group))
    total_bytes = M * N * elem_bytes + M * sum(s.result.dtype.itemsize for s in group.statements)
    outputs = M * len(group.statements)
    if form == "MAP":
        vec = choose_vec(group, "i", M)
        G = M // vec
        tx = min(256, pow2ceil(G))
        gx = min(math.ceil(G / tx), gpu.sms * 32)
        steps = math.ceil(G / (gx * tx))
        u = unroll_for(vec, steps)
        cost = kernel_time(
            gpu, dram_bytes=total_bytes, blocks=gx, threads=tx, bytes_in_flight_per_thread=elem_bytes * vec * u
        )
        return Mapping(form, M, N, vec, tx, 1, 1, steps, (gx, 1), cost, u)  # chunk: serial steps
    vec = choose_vec(group, "j", N) if form in ("ROW", "ALL") else choose_vec(group, "i", M)
    G = N // vec if form in ("ROW", "ALL") else M // vec
    serial = G if form != "COLUMN" else N  # iterations along the reduced split dimension
    best, transcendentals = None, sfu_ops(group)
    # Struct accumulators (Welford, online softmax) have no atomic: they always merge partials.
    partials = deterministic or any(st.combiner is not None and st.combiner.struct for st in group.statements)
    acc_bytes = max(st.acc.itemsize for st in group.statements)
    # Threads per block: more threads keep more bytes in flight when there are few blocks; the
    # model decides, preferring the smaller block unless the larger is clearly faster.
    if threads is not None:
        options = (threads,)
    else:
        options = (256,) if split is not None else (256, 512, 1024)
    for block in options:
        if form in ("ROW", "ALL"):
            tx = min(block, pow2ceil(G))
            ty = max(1, min(block // tx, pow2ceil(M)))
            gx, per_split = math.ceil(M / ty), tx  # every thread of a split block gets a group
        else:  # COLUMN
            tx = min(32, pow2ceil(G))
            ty = max(1, min(block // tx, pow2ceil(N)))
            gx, per_split = math.ceil(G / tx), ty
        if tx * ty < block and block > 256 and threads is None:
            continue  # the extents do not fill a larger block
        max_split = min(MAX_GRID_Y, max(1, serial // per_split))  # at least one iteration per thread
        candidates = [1 << e for e in range(max_split.bit_length()) if 1 << e <= max_split]
        if split is not None:
            candidates = [max(1, min(split, MAX_GRID_Y))]
        for s in candidates:
            chunk = math.ceil(math.ceil(serial / s) / per_split) * per_split
            s_eff = math.ceil(serial / chunk)
            blocks = gx * s_eff
            is_split = s_eff > 1
            u = unroll_for(vec, chunk // per_split)
            # A split merges into a resident workspace (one atomic per block per output, plus the
            # block's arrival on the counter) that the last block reads, stores and resets; or,
            # deterministic, every block writes its partials and the last block reads them all.
            merges = s_eff if partials else 2
            ws_bytes = outputs * merges * acc_bytes if is_split else 0
            cost = kernel_time(
                gpu,
                dram_bytes=total_bytes + ws_bytes,
                blocks=blocks,
                threads=tx * ty,
                bytes_in_flight_per_thread=elem_bytes * vec * u,  # u unguarded loads per step
                atomics=(blocks + (0 if partials else outputs * s_eff)) if is_split else 0,
                same_address=s_eff if is_split else 0,
                sfu_ops=transcendentals,
            )
            if best is None or cost.total_s < best[0] * 0.97:  # fewer blocks and threads unless clearly faster
                best = (cost.total_s, Mapping(form, M, N, vec, tx, ty, s_eff, chunk, (gx, s_eff), cost, u))
    return best[1]


def _map_stitched(group: KernelGroup, gpu: GPUSpec) -> Mapping:
    """A stitched group: blocks own whole rows (no split); one pass per level. Passes after the
    first re-read the inputs, from L2 when the rows in flight fit in half of it."""
    from ..poly.stitch import is_epilogue, levels

    M, N = group.M, group.N
    members = {s.result.uid for s in group.statements}
    reads = {
        r.tensor.uid: r.tensor for s in group.statements for r in s.reads if r.memory and r.tensor.uid not in members
    }
    in_bytes = sum(t.size * t.dtype.itemsize for t in reads.values())
    out_bytes = sum(
        s.result.size * s.result.dtype.itemsize
        for s in group.statements
        if s.kind == "map" or s.result.uid in group.external
    )
    lv = levels(group.statements)
    passes = max(lv[s.name] for s in group.statements if not is_epilogue(s)) + 1
    vec = choose_vec(group, "j", N)
    G = N // vec
    row_bytes = in_bytes / max(M, 1)
    best, transcendentals, elem_bytes = None, sfu_ops(group), max(1, bytes_per_iteration(group))
    # Threads per row: more threads keep fewer rows resident, so later passes hit in L2.
    for tx in sorted({min(t, pow2ceil(G)) for t in (128, 256, 512, 1024)}):
        ty = max(1, min(256 // tx, pow2ceil(M)))
        gx = math.ceil(M / ty)
        resident = min(gx, gpu.sms * gpu.resident_blocks(tx * ty)) * ty
        reread = (passes - 1) * in_bytes
        in_l2 = resident * row_bytes <= gpu.l2_size / 2
        u = unroll_for(vec, math.ceil(G / tx))
        cost = kernel_time(
            gpu,
            dram_bytes=in_bytes + out_bytes + (0 if in_l2 else reread),
            l2_bytes=reread if in_l2 else 0,
            blocks=gx,
            threads=tx * ty,
            bytes_in_flight_per_thread=elem_bytes * vec * u,
            epilogue_cycles=400 * passes,
            sfu_ops=transcendentals,
        )
        if best is None or cost.total_s < best[0].total_s * 0.97:
            best = (cost, tx, ty, gx, u)
    cost, tx, ty, gx, u = best
    chunk = math.ceil(G / tx) * tx
    return Mapping(group.form, M, N, vec, tx, ty, 1, chunk, (gx, 1), cost, u)
