"""Register spills (model/spill.py): the spill bytes ptxas reports go through L1, L2 and DRAM by
where the frame fits, and a Liger kernel whose row outgrows its registers pays them
(bench/row_peers.py `LIGER_SPILLS`, ptxas -v of Triton 3.3.1 for sm_90a)."""

from __future__ import annotations

import dataclasses

import pytest

from panamera.bench.peers import Work, kernel
from panamera.bench.row_peers import LIGER_SPILLS, liger
from panamera.model import H100
from panamera.model.estimate import estimate
from panamera.model.kernel_cost import kernel_time
from panamera.model.spill import spill_s

GB = 2**30


def test_no_spill_costs_nothing_and_leaves_the_features_alone():
    assert spill_s(H100, stores=0, loads=0, frame_per_sm=0) == 0.0
    plain = kernel("k", read=GB, written=GB, blocks=4096, threads=1024, in_flight=128)
    assert not any(k.startswith("spill") for k in plain.features)


def test_l1_holds_the_loads_of_a_frame_that_fits():
    """Stores write through to L2 whatever the frame; loads reach L2 only for the part of the SM's
    frame L1 does not hold."""
    fits = spill_s(H100, stores=GB, loads=GB, frame_per_sm=H100.l1_per_sm // 2)
    assert fits == pytest.approx(GB / H100.l2_bw)
    big_l2 = dataclasses.replace(H100, l2_size=10 * H100.l2_size)  # the chip's frame stays in L2
    twice = spill_s(big_l2, stores=GB, loads=GB, frame_per_sm=2 * H100.l1_per_sm)
    assert twice == pytest.approx(1.5 * GB / H100.l2_bw)


def test_the_frame_beyond_l2_goes_to_dram():
    """A chip-wide frame twice the L2: half of the L2 traffic also streams from and to DRAM."""
    frame = 2 * H100.l2_size / H100.sms
    in_l2 = spill_s(dataclasses.replace(H100, l2_size=10 * H100.l2_size), stores=GB, loads=GB, frame_per_sm=frame)
    beyond = spill_s(H100, stores=GB, loads=GB, frame_per_sm=frame)
    held = H100.l1_per_sm / frame
    l2 = GB + GB * (1 - held)
    assert in_l2 == pytest.approx(l2 / H100.l2_bw)
    assert beyond - in_l2 == pytest.approx(0.5 * (GB / H100.write_bw + GB * (1 - held) / H100.achievable_bw))


def test_registers_bound_the_blocks_whose_frames_share_an_sm():
    """1024 threads of 64 registers: one block per SM holds a frame, not the two its threads allow."""
    args = dict(dram_bytes=GB, blocks=4096, threads=1024, bytes_in_flight_per_thread=128, spill_stores=GB,
                spill_loads=GB, spill_frame=336)  # fmt: skip
    one = kernel_time(H100, **args, registers=64).spill_s
    two = kernel_time(H100, **args, registers=32).spill_s
    assert one < two
    assert one == pytest.approx(spill_s(H100, stores=GB, loads=GB, frame_per_sm=336 * 1024))


@pytest.mark.parametrize(("pattern", "N", "elem"), sorted(LIGER_SPILLS))
def test_liger_pays_its_spills(pattern, N, elem):
    """Each configuration ptxas spilled costs more than the same plan without the spill."""
    w = Work(pattern, (), (), 4096, N, elem, elem, 0)
    ln = liger(w, H100).launches[0]
    per_thread = LIGER_SPILLS[(pattern, N, elem)].stores
    assert ln.features["spill_stores"] == per_thread * ln.features["blocks"] * ln.features["threads"]
    bare = dataclasses.replace(ln, features={k: v for k, v in ln.features.items() if not k.startswith("spill")})
    traffic = (ln.bytes_read, ln.bytes_written)
    assert estimate([ln], H100, traffic).total_us > estimate([bare], H100, traffic).total_us


def test_the_estimate_shows_the_spill_apart():
    """A plan's estimate carries the spill's time as its own part, inside the total."""
    w = Work("softmax", (), (), 32768, 65536, 2, 2, 0)
    ln = liger(w, H100).launches[0]
    e = estimate([ln], H100, (ln.bytes_read, ln.bytes_written))
    assert e.spill_us > 0
    parts = e.launch_us + max(e.dram_us, e.l2_us, e.issue_us) + e.tail_us + e.atomic_us + e.sync_us + e.spill_us
    assert e.total_us == pytest.approx(parts)
