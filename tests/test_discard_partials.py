"""Column partials dropped from L2 once read (schedule/derived.py `discards_partials`,
codegen/column_partials.py `discard`): a PARTIALS_GRID merge of LayerNorm backward waits a second
time, then every thread drops its share of the partials' lines (discard.global.L2: never written
back); the model stops charging their write-back (model/workspace.py `discarded`). The emulator
fills a dropped line with 0xff, so a drop before every block had read it would show in the sums."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import tolerance
from test_row_columns import FLOORED, _inputs, _layer_norm64, _with, layer_norm_backward

import panamera as pn
from panamera.bench.train_suite import layer_norm_backward as ln_suite
from panamera.codegen import column_partials
from panamera.model.gpu import H100
from panamera.poly.program import build_program
from panamera.schedule import cost, derived
from panamera.schedule.cost import joined_cost
from panamera.schedule.decision import MergeMode
from panamera.schedule.persistent import map_joined
from panamera.schedule.row_columns import joined_group


def _grid(k, blocks: int):
    m = k.mappings[0]
    merges = tuple(MergeMode.STORE if x == MergeMode.STORE else MergeMode.PARTIALS_GRID for x in m.merges)
    return _with(k, persistent=blocks, per_sm=1, merges=merges)


@pytest.mark.parametrize("drop", ["own", "wait", "kept"])
def test_partials_dropped_once_read_match_numpy_float64(drop, rng, monkeypatch):
    """8 blocks x 1024 columns x 2 statements (64 KiB of partials): each block drops the lines of
    its own columns after a barrier of its own (`own`: every block's columns are whole lines,
    derived.combine_owns_lines), or, where they are not, after a second grid-wide wait with the
    threshold lowered to 0 (`wait`), or not at all at the shipped 1 MiB (`kept`). All against numpy
    float64 over two calls (the second writes every partial again before any is read) and three
    thread orders, bit-identical."""
    if drop != "own":  # as if the block's columns were not whole lines
        for mod in (derived, column_partials, cost):
            monkeypatch.setattr(mod, "combine_owns_lines", lambda group, d: False)
    if drop == "wait":
        monkeypatch.setattr(derived, "DISCARD_MIN_BYTES", 0)
    M, N = 64, 1024
    a, d, g, mean, rstd = _inputs(rng, M, N, "float32")
    outs = layer_norm_backward(M, N)
    k = pn.compile(outs, target="emulator", deterministic=True, gpu=FLOORED)
    r = pn.compile(outs, target="emulator", deterministic=True, gpu=FLOORED, schedule=_grid(k, 8), cache=False)
    m = r.mappings[0]
    # a block's columns in a sweep span whole lines, several even where the emulator's buffers are 64-byte aligned
    assert derived.combine_columns(m.blocks, m.threads, N) * 4 >= 256
    assert ("pn_discard_range(&ws" in r.source) == (drop != "kept")
    assert r.source.count("pn_grid_sync(&pn_counter") == (2 if drop == "wait" else 1)
    refs, scales = _layer_norm64(*(v.astype(np.float64) for v in (a, d, g, mean, rstd)))
    runs = [r(a, d, g, mean, rstd, order=o, seed=3) for o in ("forward", "reverse", "shuffled", "forward")]
    for out, ref, scale, n in zip(runs[0], refs, scales, [N, M, M]):
        np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance("float32", n) * scale.max())
    for got in runs[1:]:
        assert all(np.array_equal(x, y) for x, y in zip(runs[0], got))


def test_the_model_drops_the_write_back_of_a_megabyte_of_partials(monkeypatch):
    """LayerNorm backward 4096 x 1024 fp32 on 264 blocks (2.2 MB of partials): no write-back, a
    second wait (two L2 round trips); the kept plan pays the write-back (modeled)."""
    prog = build_program(tuple(ln_suite(4096, 1024, "float32")))
    group = joined_group(prog.column_candidates[0], prog)
    m = map_joined(group, H100, deterministic=True)
    d = dataclasses.replace(m.decision, ty=2, grid=(2048, 1), persistent=264, per_sm=2)
    ws = 264 * 1024 * 2 * 4
    assert derived.discards_partials(ws, False) and not derived.discards_partials(ws // 4, False)
    dropped = joined_cost(group, H100, d)
    written = dict(dropped.features)["write_bytes"]
    assert written == 4096 * 1024 * 4 + 2 * 1024 * 4  # dx, dgamma, dbeta: no partials written back
    monkeypatch.setattr(derived, "DISCARD_MIN_BYTES", 1 << 40)
    plain = joined_cost(group, H100, d)
    assert dict(plain.features)["write_bytes"] == written + ws
    assert dropped.sync_s > plain.sync_s and dropped.total_s < plain.total_s


def test_a_block_drops_its_own_lines_without_a_second_wait():
    """LayerNorm backward 4096 x 2048 bf16 on 128 blocks (8 row tiles each): at 256 x 4 threads
    each block sums 32 columns (whole float32 lines) and drops them after a barrier of its own; at
    128 x 4 it sums 16 (half lines, read by two blocks) and waits a second time (two L2 round trips, modeled). The
    model takes the wider block although it is within 3 % of the narrower one: the same grid and
    merges with fewer partials per thread (schedule/persistent.py `_lighter`)."""
    prog = build_program(tuple(ln_suite(4096, 2048, "bfloat16")))
    group = joined_group(prog.column_candidates[0], prog)
    m = map_joined(group, H100)
    assert (m.tx, m.ty, m.persistent) == (256, 4, 128) and MergeMode.PARTIALS_GRID in m.merges
    narrow = dataclasses.replace(m.decision, tx=128, chunk=256, unroll=2)  # the candidate the 3 % rule kept
    assert derived.combine_owns_lines(group, m.decision) and not derived.combine_owns_lines(group, narrow)
    assert derived.drops_column_partials(group, m.decision) and derived.drops_column_partials(group, narrow)
    own, waited = joined_cost(group, H100, m.decision), joined_cost(group, H100, narrow)
    # the second wait's two round trips, less the block's own barrier and its lines' drops
    assert dict(waited.features)["sync_cycles"] - dict(own.features)["sync_cycles"] > H100.l2_latency_cycles
    assert own.total_s < waited.total_s < own.total_s * 1.03


def test_a_drop_past_the_blocks_own_columns_shows(rng, monkeypatch):
    """The negative of `combine_owns_lines`: widened to every column of each row of partials, a
    block's drop poisons lines other blocks have still to read (the emulator fills them with
    0xff), and dgamma / dbeta come out non-finite; dx, which reads no partial, stays finite."""
    own = column_partials._drop_own

    def past(loop):
        return [
            ln.replace("+ pn_j0], &ws", "], &ws").replace("+ pn_hi], 0, 1)", f"+ {loop.g.N}], 0, 1)")
            for ln in own(loop)
        ]

    monkeypatch.setattr(column_partials, "_drop_own", past)
    M, N = 64, 1024
    a, d, g, mean, rstd = _inputs(rng, M, N, "float32")
    outs = layer_norm_backward(M, N)
    k = pn.compile(outs, target="emulator", deterministic=True, gpu=FLOORED)
    r = pn.compile(outs, target="emulator", deterministic=True, gpu=FLOORED, schedule=_grid(k, 8), cache=False)
    assert f"&ws3[b * {N} + {N}]" in r.source

    dx, dgamma, dbeta = r(a, d, g, mean, rstd)
    assert np.isfinite(dx).all() and not np.isfinite(dgamma).all() and not np.isfinite(dbeta).all()
