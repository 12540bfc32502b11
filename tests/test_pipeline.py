"""Generated multi-stage asynchronous-copy pipelines (issue 13, item 3; schedule/pipeline.py,
codegen/pipeline.py): the activation row the block's rows share goes through `stages` slabs
of shared memory.

Results against numpy in float64 on the emulator, which lands copies only at the covering wait
(runtime/cuda_emulation.h), with the derived bound of tests/test_contract.py (gamma_K sum |a b|
plus one rounding of the result). The mapper keeps ty = 1 for long K, so the block shape and
stages are forced through a replayed schedule (validated by mapping.replay, rule 10).
"""

import dataclasses
import math
import re

import numpy as np
import pytest
from test_contract import array, bound

import panamera as pn
from panamera.compiler import lower
from panamera.errors import BackendError, ScheduleError
from panamera.model.gpu import H100
from panamera.poly.access import AccessKind
from panamera.runtime import nvcc
from panamera.schedule.cost import in_flight
from panamera.schedule.derived import resident_per_sm
from panamera.schedule.mapping import map_group
from panamera.schedule.pipeline import check, choose, copy_bytes, staged_reads
from panamera.schedule.saved import Schedule


def matmul(M, N, K, dtype):
    x, w = pn.placeholder((M, K), dtype, name="x"), pn.placeholder((N, K), dtype, name="w")
    return x @ w.T


def decision(y, stages, tx, split=1, deterministic=False):
    """The mapper's decision for `y` reshaped to blocks of tx x (256 / tx) threads and `stages`."""
    base = pn.compile(y, target="emulator", use_database=False, cache=False, deterministic=deterministic)
    d = map_group(base.groups[0], H100, split=split, deterministic=deterministic, rtile=1, stages=1).decision
    G = d.N // d.vec
    chunk = math.ceil(math.ceil(G / split) / tx) * tx
    s = math.ceil(G / chunk)
    ty = 256 // tx
    d = dataclasses.replace(d, tx=tx, ty=ty, grid=(math.ceil(d.M / ty), s), split=s, chunk=chunk, stages=stages)
    return base, d


def pipelined(y, stages, tx, split=1, deterministic=False):
    base, d = decision(y, stages, tx, split, deterministic)
    sched = dataclasses.replace(base.schedule, kernels=(d,))
    k = pn.compile(y, target="emulator", schedule=sched, deterministic=deterministic)
    assert k.mappings[0].stages == stages
    return k


def expect(out, X, W, dtype):
    ref = X.astype(np.float64) @ W.T.astype(np.float64)
    assert (np.abs(out.astype(np.float64) - ref) <= bound(X, W.T, "mk,kn->mn", "float32", dtype)).all()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("M", [2, 4, 16])
@pytest.mark.parametrize("stages", [1, 2, 4])
def test_generated_pipeline_matches_numpy(stages, M, dtype, rng):
    """K = 1000 is not a multiple of the slab (32 threads x vec): the last step's copies past K
    are not issued and its threads past K skip their body, but every thread reaches the barriers."""
    N, K = 8, 1000
    y = matmul(M, N, K, dtype)
    k = pipelined(y, stages, 32)
    src = k.source
    assert ("__pipeline_memcpy_async" in src) == (stages > 1) and ("cuda_pipeline.h" in src) == (stages > 1)
    if stages > 1:
        assert f"__pipeline_wait_prior({stages - 1});" in src and "__pipeline_wait_prior(0);" in src
        assert "pn_ldv(&in0[" not in src  # the activations come from the stage
    X, W = array((M, K), dtype, rng), array((N, K), dtype, rng)
    for order in ("forward", "shuffled"):
        expect(k(X, W, order=order), X, W, dtype)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("stages", [2, 4])
def test_pipeline_with_split_k(stages, deterministic, rng):
    """K split across 4 blocks: each block pipelines its own slabs (by * chunk onward)."""
    M, N, K = 4, 16, 8200
    k = pipelined(matmul(M, N, K, "float32"), stages, 32, split=4, deterministic=deterministic)
    assert k.mappings[0].split == 4
    X, W = array((M, K), "float32", rng), array((N, K), "float32", rng)
    outs = [k(X, W, order=o) for o in ("forward", "shuffled")]
    for out in outs:
        expect(out, X, W, "float32")
    if deterministic:
        assert outs[0].tobytes() == outs[1].tobytes()


def test_scalar_and_narrow_copies(rng):
    """fp16 with K = 1002: rows 2004 bytes apart, so 4-byte copies; vec 2."""
    M, N, K = 4, 8, 1002
    y = matmul(M, N, K, "float16")
    k = pipelined(y, 2, 64)
    assert ", 4);" in k.source.split("__pipeline_memcpy_async")[1].split("\n")[0]
    X, W = array((M, K), "float16", rng), array((N, K), "float16", rng)
    expect(k(X, W), X, W, "float16")


def test_a_generated_kernel_without_its_wait_is_wrong(rng):
    """The generated source with the steady state's wait removed (before compiling for the
    emulator): the slabs land only at the drain, after they were read, so the result is wrong."""
    M, N, K = 4, 8, 1000
    k = pipelined(matmul(M, N, K, "float32"), 2, 32)
    X, W = array((M, K), "float32", rng) + 2.0, array((N, K), "float32", rng) + 2.0
    expect(k(X, W), X, W, "float32")
    edited = pipelined(matmul(M, N, K, "float32"), 2, 32)
    assert edited.executor.source.count("__pipeline_wait_prior(1);") == 1
    edited.executor.source = edited.executor.source.replace("__pipeline_wait_prior(1);", "")
    out = edited(X, W)
    ref = X.astype(np.float64) @ W.T.astype(np.float64)
    assert not (np.abs(out - ref) <= bound(X, W.T, "mk,kn->mn", "float32", "float32")).all()


def test_the_sm90_sass_of_a_generated_pipeline_copies_asynchronously():
    k = pipelined(matmul(4, 8, 1000, "float32"), 4, 32)
    try:
        text = nvcc.sass(k.source, k.mappings[0].name)
    except BackendError as e:
        pytest.skip(str(e))
    assert re.search(r"LDGSTS", text)  # global -> shared without registers (sm_80+)


def test_stages_survive_a_schedule_round_trip_and_default_to_one():
    base, d = decision(matmul(4, 8, 1000, "float32"), 4, 32)
    s = dataclasses.replace(base.schedule, kernels=(d,))
    assert Schedule.from_json(s.to_json()) == s
    old = s.to_json().replace(', "stages": 4', "")  # a format-3 schedule saved before pipelines
    assert '"stages"' not in old and Schedule.from_json(old).kernels[0].stages == 1


# -- the preconditions (schedule/pipeline.py), one negative test each ---------------------------
def _replay(y, d):
    base = pn.compile(y, target="emulator", use_database=False, cache=False)
    return pn.compile(y, target="emulator", schedule=dataclasses.replace(base.schedule, kernels=(d,)))


def test_stages_must_be_one_two_or_four():
    y = matmul(4, 8, 1000, "float32")
    _, d = decision(y, 3, 32)
    with pytest.raises(ScheduleError, match="stages 3 is not one of"):
        _replay(y, d)


def test_no_pipeline_with_one_row_per_block_or_a_register_tile():
    y = matmul(4, 8, 1000, "float32")
    _, d = decision(y, 2, 256)  # ty = 1
    with pytest.raises(ScheduleError, match="ty > 1 rows per block"):
        _replay(y, d)
    yt = matmul(5, 48, 256, "float32")
    base = pn.compile(yt, target="emulator", use_database=False, cache=False)
    dt = map_group(base.groups[0], H100, rtile=2, stages=1).decision
    with pytest.raises(ScheduleError, match="without a register"):
        _replay(yt, dataclasses.replace(dt, stages=2))


def test_no_pipeline_without_a_read_the_rows_share():
    """N = 4 rows per activation row, blocks of 8 rows: the block's rows read two rows of x."""
    y = matmul(4, 4, 1000, "float32")
    _, d = decision(y, 2, 32)
    with pytest.raises(ScheduleError, match="no read is shared"):
        _replay(y, d)


def test_no_pipeline_of_a_misaligned_row():
    """fp16 rows of K = 1001 elements, 2002 bytes apart: no 4-byte copy of a row is aligned (the
    mapper reads them one element at a time; here a 2-wide contiguous access is asserted)."""
    y = matmul(4, 8, 1001, "float16")
    base, d = decision(y, 2, 32)
    contig = tuple((AccessKind.CONTIG,) * len(a) for a in d.access)
    d = dataclasses.replace(d, vec=2, access=contig, chunk=math.ceil(1001 / 2 / 32) * 32)
    assert copy_bytes(base.groups[0], d, *staged_reads(base.groups[0], d)[0]) == 0
    with pytest.raises(ScheduleError, match="not aligned to 4-byte copies"):
        check(base.groups[0], d, "kernel")


def test_the_barriers_need_a_block_uniform_step_count():
    """A chunk that is not a multiple of tx: the block's threads would run different step
    counts, and a barrier some threads never reach deadlocks."""
    y = matmul(4, 8, 1000, "float32")
    base, d = decision(y, 2, 32)
    with pytest.raises(ScheduleError, match="block-uniform step count"):
        check(base.groups[0], dataclasses.replace(d, chunk=d.chunk + 1), "kernel")


# -- the model ------------------------------------------------------------------------------------
def test_full_size_plans_show_the_stages_without_running():
    """GEMV-sized plans (not run): where the block's rows share the activations, the staged
    slabs are mostly L2 re-reads of other blocks' slabs (x is 2 KB, read by 2048 blocks), adding
    no DRAM traffic in flight, so the model keeps direct loads and says why."""
    for M, N, K in [(4, 4096, 256), (4, 16384, 64), (2, 256, 8192)]:
        a = lower(matmul(M, N, K, "float16"), stop_after="mappings", target="emulator")
        assert a.mappings[0].stages == 1
    k = pn.compile(matmul(4, 4096, 256, "float16"), target="emulator", use_database=False, cache=False)
    text = k.explain()
    assert "pipeline (ALCOP, schedule/pipeline.py): model stages=1 (stages add too little DRAM" in text
    assert "need 24.0 KB/SM" in text and "modeled" in text


def test_direct_loads_that_keep_enough_bytes_in_flight_keep_one_stage():
    """Little's law: 4 resident blocks (the launch bounds' 64 registers per thread,
    `derived.resident_per_sm`) x 256 threads x 32 bytes = 32 KB per SM saturate H100's DRAM
    (gpu.in_flight_per_sm: 24 KB fitted to Liger's rows), so no stage is added; 16 bytes a thread
    (16 KB) do not."""
    y = matmul(4, 4096, 256, "float16")
    a = lower(y, stop_after="mappings", target="emulator")
    g, m = a.groups[0], a.mappings[0]
    assert H100.in_flight_per_sm == pytest.approx(24 * 1024)
    assert m.threads == 256 and resident_per_sm(H100, m.threads, 0, m.min_blocks) == 4
    c = choose(g, H100, m, 32, 1 << 20, 1e-5)
    assert c.stages == 1 and "direct loads already keep enough bytes in flight" in c.describe()
    assert "x4 blocks" in c.describe() and choose(g, H100, m, 16, 1 << 20, 1e-5).reason != c.reason
    assert choose(g, H100, m, in_flight(g, m), 1 << 20, 1e-5).reason != c.reason


def test_explain_shows_the_models_choice_for_a_pipelined_kernel():
    """Few blocks whose rows share a large part of the traffic: the model itself takes 4 stages;
    a schedule forcing 2 says so."""
    k = pipelined(matmul(4, 8, 1000, "float32"), 4, 32)
    assert "model stages=4 (more stages raise the bytes in flight" in k.explain()
    k = pipelined(matmul(4, 8, 1000, "float32"), 2, 32)
    assert "stages=2 as the schedule says" in k.explain()
