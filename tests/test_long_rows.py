"""The long-rows bench suite against QuACK's measured bandwidth (panamera/bench/long_rows.py):
the issue-25 target, read from the model (a modeled figure, not a timed test)."""

from __future__ import annotations

from panamera.bench.long_rows import quack_bytes, quack_measured, table, versus_quack


def test_every_quack_shape_models_at_least_095x_quacks_bandwidth():
    rows = versus_quack(measured_only=True)
    assert len(rows) == 11  # bf16 RMSNorm, softmax, cross-entropy x 3 shapes; fp32 softmax x 2
    for r in rows:
        assert r["vs_quack"] >= 0.95, r
        if r["pattern"] == "cross_entropy":  # online statistics: one pass over whole rows, nothing re-read
            assert "split=1" in r["mapping"] and "rows in" not in r["mapping"], r
        else:
            assert "cluster=" in r["mapping"] and "rows in" in r["mapping"], r  # on chip, across a cluster
    assert "| softmax 8192x262144 | bfloat16 |" in table(rows)


def test_quack_byte_counts_and_figures():
    assert quack_bytes("rms_norm", 2, 8, "bfloat16") == 2 * 2 * 8 * 2 + 2 * 8
    assert quack_bytes("cross_entropy", 2, 8, "float32") == (16 + 4) * 4
    assert quack_measured("softmax", (8192, 262144), "bfloat16") == 3012
    assert quack_measured("softmax", (1, 131072), "bfloat16") is None
