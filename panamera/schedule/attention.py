"""The mapping of fused decode attention (poly/attention.py), chosen by the performance model.

A block owns one row tile (up to `rows_per_tile` of the G x Lq query rows that share one kv head)
of one (batch, kv head) and one chunk of the keys; its threads form groups of `lanes` threads per
key (each thread holds `vec`-element vector loads of a key row and of a value row, `slots` of
them per row), the groups take keys in turn (`unroll` keys per step each, loads first), and each
group keeps its own (m, s, o[D]) per row; the groups merge through shared memory at the end. The
key length is split across `split` blocks; their partials merge with log-sum-exp rescaling
(algebra.ONLINE_SOFTMAX_VEC) in the same launch (the last block to arrive, `launches` = 1) or in
a merge kernel (`launches` = 2).

The model chooses the split and the merge: every power-of-two split that keeps the grid in one
wave of resident blocks (registers bound residency: `registers` is this module's estimate of
the kernel's per-thread need, checked by ptxas in tests/test_attention.py), both merges, each
costed with model/kernel_cost.py's `kernel_time`, the cheapest kept. The peer is Flash-Decoding's split
rule (`flash_decoding_split`: split until the (batch x heads x splits) blocks fill the SMs in
waves of at least 85 % of the best efficiency), shown beside ours in `describe`.

>>> import panamera as pn
>>> from panamera.poly.attention import recognize
>>> q = pn.placeholder((1, 32, 1, 128), "float16", name="q")
>>> kv = pn.placeholder((1, 8, 4096, 128), "float16", name="k")
>>> p = plan_attention(recognize((pn.nn.attention(q, kv, kv).inputs[0],)), pn.model.gpu.H100)
>>> p.rows_per_tile, p.vec, p.lanes, p.split > 1
(4, 8, 16, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..algebra import ONLINE_SOFTMAX_VEC
from ..errors import OptionError
from ..model.gpu import GPUSpec
from ..model.kernel_cost import KernelCost, kernel_time, sequence_s
from ..model.workspace import workspace_traffic
from ..poly.attention import AttentionChain

THREADS = 128
REGISTER_BUDGET = 128  # __launch_bounds__(128, 4): ptxas may use 128 registers per thread
SMEM_BUDGET = 40 * 1024  # the block merge's static shared memory


@dataclass(frozen=True)
class AttentionPlan:
    """Every decision codegen and the executor need for one fused attention."""

    chain: AttentionChain
    vec: int  # elements per vector load of q, k, v
    lanes: int  # threads per key (a power of two, <= 32)
    slots: int  # vector loads per thread per row
    unroll: int  # keys per group per step (their loads in flight together)
    rows_per_tile: int
    split: int  # blocks per row tile over the keys
    chunk: int  # keys per block
    launches: int  # 1: the last block merges the partials; 2: a merge kernel
    costs: tuple[KernelCost, ...]  # the main kernel, then the merge kernel where there is one
    considered: tuple[tuple[int, int, float], ...] = ()  # (split, launches, modeled us) of every candidate
    threads: int = THREADS
    peer_split: int = 1  # Flash-Decoding's rule on the same GPU, for comparison (not used)
    peer_us: float = 0.0  # this kernel at the peer's split with the peer's separate combine kernel, modeled
    queued_s: float | None = None  # the planned GPU's queued-launch gap (kernel_cost.sequence_s); None: every floor

    @property
    def groups(self) -> int:
        return self.threads // self.lanes

    @property
    def row_tiles(self) -> int:
        return math.ceil(self.chain.rows / self.rows_per_tile)

    @property
    def grid(self) -> tuple[int, int]:
        """(split x row tiles, batch x kv heads)."""
        return self.split * self.row_tiles, self.chain.B * self.chain.Hkv

    @property
    def partials(self) -> int:
        """Partial accumulators written per call (one per block and row)."""
        return 0 if self.split == 1 else self.grid[0] * self.grid[1] * self.rows_per_tile

    @property
    def modeled_us(self) -> float:
        """The launches back to back: a merge kernel queued behind the main one pays only the gap."""
        total = sum(c.total_s for c in self.costs)
        if self.queued_s is not None and len(self.costs) > 1:
            total -= (len(self.costs) - 1) * (self.costs[0].launch_s - self.queued_s)
        return total * 1e6

    def describe(self) -> str:
        c = self.chain
        return (
            f"ATTENTION B={c.B} Hq={c.Hq} Hkv={c.Hkv} Lq={c.Lq} Lk={c.Lk} D={c.D} mask={c.mask_kind} "
            f"rows/tile={self.rows_per_tile} vec={self.vec} lanes/key={self.lanes} unroll={self.unroll} "
            f"split={self.split} chunk={self.chunk} launches={self.launches} grid={self.grid} "
            f"(Flash-Decoding's rule: split={self.peer_split}, two launches, {self.peer_us:.2f} us modeled)"
        )


def flash_decoding_split(blocks: int, keys: int, sms: int, max_splits: int = 128, block_keys: int = 64) -> int:
    """The peer's rule (Flash-Decoding, flash-attention's split heuristic): no split when the
    blocks already fill 80 % of the SMs; else the smallest split whose wave efficiency
    (blocks x split / SMs over its ceiling) is within 85 % of the best one.

    >>> flash_decoding_split(8, 4096, 132), flash_decoding_split(128, 4096, 132)
    (15, 1)
    """
    if blocks >= 0.8 * sms:
        return 1
    limit = min(max_splits, sms, math.ceil(keys / block_keys))
    eff = [(w := blocks * s / sms) / math.ceil(w) for s in range(1, limit + 1)]
    best = max(eff)
    return next(s for s, e in zip(range(1, limit + 1), eff) if e >= 0.85 * best)


def _vector(c: AttentionChain) -> tuple[int, int, int]:
    """(vec, lanes per key, slots): 16-byte loads where the head dim allows."""
    vec = 16 // c.dtype.itemsize
    while c.D % vec:
        vec //= 2
    lanes = min(32, 1 << max(0, math.ceil(math.log2(math.ceil(c.D / vec)))))
    return vec, lanes, math.ceil(c.D / (lanes * vec))


def registers(vec: int, slots: int, rows: int, unroll: int, acc_words: int) -> int:
    """Estimated registers per thread: q and o per row, (m, s) per row, the unrolled k and v
    loads, and about 24 for addresses and loop state."""
    per_vector = vec * slots * acc_words
    return 2 * rows * per_vector + 2 * rows * acc_words + 2 * unroll * per_vector + 24


def shared_bytes(c: AttentionChain, lanes: int, rows: int) -> int:
    """The block's shared memory (codegen/attention_kernel.py): every group's (m, s, o[D]) per row,
    merged in group order. It and the registers bound the blocks an SM holds (`GPUSpec.resident_blocks`)."""
    return THREADS // lanes * rows * (c.D + 2) * c.acc.itemsize


def _resident(c: AttentionChain, gpu: GPUSpec, vec: int, lanes: int, slots: int, rt: int, unroll: int) -> int:
    """Blocks per SM: threads, registers and shared memory (the one rule, `GPUSpec.resident_blocks`)."""
    regs = registers(vec, slots, rt, unroll, c.acc.itemsize // 4)
    return gpu.resident_blocks(THREADS, shared_bytes(c, lanes, rt), regs)


def _tile(c: AttentionChain, vec: int, lanes: int, slots: int) -> tuple[int, int]:
    """(rows per tile, unroll): the most rows, then the most keys in flight, within budget."""
    words = c.acc.itemsize // 4
    for rt in (8, 4, 2, 1):
        if rt > 1 and rt >= 2 * c.rows:
            continue
        smem = (THREADS // lanes) * rt * (lanes * slots * vec + 2) * c.acc.itemsize
        for unroll in (2, 1):
            if registers(vec, slots, rt, unroll, words) <= REGISTER_BUDGET and smem <= SMEM_BUDGET:
                return rt, unroll
    return 1, 1


def _costs(c: AttentionChain, gpu: GPUSpec, vec, lanes, slots, unroll, rt, split, launches) -> tuple[KernelCost, ...]:
    """Modeled launches of one candidate (model/kernel_cost.py's terms)."""
    tiles = math.ceil(c.rows / rt)
    blocks = split * tiles * c.B * c.Hkv
    kv = c.k.size * c.k.dtype.itemsize + c.v.size * c.v.dtype.itemsize
    reread = (tiles - 1) * kv  # every row tile past the first reads k and v again
    spill = reread if kv > gpu.l2_reach else 0.0  # beyond L2's reach: from DRAM again
    mask = c.mask.size * c.mask.dtype.itemsize if c.mask is not None else 0
    q_bytes, out_bytes = c.q.size * c.q.dtype.itemsize, c.node.size * c.node.dtype.itemsize
    part_bytes = 0 if split == 1 else blocks * rt * (c.D + 2) * 4
    pairs = c.B * c.Hq * c.Lq * c.Lk  # (row, key) pairs
    shuffles = lanes * max(1, int(math.log2(lanes)))
    merge_elems = math.ceil(rt * c.D / THREADS)
    in_flight = 2 * unroll * vec * c.dtype.itemsize
    per_sm = _resident(c, gpu, vec, lanes, slots, rt, unroll)
    main_out = out_bytes if (split == 1 or launches == 1) else 0
    epilogue = 400 + 8 * (THREADS // lanes) * merge_elems
    atomics = 0
    if split > 1 and launches == 1:  # the last block merges: its S partial loads, after an arrival
        epilogue += 2 * gpu.l2_latency_cycles + split * merge_elems * ONLINE_SOFTMAX_VEC.merge_instructions_per_element
        atomics = blocks
    # the partials: read (by the last block or the merge kernel) from L2 where they fit, and discarded
    # there, never written back (codegen/attention_kernel.py; model/workspace.py, the one rule of every split)
    ws = workspace_traffic(gpu, part_bytes, discarded=True)
    read_back = ws["dram_bytes"] - ws["write_bytes"]  # the read's DRAM bytes: 0 where they fit
    main = kernel_time(
        gpu,
        dram_bytes=q_bytes + kv + spill + mask + main_out + ws["write_bytes"] + (read_back if launches == 1 else 0),
        write_bytes=main_out + ws["write_bytes"],
        blocks=min(blocks, gpu.sms * per_sm),  # one wave of register-bound resident blocks (the split keeps it so)
        threads=THREADS,
        bytes_in_flight_per_thread=in_flight,
        atomics=atomics,
        same_address=split if atomics else 0,
        epilogue_cycles=epilogue,
        l2_bytes=reread - spill + (ws["l2_bytes"] if launches == 1 else 0),
        sfu_ops=pairs * ONLINE_SOFTMAX_VEC.merge_transcendentals,
        fp32_ops=pairs * (4 * c.D + shuffles + 10),
        shared_bytes=shared_bytes(c, lanes, rt),
    )
    if split == 1 or launches == 1:
        return (main,)
    merge = kernel_time(
        gpu,
        dram_bytes=out_bytes + read_back,
        write_bytes=out_bytes,
        blocks=tiles * c.B * c.Hkv,
        threads=THREADS,
        bytes_in_flight_per_thread=4 * split,
        epilogue_cycles=400,
        l2_bytes=ws["l2_bytes"],
        sfu_ops=2 * split * c.B * c.Hq * c.Lq,
        fp32_ops=2 * split * c.node.size,
    )
    return main, merge


def split_limits(c: AttentionChain, gpu: GPUSpec) -> tuple[int, int]:
    """The most blocks the model splits `c`'s keys over: (one key step per block at least, every
    block resident in one wave: the model's `_costs` assumes one). The static plan weighs the
    powers of two within both; a size class (schedule/param_attention.py) every split within them."""
    vec, lanes, slots = _vector(c)
    rt, unroll = _tile(c, vec, lanes, slots)
    step = (THREADS // lanes) * unroll  # keys a block takes per step
    per_sm = _resident(c, gpu, vec, lanes, slots, rt, unroll)
    base = math.ceil(c.rows / rt) * c.B * c.Hkv
    return max(1, math.ceil(c.Lk / step)), max(1, gpu.sms * per_sm // base)


def plan_attention(
    c: AttentionChain, gpu: GPUSpec, split: int | None = None, launches: int | None = None
) -> AttentionPlan:
    """The model's plan for fused attention `c` on `gpu`; `split` and `launches` override its
    choices (tests and experiments; the split is clamped to what the keys allow)."""
    if launches not in (None, 1, 2):
        raise OptionError(
            f"attention: launches must be 1 (the last block merges) or 2 (a merge kernel), got {launches!r}"
        )
    vec, lanes, slots = _vector(c)
    rt, unroll = _tile(c, vec, lanes, slots)
    base = math.ceil(c.rows / rt) * c.B * c.Hkv
    most, resident = split_limits(c, gpu)
    if split is not None:
        splits = [max(1, min(split, most))]
    else:
        splits = [1] + [s for s in (2**e for e in range(1, 12)) if s <= most and s <= resident]
    considered = []
    for s in splits:
        chunk = math.ceil(c.Lk / s)
        s = math.ceil(c.Lk / chunk)  # no empty block
        for n in (1,) if s == 1 else (launches,) if launches else (1, 2):
            costs = _costs(c, gpu, vec, lanes, slots, unroll, rt, s, n)
            considered.append((s, n, chunk, costs, sequence_s(costs, gpu) * 1e6))
    s, n, chunk, costs, _ = min(considered, key=lambda t: t[4])
    peer = min(flash_decoding_split(base, c.Lk, gpu.sms), most)
    return AttentionPlan(
        c,
        vec,
        lanes,
        slots,
        unroll,
        rt,
        s,
        chunk,
        n,
        costs,
        tuple((a, b, round(us, 3)) for a, b, _, _, us in considered),
        peer_split=peer,
        peer_us=sequence_s(_costs(c, gpu, vec, lanes, slots, unroll, rt, peer, 1 if peer == 1 else 2), gpu) * 1e6,
        queued_s=gpu.queued_s,
    )
