"""Contractions on tensor cores: the tiling the model chooses for an `analyse`d contraction
(schedule/tensor_core.py), its modeled cost, the merge of its split, and replay's rules for it.

On tensor cores a block owns BM x BN outputs (`wm` x `wn` warps of FM x FN 16 x 16 fragments
each, `frags`) and a K range (split-K: one per gridDim.y); every K slab of BK, its threads
evaluate the two operand expressions (with their fused producers: a dequantized weight is
computed in registers) into shared memory as the MMA's operand type, zero outside the tile, and
each warp runs FM x FN x BK / 16 `nvcuda::wmma` m16n16k16 MMAs (codegen/tc_kernel.py); on a GPU with
warpgroup MMAs (sm_90a) a tile may instead be 1-2 warpgroups of 64 x N, each issuing BK / 16
(s8: BK / 32) `wgmma.mma_async` (`MmaOp`, `wgmma_error`), which the model rates at the tensor cores' full peak. The result
is merged as the CUDA-core template merges it (store, one atomic per block into the resident
workspace, or partials the last block combines, landed in shared memory where they fit:
`landing`, decided once by `candidates` and carried on the decision as `Decision.mma_land`).

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> from panamera.model.gpu import H100
>>> x, w = pn.placeholder((64, 256), "float16", name="x"), pn.placeholder((64, 256), "float16", name="w")
>>> g = lower(x @ w.T, stop_after="groups", target="emulator").groups[0]
>>> cost, d = choose(g, H100)
>>> d.mma, tiles(d)[2] in (32, 64, 128)
('f16', True)
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, replace

from ..model.gpu import GPUSpec
from ..model.kernel_cost import KernelCost, kernel_time
from ..model.workspace import workspace_traffic
from ..poly.access import AccessKind, choose_vec
from ..poly.expr import Expr
from ..poly.program import KernelGroup
from ..poly.statement import StatementKind
from ..runtime.plan import MAX_ASYNC_COPIES
from .decision import MAX_GRID_Y, Decision, MergeMode
from .derived import access_for, along, input_bytes, levels_for, merges_for, partials_options, vector_extent
from .int4_dequant import OPS_PER_WEIGHT, Nibbles, nibbles
from .rtile import register_budget
from .tensor_core import FRAG, Mma, Operands, analyse, operand_reads
from .warpgroup import MmaOp, registers, warpgroup_tiles, wgmma_error

UNROLL = 4  # staging loop copies per step: the operand loads a thread has in flight (codegen/tc_staging.py)
UNROLL_OPS = 6  # beyond this many operations per element (int4's unpacking), 2 copies: 64 registers, no spill
STAGING_REGISTERS = 32  # loaded lanes a thread's staging step may hold (staging_unroll)
SMEM_BYTES = 48 * 1024  # static shared memory per block


def frags(d: Decision) -> tuple[int, int]:
    """Fragments per warp along rows and columns (FM, FN): mma_tile (wm, wn, bk, FM, FN), or (1, 1)
    for a three-part tile. A warp's FM x FN accumulators share each A fragment FN times and each
    B fragment (a dequantized weight's) FM times: fewer shared-memory loads per MMA, larger block
    tiles (fewer L2 re-reads of the operands) for the same warps.

    >>> from panamera.poly.statement import Form
    >>> frags(Decision(statements=("s",), form=Form.ROW, M=1, N=1, stitched=False, vec=8, tx=32, ty=1, split=1,
    ...                chunk=64, grid=(1, 1), unroll=1, merges=(), access=(), levels=(), mma="f16",
    ...                mma_tile=(1, 2, 64, 4, 1)))
    (4, 1)
    """
    return (d.mma_tile[3], d.mma_tile[4]) if len(d.mma_tile) == 5 else (1, 1)


def tiles(d: Decision) -> tuple[int, int, int]:
    """(BM, BN, BK) of a tensor-core decision: wm x FM fragments of rows, wn x FN of columns."""
    wm, wn, bk = d.mma_tile[:3]
    fm, fn = frags(d)
    return FRAG * wm * fm, FRAG * wn * fn, bk


def grid_tiles(ops: Operands, d: Decision) -> tuple[int, int]:
    """Row tiles and column tiles: gridDim.x = their product, column tiles fastest."""
    BM, BN, _ = tiles(d)
    return math.ceil(ops.rows / BM), math.ceil(ops.cols / BN)


def smem_bytes(kind: Mma, BM: int, BN: int, BK: int) -> int:
    return (BM + BN) * BK * kind.itemsize + BM * BN * 4


def candidates(group: KernelGroup, ops: Operands, gpu: GPUSpec, split: int | None, deterministic: bool):
    """Tensor-core decisions: warps 1-8 of FM x FN fragments each (`_warp_tiles`), K slabs of
    32-128, power-of-two splits (each at least one slab; none for a stitched group), atomics or
    partials."""
    vec = choose_vec(group.statements, along(group), vector_extent(group))  # k lanes per staging load
    base = dict(
        statements=group.names, form=group.form, M=group.M, N=group.N, stitched=group.stitched, levels=levels_for(group),
        epilogue=group.epilogue, vec=vec, ty=1, unroll=1, access=access_for(group, vec),
        atomic_vec=(1,) * len(group.statements), mma=str(ops.kind),
    )  # fmt: skip
    merge_options = partials_options(group.statements, deterministic)
    Kp = math.ceil(ops.K / FRAG) * FRAG
    for wm, wn, fm, fn, op in [(*t, MmaOp.MMA_SYNC) for t in _warp_tiles(ops)] + warpgroup_tiles(ops, gpu, vec):
        for bk in (32, 64, 128):
            BM, BN = FRAG * wm * fm, FRAG * wn * fn
            if bk > max(32, Kp) or smem_bytes(ops.kind, BM, BN, bk) > SMEM_BYTES:
                continue
            tile = (wm, wn, bk) if fm == fn == 1 else (wm, wn, bk, fm, fn)
            slabs = math.ceil(ops.K / bk)
            gx = math.ceil(ops.rows / BM) * math.ceil(ops.cols / BN)
            splits = [1 << e for e in range(min(MAX_GRID_Y, slabs).bit_length()) if 1 << e <= slabs]
            if split is not None:
                splits = [max(1, min(split, slabs))]
            if group.stitched:  # its split would be a cooperative launch: whole K per block
                splits = [1]
            probe = Decision(**base, tx=32 * wm * wn, split=1, chunk=bk, grid=(1, 1), merges=(), mma_tile=tile,
                             mma_op=op)  # fmt: skip
            if held_registers(ops, probe, group) > HELD_REGISTERS:
                continue
            for s in splits:
                chunk = math.ceil(slabs / s) * bk
                s_eff = math.ceil(ops.K / chunk)
                for partials in merge_options if s_eff > 1 else merge_options[:1]:
                    merges = merges_for(group, s_eff, partials)
                    d = Decision(**base, tx=32 * wm * wn, split=s_eff, chunk=chunk, grid=(gx, s_eff), merges=merges,
                                 mma_tile=tile, mma_op=op)  # fmt: skip
                    land = landing(ops.kind, d, ops.rows, group.statements[0].acc.itemsize)
                    if land:  # decided here, once: the cost, replay and codegen read it (`landed`)
                        d = replace(d, mma_land=astuple(land))
                    if unlanded_fragments(d):
                        continue
                    yield d


def unlanded_fragments(d: Decision) -> bool:
    """A warp of more than one fragment whose split's merge would hold the outputs' partials in
    registers (atomics, or partials that are not `landed`): refused, ptxas spilled 16 outputs
    per thread of a 2-fragment warp (int4, sm_80)."""
    return frags(d) != (1, 1) and d.split > 1 and landed(d) is None


WARP_FRAGS = ((1, 1), (2, 1), (1, 2))  # (FM, FN) per warp: 2 x 2 bf16 spilled on sm_80 (64 registers)


def _warp_tiles(ops: Operands):
    """(wm, wn, FM, FN): 1-8 warps, each FM x FN fragments (`frags`), neither axis of the block
    tile beyond the operand's rows or columns padded to 16 (a warp of more than one fragment
    only where the block's warps already cover that axis)."""
    rows, cols = math.ceil(ops.rows / FRAG) * FRAG, math.ceil(ops.cols / FRAG) * FRAG
    for wm in (1, 2, 4):
        for wn in (1, 2, 4, 8):
            for fm, fn in WARP_FRAGS:
                if wm * wn > 8 or (wm * fm > 1 and FRAG * wm * fm > rows) or (wn * fn > 1 and FRAG * wn * fn > cols):
                    continue
                yield wm, wn, fm, fn


def _ops(e: Expr) -> int:
    return sum(1 for n in e.walk() if n.op not in ("load", "const"))


def _bytes_per_element(group: KernelGroup, e: Expr, elements: int) -> float:
    """Bytes of the distinct tensors an operand expression reads, per operand element."""
    st = group.statements[0]
    ts = {st.reads[r].tensor.uid: st.reads[r].tensor for r in operand_reads(e) if st.reads[r].memory}
    return sum(t.size * t.dtype.itemsize for t in ts.values()) / max(1, elements)


def staging_steps(rows: int, d: Decision) -> int:
    """Iterations of the loop staging `rows` x BK operand elements, `vec` consecutive k per thread
    and step, over the block's threads."""
    return math.ceil(rows * tiles(d)[2] / d.vec / d.threads)


def loads_first(e: Expr, d: Decision, group: KernelGroup) -> bool:
    """Whether operand `e`'s slabs are loaded whole into registers (`staging_steps` vectors per
    thread, all in flight), double-buffered: the next slab's loads are issued before this slab's
    other operand is staged and its values converted (codegen/tc_staging.py). So are a packed int4
    weight (schedule/int4_dequant.py) and `words_first` operands (an int8 weight and its scale).
    Their tiles hold at most `HELD_REGISTERS` registers of loads per thread (`held_registers`;
    ptxas spilled 8 held int4 words of bf16, and 24 registers of int8 loads, beside the MMA's
    fragments)."""
    st = group.statements[0]
    return isinstance(nibbles(e, st, d.mma, d.vec, d.access[0]), Nibbles) or words_first(e, st, d)


def words_first(e: Expr, st, d: Decision) -> bool:
    """An operand that is not a raw copy, whose reads are all in memory (no gather, no index),
    each a contiguous vector of 4, 8 or 16 bytes over the step's vec lanes or one value for all
    of them (UNIFORM), at least one contiguous: loaded raw first, converted lane by lane later."""
    access = d.access[0]
    reads = operand_reads(e)
    if raw_copy(e, st, Mma(d.mma), d.vec, access) or any(not st.reads[r].memory for r in reads):
        return False
    contig = [
        r for r in reads if access[r] == AccessKind.CONTIG and d.vec * st.reads[r].tensor.dtype.itemsize in (4, 8, 16)
    ]
    return bool(contig) and all(r in contig or access[r] == AccessKind.UNIFORM for r in reads)


HELD_REGISTERS = 16  # registers of the `loads_first` loads a thread holds, both buffers (ptxas spilled 24 at M 64)


def held_registers(ops: Operands, d: Decision, group: KernelGroup) -> int:
    """Registers per thread that a `loads_first` operand's two slabs of loads hold: per staging
    step a 32-bit register per 4 bytes of each vector load and one per uniform value (an int4
    step: its word and scale; an int8 step of 8 lanes: 2 and the scale); 0 without one."""
    st, total = group.statements[0], 0
    for e, rows in ((ops.a, tiles(d)[0]), (ops.b, tiles(d)[1])):
        if not loads_first(e, d, group):
            continue
        if isinstance(nibbles(e, st, d.mma, d.vec, d.access[0]), Nibbles):
            per_step = d.vec // 8 + 1
        else:
            per_step = sum(
                d.vec * st.reads[r].tensor.dtype.itemsize // 4 if d.access[0][r] == AccessKind.CONTIG else 1
                for r in operand_reads(e)
            )
        total += 2 * staging_steps(rows, d) * per_step
    return total


def staging_unroll(e: Expr, rows: int, d: Decision, group: KernelGroup, held: bool = False) -> int:
    """Copies of the staging loop's body per step (its loads in flight): as many as keep the
    loaded lanes (vec per memory read of the expression) within `STAGING_REGISTERS`, at most
    `UNROLL`, 2 for an expression of more than `UNROLL_OPS` operations, and at most the loop's
    iterations; 1 while the other operand's int4 words are `held` (`loads_first`). (ptxas under
    the 64 registers of __launch_bounds__ spilled int4's unpacking at 4 copies, int8 weights with
    their scales at 4 x 8 lanes, and the activations' raw copies at 2 beside 8 held words.)"""
    if held:
        return 1
    st = group.statements[0]
    lanes = d.vec * max(1, sum(1 for r in operand_reads(e) if st.reads[r].memory))
    copies = max(1, min(UNROLL if _ops(e) <= UNROLL_OPS else 2, STAGING_REGISTERS // lanes))
    return min(copies, staging_steps(rows, d))


PARTIAL_REGISTERS = 16  # partials a thread of the last block holds at once (ptxas spilled 32 at 8 outputs x 4 blocks)


def partial_batch(per_thread: int, split: int) -> int:
    """Blocks whose partials the last block's threads load together in one batch: each thread's
    `per_thread` outputs x that many blocks stay within `PARTIAL_REGISTERS` loads in flight
    (codegen/tc_partials.py `combine_partials`); the partials then cost ceil(split / batch) L2 round
    trips, not one per output and block.

    >>> partial_batch(8, 2), partial_batch(4, 16), partial_batch(64, 2)
    (2, 4, 1)
    """
    return max(1, min(split, PARTIAL_REGISTERS // max(1, per_thread)))


MAX_LANDED_COPIES = MAX_ASYNC_COPIES  # cp.async copies one thread may have in flight (the emulator's bound)
# [assumed] shared memory 1024 threads' blocks may hold for landed partials, so that a landing does not
# buy its one round trip with residency the model does not see (H100: 228 KB per SM; A100's 164 KB: 3 of 4)
LANDING_PER_SM = 192 * 1024


@dataclass(frozen=True)
class Landing:
    """How the last block of a split with partials gathers them in one L2 round trip: the first
    `blocks` blocks' partials of each of its outputs copied to shared memory (`bytes` of it, the
    K slabs' and the accumulators' storage reused), the other `held` blocks' loaded into
    registers, all in flight together (codegen/tc_partials.py `land_partials`)."""

    blocks: int
    held: int
    bytes: int
    copy: int  # bytes per cp.async (4, 8 or 16)


def landed(d: Decision) -> Landing | None:
    """The landing `candidates` decided for `d` (carried as `Decision.mma_land`), or None."""
    return Landing(*d.mma_land) if d.mma_land else None


def landing(kind: Mma, d: Decision, rows: int, acc_bytes: int) -> Landing | None:
    """The split's partials landed in shared memory (`__pipeline_memcpy_async`) and registers, or
    None where they do not fit: then the register batches of `partial_batch` (one L2 round trip
    each). Shared memory: at most `SMEM_BYTES`, and no more than the block's share of
    `LANDING_PER_SM` unless the K slabs and accumulators take that already; the blocks that do
    not fit are held in registers, at most `PARTIAL_REGISTERS` per thread; at most
    `MAX_LANDED_COPIES` copies per thread.

    >>> from panamera.poly.statement import Form
    >>> d = Decision(statements=("s",), form=Form.ROW, M=4096, N=64, stitched=False, vec=8, tx=256, ty=1, split=4,
    ...              chunk=16, grid=(64, 4), unroll=1, merges=(MergeMode.PARTIALS,), access=(), levels=(),
    ...              mma="f16", mma_tile=(2, 4, 128, 2, 1))
    >>> landing(Mma.F16, d, 64, 4)  # 64 x 64 outputs, 16 per thread: 3 blocks' partials in 48 KB, one held
    Landing(blocks=3, held=1, bytes=49152, copy=4)
    """
    if d.split < 2 or MergeMode.PARTIALS not in d.merges:
        return None
    BM, BN, BK = tiles(d)
    RM = min(BM, rows)  # the tile's rows that hold outputs
    per_block, pt = RM * BN * acc_bytes, math.ceil(RM * BN / d.threads)
    own = smem_bytes(kind, BM, BN, BK)  # the K slabs and the accumulators' tile: free once the last block is known
    cap = min(SMEM_BYTES, max(own, LANDING_PER_SM * d.threads // 1024))
    blocks = min(d.split, cap // per_block)
    held = d.split - blocks
    if blocks < 1 or held * pt > PARTIAL_REGISTERS:
        return None
    copy = next(c for c in (16, 8, 4) if (blocks * acc_bytes) % c == 0 and (d.split * acc_bytes) % c == 0)
    if pt * blocks * acc_bytes // copy > MAX_LANDED_COPIES:
        return None
    return Landing(blocks, held, max(own, blocks * per_block), copy)


def landing_error(kind: Mma, d: Decision, rows: int, acc_bytes: int) -> str | None:
    """Why a carried landing (`Decision.mma_land`, a saved schedule's) cannot run, as "N: why",
    or None (nothing carried, or every precondition holds; one negative test each in
    tests/test_tensor_core.py). `LANDING_PER_SM` is the model's preference, not a rule.
      1. it is (blocks, held, bytes, copy), on a split whose blocks write partials;
      2. blocks >= 1 land and held >= 0 are loaded, blocks + held = the split;
      3. its buffer holds the K slabs and accumulators it reuses and the landed partials, within
         `SMEM_BYTES`;
      4. the held partials take at most `PARTIAL_REGISTERS` registers per thread;
      5. copies of 4, 8 or 16 bytes, aligned at both ends (dividing blocks and split x the
         accumulator's bytes), at most `MAX_LANDED_COPIES` per thread."""
    if not d.mma_land:
        return None
    if len(d.mma_land) != 4 or d.split < 2 or MergeMode.PARTIALS not in d.merges:
        return "1: not (blocks, held, bytes, copy) of a split merging partials"
    land = landed(d)
    if land.blocks < 1 or land.held < 0 or land.blocks + land.held != d.split:
        return f"2: {land.blocks} landed + {land.held} held blocks are not the split's {d.split}"
    BM, BN, BK = tiles(d)
    RM = min(BM, rows)
    per_block, pt = RM * BN * acc_bytes, math.ceil(RM * BN / d.threads)
    need = max(smem_bytes(kind, BM, BN, BK), land.blocks * per_block)
    if not need <= land.bytes <= SMEM_BYTES:
        return f"3: {land.bytes} bytes, not between the {need} it needs and {SMEM_BYTES}"
    if land.held * pt > PARTIAL_REGISTERS:
        return f"4: {land.held} held blocks x {pt} outputs per thread exceed {PARTIAL_REGISTERS} registers"
    if land.copy not in (4, 8, 16) or (land.blocks * acc_bytes) % land.copy or (d.split * acc_bytes) % land.copy:
        return f"5: copies of {land.copy} bytes are not 4, 8 or 16 aligned at both ends"
    if pt * land.blocks * acc_bytes // land.copy > MAX_LANDED_COPIES:
        return f"5: more than {MAX_LANDED_COPIES} copies per thread"
    return None


RAW_OPS_PER_STEP = 4  # a raw staging step: its vector load, shared store, address and tail test


def raw_copy(e: Expr, st, kind: Mma, vec: int, access: tuple) -> bool:
    """Whether operand `e` is one contiguous read of the MMA's own type whose `vec` lanes are 4,
    8 or 16 bytes: staged by copying them (codegen/tc_staging.py), not converted lane by lane."""
    if e.op != "load" or not st.reads[e.read].memory or access[e.read] != AccessKind.CONTIG:
        return False
    return st.reads[e.read].tensor.dtype.name == kind.dtype and vec * kind.itemsize in (4, 8, 16)


def staging_ops(e: Expr, d: Decision, group: KernelGroup) -> float:
    """CUDA-core instructions per staged element of operand `e`: a raw copy `RAW_OPS_PER_STEP`
    per vec lanes, a packed int4 weight by the exponent trick (schedule/int4_dequant.py)
    `OPS_PER_WEIGHT`, else the expression's operations, its conversion and the shared store."""
    st = group.statements[0]
    if raw_copy(e, st, Mma(d.mma), d.vec, d.access[0]):
        return RAW_OPS_PER_STEP / d.vec
    if isinstance(nibbles(e, st, d.mma, d.vec, d.access[0]), Nibbles):
        return OPS_PER_WEIGHT
    return _ops(e) + 2


def tc_cost(group: KernelGroup, gpu: GPUSpec, d: Decision) -> KernelCost:
    """The model's time of a tensor-core decision: the CUDA-core cost's DRAM, merge and tail
    terms, with the operands staged once per tile (the other tiles' re-reads hit L2), the
    CUDA-core instructions of staging (the operand expression, its conversion and the shared
    store per staged element) and the MMAs' FLOPs at the tensor cores' rate (kernel_time's
    `mma_flops`), on padded tiles."""
    ops = analyse(group)
    assert not isinstance(ops, str), ops
    BM, BN, BK = tiles(d)
    MT, NT = grid_tiles(ops, d)
    Kp = d.chunk * d.split
    st = group.statements[0]
    a_bytes = _bytes_per_element(group, ops.a, ops.rows * ops.K)
    b_bytes = _bytes_per_element(group, ops.b, ops.cols * ops.K)
    l2 = a_bytes * ops.rows * ops.K * (NT - 1) + b_bytes * ops.cols * ops.K * (MT - 1)
    staged_a, staged_b = MT * BM * Kp * NT, NT * BN * Kp * MT
    fp32 = staged_a * staging_ops(ops.a, d, group) + staged_b * staging_ops(ops.b, d, group)
    # bytes in flight from DRAM: an operand's loads in flight times the share of its staged bytes that
    # DRAM serves (the other tiles' re-reads hit L2: 1 / NT of the rows' operand, 1 / MT of the columns');
    # a packed int4 operand has its slab and the next in flight while the other is staged, else the loops take turns
    first = [loads_first(e, d, group) for e in (ops.a, ops.b)]
    lanes = [
        2 * staging_steps(rows, d)  # double-buffered
        if held
        else staging_unroll(e, rows, d, group, any(first))
        for e, rows, held in ((ops.a, BM, first[0]), (ops.b, BN, first[1]))
    ]
    flights = (d.vec * lanes[0] * a_bytes / NT, d.vec * lanes[1] * b_bytes / MT)
    kept = group.on_chip - group.external
    stored = [s for s in group.statements if s.kind == StatementKind.MAP or s.result.uid not in kept]
    out_bytes = group.M * sum(s.result.dtype.itemsize for s in stored)
    split = d.split > 1
    partials = any(m.value == "partials" for m in d.merges)
    # the workspace (every block's partials, or the words the atomics merge into): written back, read from
    # L2 where it fits (model/workspace.py, the one rule of every split plan); the last block discards the
    # partials' lines it has read (codegen/tc_partials.py), an atomic workspace stays resident
    ws = workspace_traffic(gpu, group.M * (d.split if partials else 1) * st.acc.itemsize if split else 0, partials)
    blocks = d.grid[0] * d.split
    # the last block's element loop over its share of the tile's outputs (4 cycles each) after the loads of
    # what it merges, all in flight together (codegen/tc_partials.py): one L2 round trip for the atomic
    # workspace, one per batch of blocks' partials (`partial_batch`)
    # (or all of them at once where they land in shared memory and registers, `landing`)
    per_thread = math.ceil(min(BM, ops.rows) * BN / d.threads)  # the rows of the tile that hold outputs
    trips = (math.ceil(d.split / partial_batch(per_thread, d.split)) if partials else 1) if split else 0
    land = landed(d)
    if land:
        trips = 1
    tail = 400 + per_thread * 4 + trips * gpu.l2_latency_cycles
    return kernel_time(
        gpu,
        dram_bytes=input_bytes(group) + out_bytes + ws["dram_bytes"],
        write_bytes=out_bytes + ws["write_bytes"],
        blocks=blocks,
        threads=d.threads,
        bytes_in_flight_per_thread=sum(flights) if any(first) else max(flights),
        atomics=(blocks + (0 if partials else group.M * d.split)) if split else 0,
        same_address=d.split if split else 0,
        atomic_dtype=st.acc.name if split and not partials else "",
        epilogue_cycles=tail,
        l2_bytes=l2 + ws["l2_bytes"],
        fp32_ops=fp32,
        mma_flops=2.0 * MT * BM * NT * BN * Kp,
        mma_dtype=Mma(d.mma).dtype,
        mma_async=d.mma_op == MmaOp.WGMMA,  # warpgroup MMAs: the full rate, mma.sync's is half on Hopper
        # the block's shared memory (codegen/tc_kernel.py declares it): the K slabs and accumulators, or the
        # landing that reuses them; it bounds the blocks an SM holds (GPUSpec.resident_blocks)
        shared_bytes=land.bytes if land else smem_bytes(Mma(d.mma), BM, BN, BK),
        # what the launch bounds let ptxas use (model/gpu.py launch_bound_registers); a warpgroup tile's
        # estimate where it is fewer (N / 2 accumulators a thread, schedule/warpgroup.registers)
        registers=min(register_budget(d), registers(d.mma_tile, d.split, any(first), Mma(d.mma)))
        if d.mma_op == MmaOp.WGMMA
        else register_budget(d),
    )


def choose(group: KernelGroup, gpu: GPUSpec, split: int | None = None, deterministic: bool = False):
    """The tensor-core decision with the least modeled time and its cost, or None where the
    preconditions fail."""
    ops = analyse(group)
    if isinstance(ops, str):
        return None
    costed = ((tc_cost(group, gpu, d), d) for d in candidates(group, ops, gpu, split, deterministic))
    return min(costed, key=lambda cd: cd[0].total_s, default=None)


def check(group: KernelGroup, d: Decision, gpu: GPUSpec, at: str) -> None:
    """Replay's rules for a tensor-core decision (schedule/replay.py): the preconditions hold for
    the group, the tile is 1-8 warps of `WARP_FRAGS` wmma fragments each, with a K slab that is a
    multiple of 16 and fits in shared memory, the block is one dimension of 32 x warps threads, the grid covers the row
    and column tiles, the split covers K in whole slabs and the vector width divides 16; a carried landing holds
    `landing_error`'s preconditions, and a warp of more than one fragment lands its split's partials; a warpgroup
    tile (`mma_op` wgmma) holds `wgmma_error`'s preconditions on `gpu`."""
    from ..errors import ScheduleError

    if not d.mma:
        return
    if d.cluster > 1 or d.persistent or str(d.onchip) != "memory":
        raise ScheduleError(
            f"{at}: a tensor-core kernel is neither a thread-block cluster, a persistent grid nor a row kept on chip"
        )
    ops = analyse(group)
    if isinstance(ops, str):
        raise ScheduleError(f"{at}: tensor cores are not legal here (precondition {ops})")
    if str(ops.kind) != d.mma:
        raise ScheduleError(f"{at}: MMA type {d.mma}, the operands' is {ops.kind}")
    if d.mma_op not in set(MmaOp):
        raise ScheduleError(f"{at}: mma_op {d.mma_op!r} is not one of {[str(o) for o in MmaOp]}")
    problem = wgmma_error(gpu, ops.kind, d.mma_tile, d.vec) if d.mma_op == MmaOp.WGMMA else None
    if problem:
        raise ScheduleError(f"{at}: not a warpgroup-MMA tile ({problem})")
    if len(d.mma_tile) not in (3, 5):
        raise ScheduleError(
            f"{at}: mma_tile {d.mma_tile} is not (warps along rows, along columns, K slab[, fragments per warp "
            "along rows, along columns])"
        )
    wm, wn, bk = d.mma_tile[:3]
    BM, BN, _ = tiles(d)
    if frags(d) not in WARP_FRAGS and d.mma_op != MmaOp.WGMMA:
        raise ScheduleError(f"{at}: {frags(d)} fragments per warp, not one of {WARP_FRAGS}")
    if wm < 1 or wn < 1 or wm * wn > 8 or bk < FRAG or bk % FRAG or smem_bytes(ops.kind, BM, BN, bk) > SMEM_BYTES:
        raise ScheduleError(
            f"{at}: tensor-core tile {d.mma_tile} is not 1-8 warps with a K slab of 16s in shared memory"
        )
    if d.tx != 32 * wm * wn or d.ty != 1 or FRAG % d.vec:
        raise ScheduleError(
            f"{at}: a tensor-core block is ({32 * wm * wn}, 1) threads with vectors dividing 16, "
            f"not ({d.tx}, {d.ty}) x {d.vec}"
        )
    MT, NT = grid_tiles(ops, d)
    if held_registers(ops, d, group) > HELD_REGISTERS:
        raise ScheduleError(
            f"{at}: tile {d.mma_tile} holds {held_registers(ops, d, group)} registers of loads per thread, "
            f"more than {HELD_REGISTERS} (a smaller K slab or more warps)"
        )
    if d.stitched and d.split > 1:
        raise ScheduleError(f"{at}: a stitched group on tensor cores is not split (split {d.split})")
    problem = landing_error(ops.kind, d, ops.rows, group.statements[0].acc.itemsize)
    if problem:
        raise ScheduleError(f"{at}: mma_land {d.mma_land} is not a landing of this tile's partials ({problem})")
    if unlanded_fragments(d):
        raise ScheduleError(
            f"{at}: a warp of {frags(d)} fragments merges its split in registers (land its partials: a smaller split)"
        )
    if d.grid[0] != MT * NT or d.chunk % bk or d.chunk * d.split < ops.K or d.chunk * (d.split - 1) >= ops.K:
        raise ScheduleError(
            f"{at}: grid {d.grid} with chunk {d.chunk} does not cover the {MT} x {NT} tiles and K {ops.K}"
        )
