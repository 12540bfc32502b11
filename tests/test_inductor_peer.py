"""TorchInductor's reduction-kernel rules (panamera/bench/inductor_peer.py, PyTorch 2.7.1), one test per rule,
and the peer plan that peers.py builds from them."""

from panamera.bench.inductor_peer import (
    Hint,
    InductorConfig,
    is_persistent,
    looped_config,
    persistent_config,
    reduction_config,
    row_loops,
)
from panamera.bench.peers import Work, inductor
from panamera.model.gpu import H100


def work(pattern: str, M: int, N: int) -> Work:
    return Work(pattern, (), (), M, N, 2, 4 if pattern == "cross_entropy" else 2, 0)


def test_rule1_persistent_up_to_1024_inner_and_64_otherwise():
    assert is_persistent(1024, Hint.INNER) and not is_persistent(1025, Hint.INNER)
    assert is_persistent(64, Hint.OUTER) and not is_persistent(65, Hint.OUTER)
    assert reduction_config(32768, 1024, Hint.INNER).persistent
    assert not reduction_config(32768, 2048, Hint.INNER).persistent


def test_rule2_persistent_xblock_and_warps():
    assert persistent_config(32768, 256, Hint.INNER) == InductorConfig(True, 1, 256, 2)  # 256 / 128, at least 2
    assert persistent_config(32768, 1024, Hint.INNER) == InductorConfig(True, 1, 1024, 8)
    assert persistent_config(32768, 600, Hint.INNER).rblock == 1024  # the row padded to its power of 2
    short = persistent_config(4096, 64, Hint.OUTER)  # XBLOCK x RBLOCK <= 4096: 32 rows of 64
    assert (short.xblock, short.warps) == (32, 8)  # 2048 / 128 = 16 warps, halved maximum (register intensive): 8
    assert persistent_config(4, 64, Hint.OUTER).xblock == 1  # no more rows per program than there are rows


def test_rule3_looped_rblock_2048_and_up_to_16_warps():
    c = looped_config(65536, Hint.INNER)
    assert (c.xblock, c.rblock, c.warps, c.threads, c.per_thread()) == (1, 2048, 16, 512, 4)
    assert looped_config(1500, Hint.INNER).rblock == 2048  # the size hint's power of 2
    assert looped_config(100_000, Hint.OUTER) == InductorConfig(False, 64, 8, 4)


def test_rule4_loops_over_the_row():
    assert row_loops("softmax").loops == 2 and row_loops("softmax").exps(persistent=False) == 3  # online, then write
    assert row_loops("softmax").exps(persistent=True) == 1
    assert row_loops("cross_entropy").loops == 1  # online log-softmax, the target gathered in the epilogue
    assert row_loops("rms_norm").loops == row_loops("layer_norm").loops == 2
    p = inductor(work("cross_entropy", 32768, 65536), H100)
    assert "1 loop(s)," in p.description and "re-read" not in p.description
    assert p.launches[0].bytes_read == 32768 * 65536 * 2  # the logits once


def test_rule5_every_looped_step_is_a_dependent_round_trip():
    assert looped_config(16384, Hint.INNER).round_trips(16384, loops=2) == 16
    assert looped_config(16385, Hint.INNER).round_trips(16385) == 9
    assert persistent_config(32768, 512, Hint.INNER).round_trips(512, loops=2) == 1
    p = inductor(work("softmax", 32768, 16384), H100)
    assert p.launches[0].features["round_trips"] == 16 and "16 dependent steps" in p.description
    assert looped_config(8192, Hint.INNER).round_trips(8192, loops=2) == 2  # 4 steps: unrolled, loads together
    assert looped_config(65536, Hint.INNER).round_trips(65536, loops=2, unroll=8) == 8  # RMSNorm's unroll by 8
    assert inductor(work("cross_entropy", 32768, 16384), H100).launches[0].features["round_trips"] == 8
    assert "round_trips" not in inductor(work("softmax", 32768, 1024), H100).launches[0].features


def test_rule5_unrolled_steps_are_in_flight_together():
    assert looped_config(8192, Hint.INNER).steps_together(8192) == 4  # unrolled whole
    assert looped_config(65536, Hint.INNER).steps_together(65536, unroll=8) == 8  # RMSNorm's unroll
    assert looped_config(65536, Hint.INNER).steps_together(65536, unroll=1) == 1  # the online-softmax loop
    rms = inductor(work("rms_norm", 32768, 8192), H100).launches[0].features
    soft = inductor(work("softmax", 32768, 65536), H100).launches[0].features
    assert rms["bytes_in_flight_per_thread"] == 4 * 4 * 2 and soft["bytes_in_flight_per_thread"] == 4 * 2


def test_long_rows_are_one_looped_kernel_not_a_split_reduction():
    """ir.py `Reduction.num_splits` (2.7.1 l. 1209-1213: no split once the rows number 64 per SM) and choices.py
    `reduction_split_factor` (l. 138-142: none from 2 rows per SM): QuACK's long rows (16384 x 131072 and
    8192 x 262144) have thousands of rows, so each is one looped kernel, not a split reduction's two. A split takes
    few rows: 2 x SMs - 1 rows of 262144 elements are split."""
    from panamera.bench.peers import inductor_num_splits

    for M, N in ((16384, 131072), (8192, 262144)):
        assert inductor_num_splits(M, N, "INNER", H100) == 1
        for pattern in ("softmax", "cross_entropy", "rms_norm"):
            assert len(inductor(work(pattern, M, N), H100).launches) == 1
    assert inductor_num_splits(2 * H100.sms - 1, 262144, "INNER", H100) > 1
    assert inductor_num_splits(2 * H100.sms, 262144, "INNER", H100) == 1


def test_rule6_a_symbolic_row_is_looped_from_its_size_hint_and_not_unrolled():
    """A kernel recompiled with its row length symbolic (QuACK's sweeps, recompiled at 256): never persistent, the
    looped config of the size hint (R0_BLOCK 256, 2 warps, at any length), every step of every loop a round trip
    with one step's loads in flight; the static compile of the same row unrolls it (4 steps, one round trip)."""
    from panamera.bench.inductor_peer import QUACK_SWEEP_HINT, dynamic_config

    c = reduction_config(32768, 8192, Hint.INNER, size_hint=QUACK_SWEEP_HINT)
    assert c == dynamic_config(256, Hint.INNER) == InductorConfig(False, 1, 256, 2, symbolic=True)
    assert reduction_config(32768, 512, Hint.INNER, size_hint=256) == c  # not persistent, though <= 1024
    assert (c.round_trips(8192, loops=2, unroll=8), c.steps_together(8192, 8)) == (64, 1)
    static = reduction_config(32768, 8192, Hint.INNER)
    assert (static.round_trips(8192, loops=2, unroll=8), static.steps_together(8192, 8)) == (2, 4)
    assert dynamic_config(65536, Hint.INNER) == InductorConfig(False, 1, 2048, 16, symbolic=True)
    dyn = inductor(work("softmax", 32768, 8192), H100, size_hint=256)
    assert dyn.launches[0].features["round_trips"] == 2 * 8192 // 256
    assert dyn.estimate(H100, 0).total_us > inductor(work("softmax", 32768, 8192), H100).estimate(H100, 0).total_us


def test_rule7_few_long_rows_are_split_and_online_softmax_falls_back():
    """choices.py `reduction_split_factor` / ir.py `Reduction.num_splits`: fewer than 2 x SMs rows longer than 8192
    are split; lowering.py `prepare_softmax_online` then takes max and sum(exp) as two split reductions (two
    kernels each) and softmax's output is a pointwise kernel (codegen/simd.py `can_fuse`), cross-entropy's loss
    the final sum kernel's epilogue, a norm's normalize a pointwise kernel after its one split reduction. The norms
    suite's softmax [8x128256] and cross-entropy [64x256000] (bench/suites.py)."""
    import panamera as pn
    from panamera.bench.inductor_peer import split_rows
    from panamera.bench.peers import inductor_num_splits, plan_peers

    soft = plan_peers([pn.nn.softmax(pn.placeholder((8, 128256), "float32", name="x"))], H100)["inductor"]
    assert soft.facts["split"] == 16 == inductor_num_splits(8, 128256, "INNER", H100)  # 1M elements: 32 per thread
    names = [ln.name for ln in soft.launches]
    assert names == ["triton_red_split", "triton_red_final"] * 2 + ["triton_poi_fused"]
    assert [ln.features["blocks"] for ln in soft.launches[::2]] == [8 * 16, 8 * 16, -(-8 * 128256 // 1024)]
    x = 8 * 128256 * 4  # the row, read by both split reductions and the pointwise kernel: from L2 after the first
    assert [ln.features["l2_bytes"] >= x for ln in soft.launches[::2]] == [False, True, True]
    assert "online softmax off" in soft.description
    t = pn.placeholder((64,), "int64", name="t")
    ce = plan_peers([pn.nn.cross_entropy(pn.placeholder((64, 256000), "float32", name="x"), t, reduction="none")], H100)
    ce = ce["inductor"]
    assert ce.facts["split"] == 10  # split size 100: the divisor of 256000 nearest 112 (512 target blocks / 64 rows)
    assert [ln.name for ln in ce.launches] == ["triton_red_split", "triton_red_final"] * 2  # the loss fused
    assert ce.launches[-1].bytes_written == 64 * 4
    rms = inductor(work("rms_norm", 64, 256000), H100)
    assert [ln.name for ln in rms.launches] == ["triton_red_split", "triton_red_final", "triton_poi_fused"]
    assert split_rows("layer_norm").outputs == 3  # Welford's partials


def test_rule7_no_split_from_2_sms_rows_or_at_8192():
    """The two preconditions of rule 7, each failing alone: 2 x SMs rows, or a row of 8192, stay one kernel."""
    few, enough = 2 * H100.sms - 1, 2 * H100.sms
    assert len(inductor(work("softmax", few, 16384), H100).launches) == 5
    assert len(inductor(work("softmax", enough, 16384), H100).launches) == 1
    assert len(inductor(work("softmax", 8, 8192), H100).launches) == 1
    assert len(inductor(work("softmax", 8, 8193), H100).launches) == 5
