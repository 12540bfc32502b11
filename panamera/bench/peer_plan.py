"""A peer's plan (panamera/bench/peers.py explains peers): its launches as kernel_time's keyword arguments (`kernel`,
`PeerLaunch`, `PeerPlan`), and the rules every peer's plan shares: a workspace read back from L2
(`from_workspace`), a looped row's later passes re-read from L2 or DRAM (`reread`).

>>> k = kernel("row_reduce", read=2**20, written=2**10, blocks=256, threads=256, in_flight=16)
>>> k.features["dram_bytes"], k.features["write_bytes"], cdiv(1000, 256), next_pow2(1000), last_pow2(1000)
(1049600.0, 1024.0, 4, 1024, 512)
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field

from ..model.estimate import Estimate, estimate
from ..model.gpu import GPUSpec
from ..model.kernel_cost import kernel_time
from ..model.spill import Spill
from ..model.workspace import workspace_fits

_KT_ARGS = set(inspect.signature(kernel_time).parameters) - {"gpu"}
DRAM_ROUND_TRIP_CYCLES = 700  # one more dependent global-memory round trip in a last-block epilogue


@dataclass(frozen=True)
class PeerLaunch:
    """One kernel of a peer's plan: kernel_time's keyword arguments, as Panamera's launches carry them."""

    name: str
    features: dict
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def cost_features(self) -> tuple:
        return tuple((k, v) for k, v in self.features.items() if k in _KT_ARGS)


@dataclass(frozen=True)
class PeerPlan:
    peer: str
    launches: tuple[PeerLaunch, ...]
    description: str
    facts: dict = field(default_factory=dict)  # the rule's decisions (ctas_per_output, split, BLOCK_SIZE, ...)

    @property
    def kernels(self) -> int:
        return len(self.launches)

    @property
    def blocks(self) -> int:
        return sum(ln.features["blocks"] for ln in self.launches)

    @property
    def atomics(self) -> int:
        return sum(int(ln.features.get("atomics", 0)) for ln in self.launches)

    def estimate(self, gpu: GPUSpec, compulsory: int | tuple[int, int]) -> Estimate:
        return estimate(list(self.launches), gpu, compulsory)


def kernel(name, *, read, written, blocks, threads, in_flight, l2=0.0, atomics=0, same=0, cas=0, sfu=0.0,
           epilogue=400, round_trips=0, spill: Spill | None = None, shared=0, registers=0) -> PeerLaunch:  # fmt: skip
    """A launch from its streamed bytes and shape; `in_flight` = streamed input bytes per thread per
    loop step (vector width x loads issued before the first use); `spill`: the compiler's register
    spills per thread as ptxas -v reports them (model/spill.py); `shared`: the block's shared memory
    where the peer's source states it, and `registers` per thread where its compiler's output was
    read (both bound the resident blocks, `GPUSpec.resident_blocks`; 0: not known)."""
    f = {"dram_bytes": float(read + written), "blocks": int(max(blocks, 1)), "threads": int(threads),
         "bytes_in_flight_per_thread": float(in_flight), "atomics": int(atomics), "same_address": int(same),
         "cas_atomics": int(cas), "epilogue_cycles": int(epilogue), "l2_bytes": float(l2), "sfu_ops": float(sfu)}  # fmt: skip
    if written:  # written bytes stream at the write bandwidth (model/gpu.py stream_bw)
        f["write_bytes"] = float(written)
    if round_trips:
        f["round_trips"] = int(round_trips)
    if shared:
        f["shared_bytes"] = int(shared)
    if registers:
        f["registers"] = int(registers)
    if spill:
        n = int(max(blocks, 1)) * int(threads)
        f.update(spill_stores=float(spill.stores * n), spill_loads=float(spill.loads * n), spill_frame=int(spill.frame))
    return PeerLaunch(name, f, int(read), int(written))


def from_workspace(ln: PeerLaunch, nbytes: float, gpu: GPUSpec) -> PeerLaunch:
    """`ln` with `nbytes` of its DRAM reads taken from L2 where they fit: the read-back of a
    workspace a kernel (this one or the one before) wrote, its partials or staging buffer
    (model/workspace.py: the rule of Panamera's own splits; the write stays a DRAM write).

    >>> from panamera.model import H100
    >>> k = kernel("splitKreduce_kernel", read=4 * 2**20, written=2**17, blocks=8, threads=512, in_flight=16)
    >>> f = from_workspace(k, 4 * 2**20, H100).features
    >>> f["dram_bytes"], f["l2_bytes"]
    (131072.0, 4194304.0)
    >>> from_workspace(k, 4 * 2**20, dataclasses.replace(H100, l2_size=6 * 2**20)).features["dram_bytes"]
    4325376.0
    """
    if not nbytes or not workspace_fits(gpu, nbytes):
        return ln
    f = {**ln.features, "dram_bytes": ln.features["dram_bytes"] - nbytes}
    f["l2_bytes"] = f.get("l2_bytes", 0.0) + nbytes
    return dataclasses.replace(ln, features=f, bytes_read=int(ln.bytes_read - nbytes))


def _plan(peer: str, launches, what: str, **facts) -> PeerPlan:
    launches = tuple(launches)
    shapes = ", ".join(f"{ln.features['blocks']}x{ln.features['threads']}" for ln in launches)
    n = len(launches)
    return PeerPlan(peer, launches, f"{what}: {n} kernel{'s' * (n != 1)} ({shapes} blocks x threads)", facts)


def reread(
    rows: int, row_bytes: int, threads: int, passes: int, gpu: GPUSpec, rows_per_block: int = 1, registers: int = 0
) -> dict:
    """Where a looped row kernel's later passes re-read its rows: from L2 while the rows in flight
    (the resident blocks' rows) fit in half of it (the half an SM's requests reach); beyond, the
    part that no longer fits comes from DRAM again (the QuACK blog's profile of torch.compile's
    looped softmax; fitted to eager PyTorch's RMSNorm and LayerNorm rows in CALIBRATION.md L).
    The resident blocks are counted as the kernel's are (`GPUSpec.resident_blocks`), with the
    peer's `registers` per thread where its compiler's output was read (0: not known).
    Returns the extra `read` (DRAM) and `l2` bytes for `kernel`."""
    extra = (passes - 1) * rows * row_bytes
    blocks = cdiv(rows, rows_per_block)
    in_flight = min(blocks, gpu.sms * gpu.resident_blocks(threads, registers=registers)) * rows_per_block * row_bytes
    hit = min(1.0, gpu.l2_reach / max(in_flight, 1))
    return {"l2": extra * hit, "read": extra * (1 - hit)}


def cdiv(a, b) -> int:
    return -(-int(a) // int(b))


def next_pow2(n) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def last_pow2(n) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(n, 1)))))
