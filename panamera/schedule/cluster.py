"""Thread-block clusters: the blocks that share a split row exchange partials on chip (sm_90).

A stitched group split across S blocks (schedule/mapping.py) exchanges its partials after each
pass with reductions. Without clusters they go through global memory and a grid-wide wait, so
every block of the grid must be resident (a cooperative launch, `Decision.cooperative`). On
sm_90 the S blocks of a row can be one thread-block cluster (`__cluster_dims__(1, S, 1)`,
`Decision.cluster` = S): they are co-scheduled on neighbouring SMs and exchange as QuACK's
cluster reduction does (quack/reduce.py `cluster_reduce`): every warp reduces its partial with
shuffles and pushes it into the shared memory of each block of the cluster (a store through
`cluster.map_shared_rank`), then after the cluster barrier every warp combines the W x S
partials of its row from its own shared memory in one fixed order (rank, then warp) and
shuffles the result to its lanes (codegen/stitched_kernel.py). No block barrier, no read of a
peer's memory after the barrier, and so no barrier before a block exits; the barrier that makes
every block of the cluster started before the first push is split: arrived at the kernel's start,
waited for after the first pass's loads. No global round trip, no counter, and only the cluster
must be co-resident, so a grid of many split rows (32K rows of 65K) runs in waves.

    exchange (cooperative):  ws[o * S + by] = part; grid wait; acc = sum_b ws[o * S + b]
    exchange (cluster):      *map_shared_rank(&dsm[ty][rank * W + w], b) = warp part for each b;
                             cluster.sync(); acc = warp-reduce of dsm[ty][0 .. W * S)

Splits larger than a cluster keep the cooperative plan.

Completion (`Decision.completion`). The cluster barrier after the pushes makes every block wait
for every thread of the cluster. QuACK completes the exchange instead with an mbarrier in each
block that counts the bytes landing in it (quack/utils.py `store_shared_remote`,
`mbarrier_arrive_and_expect_tx`): one thread of each block announces the bytes its peers will
push (mbarrier.arrive.expect_tx), every push is an `st.async ... mbarrier::complete_tx::bytes`
into the peer's buffer and onto the peer's mbarrier, and a block's threads wait on their own
mbarrier only (mbarrier.try_wait.parity), for the bytes that are theirs. Each exchange has its
own mbarrier, used for one phase; they are initialized once at the start, before the split
cluster barrier that already guards the first push (fence.mbarrier_init.release.cluster, then
barrier.cluster.arrive), codegen/mbarrier.py. The model takes it where it is cheaper
(`exchange_cycles`, `MBARRIER_INIT_CYCLES`):

    exchange (mbarrier):     expect_tx(bytes of W x S partials); st.async(peer slot, part, peer mbarrier)
                             for each peer b; wait(own mbarrier, parity 0); acc = warp-reduce as above

A split reduce kernel (codegen/reduce_kernel.py) may group its blocks into clusters of C too: the
cluster's blocks combine their partials in its rank-0 block through distributed shared memory,
and only the split / C rank-0 blocks merge as the merge mode says (atomics or partials and the
last block; a split that is one cluster stores directly). `Decision.merges` are the merges of
those split / C partials. By the cluster barrier, each block stores its partial in its own shared
memory, a barrier, rank 0 loads the C partials from its peers (loop-carried distributed-shared-
memory loads), a second barrier keeps the peers alive until then (`merge_cycles`). By mbarriers,
every block pushes its partial into rank 0 with st.async onto rank 0's mbarrier (armed at the
start, before the split barrier the main loop hides), and only rank 0 waits, then folds the C
partials from its own shared memory: one push latency, no barrier after the main loop.

    combine (barrier):   csm[ty] = part; cluster.sync(); rank 0: acc = fold_b *map_shared_rank(&csm[ty], b);
                         cluster.sync()
    combine (mbarrier):  st.async(rank 0's csm[rank][ty], part, rank 0's mbarrier);
                         rank 0: wait(mbarrier, parity 0); acc = fold_b csm[b][ty]

Preconditions (`check`; one negative test each in tests/test_cluster.py, 5's in tests/test_mbarrier.py):
  1. the cluster divides the split (= gridDim.y), and is every block of a split stitched row;
  2. the GPU has clusters of that size (`GPUSpec.max_cluster`: 16 on sm_90, none before);
  3. a reduce kernel's clusters: a ROW/ALL group without register tile or pipeline (one partial
     per row of the block);
  4. a stitched row's cluster: whole warps per row (`tx` a multiple of 32: each warp pushes one
     partial of one row);
  5. mbarrier completion only with clusters: a stitched row split over one cluster, or a reduce
     kernel's clusters (a plan without clusters has nothing to complete). The bytes a phase
     expects stay far below the mbarrier's 2^20 - 1 transaction count: at most 16 blocks x 1024
     threads' partials of a few words.

>>> from panamera.model import H100, A100
>>> H100.max_cluster, A100.max_cluster
(16, 1)
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import ScheduleError
from ..model.gpu import GPUSpec
from ..poly.program import KernelGroup
from ..poly.statement import Form
from .decision import Completion, Decision

# [assumed] Hopper microbenchmarks (Luo et al., "Benchmarking and Dissecting the Nvidia Hopper GPU
# Architecture", 2024) put a distributed-shared-memory load at ~180-210 cycles; the cluster barrier
# (arrive + wait) is taken as one such round trip.
DSMEM_CYCLES = 200
CLUSTER_SYNC_CYCLES = 200
# [assumed] the warp-level work around a pushed exchange: the shuffle reduction of the warp's
# partial before it, the W x S local loads and the shuffle reduction after it (no block barrier).
WARP_COMBINE_CYCLES = 100
# [assumed] the mbarriers' set-up, once per kernel: one thread's mbarrier.init per exchange and its
# fence.mbarrier_init.release.cluster, before the split cluster barrier of the start (whose wait the
# first pass's loads hide); taken as half a distributed-shared-memory round trip. No measurement in
# docs/GPU_MODEL.md or CALIBRATION.md yet: a GPU run of bench/long_rows should replace it.
MBARRIER_INIT_CYCLES = 100
# [assumed] one shared-memory load of the block's own memory, loop-carried in rank 0's fold of the C
# partials under mbarriers (GPU_MODEL's L1 latency, ~30 cycles).
SMEM_CYCLES = 30


def problem(group: KernelGroup, d: Decision, gpu: GPUSpec) -> str:
    """Why `d.cluster` is not legal (the module's preconditions), or "" when it is."""
    if d.completion == Completion.MBARRIER and d.cluster == 1:
        return "5: mbarrier completion needs a thread-block cluster (a stitched row's, or a reduce kernel's)"
    if d.cluster == 1:
        return ""
    if d.split < 2 or d.split % d.cluster or d.grid[1] != d.split or (group.stitched and d.cluster != d.split):
        return (
            f"1: a cluster of {d.cluster} blocks must divide the split ({d.split}) and, for a stitched row, "
            "be all of its blocks"
        )
    if not group.stitched and (group.form not in (Form.ROW, Form.ALL) or d.rtile * d.ctile > 1 or d.stages > 1):
        return "3: a reduce kernel's clusters combine one partial per row: ROW/ALL, no register tile, no pipeline"
    if group.stitched and d.tx % 32:
        return f"4: a stitched row's cluster needs whole warps per row ({d.tx} threads per row)"
    if not 2 <= d.cluster <= gpu.max_cluster:
        return f"2: {gpu.name} has no thread-block clusters of {d.cluster} blocks (at most {gpu.max_cluster})"
    return ""


def completions(group: KernelGroup, d: Decision, gpu: GPUSpec) -> tuple[Completion, ...]:
    """The completions the model prices for `d` (precondition 5): the cluster barrier
    always, and mbarriers with clusters.

    >>> from panamera.model import H100
    >>> import panamera as pn
    >>> g = pn.compile(pn.nn.softmax(pn.placeholder((2, 8192))), target="emulator", use_database=False).groups[0]
    >>> d = Decision(statements=g.names, form=g.form, M=2, N=8192, stitched=True, vec=4, tx=256, ty=1, split=4,
    ...              chunk=512, grid=(2, 4), unroll=1, merges=(), access=(), levels=(), cluster=4)
    >>> [str(c) for c in completions(g, d, H100)]
    ['barrier', 'mbarrier']
    """
    how = (Completion.BARRIER, Completion.MBARRIER)
    return tuple(c for c in how if not problem(group, replace(d, completion=c), gpu)) or (Completion.BARRIER,)


def check(group: KernelGroup, d: Decision, gpu: GPUSpec, at: str) -> None:
    """A replayed decision's cluster: a ScheduleError naming the kernel and the precondition."""
    why = problem(group, d, gpu)
    if why:
        raise ScheduleError(f"{at}: thread-block cluster: precondition {why} (schedule/cluster.py)")


def merge_cycles(d: Decision) -> int:
    """A reduce kernel's cluster combine (codegen/reduce_kernel.py), 0 without clusters: by the
    cluster barrier, two barriers and the rank-0 thread's C loop-carried distributed-shared-memory
    loads; by mbarriers, one push's latency, rank 0's C loads of its own shared memory and the
    mbarrier's set-up.

    >>> d = Decision(statements=("s",), form=Form.ROW, M=2, N=65536, stitched=False, vec=4, tx=256, ty=1, split=16,
    ...              chunk=4096, grid=(2, 16), unroll=1, merges=(), access=(), levels=(), cluster=8)
    >>> merge_cycles(d), merge_cycles(replace(d, completion=Completion.MBARRIER))
    (2000, 540)
    """
    if d.cluster == 1 or d.stitched:
        return 0
    if d.completion == Completion.MBARRIER:
        return DSMEM_CYCLES + d.cluster * SMEM_CYCLES + MBARRIER_INIT_CYCLES
    return 2 * CLUSTER_SYNC_CYCLES + d.cluster * DSMEM_CYCLES


def reduce_cycles(barrier: bool) -> int:
    """One cluster reduction whose warps push their partials into every block of the cluster
    (QuACK's `cluster_reduce`; the stitched kernel's exchange): the pushed stores land in the
    peers' shared memory (a distributed-shared-memory latency), then the warp-level combine.
    `barrier`: completion is the cluster barrier (arrive.release / wait.acquire, Panamera's), not
    an mbarrier counting the bytes that landed (QuACK's `mbarrier_arrive_and_expect_tx`).

    >>> reduce_cycles(barrier=False), reduce_cycles(barrier=True)
    (300, 500)
    """
    return DSMEM_CYCLES + WARP_COMBINE_CYCLES + (CLUSTER_SYNC_CYCLES if barrier else 0)


def exchange_cycles(d: Decision) -> int:
    """One exchange of a stitched row's cluster (codegen/stitched_kernel.py): the pushed warp
    partials completed by the cluster barrier, or by each block's mbarrier (`reduce_cycles`). The
    barrier at the start, split around the first pass's loads, is not exposed."""
    return reduce_cycles(barrier=d.completion == Completion.BARRIER)


def setup_cycles(d: Decision) -> int:
    """Once per kernel: the mbarriers' initialization (`MBARRIER_INIT_CYCLES`), 0 without them."""
    return MBARRIER_INIT_CYCLES if d.completion == Completion.MBARRIER else 0
