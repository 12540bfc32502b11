"""One rule for split workspaces (model/workspace.py): a workspace that fits in half of L2 is read
back from L2, one that does not from DRAM; its write-back is a DRAM write either way. Panamera's
tensor-core and CUDA-core splits and the peers' partials kernels (cuBLAS split-K) all follow it."""

import dataclasses

import panamera as pn
from panamera.bench.contraction_peers import cublas_gemm
from panamera.compiler import lower
from panamera.model import H100
from panamera.model.workspace import workspace_traffic
from panamera.schedule.cost import decision_cost


def _features(group, gpu, d) -> dict:
    return dict(decision_cost(group, gpu, d, any(str(m) == "partials" for m in d.merges)).features)


def _charged(group, d, ws: float, discarded: bool = False) -> None:
    """The same decision, on H100 (fits: read from L2) and on a GPU whose L2 is the workspace's size
    (half of it does not hold it): the read-back moves from L2 to DRAM; the write-back is a DRAM
    write either way, unless the reader discards the lines (then only where they do not fit)."""
    assert ws <= H100.l2_size / 2
    fits, spills = _features(group, H100, d), _features(group, dataclasses.replace(H100, l2_size=int(ws)), d)
    assert fits["l2_bytes"] - spills["l2_bytes"] == ws
    assert spills["dram_bytes"] - fits["dram_bytes"] == (2 * ws if discarded else ws)
    assert spills["write_bytes"] - fits["write_bytes"] == (ws if discarded else 0)


def test_rule():
    assert workspace_traffic(H100, 0) == {"dram_bytes": 0.0, "write_bytes": 0.0, "l2_bytes": 0.0}
    assert workspace_traffic(H100, H100.l2_size / 2)["l2_bytes"] == H100.l2_size / 2
    assert workspace_traffic(H100, H100.l2_size / 2 + 4)["dram_bytes"] == H100.l2_size + 8


def test_tensor_core_split_k_partials_charged_l2_where_they_fit():
    """int4 16 x 4096 x 4096 on tensor cores, split 8: 65536 outputs x 8 fp32 partials = 2 MiB."""
    from panamera.bench.suites import _linear

    a = lower(_linear(16, 4096, 4096, "int4")(), stop_after="mappings", target="emulator")
    g, d = a.groups[0], a.mappings[0]
    assert d.mma and d.split > 1
    partials = str(d.merges[0]) == "partials"  # the last block discards the partials' lines
    _charged(g, d, g.M * d.split * 4 if partials else g.M * 4, discarded=partials)


def test_cuda_core_split_workspace_charged_l2_where_it_fits():
    x = pn.placeholder((64, 2**16), "float32", name="x")
    a = lower(pn.sum(x, axis=1), stop_after="mappings", target="emulator")
    g, d = a.groups[0], a.mappings[0]
    assert d.split > 1
    ws = g.M * (d.split if str(d.merges[0]) == "partials" else 1) * 4
    _charged(g, d, ws)


def test_cublas_split_k_reduce_reads_partials_from_l2_where_they_fit():
    """cuBLAS at 1 x 512 x 16384 (bf16): 8 tiles of 64 x 8, split-K into fp32 partials, then
    splitKreduce_kernel reads them back: from L2 on H100, from DRAM where L2 is too small."""
    (_, reduce), facts = cublas_gemm(1, 512, 16384, 1, "bfloat16", 2, H100)
    partial = 512 * 4 * facts["split"]
    assert reduce.features["l2_bytes"] == partial and reduce.features["dram_bytes"] == 512 * 2
    launches, facts = cublas_gemm(1, 512, 16384, 1, "bfloat16", 2, dataclasses.replace(H100, l2_size=partial))
    assert facts["split"] > 1
    assert launches[1].features["l2_bytes"] == 0 and launches[1].features["dram_bytes"] == partial + 512 * 2


def test_discarded_partials_cost_no_dram_where_they_fit():
    """The tensor-core kernel's last block drops the partials' lines it read (discard.global.L2):
    where they fit, no byte of them reaches DRAM; where they do not, written back and read again."""
    from panamera.model.workspace import workspace_traffic

    assert workspace_traffic(H100, 2**20, discarded=True) == {"dram_bytes": 0.0, "write_bytes": 0.0, "l2_bytes": 2**20}
    assert workspace_traffic(H100, H100.l2_size, discarded=True)["dram_bytes"] == 2 * H100.l2_size


def test_discarded_partials_are_rewritten_before_the_next_read(rng):
    """Split-K partials on tensor cores (deterministic: combined by the last block), called twice
    with different inputs: the emulator poisons every discarded line (NaN), so a partial read
    before it is written again would show; both calls match numpy in float64."""
    import numpy as np
    from test_contract import array, bound
    from test_tensor_core import tc_compile

    x, w = pn.placeholder((20, 100), "float16", name="x"), pn.placeholder((40, 100), "float16", name="w")
    k = tc_compile(x @ w.T, (1, 2, 32), 4, deterministic=True)
    assert [str(m) for m in k.schedule.kernels[0].merges] == ["partials"] and "pn_discard_l2(" in k.source
    for _ in range(2):
        X, W = array((20, 100), "float16", rng), array((40, 100), "float16", rng)
        out = np.asarray(k(X, W)).astype(np.float64)
        ref = X.astype(np.float64) @ W.astype(np.float64).T
        assert (np.abs(out - ref) <= bound(X, W.T, "mk,kn->mn", "float32", "float16")).all()


def test_discarded_attention_partials_are_rewritten_before_the_next_read(rng):
    """Split-KV attention in one launch (the last block merges) and two (a merge kernel): both
    discard the tile's partials once merged; calls with fresh inputs still match numpy."""
    import math

    from test_attention import check, forced, holders, inputs, reference

    shape = ("float16", 1, 8, 2, 1, 1000, 32)
    for launches in (1, 2):
        a, run = forced(pn.nn.attention(*holders(*shape)), split=8, launches=launches)
        assert a.source.count("pn_discard_range(&ws_") == 3  # ws_m, ws_s, ws_o where they are merged
        for _ in range(2):
            arrays = inputs(rng, *shape)
            check(run, arrays, reference(*arrays, 1 / math.sqrt(shape[-1])), "float16", orders=("forward",))
