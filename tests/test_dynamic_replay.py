"""A replayed symbolic class plan is held to schedule/replay.py's rules by replay's own code
(panamera/dynamic.py `check_plan` on each kernel's static view at the class's sample sizes,
schedule/param_schedule.py `check_bound`): one negative test per rule the class plan shares.
Nothing is built or launched: the plans are refused when the schedule is given."""

import dataclasses

import pytest

import panamera as pn
from panamera.schedule.decision import MergeMode


def _refused(deterministic: bool, match: str, **change):
    y = pn.sum(pn.placeholder(("B", 64), name="x"), axis=1)
    k = pn.compile(y, target="emulator", cache=False, use_database=False, deterministic=deterministic)
    plan = k.plan(k.size_class({"B": 5}))
    bad = dataclasses.replace(plan, decisions=(dataclasses.replace(plan.decisions[0], **change),))
    with pytest.raises(pn.ScheduleError, match=match):
        pn.compile(y, target="emulator", cache=False, deterministic=deterministic,
                   schedule=dataclasses.replace(k.schedule, classes=(bad,)))  # fmt: skip


@pytest.mark.parametrize(
    "deterministic, change, match",
    [
        (False, {"tx": 48}, r"class .* at B=\d+: kernel S0: block \(48, 1\) is not a power-of-two block"),  # 2
        (False, {"tx": 64, "ty": 32}, r"kernel S0: block \(64, 32\) is not a power-of-two block of at most 1024"),
        (False, {"split": 70000, "merge": MergeMode.ATOMIC_WS}, r"grid .* exceeds CUDA's limits"),  # 2
        (False, {"vec": 8}, r"kernel S0: vector width 8 loads more than 16 bytes"),  # 3
        (False, {"split": 2, "merge": MergeMode.STORE}, r"merge modes \['store'\] are not legal"),  # 5
        (True, {"split": 2, "merge": MergeMode.ATOMIC_WS}, r"merge modes \['atomic_ws'\] are not legal"),  # 5
        (False, {"unroll": 33}, r"kernel S0: unroll 33 must be 1 to 32"),  # 7
        (False, {"atomic_vec": 4}, r"kernel S0: vector atomics \[4\] are not legal"),  # 8
    ],
)
def test_a_replayed_class_plan_breaking_a_replay_rule_is_refused(deterministic, change, match):
    _refused(deterministic, match, **change)
