"""Thread-block clusters (schedule/cluster.py): a split stitched row whose blocks are one cluster
exchanges partials through distributed shared memory; the emulator runs each cluster's blocks
together, so every cluster kernel runs here against numpy."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import need_nvcc
from test_stitched_split import assert_close, case, tolerance

import panamera as pn
from panamera.errors import BackendError, ScheduleError
from panamera.model import A100, H100
from panamera.runtime import nvcc
from panamera.runtime.executor import Executor
from panamera.schedule.decision import Completion, MergeMode, Residence
from panamera.schedule.derived import merges_for
from panamera.schedule.mapping import map_group

ORDERS = ("forward", "reverse", "shuffled")


def compile_split(
    outputs, split: int, cluster: bool, res: Residence = Residence.MEMORY, gpu=H100, how=Completion.BARRIER
):
    """The model's plan with its stitched group split `split` ways, as one cluster or a
    cooperative launch, rows kept in `res`, a cluster's exchanges completed `how` (None: as the
    model chose; a replayed schedule: validated as any saved one)."""
    k = pn.compile(outputs, target="emulator", use_database=False, gpu=gpu)
    kernels = tuple(
        _completed(dataclasses.replace(map_group(g, gpu, split=split, cluster=cluster).decision, onchip=res), how)
        if g.stitched
        else m.decision
        for g, m in zip(k.groups, k.mappings)
    )
    return pn.compile(outputs, target="emulator", gpu=gpu, schedule=dataclasses.replace(k.schedule, kernels=kernels))


def _completed(d, how):
    return d if how is None or d.cluster == 1 else dataclasses.replace(d, completion=how)


CASES = [
    ("softmax", (2, 8192), "float32", 2, Residence.REGISTERS),
    ("cross_entropy", (2, 8192), "bfloat16", 4, Residence.MEMORY),
    ("rms_norm", (3, 8192), "bfloat16", 8, Residence.SHARED),
    ("layer_norm", (1, 16384), "float32", 16, Residence.REGISTERS),
    ("log_softmax", (1, 16384), "float16", 16, Residence.MEMORY),  # 16-byte loads: 16 blocks of 128 x 8 lanes
]


@pytest.mark.parametrize("op,shape,dtype,split,res", CASES, ids=[f"{c[0]}-{c[2]}-c{c[3]}-{c[4]}" for c in CASES])
def test_clusters_match_numpy_and_the_cooperative_plan(op, shape, dtype, split, res, rng):
    outputs, arrays, ref = case(op, shape, dtype, rng)
    k = compile_split(outputs, split, True, res)
    (m,) = [m for m in k.mappings if m.stitched]
    assert m.cluster == m.split == split and not m.cooperative and m.onchip == res
    (ln,) = [ln for ln in k.plan.per_call if ln.cluster > 1]
    assert ln.cluster == split and ln.grid[1] == split and not ln.cooperative
    assert not [b for b in m.buffers if b.role in ("partials", "counter")]  # no global round trip
    assert "map_shared_rank" in k.source and "pn_grid_sync(&" not in k.source
    assert "pn_cluster.barrier_arrive()" in k.source and "__syncthreads" not in k.source.split("// exchange 1")[1]
    coop = compile_split(outputs, split, False, res)
    assert coop.mappings[-1].cooperative
    assert_close(coop(*arrays), ref, dtype, shape[1])
    first = None
    for order in ORDERS:
        out = k(*arrays, order=order, seed=5)
        assert_close(out, ref, dtype, shape[1])
        first = out if first is None else first
        np.testing.assert_array_equal(out, first)  # the warps' partials combine in one fixed order


@pytest.mark.parametrize("method,exchanges", [("online", 1), ("multipass", 2)])
@pytest.mark.parametrize("split", [2, 16])
def test_cross_entropy_in_a_cluster_exchanges_once_with_online_statistics(method, exchanges, split, rng):
    """nn.cross_entropy(method=...): the online logsumexp's (max, sum) and the target's logit are
    the one pass's partials, so a row split over a cluster exchanges once; multipass twice. Both
    match numpy in float64, and the model prefers one exchange for a few long rows."""
    shape, dtype = (2, 8192), "float32"
    x, t = pn.placeholder(shape, dtype, name="x"), pn.placeholder((2,), "int64", name="t")
    a = (rng.standard_normal(shape) * 3).astype(np.float32)
    ti = rng.integers(0, shape[1], 2).astype(np.int64)
    a64 = a.astype(np.float64)
    m = a64.max(1)
    ref = np.log(np.exp(a64 - m[:, None]).sum(1)) + m - a64[np.arange(2), ti]
    k = compile_split(pn.nn.cross_entropy(x, t, reduction="none", method=method), split, True)
    (mp,) = [mp for mp in k.mappings if mp.stitched]
    assert mp.cluster == mp.split == split
    assert len(re.findall(r"// exchange \d+:", k.source)) == exchanges
    for order in ORDERS:
        assert_close(k(a, ti, order=order, seed=3), ref, dtype, shape[1])
    few_long = pn.nn.cross_entropy(
        pn.placeholder((8, 128256), "bfloat16"), pn.placeholder((8,), "int64"), reduction="none"
    )
    auto = pn.compile(few_long, target="emulator", use_database=False)
    assert [f.chosen for f in auto.formulations] == ["online"], auto.explain()


def test_cross_entropy_names_a_bad_method():
    x, t = pn.placeholder((2, 8)), pn.placeholder((2,), "int64")
    with pytest.raises(pn.errors.OptionError, match="cross_entropy: unknown method 'fast'"):
        pn.nn.cross_entropy(x, t, method="fast")


# -- split reduce kernels in clusters: the cluster combines in rank 0, the clusters merge ------------
REDUCE_CASES = [  # op, shape, split, cluster, deterministic (partials) or atomics
    ("sum", (2, 65536), 2, 2, False),  # one cluster: rank 0 stores
    ("max", (3, 65536), 16, 4, False),  # 4 clusters merged by atomics
    ("mean", (2, 65536), 16, 4, True),  # 4 clusters merged by partials
    ("sum", (2, 131072), 32, 8, True),
    ("var", (2, 131072), 32, 8, False),  # Welford: partials (no atomic merges a struct)
    ("sum", (2, 131072), 64, 16, False),
    ("max", (2, 131072), 64, 16, True),
]


def compile_reduce(y, split: int, cluster: int, det: bool, how=Completion.BARRIER):
    """y's split reduction with its blocks in clusters of `cluster` (a replayed schedule), their
    combine completed `how`."""
    k = pn.compile(y, target="emulator", use_database=False, deterministic=det)
    (g,) = k.groups
    d = map_group(g, H100, split=split, deterministic=det, cluster=True).decision
    partials = det or any(m == MergeMode.PARTIALS for m in d.merges)
    merges = merges_for(g, d.split // cluster, partials)
    d = dataclasses.replace(d, cluster=cluster, merges=merges, completion=how)
    return pn.compile(y, target="emulator", deterministic=det, schedule=dataclasses.replace(k.schedule, kernels=(d,)))


@pytest.mark.parametrize(
    "op,shape,split,cluster,det",
    REDUCE_CASES,
    ids=[f"{c[0]}-s{c[2]}-c{c[3]}-{'partials' if c[4] else 'atomics'}" for c in REDUCE_CASES],
)
def test_split_reductions_in_clusters_match_numpy_in_both_merge_modes(op, shape, split, cluster, det, rng):
    x = pn.placeholder(shape, "float32", name="x")
    a = (rng.standard_normal(shape) * 3).astype(np.float32)
    k = compile_reduce(getattr(pn, op)(x, axis=1), split, cluster, det)
    (m,) = k.mappings
    assert (m.split, m.cluster) == (split, cluster)
    merge = {1: MergeMode.STORE}.get(
        split // cluster, MergeMode.PARTIALS if det or op == "var" else MergeMode.ATOMIC_WS
    )
    assert set(m.merges) == {merge}
    assert k.plan.per_call[-1].cluster == cluster and "map_shared_rank" in k.source
    ref = getattr(np, op)(a.astype(np.float64), axis=1)
    tol = tolerance("float32", shape[1])
    scale = {"sum": np.abs(a).sum(1).max(), "mean": np.abs(a).mean(1).max()}.get(op, float(np.abs(ref).max()))
    first = None
    for order in ORDERS:
        for call in range(2):  # the resident workspace and counters are back at their start
            out = k(a, order=order, seed=call)
            np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * scale)
            if det:  # partials combine in one fixed order: bit-identical
                first = out if first is None else first
                np.testing.assert_array_equal(out, first)


def _broken(k, pattern: str, repl: str) -> Executor:
    src, n = re.subn(pattern, repl, k.source)
    assert n >= 1
    return Executor(k.plan, src, k.signatures, "emulator")


def test_a_missing_cluster_barrier_is_caught(rng):
    """Without the barrier after the pushes, a block combines its row before its peers' partials
    landed, and a peer that ran ahead exits before a slower block pushes into it: the emulator
    reports that push (or, in another order, the fresh shared memory's NaN spoils the result)."""
    outputs, arrays, ref = case("softmax", (2, 8192), "float32", rng)
    k = compile_split(outputs, 4, True)
    assert_close(k(*arrays), ref, "float32", 8192)
    ex = _broken(k, r"pn_cluster\.sync\(\);  // every block's partials are written", "")
    with pytest.raises(BackendError, match="cluster block \\d+ accessed after it exited"):
        ex(list(arrays), order="forward")
    try:
        bad = ex(list(arrays), order="reverse")
    except BackendError as e:
        assert "accessed after it exited" in str(e)
    else:
        assert not np.allclose(bad, ref, equal_nan=False)


def test_a_push_before_the_cluster_has_started_is_reported(rng):
    """A block may push into a peer's shared memory only once every block of the cluster has
    started (a cluster barrier passed): without the split barrier at the start, the emulator
    says so; a wait without its arrival, or an arrival never waited for, is named too."""
    outputs, arrays, _ = case("softmax", (2, 8192), "float32", rng)
    k = compile_split(outputs, 4, True)
    src = k.source
    for cut, why in (
        (r"  pn_cluster\.barrier_(arrive|wait)\(\);[^\n]*\n", "accessed before this thread passed a cluster barrier"),
        (r"  pn_cluster\.barrier_wait\(\);[^\n]*\n", "cluster.sync\\(\\) after barrier_arrive\\(\\) without"),
        (r"  pn_cluster\.barrier_arrive\(\);[^\n]*\n", "barrier_wait\\(\\) without a barrier_arrive"),
    ):
        with pytest.raises(BackendError, match=why):
            _broken(k, cut, "")(list(arrays))
    assert k.source == src


def test_a_cluster_barrier_some_threads_skip_is_a_deadlock(rng):
    """Block 0's other threads wait at a block barrier for its thread 0, which waits at the
    cluster barrier for them: nobody can move, and the emulator says so instead of hanging."""
    outputs, arrays, _ = case("softmax", (2, 8192), "float32", rng)
    k = compile_split(outputs, 4, True)
    sync = "if (tx == 0 || by != 0) pn_cluster.sync(); __syncthreads();  // every"
    ex = _broken(k, r"pn_cluster\.sync\(\);  // every", sync)
    with pytest.raises(BackendError, match="deadlock: threads of a cluster wait at a cluster barrier"):
        ex(list(arrays))


def test_the_model_takes_clusters_for_long_rows_on_h100_and_not_on_a100():
    x = pn.placeholder((64, 256000), "float32", name="x")
    k = pn.compile(pn.nn.softmax(x), target="emulator", use_database=False)
    (m,) = k.mappings
    assert 2 <= m.cluster == m.split <= 16 and not m.cooperative
    assert "clusters of" in k.explain() and "thread-block cluster" in k.explain()
    a = pn.compile(pn.nn.softmax(x), target="emulator", use_database=False, gpu="a100")
    assert all(m.cluster == 1 for m in a.mappings)


def test_cluster_kernels_compile_for_sm80_and_sm90_and_use_distributed_shared_memory(rng):
    need_nvcc()
    outputs, _, _ = case("rms_norm", (1, 16384), "bfloat16", rng)
    k = compile_split(outputs, 16, True, Residence.REGISTERS)
    assert k.mappings[-1].cluster == 16, k.explain()
    res = nvcc.compile_cuda(k.source)
    assert {r.arch for r in res} == {"sm_80", "sm_90"}
    assert all(r.spill_stores == 0 and r.spill_loads == 0 for r in res), res
    with tempfile.TemporaryDirectory() as tmp:  # the PTX: mapa + ld.shared::cluster, the cluster barrier
        Path(tmp, "k.cu").write_text(k.source)
        cmd = [nvcc.find_nvcc(), "-ptx", "-arch=sm_90", "-std=c++17", f"{tmp}/k.cu", "-o", f"{tmp}/k.ptx"]
        subprocess.run(cmd, check=True, capture_output=True)
        ptx = Path(tmp, "k.ptx").read_text()
    assert "mapa" in ptx and "st.shared::cluster" in ptx and "barrier.cluster.wait" in ptx
    assert "barrier.cluster.arrive" in ptx  # the split barrier at the start, and the exchange's
    try:
        sass = nvcc.sass(k.source, k.mappings[0].name)
    except BackendError:
        return
    assert "UCGABAR_WAIT" in sass  # the cluster barrier in the sm_90 SASS


# -- one negative test per precondition (schedule/cluster.py) -----------------------------------
def test_precondition_1_the_cluster_is_every_block_of_the_split(rng):
    outputs, _, _ = case("softmax", (2, 8192), "float32", rng)
    k = compile_split(outputs, 4, True)
    bad = dataclasses.replace(k.schedule.kernels[0], cluster=3)  # does not divide the split of 4
    with pytest.raises(ScheduleError, match="precondition 1"):
        pn.compile(outputs, target="emulator", schedule=dataclasses.replace(k.schedule, kernels=(bad,)))


def test_precondition_4_a_stitched_cluster_has_whole_warps_per_row(rng):
    outputs, _, _ = case("softmax", (2, 8192), "float32", rng)
    k = compile_split(outputs, 4, True)
    bad = dataclasses.replace(k.schedule.kernels[0], tx=16)  # half a warp per row: no warp partial of one row
    with pytest.raises(ScheduleError, match="precondition 4: a stitched row's cluster needs whole warps"):
        pn.compile(outputs, target="emulator", schedule=dataclasses.replace(k.schedule, kernels=(bad,)))


def test_precondition_3_a_reduce_kernel_cluster_combines_rows(rng):
    x = pn.placeholder((4096, 64), "float32", name="x")
    y = pn.sum(x, axis=0)  # COLUMN: a block's partials are a row of outputs, not one per row
    k = pn.compile(y, target="emulator", use_database=False, split=4)
    (m,) = k.mappings
    assert m.split == 4
    bad = dataclasses.replace(m.decision, cluster=4, merges=(MergeMode.STORE,), atomic_vec=(1,))
    with pytest.raises(ScheduleError, match="precondition 3"):
        pn.compile(y, target="emulator", schedule=dataclasses.replace(k.schedule, kernels=(bad,)))


def test_precondition_2_the_gpu_has_clusters_of_that_size(rng):
    outputs, _, _ = case("softmax", (2, 8192), "float32", rng)
    k = compile_split(outputs, 4, True)
    assert A100.max_cluster == 1
    a100 = dataclasses.replace(k.schedule, gpu=A100.name)  # the H100 schedule replayed for an A100
    with pytest.raises(ScheduleError, match="precondition 2"):
        pn.compile(outputs, target="emulator", gpu="a100", schedule=a100)
