"""The `training` bench suite: its workloads build, every training peer is modeled at or above the
limit, backward graphs without a reduction have peers (no IndexError), and the runner lists a
workload Panamera refuses instead of failing. Plans only: nothing here is timed."""

from __future__ import annotations

import pytest

import panamera as pn
from panamera.bench.baselines import compulsory_traffic, plan_all
from panamera.bench.peers import describe, plan_peers
from panamera.bench.runner import run_bench
from panamera.bench.suites import SUITES, Workload
from panamera.bench.train_peers import Backward, Pattern, plan_train_peers
from panamera.bench.train_suite import layer_norm_backward, training
from panamera.errors import Unsupported
from panamera.model import H100

WORKLOADS = training()


def test_the_suite_is_registered_and_every_workload_builds_or_is_refused_by_name():
    assert "training" in SUITES
    refused = []
    for w in WORKLOADS:
        try:
            outs = w.build()
        except Unsupported as e:
            refused.append((w.name, str(e)))
            continue
        assert outs and all(isinstance(t, pn.Tensor) for t in outs), w.name
    # only the embedding gradient at GPT-2's vocabulary may be refused (owner computes: too many terms),
    # until the atomic indirect-write statement takes it
    assert {n for n, _ in refused} <= {"embedding_bwd [8192 ids into 50257x768]"}


@pytest.mark.parametrize("w", [w for w in WORKLOADS if w.backward is not None], ids=lambda w: f"{w.name} {w.dtype}")
def test_every_training_peer_is_at_or_above_the_limit(w):
    b = w.backward
    try:
        compulsory = compulsory_traffic(w.build(), H100)  # with the forced re-read (bench/reread.py)
    except Unsupported:  # the embedding gradient: ids and dy read, the table written
        assert b.pattern is Pattern.EMBEDDING
        compulsory = (b.M * 8 + b.M * b.N * b.elem, b.rows * b.N * 4)
    plans = {k: p for k, p in plan_train_peers(b, H100).items() if p is not None}
    assert plans
    for name, p in plans.items():
        e = p.estimate(H100, compulsory)
        assert e.ratio_to_limit >= 1.0, (name, p.description, e.total_us, e.limit_us)
        # a peer reads at least every full input tensor and writes every output
        assert sum(ln.bytes_read + ln.bytes_written for ln in p.launches) >= sum(compulsory) * 0.999, name


def test_liger_norm_backward_is_per_sm_partials_then_a_column_sum():
    p = plan_train_peers(Backward(Pattern.LAYER_NORM, 4096, 1024, 4), H100)["liger"]
    main, *fin = p.launches
    assert main.features["blocks"] == H100.sms and len(fin) == 2  # _DW.sum(0), _DB.sum(0)
    assert p.facts["rows_per_program"] == -(-4096 // H100.sms)


def test_eager_layer_norm_backward_is_two_kernels_with_gamma_beta_over_columns():
    p = plan_train_peers(Backward(Pattern.LAYER_NORM, 4096, 1024, 4), H100)["pytorch-eager"]
    dx, gb = p.launches
    assert dx.features["blocks"] == 4096 and gb.features["blocks"] == 1024 // 32  # N / block_dim_x


def test_liger_has_no_cross_entropy_backward_kernel():
    assert plan_train_peers(Backward(Pattern.CROSS_ENTROPY, 4096, 4096, 4), H100)["liger"] is None


def test_a_graph_without_a_reduction_has_peers_not_an_index_error():
    x, dy = pn.placeholder((256, 512), name="x"), pn.placeholder((256, 512), name="dy")
    outs = [pn.where(x > 0, dy, 0.0)]  # threshold_backward
    w = describe(outs)
    assert w.pattern == "elementwise" and w.reductions == ()
    plans = {k: p for k, p in plan_peers(outs, H100).items() if p is not None}
    assert set(plans) == {"pytorch-eager", "inductor"}
    for p in plans.values():
        assert p.estimate(H100, compulsory_traffic(outs)).ratio_to_limit >= 1.0


def test_plan_all_and_the_runner_on_a_small_training_workload():
    small = Workload("layer_norm_bwd [64x256]", "training", "float32", lambda: layer_norm_backward(64, 256, "float32"),
                     Backward(Pattern.LAYER_NORM, 64, 256, 4))  # fmt: skip
    plans = plan_all(small.build, H100, backward=small.backward)
    assert {"panamera", "pytorch-eager", "inductor", "liger"} <= set(plans)

    def refused():
        raise Unsupported("scatter_add_rows: too many terms")

    records, summary = run_bench(["training"], H100, workloads=[small, Workload("huge", "training", "float32", refused)],
                                 measure=False, nvrtc_times=False)  # fmt: skip
    assert records[0]["plan"] == "panamera" and set(records[0]["peers"]) == {"pytorch-eager", "inductor", "liger"}
    assert "## Not planned" in summary and "huge float32: scatter_add_rows: too many terms" in summary


# -- the training-step table (issue 23 item 4) ----------------------------------------------------------
def test_eager_model_of_a_subgraph_counts_one_kernel_per_op_that_moves_bytes():
    from panamera.bench.train_steps import eager_us

    traffic = (
        ("aten.view.default", 0, 0),
        ("aten.add.Tensor", 2 << 20, 1 << 20),
        ("aten.sum.dim_IntList", 1 << 20, 64),
    )
    us, kernels = eager_us(traffic, H100)
    assert kernels == 2 and us > H100.launch_s * 1e6


def test_one_training_step_row(monkeypatch):
    torch = pytest.importorskip("torch")
    from torch import nn

    from panamera.bench import train_steps

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 8)

        def forward(self, x, y):
            return nn.functional.cross_entropy(self.fc(x), y)

    monkeypatch.setitem(train_steps.MODELS, "tiny", lambda: (Tiny(), [torch.randn(8, 16), torch.randint(0, 8, (8,))]))
    row = train_steps.run_model("tiny")
    assert row.kernels >= 2 and row.eager_kernels > row.kernels and row.eager_ops >= 1  # the matmuls stay eager
    assert 0 < row.panamera_us and 0 < row.eager_us
    assert row.grad_error <= 1e-5 and row.loss_error <= 1e-5  # float32 against eager PyTorch
    assert "| tiny |" in train_steps.table([row])


def test_eager_embedding_backward_sorts_then_sums_partial_segments():
    """Embedding.cu: up to 3072 ids the feature kernel; beyond, cub's radix sort over 64 key bits
    (8 onesweep passes) and EmbeddingBackwardKernel.cu's partial segments: deterministic, the peer
    of Panamera's sorted segments (test_scatter_sorted.py)."""
    small = plan_train_peers(Backward(Pattern.EMBEDDING, 2048, 768, 4, rows=50257), H100)["pytorch-eager"]
    assert [ln.name for ln in small.launches] == ["fill (at::zeros)", "embedding_backward_feature_kernel"]
    p = plan_train_peers(Backward(Pattern.EMBEDDING, 8192, 768, 4, rows=50257), H100)["pytorch-eager"]
    names = [ln.name for ln in p.launches]
    assert names.count("DeviceRadixSortOnesweepKernel") == 8 and names[-2:] == [
        "compute_grad_weight",
        "sum_and_scatter",
    ]
