"""A stitched cluster's exchange completed by mbarriers counting st.async bytes (schedule/cluster.py
`Completion.MBARRIER`, codegen/mbarrier.py): values against numpy in float64 at cluster sizes 2 to
16, bit-identical to the cluster-barrier plan (same combine order); the emulator's reports of a
missing expect_tx, a wrong byte count, a missing initialization; the model's choice; nvcc for
sm_80 and sm_90 with the SYNCS / STAS instructions in the SASS; precondition 5's negative tests.
A split reduce kernel's cluster combine by rank 0's mbarrier likewise: clusters of 2 to 16, both
merge modes, a missing push or expect_tx or start barrier reported, the model's choice, its SASS."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import need_nvcc
from test_cluster import _broken, compile_reduce, compile_split
from test_stitched_split import assert_close, case, tolerance

import panamera as pn
from panamera.errors import BackendError, ScheduleError
from panamera.model import H100
from panamera.runtime import nvcc
from panamera.schedule.cluster import merge_cycles
from panamera.schedule.decision import Completion, Residence
from panamera.schedule.mapping import map_group

MB = Completion.MBARRIER
CASES = [  # op, shape, dtype, cluster, residence; exchanges of 4- to 12-byte accumulators
    ("softmax", (2, 8192), "float32", 2, Residence.REGISTERS),  # one exchange of (max, sum)
    ("rms_norm", (3, 8192), "bfloat16", 4, Residence.SHARED),
    ("layer_norm", (2, 8192), "float32", 8, Residence.MEMORY),  # Welford: 12-byte partials
    ("log_softmax", (1, 16384), "float16", 16, Residence.REGISTERS),
]


@pytest.mark.parametrize("op,shape,dtype,split,res", CASES, ids=[f"{c[0]}-c{c[3]}" for c in CASES])
def test_mbarrier_exchange_matches_numpy_and_the_barrier_plan(op, shape, dtype, split, res, rng):
    outputs, arrays, ref = case(op, shape, dtype, rng)
    k = compile_split(outputs, split, True, res, how=MB)
    (m,) = [m for m in k.mappings if m.stitched]
    assert (m.cluster, m.completion) == (split, MB)
    exchanges = len(re.findall(r"// exchange \d+:", k.source))
    assert k.source.count("pn_mbar_wait(&pn_mbar[") == exchanges >= 1
    assert "pn_cluster.sync()" not in k.source and "map_shared_rank" not in k.source  # no cluster-wide barrier
    barrier = compile_split(outputs, split, True, res)
    assert barrier.mappings[-1].completion == Completion.BARRIER
    want = barrier(*arrays, order="forward")
    for order in ("forward", "reverse", "shuffled"):
        out = k(*arrays, order=order, seed=7)
        assert_close(out, ref, dtype, shape[1])
        np.testing.assert_array_equal(out, want)  # the same partials, combined in the same order


def test_a_multipass_cross_entropy_has_one_mbarrier_per_exchange(rng):
    """Two exchanges (max, then the sum of exponentials and the target's logit): two mbarriers,
    each used for one phase, initialized together at the start."""
    shape = (2, 8192)
    x, t = pn.placeholder(shape, "float32", name="x"), pn.placeholder((2,), "int64", name="t")
    a = (rng.standard_normal(shape) * 3).astype(np.float32)
    ti = rng.integers(0, shape[1], 2).astype(np.int64)
    a64 = a.astype(np.float64)
    mx = a64.max(1)
    ref = np.log(np.exp(a64 - mx[:, None]).sum(1)) + mx - a64[np.arange(2), ti]
    k = compile_split(pn.nn.cross_entropy(x, t, reduction="none", method="multipass"), 4, True, how=MB)
    assert "PN_BLOCK_SHARED(unsigned long long, pn_mbar, [2])" in k.source
    assert "pn_mbar_wait(&pn_mbar[1], 0u)" in k.source
    for order in ("forward", "reverse", "shuffled"):
        assert_close(k(a, ti, order=order, seed=1), ref, "float32", shape[1])


def _softmax(rng, split=4):
    outputs, arrays, ref = case("softmax", (2, 8192), "float32", rng)
    return compile_split(outputs, split, True, how=MB), list(arrays), ref


def test_a_missing_expect_tx_is_a_deadlock_not_a_hang(rng):
    k, arrays, ref = _softmax(rng)
    assert_close(k(*arrays), ref, "float32", 8192)
    ex = _broken(k, r"    pn_mbar_expect\([^\n]*\n", "")
    with pytest.raises(BackendError, match=r"deadlock: threads wait on an mbarrier .*: 1 arrival\(s\) missing"):
        ex(arrays)


def test_a_wrong_byte_count_is_caught(rng):
    """More bytes announced than pushed: the wait never completes (a deadlock report). Fewer: the
    phase completes early, and the last push lands beyond the count (reported at the cluster's exit)."""
    k, arrays, _ = _softmax(rng)
    more = _broken(k, r"pn_mbar_expect\(&pn_mbar\[0\], 32u \*", "pn_mbar_expect(&pn_mbar[0], 33u *")
    with pytest.raises(BackendError, match=r"never completes: 8 byte\(s\) announced by expect_tx that no push"):
        more(arrays)
    fewer = _broken(k, r"pn_mbar_expect\(&pn_mbar\[0\], 32u \*", "pn_mbar_expect(&pn_mbar[0], 31u *")
    for order in ("forward", "reverse"):
        with pytest.raises(BackendError, match="8 byte\\(s\\) landed beyond those its expect_tx announced"):
            fewer(arrays, order=order)


def test_a_push_into_a_block_that_has_exited_is_reported(rng):
    """Block 0 skips its wait, exits, and its peers' pushes find no shared memory there."""
    k, arrays, _ = _softmax(rng)
    skip = _broken(k, r"  pn_mbar_wait\(", "  if (pn_cluster.block_rank() != 0) pn_mbar_wait(")
    with pytest.raises(BackendError, match="st.async into the shared memory of cluster block 0 after it exited"):
        skip(arrays, order="reverse")


def test_an_mbarrier_used_before_its_initialization_is_reported(rng):
    k, arrays, _ = _softmax(rng)
    ex = _broken(k, r"pn_mbar_init\(&pn_mbar\[e\], 1u\);", ";")
    with pytest.raises(BackendError, match="mbarrier of cluster block \\d+ is not initialized"):
        ex(arrays)


def test_the_model_takes_mbarriers_for_long_rows_on_h100():
    """Cheaper per exchange by the cluster barrier's round trip (schedule/cluster.py, assumed):
    the model completes every H100 cluster exchange by mbarriers; the A100 has no clusters."""
    x = pn.placeholder((1, 131072), "bfloat16", name="x")
    k = pn.compile(pn.nn.softmax(x), target="emulator", use_database=False)
    (m,) = k.mappings
    assert m.cluster > 1 and m.completion == MB, m.describe()
    back = dataclasses.replace(m.decision, completion=Completion.BARRIER)
    assert back.to_dict().get("completion") is None and m.decision.to_dict()["completion"] == "mbarrier"
    assert type(m.decision).from_dict(m.decision.to_dict()) == m.decision
    a = pn.compile(pn.nn.softmax(x), target="emulator", use_database=False, gpu="a100")
    assert all(mm.cluster == 1 and mm.completion == Completion.BARRIER for mm in a.mappings)


def test_mbarrier_kernels_compile_for_sm80_and_sm90_with_syncs_and_stas(rng):
    need_nvcc()
    outputs, _, _ = case("rms_norm", (1, 16384), "bfloat16", rng)
    k = compile_split(outputs, 16, True, Residence.REGISTERS, how=MB)
    res = nvcc.compile_cuda(k.source)
    assert {r.arch for r in res} == {"sm_80", "sm_90"}
    assert all(r.spill_stores == 0 and r.spill_loads == 0 for r in res), res
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "k.cu").write_text(k.source)
        cmd = [nvcc.find_nvcc(), "-ptx", "-arch=sm_90", "-std=c++17", f"{tmp}/k.cu", "-o", f"{tmp}/k.ptx"]
        subprocess.run(cmd, check=True, capture_output=True)
        ptx = Path(tmp, "k.ptx").read_text()
    for op in ("mbarrier.init", "fence.mbarrier_init", "mbarrier.arrive.expect_tx", "mbarrier.try_wait.parity"):
        assert op in ptx
    assert "st.async.shared::cluster.mbarrier::complete_tx::bytes" in ptx and "barrier.cluster.sync" not in ptx
    try:
        sass = nvcc.sass(k.source, k.mappings[-1].name)
    except BackendError:
        return
    assert "STAS" in sass and "SYNCS.ARRIVE.TRANS64" in sass and "SYNCS.PHASECHK.TRANS64.TRYWAIT" in sass


def test_precondition_5_mbarriers_complete_a_stitched_row_split_over_one_cluster(rng):
    outputs, _, _ = case("softmax", (2, 8192), "float32", rng)
    k = compile_split(outputs, 4, False)  # the cooperative plan: no cluster to complete
    (d,) = k.schedule.kernels
    assert d.cluster == 1
    bad = dataclasses.replace(d, completion=MB)
    with pytest.raises(ScheduleError, match="precondition 5: mbarrier completion needs a thread-block cluster"):
        pn.compile(outputs, target="emulator", schedule=dataclasses.replace(k.schedule, kernels=(bad,)))
    assert H100.max_cluster == 16


# -- a split reduce kernel's cluster combine completed by rank 0's mbarrier ---------------------------
REDUCE_CASES = [  # op, shape, split, cluster, deterministic (partials) or atomics
    ("sum", (2, 16384), 2, 2, False),  # one cluster: rank 0 stores
    ("max", (3, 65536), 16, 4, False),  # 4 clusters merged by atomics
    ("var", (2, 65536), 16, 8, True),  # Welford: 12-byte partials, 2 clusters' partials
    ("mean", (2, 65536), 32, 16, True),  # 2 clusters merged by partials
]


@pytest.mark.parametrize(
    "op,shape,split,cluster,det", REDUCE_CASES, ids=[f"{c[0]}-s{c[2]}-c{c[3]}" for c in REDUCE_CASES]
)
def test_reduce_cluster_combine_by_mbarrier_matches_numpy_and_the_barrier_plan(op, shape, split, cluster, det, rng):
    """Every block pushes its partial into rank 0 (st.async onto rank 0's mbarrier), rank 0 alone
    waits and folds them in rank order: values as numpy's in float64, bit-identical to the
    cluster-barrier plan whatever order the emulator runs the blocks in."""
    x = pn.placeholder(shape, "float32", name="x")
    a = (rng.standard_normal(shape) * 3).astype(np.float32)
    y = getattr(pn, op)(x, axis=1)
    k = compile_reduce(y, split, cluster, det, how=MB)
    (m,) = k.mappings
    assert (m.split, m.cluster, m.completion) == (split, cluster, MB)
    assert "pn_cluster.sync()" not in k.source and "map_shared_rank" not in k.source
    assert k.source.count("pn_mbar_wait(&pn_mbar[0], 0u)") == 1 and "pn_cluster.barrier_wait()" in k.source
    ref = getattr(np, op)(a.astype(np.float64), axis=1)
    tol = tolerance("float32", shape[1])
    scale = {"sum": np.abs(a).sum(1).max(), "mean": np.abs(a).mean(1).max()}.get(op, float(np.abs(ref).max()))
    barrier = compile_reduce(y, split, cluster, det)
    assert "map_shared_rank" in barrier.source
    for order in ("forward", "reverse", "shuffled"):
        out = k(a, order=order, seed=3)
        np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * scale)
        if det or split == cluster:  # no atomics between clusters: one fixed order
            np.testing.assert_array_equal(out, barrier(a, order=order, seed=3))


def _reduce(rng):
    x = pn.placeholder((3, 65536), "float32", name="x")
    a = (rng.standard_normal((3, 65536)) * 3).astype(np.float32)
    return compile_reduce(pn.sum(x, axis=1), 16, 4, True, how=MB), [a]


def test_reduce_combine_a_missing_push_is_a_deadlock_not_a_hang(rng):
    """Rank 0 waits for the bytes of 4 pushes; a block that skips its push leaves 4 of them
    undelivered: the emulator names the missing bytes instead of hanging."""
    k, arrays = _reduce(rng)
    skip = _broken(k, r"  if \(tx == 0\) pn_push\(", "  if (tx == 0 && pn_rank != 3) pn_push(")
    with pytest.raises(BackendError, match=r"never completes: 4 byte\(s\) announced by expect_tx that no push"):
        skip(arrays)


def test_reduce_combine_a_missing_expect_tx_or_split_barrier_is_reported(rng):
    """Without rank 0's expect_tx its wait misses an arrival (a deadlock); without the split
    barrier's wait a block may push before rank 0 has started (or armed its mbarrier)."""
    k, arrays = _reduce(rng)
    no_expect = _broken(k, r"    pn_mbar_expect\([^\n]*\n", "")
    with pytest.raises(BackendError, match=r"deadlock: threads wait on an mbarrier .*: 1 arrival\(s\) missing"):
        no_expect(arrays)
    no_wait = _broken(k, r"  pn_cluster\.barrier_wait\(\);[^\n]*\n", "")
    with pytest.raises(BackendError, match="cluster block 0 accessed before this thread passed a cluster barrier"):
        no_wait(arrays, order="reverse")


def test_the_model_takes_mbarriers_for_a_reduce_kernels_clusters_on_h100():
    """One push's latency and rank 0's own loads instead of two cluster barriers and C remote
    loads (schedule/cluster.py `merge_cycles`, assumed cycles): every H100 reduce cluster plan."""
    x = pn.placeholder((2, 1 << 20), "float32", name="x")
    k = pn.compile(pn.sum(x, axis=1), target="emulator", use_database=False)
    (g,) = k.groups
    d = map_group(g, H100, cluster=True).decision
    assert d.cluster > 1 and d.completion == MB, d
    assert merge_cycles(d) < merge_cycles(dataclasses.replace(d, completion=Completion.BARRIER))


def test_reduce_mbarrier_kernel_compiles_for_sm80_and_sm90_with_syncs_and_stas(rng):
    need_nvcc()
    k, _ = _reduce(rng)
    res = nvcc.compile_cuda(k.source)
    assert {r.arch for r in res} == {"sm_80", "sm_90"}
    assert all(r.spill_stores == 0 and r.spill_loads == 0 for r in res), res
    try:
        sass = nvcc.sass(k.source, k.mappings[-1].name)
    except BackendError:
        return
    assert "STAS" in sass and "SYNCS.ARRIVE.TRANS64" in sass and "SYNCS.PHASECHK.TRANS64.TRYWAIT" in sass
    assert "UCGABAR_ARV" in sass and "UCGABAR_WAIT" in sass  # the split barrier of the start, nothing after


def test_precondition_5_a_split_reduce_kernel_without_clusters_has_no_mbarrier(rng):
    x = pn.placeholder((3, 65536), "float32", name="x")
    y = pn.sum(x, axis=1)
    k = pn.compile(y, target="emulator", use_database=False)
    (g,) = k.groups
    d = map_group(g, H100, split=16, cluster=False).decision
    assert d.cluster == 1 and d.split == 16
    bad = dataclasses.replace(d, completion=MB)
    with pytest.raises(ScheduleError, match="precondition 5: mbarrier completion needs a thread-block cluster"):
        pn.compile(y, target="emulator", schedule=dataclasses.replace(k.schedule, kernels=(bad,)))
