"""The plans a workload is compared under, all modeled by the same model:

- **panamera**: fusion, stitching, the model-chosen multi-block split, one atomic per block.
- **panamera-deterministic**: Panamera with `deterministic=True` (block partials merged in a fixed order).
- The real peers of peers.py and eager_peer.py, each planned from that peer's own rules: **pytorch-eager**, **cub**,
  **inductor**, **triton-tutorial**, **tvm-default**, and row_peers.py's **quack** and **liger**; for contractions those of contraction_peers.py:
  **cublas**, **triton-splitk**, **flash-decoding**, **pytorch-eager**, **marlin** (marlin_peer.py), and decode_peers.py's **fa3-decode** and
  **flashinfer-decode** (absent where the peer has no kernel).
- Two stand-ins, planned by *Panamera's* machinery and named for what they are:
  - **panamera-single-block (stand-in)**: Panamera with `split=1` (producers fused, one block per
    output row / column tile, no split);
  - **panamera-unfused (stand-in)**: one Panamera kernel per operator, each reading its inputs from
    and writing its output to DRAM (views are free), no atomics, and a scalar (ALL) output in two
    passes (partials, then one more launch).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from ..compiler import Compiled, lower
from ..compiler import compile as pn_compile
from ..frontend.tensor import Tensor, _ids, placeholder, topological
from ..model.estimate import Estimate, estimate
from ..model.gpu import GPUSpec
from .contraction_peers import CONTRACTION_PEERS
from .decode_peers import DECODE_PEERS
from .peer_plan import PeerPlan
from .peers import PEERS, plan_peers
from .reread import forced_reread
from .row_peers import ROW_PEERS
from .train_peers import plan_train_peers

DETERMINISTIC, SINGLE, UNFUSED = (
    "panamera-deterministic",
    "panamera-single-block (stand-in)",
    "panamera-unfused (stand-in)",
)
STANDINS = (DETERMINISTIC, SINGLE, UNFUSED)
PEER_NAMES = tuple(dict.fromkeys((*PEERS, *ROW_PEERS, *CONTRACTION_PEERS, *DECODE_PEERS)))
PLANS = ("panamera", *PEER_NAMES, *STANDINS)
INLINE = ("const", "iota", "argkey_max", "argkey_min")  # computed where used, never a kernel


@dataclass(frozen=True)
class PlanResult:
    plan: str
    estimate: Estimate
    blocks: int
    atomics: int
    compile_s: float
    compiled: tuple[Compiled, ...]
    description: str = ""
    launches_of: int = 0
    splits: tuple[int, ...] = ()  # each kernel group's split across blocks (Panamera's plans)

    @property
    def modeled_us(self) -> float:
        return self.estimate.total_us


def _counts(c: Compiled) -> tuple[int, int]:
    """Blocks of the reduction/map kernels, and their atomics: merges into workspaces plus each
    block's arrival on the last-block counter (a deterministic plan has only the arrivals)."""
    blocks = sum(ln.grid[0] * ln.grid[1] * ln.grid[2] for ln in c.plan.kernels)
    atomics = sum(int(dict(ln.cost_features).get("atomics", 0)) for ln in c.plan.kernels)
    return blocks, atomics


def _single(plan: str, outs, gpu: GPUSpec, compulsory: int | tuple[int, int] | None) -> PlanResult:
    kw = {"deterministic": plan == DETERMINISTIC, "split": 1 if plan == SINGLE else None}
    t0 = time.perf_counter()
    c = pn_compile(list(outs), target="emulator", gpu=gpu, **kw)
    dt = time.perf_counter() - t0
    blocks, atomics = _counts(c)
    what = "; ".join(m.describe() for m in c.mappings)
    splits = tuple(m.split for m in c.mappings)
    att = c.stages.attention  # a fused attention has no reduction mappings: its own plan
    if att is not None:
        what = f"fused attention split={att.split} over the keys, {att.chunk} keys per block, {att.launches} launch(es)"
        splits = (att.split,)
    if c.stages.segments is not None:  # a sorted-segment scatter-add: its plan and the forms it was chosen among
        what = "; ".join((c.stages.segments.describe(), *(f.describe() for f in c.formulations)))
    return PlanResult(plan, estimate(c.plan, gpu, compulsory), blocks, atomics, dt, (c,), what, splits=splits)


def eager_ops(outs) -> list[Tensor]:
    """Each kernel of the eager plan as a one-op graph whose inputs are fresh placeholders."""

    def standin(t: Tensor) -> Tensor:
        if t.op in INLINE:
            return dataclasses.replace(t, inputs=tuple(standin(i) for i in t.inputs), uid=next(_ids))
        return placeholder(t.shape, t.dtype, name=t.name or "x")

    return [
        dataclasses.replace(t, inputs=tuple(standin(i) for i in t.inputs), uid=next(_ids))
        for t in topological(outs)
        if t.op not in INLINE + ("placeholder", "reshape")
    ]


def _eager(outs, gpu: GPUSpec, compulsory: int | tuple[int, int]) -> PlanResult:
    t0 = time.perf_counter()
    outs = lower(list(outs), "formulations", target="emulator", gpu=gpu).graph  # the formulations Panamera picks
    compiled = [pn_compile(op, target="emulator", gpu=gpu, deterministic=True) for op in eager_ops(outs)]
    dt = time.perf_counter() - t0
    second_pass = sum(1 for c in compiled for ln in c.plan.kernels if ln.form == "ALL" and ln.blocks_per_reduction > 1)
    est = estimate([ln for c in compiled for ln in c.plan.per_call], gpu, compulsory, extra_launches=second_pass)
    blocks = sum(_counts(c)[0] for c in compiled)
    return PlanResult(UNFUSED, est, blocks, sum(_counts(c)[1] for c in compiled), dt, tuple(compiled))


def _peer(p: PeerPlan, gpu: GPUSpec, compulsory: int | tuple[int, int], dt: float) -> PlanResult:
    return PlanResult(p.peer, p.estimate(gpu, compulsory), p.blocks, p.atomics, dt, (), p.description)


def compulsory_bytes(outs) -> int:
    """The limit's bytes (docs/GPU_MODEL.md): every graph input read once and every output written
    once. A plan's in/out buffers can also hold intermediates passed between its kernels (decode
    attention's scores), which no implementation is obliged to move.

    >>> import panamera as pn
    >>> compulsory_bytes([pn.sum(pn.placeholder((4, 8), "float16", name="x"), axis=1)])
    72
    """
    return sum(compulsory_traffic(outs))


def compulsory_traffic(outs, gpu: GPUSpec | None = None) -> tuple[int, int]:
    """(read, written): the limit's bytes, inputs and outputs apart (they stream at different rates).
    On a `gpu`, the reads include the re-read a grid-wide dependence forces on every plan there
    (panamera/bench/reread.py: BatchNorm backward NHWC over more than fits on chip).

    >>> import panamera as pn
    >>> from panamera.model import H100
    >>> dy = pn.placeholder((1 << 20, 256), "float32", name="dy")
    >>> compulsory_traffic([dy - pn.sum(dy, axis=0)]), compulsory_traffic([dy - pn.sum(dy, axis=0)], H100)[0] > 2**30
    ((1073741824, 1073741824), True)
    """
    order = topological(list(outs))
    read = sum(t.size * t.dtype.itemsize for t in order if t.op == "placeholder")
    again = forced_reread(outs, gpu) if gpu is not None else 0
    return read + again, sum(t.size * t.dtype.itemsize for t in outs)


def plan_all(build, gpu: GPUSpec, plans=PLANS, backward=None) -> dict[str, PlanResult]:
    """Every plan of one workload (a peer without a kernel for it is left out). `build()` returns
    fresh output tensors; `backward` (train_peers.Backward) says what a training workload computes,
    and its peers are then the training peers, planned from that."""
    outs = build()
    compulsory = compulsory_traffic(outs, gpu)
    results = {"panamera": _single("panamera", outs, gpu, compulsory)}
    t0 = time.perf_counter()
    peers = plan_peers(build(), gpu) if backward is None else plan_train_peers(backward, gpu)
    dt = time.perf_counter() - t0
    for p in plans:
        if p == UNFUSED:
            results[p] = _eager(build(), gpu, compulsory)
        elif p in PEER_NAMES:
            if peers.get(p) is not None:
                results[p] = _peer(peers[p], gpu, compulsory, dt)
        elif p != "panamera":
            results[p] = _single(p, build(), gpu, compulsory)
    return results
