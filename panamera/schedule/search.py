"""The mapper's search: the candidate decision with the least modeled time (schedule/cost.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import product

from ..errors import ScheduleError
from ..model.gpu import H100, GPUSpec
from ..poly.access import choose_vec
from ..poly.program import KernelGroup
from ..poly.statement import Form
from .cluster import completions
from .cost import complete, decision_cost, in_flight, stitched_cost
from .decision import MAX_GRID_Y, Decision, Mapping, Residence, pow2ceil
from .derived import (
    access_for,
    along,
    atomic_vec_for,
    co_resident,
    input_bytes,
    levels_for,
    merges_for,
    partials_options,
    passes,
    unroll_for,
    vector_extent,
)
from .onchip import choose as onchip_choices
from .persistent import map_joined, row_grids, smaller_if_faster
from .pipeline import choose as choose_stages
from .registers import fit_unroll
from .rtile import NO_TILE, register_budget, registers, tilings
from .tc_tiling import choose as choose_tensor_core


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
    mma: bool | None = None,
    cluster: bool | None = None,
) -> Mapping:
    """Choose block/thread binding, vector width and split for a kernel group: the candidate
    with the least modeled time, merging a split by atomics or by partials the last block
    combines, whichever the model prefers (`deterministic` forces partials). `split` and
    `threads` force those choices (an explicit split alone keeps 256 threads per block). `name` names the kernel and its workspaces. `rtile` and
    `ctile` force the rows of a register tile (schedule/rtile.py; 1: none; ignored where the
    group has no tile to share). `stages` forces the pipeline's stages (schedule/pipeline.py;
    else the model's). `mma` forces tensor cores (True, where schedule/tensor_core.py's
    preconditions hold) or CUDA cores (False); None: the model's choice between the two best.
    `cluster` forces or forbids a stitched split row as one thread-block cluster
    (schedule/cluster.py)."""
    if group.columns:  # column partials: a persistent row loop (schedule/persistent.py)
        m = map_joined(group, gpu, name, deterministic)
        if m is None:
            raise ScheduleError(f"kernel {name or '?'}: the column partials of {'+'.join(group.names)} fit no block")
        return m
    if group.stitched:
        m = _map_stitched(group, gpu, name, split, rtile, ctile, cluster)
        tc = None if mma is False or rtile or ctile else choose_tensor_core(group, gpu, split, deterministic)
        if tc is not None and (mma or tc[0].total_s < m.cost.total_s * 0.97):  # a contraction + element-wise consumers
            return complete(group, tc[1], gpu, name, tc[0])
        return m
    form, M, N = group.form, group.M, group.N
    base = dict(
        statements=group.names, form=form, M=M, N=N, stitched=False, levels=levels_for(group), epilogue=group.epilogue
    )
    if form == Form.MAP:
        vec = choose_vec(group.statements, "i", M)
        G = M // vec
        tx = min(256, pow2ceil(G))
        gx = min(math.ceil(G / tx), gpu.sms * 32)
        steps = math.ceil(G / (gx * tx))
        d = Decision(
            **base, vec=vec, tx=tx, ty=1, split=1, chunk=steps, grid=(gx, 1), unroll=unroll_for(vec, steps),
            merges=merges_for(group, 1, False), access=access_for(group, vec), atomic_vec=(1,) * len(group.statements),
        )  # fmt: skip
        return complete(group, d, gpu, name)
    vec = choose_vec(group.statements, along(group), vector_extent(group))
    access = access_for(group, vec)
    G = N // vec if form in (Form.ROW, Form.ALL) else M // vec
    serial_extent = G if form != Form.COLUMN else N  # iterations along the reduced split dimension
    # Partials or atomics: forced by `deterministic` and struct accumulators, else the model's.
    merge_options = partials_options(group.statements, deterministic)
    best, seen = None, []
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
            clusters = _reduce_clusters(group, gpu, s_eff, R * C, cluster)
            for partials, K in [
                (p, K) for K in clusters for p in merge_options if s_eff // K > 1 or p == merge_options[0]
            ]:
                merges = merges_for(group, s_eff // K, partials)  # one partial per cluster of K blocks
                d = Decision(
                    **base, vec=vec, tx=tx, ty=ty, split=s_eff, chunk=chunk, grid=(gx, s_eff),
                    unroll=max(1, unroll_for(vec, chunk // per_split) // (R * C)), merges=merges,
                    access=access, atomic_vec=atomic_vec_for(group, gpu, vec, merges),
                    rtile=R, rstride=stride, rshared=rshared, ctile=C, cshared=cshared, cluster=K,
                )  # fmt: skip
                d = fit_unroll(group, d)
                if R * C > 1 and rtile is None and registers(group, d) > register_budget(d):
                    continue  # ptxas would spill the tile's accumulators and loads
                # a cluster's combine by barriers or by mbarriers, whichever the model prices lower
                cost, d = min(
                    ((decision_cost(group, gpu, dd, partials), dd) for dd in _completed(group, d, gpu)),
                    key=lambda c: c[0].total_s,
                )
                # fewer blocks and threads, and atomics before partials, unless clearly faster
                if best is None or cost.total_s < best[0].total_s * 0.97:
                    best = (cost, d)
                if form == Form.COLUMN:
                    seen.append((cost, d))
    best = smaller_if_faster(seen, best, _fewer_merges)  # then a smaller split, where faster at all
    cost, d = best
    forced = rtile is not None or ctile is not None or stages is not None or threads is not None
    tc = None if mma is False or (forced and not mma) else choose_tensor_core(group, gpu, split, deterministic)
    if tc is not None and (mma or tc[0].total_s < cost.total_s * 0.97):  # CUDA cores unless clearly slower
        return complete(group, tc[1], gpu, name, tc[0])
    if d.cluster > 1:
        stages = 1  # a cluster combines one partial per row: no pipeline (schedule/cluster.py)
    if stages is None:
        stages = choose_stages(
            group, gpu, d, in_flight(group, d), dict(cost.features).get("dram_bytes", 0.0), cost.total_s
        ).stages
    return complete(group, replace(d, stages=stages), gpu, name, cost)


_DUMMY = dict(vec=1, tx=1, ty=1, split=1, chunk=1, grid=(1, 1), unroll=1, merges=(), access=())


def _completed(group: KernelGroup, d: Decision, gpu: GPUSpec) -> list[Decision]:
    """`d` with each completion its cluster may take (schedule/cluster.py `completions`)."""
    return [replace(d, completion=how) for how in completions(group, d, gpu)]


def _reduce_clusters(group: KernelGroup, gpu: GPUSpec, split: int, tile: int, cluster: bool | None) -> list[int]:
    """Cluster sizes a split reduce kernel tries (schedule/cluster.py): none, and on a GPU with
    clusters the largest power of two up to `max_cluster` that divides the split, for ROW/ALL
    groups without a register tile; `cluster` forces (True) or forbids (False) one."""
    K = 1
    if cluster is not False and split > 1 and tile == 1 and group.form in (Form.ROW, Form.ALL):
        while K * 2 <= min(gpu.max_cluster, split) and split % (K * 2) == 0:
            K *= 2
    if K == 1:
        return [1]
    return [K] if cluster else [1, K]


def _fewer_merges(d: Decision, than: Decision) -> bool:
    """A column reduction's `d` splits less (fewer merges into each word) with no more threads and
    the same merges as the chosen `than`: taken over it when faster at all, never over a faster one
    (bias gradient 65536 x 64: 64 blocks of 1024 threads, 11.05 us modeled, over 256 of 256, 11.20)."""
    return _no_larger(d, than) and d.split < than.split and d.merges == than.merges


def _no_larger(d: Decision, than: Decision) -> bool:
    """`d` launches no more threads than `than` and splits its rows no more: the preference for
    fewer blocks and threads (a later candidate must be clearly faster) does not hold it back.
    Softmax backward 4096 x 4096: one block of 256 threads per row, the row in registers (Liger's
    plan, 71.2 us modeled), after a cluster of two blocks per row with the same threads (71.6)."""
    return d.blocks * d.threads <= than.blocks * than.threads and d.split <= than.split


def _map_stitched(
    group: KernelGroup,
    gpu: GPUSpec,
    name: str,
    split: int | None = None,
    rtile: int | None = None,
    ctile: int | None = None,
    cluster: bool | None = None,
) -> Mapping:
    """A stitched group: threads per row and blocks per row (split) chosen by the model. More
    threads keep fewer rows resident, so later passes hit in L2; a split spreads rows too few to
    fill the GPU over more blocks, at the price of a grid-wide exchange per pass with
    reductions, and only while every block of the grid is co-resident (`co_resident`: the
    blocks wait for each other). Splits are powers of two with at least one step per thread;
    `split` forces one (1: whole rows). Unsplit rows may also take a register tile
    (schedule/rtile.py; `rtile` and `ctile` force one), with 32 to 128 threads per row. On a GPU
    with thread-block clusters, a split of 2 to `max_cluster` blocks may be one cluster instead
    (schedule/cluster.py; no co-residency bound); `cluster` forces (True) or forbids (False) it. Whole
    rows whose later passes re-read them may also loop persistently over their row tiles on fewer
    blocks (schedule/persistent.py `row_grids`), so the tiles in flight fit half the L2."""
    M, N = group.M, group.N
    vec = choose_vec(group.statements, "j", N)
    G = N // vec
    base = dict(
        statements=group.names, form=group.form, M=M, N=N, stitched=True, vec=vec,
        access=access_for(group, vec), levels=levels_for(group),
        atomic_vec=(1,) * len(group.statements),
    )  # fmt: skip
    candidates = []  # (tx, ty, gx, split, tile, cluster, persistent blocks), fewer threads and blocks first
    for tx in sorted({min(t, pow2ceil(G)) for t in (128, 256, 512, 1024)}):
        ty = max(1, min(256 // tx, pow2ceil(M)))
        gx = math.ceil(M / ty)
        max_split = max(1, min(MAX_GRID_Y, G // tx, co_resident(gpu, tx * ty) // gx))
        candidates += [
            (tx, ty, gx, 1 << e, NO_TILE, False, 0) for e in range(max_split.bit_length()) if 1 << e <= max_split
        ]
        # one thread-block cluster per split row (sm_90, schedule/cluster.py): no co-residency bound
        max_cluster = min(gpu.max_cluster, G // tx)
        candidates += [
            (tx, ty, gx, 1 << e, NO_TILE, True, 0) for e in range(1, max_cluster.bit_length()) if 1 << e <= max_cluster
        ]
        if passes(group, base["levels"]) > 1:  # later passes re-read the rows: fewer tiles in flight
            tile_bytes = ty * input_bytes(group) / max(M, 1)
            candidates += [(tx, ty, gx, 1, NO_TILE, False, b) for b in row_grids(gx, gpu, tx * ty, tile_bytes)]
    tiles = tilings(group)[1:]
    if rtile is not None:
        candidates = [] if rtile * (ctile or 1) > 1 else candidates
        tiles = [t for t in tiles if t[0] == rtile and t[2] == (ctile or 1)]
    for t in tiles:  # unsplit tiled rows
        dummy = {k: v for k, v in _DUMMY.items() if k not in base}
        rows = Decision(**base, **dummy, rtile=t[0], rstride=t[1], ctile=t[2]).tile_rows
        for tx in sorted({min(x, pow2ceil(G)) for x in (32, 64, 128)}):
            ty = max(1, min(256 // tx, pow2ceil(rows)))
            candidates.append((tx, ty, math.ceil(rows / ty), 1, t, False, 0))
    if split is not None:
        candidates = [c for c in candidates if c[3] == split] or [c for c in candidates if c[3] == 1]
    if cluster is not None:  # forced: clusters (True) or none (False)
        candidates = [c for c in candidates if c[5] == cluster] or candidates
    best: dict[bool, tuple] = {}  # the best plan that re-reads its rows (True), that keeps them (False)
    for tx, ty, gx, s, (R, stride, C, rshared, cshared), clustered, persistent in candidates:
        chunk = math.ceil(math.ceil(G / s) / tx) * tx
        s_eff = math.ceil(G / chunk)
        d = Decision(
            **base, tx=tx, ty=ty, split=s_eff, chunk=chunk, grid=(gx, s_eff),
            unroll=max(1, unroll_for(vec, chunk // tx) // (R * C)),
            merges=merges_for(group, 1 if clustered else s_eff, True),  # a cluster exchanges on chip
            rtile=R, rstride=stride, ctile=C, rshared=rshared, cshared=cshared,
            cluster=s_eff if clustered else 1,
            persistent=persistent, per_sm=math.ceil(persistent / gpu.sms) if persistent else 0,
        )  # fmt: skip
        if clustered and s_eff == 1:
            continue
        if R * C > 1 and rtile is None and registers(group, d) > register_budget(d):
            continue
        ways = completions(group, d, gpu)  # a cluster's exchange: by the cluster barrier or by mbarriers
        # the row kept in registers or shared memory (schedule/onchip.py), or re-read
        # (a persistent row loop is the re-reading plan's alternative: its rows are re-read from L2)
        for res, how in product((*(() if persistent else onchip_choices(group, d, gpu)), Residence.MEMORY), ways):
            dd = replace(d, onchip=res, completion=how)
            cost = stitched_cost(group, gpu, dd)
            kind = res == Residence.MEMORY
            # fewer blocks and threads unless clearly faster; no more of them and faster at all
            if kind not in best or cost.total_s < best[kind][0].total_s * (
                1.0 if _no_larger(dd, best[kind][1]) else 0.97
            ):
                best[kind] = (cost, dd)
    if not best:
        raise ScheduleError(
            f"kernel {name or '?'}: no stitched plan of {'+'.join(group.names)} meets the forced "
            f"split={split} rtile={rtile} ctile={ctile} cluster={cluster}"
        )
    # the best plan that keeps its rows on chip, unless re-reading them is clearly faster
    cost, d = best[False] if False in best else best[True]
    if True in best and best[True][0].total_s < cost.total_s * 0.97:
        cost, d = best[True]
    return complete(group, d, gpu, name, cost)
