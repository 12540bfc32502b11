"""The mapper's search: the candidate decision with the least modeled time (schedule/cost.py)."""

from __future__ import annotations

import math
from dataclasses import replace

from ..errors import ScheduleError
from ..model.gpu import H100, GPUSpec
from ..poly.access import choose_vec
from ..poly.program import KernelGroup
from ..poly.statement import Form
from .cost import _input_bytes, complete, decision_cost, in_flight, stitched_cost
from .decision import MAX_GRID_Y, Decision, Mapping, pow2ceil
from .derived import (
    access_for,
    along,
    atomic_vec_for,
    co_resident,
    levels_for,
    merges_for,
    passes,
    struct_accumulators,
    unroll_for,
    vector_extent,
)
from .persistent import map_joined, row_grids
from .pipeline import choose as choose_stages
from .registers import fit_unroll
from .rtile import NO_TILE, register_budget, registers, tilings


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
    if group.columns:  # column partials: a persistent row loop (schedule/persistent.py)
        m = map_joined(group, gpu, name, deterministic)
        if m is None:
            raise ScheduleError(f"kernel {name or '?'}: the column partials of {'+'.join(group.names)} fit no block")
        return m
    if group.stitched:
        return _map_stitched(group, gpu, name, split, rtile, ctile)
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
    merge_options = (True,) if deterministic or struct_accumulators(group) else (False, True)
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
                    unroll=max(1, unroll_for(vec, chunk // per_split) // (R * C)), merges=merges_for(group, s_eff, partials),
                    access=access,
                    atomic_vec=atomic_vec_for(group, gpu, vec, merges_for(group, s_eff, partials)),
                    rtile=R, rstride=stride, rshared=rshared, ctile=C, cshared=cshared,
                )  # fmt: skip
                d = fit_unroll(group, d)
                if R * C > 1 and rtile is None and registers(group, d) > register_budget(d):
                    continue  # ptxas would spill the tile's accumulators and loads
                cost = decision_cost(group, gpu, d, partials)
                # fewer blocks and threads, and atomics before partials, unless clearly faster
                if best is None or cost.total_s < best[0].total_s * 0.97:
                    best = (cost, d)
    cost, d = best
    if stages is None:
        stages = choose_stages(
            group, gpu, d, in_flight(group, d), dict(cost.features).get("dram_bytes", 0.0), cost.total_s
        ).stages
    return complete(group, replace(d, stages=stages), gpu, name, cost)


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
    (schedule/rtile.py; `rtile` and `ctile` force one), with 32 to 128 threads per row. Whole
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
    candidates = []  # (tx, ty, gx, split, tile), fewer threads and blocks first
    for tx in sorted({min(t, pow2ceil(G)) for t in (128, 256, 512, 1024)}):
        ty = max(1, min(256 // tx, pow2ceil(M)))
        gx = math.ceil(M / ty)
        max_split = max(1, min(MAX_GRID_Y, G // tx, co_resident(gpu, tx * ty) // gx))
        candidates += [(tx, ty, gx, 1 << e, NO_TILE) for e in range(max_split.bit_length()) if 1 << e <= max_split]
        if passes(group, base["levels"]) > 1:  # later passes re-read the rows: fewer tiles in flight
            tile_bytes = ty * _input_bytes(group) / max(M, 1)
            candidates += [(tx, ty, gx, 1, NO_TILE, b) for b in row_grids(gx, gpu, tx * ty, tile_bytes)]
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
    for tx, ty, gx, s, (R, stride, C, rshared, cshared), *grid in candidates:
        chunk = math.ceil(math.ceil(G / s) / tx) * tx
        s_eff = math.ceil(G / chunk)
        persistent = grid[0] if grid else 0  # a persistent row loop over the gx row tiles
        d = Decision(
            **base, tx=tx, ty=ty, split=s_eff, chunk=chunk, grid=(gx, s_eff),
            unroll=max(1, unroll_for(vec, chunk // tx) // (R * C)), merges=merges_for(group, s_eff, True),
            rtile=R, rstride=stride, ctile=C, rshared=rshared, cshared=cshared,
            persistent=persistent, per_sm=math.ceil(persistent / gpu.sms) if persistent else 0,
        )  # fmt: skip
        if R * C > 1 and rtile is None and registers(group, d) > register_budget(d):
            continue
        cost = stitched_cost(group, gpu, d)
        # fewer blocks and threads unless clearly faster
        if best is None or cost.total_s < best[0].total_s * 0.97:
            best = (cost, d)
    return complete(group, best[1], gpu, name, best[0])
