"""Schedules: the mapping is the complete decision, so a saved schedule replays byte for byte;
each validation rule refuses a schedule that does not fit; the database is consulted and a stale
entry is skipped, never turned into a wrong kernel."""

from __future__ import annotations

import dataclasses
import json
import warnings

import islpy as isl
import numpy as np
import pytest
from conftest import pn

from panamera.bench.schedules import entry_name
from panamera.bench.suites import SUITES
from panamera.errors import ScheduleError
from panamera.model.gpu import A100, H100
from panamera.schedule import database
from panamera.schedule.mapping import Decision, covers
from panamera.schedule.saved import Schedule

# the training suite's Liger-shape sweep adds nothing to replay beyond one workload per pattern and
# dtype (and its embedding row may be refused by name): a representative subset keeps the file short
TRAINING = ("layer_norm_bwd [4096x1024]", "rms_norm_bwd [4096x1024]", "softmax_bwd [4096x1024]",
            "cross_entropy_bwd [4096x4096]", "A2#8 as layer_norm_bwd [8192x768]", "batch_norm_bwd NCHW [32x64x56x56]")  # fmt: skip
WORKLOADS = [w for name, suite in SUITES.items() for w in suite() if name != "training" or w.name in TRAINING]


def _replayed(build, **kw):
    """Compile, save, reload, replay: (first, replayed)."""
    first = pn.compile(build(), target="emulator", use_database=False, **kw)
    s = Schedule.from_json(first.schedule.to_json())
    return first, pn.compile(build(), target="emulator", schedule=s, **kw)


def _same(a, b):
    assert a.source == b.source
    pa, pb = a.plan.as_dicts(), b.plan.as_dicts()
    ids = {}  # buffer keys name tensors by uid, which differ between two builds of one graph

    def canon(plan):
        text = json.dumps(plan, default=str)
        ids.clear()
        import re

        return re.sub(r"(in|out|ws|cnt):(\d+)", lambda m: f"{m.group(1)}:{ids.setdefault(m.group(2), len(ids))}", text)

    assert canon(pa) == canon(pb)


@pytest.mark.parametrize("w", WORKLOADS, ids=lambda w: f"{w.suite}-{w.name}-{w.dtype}")
def test_every_bench_workload_round_trips(w):
    """Planned afresh for H100, saved and replayed: the same kernel; and H100's shipped entry for it
    (panamera/schedules/) replays to that kernel too (A100's: `test_every_shipped_entry_replays`)."""
    first, replayed = _replayed(w.build, gpu=H100)
    _same(first, replayed)
    name = entry_name(w, H100)
    k = pn.compile(w.build(), target="emulator", gpu=H100)
    # a workload two suites share (norms' and long_rows' cross-entropy 1x131072) has one program:
    # either suite's entry answers it
    assert k.origin.startswith("from schedules/") and k.origin.split("--", 1)[1] == name.split("--", 1)[1], name
    _same(k, first)


def _x(shape=(6, 40), dtype="float32"):
    return pn.placeholder(shape, dtype, name="x")


NN_OPS = {
    "softmax": lambda: pn.nn.softmax(_x()),
    "softmax-multipass": lambda: pn.nn.softmax(_x(), method="multipass"),
    "log_softmax": lambda: pn.nn.log_softmax(_x()),
    "logsumexp": lambda: pn.nn.logsumexp(_x(), axis=1),
    "cross_entropy": lambda: pn.nn.cross_entropy(_x(), pn.placeholder((6,), "int32", name="t")),
    "layer_norm": lambda: pn.nn.layer_norm(_x(), pn.placeholder((40,), name="g"), pn.placeholder((40,), name="b")),
    "rms_norm": lambda: pn.nn.rms_norm(_x((6, 40), "float16")),
    "l2_normalize": lambda: pn.nn.l2_normalize(_x()),
    "batch_norm": lambda: list(pn.nn.batch_norm(_x((2, 3, 4, 5)))),
    "batch_norm-inference": lambda: pn.nn.batch_norm(
        _x((2, 3, 4, 5)),
        running_mean=pn.placeholder((3,), name="m"),
        running_var=pn.placeholder((3,), name="v"),
        training=False,
    ),  # fmt: skip
    "instance_norm": lambda: pn.nn.instance_norm(_x((2, 3, 4, 5))),
    "group_norm": lambda: pn.nn.group_norm(_x((2, 8, 4, 4)), 4),
    "var": lambda: pn.var(_x(), axis=0, ddof=1),
    "std": lambda: pn.std(_x()),
    "argmax": lambda: pn.argmax(_x(), axis=1),
    "split-sum": lambda: pn.sum(_x((4, 70000)), axis=1),
}


@pytest.mark.parametrize("op", NN_OPS)
@pytest.mark.parametrize("deterministic", [False, True])
def test_every_nn_op_round_trips(op, deterministic):
    _same(*_replayed(NN_OPS[op], deterministic=deterministic))


def test_a_forced_split_round_trips_and_replays_exactly(rng):
    def build():
        return pn.sum(pn.placeholder((8, 65536), "float32", name="x"), axis=1)

    first, again = _replayed(build, split=4)
    assert first.mappings[0].split == again.mappings[0].split == 4
    _same(first, again)
    x = rng.standard_normal((8, 65536)).astype(np.float32)
    np.testing.assert_allclose(again(x), x.astype(np.float64).sum(1), rtol=1e-4, atol=1e-3)


def test_the_formulation_is_part_of_the_schedule():
    k = pn.compile(pn.nn.softmax(_x()), target="emulator", use_database=False)
    s = k.schedule
    assert len(s.formulations) == 1 and s.formulations[0].startswith("softmax=")
    other = "multipass" if s.formulations[0].endswith("online") else "online"
    forced = pn.compile(pn.nn.softmax(_x(), method=other), target="emulator", use_database=False)
    replayed = pn.compile(
        pn.nn.softmax(_x()),
        target="emulator",
        schedule=dataclasses.replace(forced.schedule, formulations=(f"softmax={other}",)),
    )
    assert replayed.source == forced.source and "from the schedule" in replayed.explain()


# -- one negative test per validation rule ------------------------------------------------------
def _softmax():
    return pn.nn.softmax(pn.placeholder((4, 4096), "float32", name="x"))


def _sum_split():
    return pn.sum(pn.placeholder((4, 70000), "float32", name="x"), axis=1)


def _refused(build, edit, match, **kw):
    s = pn.compile(build(), target="emulator", use_database=False, **kw).schedule
    with pytest.raises(ScheduleError, match=match):
        pn.compile(build(), target="emulator", schedule=edit(s), **kw)


def _kernel(**change):
    def edit(s: Schedule) -> Schedule:
        return dataclasses.replace(s, kernels=(dataclasses.replace(s.kernels[0], **change), *s.kernels[1:]))

    return edit


def test_unreadable_or_old_schedules_are_refused():
    with pytest.raises(ScheduleError, match="not a readable schedule"):
        Schedule.from_json("[1, 2]")
    with pytest.raises(ScheduleError, match="format 'panamera-schedule/1'"):
        Schedule.from_json('{"format": "panamera-schedule/1", "gpu": "H100-SXM5", "stitched": [], "kernels": []}')
    with pytest.raises(ScheduleError, match="not a readable schedule"):
        text = pn.compile(_softmax(), target="emulator").schedule.to_json().replace('"store"', '"stored"')
        Schedule.from_json(text)


def test_rule_gpu():
    s = pn.compile(_softmax(), target="emulator").schedule
    with pytest.raises(ScheduleError, match="made for H100"):
        pn.compile(_softmax(), target="emulator", gpu=A100, schedule=s)


def test_rule_legal_stitching():
    s = Schedule("H100-SXM5", (("S0", "S7"),), (), formulations=("softmax=online",))
    with pytest.raises(ScheduleError, match="not a legal stitched group"):
        pn.compile(_softmax(), target="emulator", schedule=s)


def test_rule_kernel_count():
    _refused(_softmax, lambda s: dataclasses.replace(s, kernels=s.kernels + s.kernels), "kernel")
    _refused(_softmax, lambda s: dataclasses.replace(s, kernels=()), "needs more")


def test_rule_formulations():
    _refused(_softmax, lambda s: dataclasses.replace(s, formulations=()), "formulation")
    _refused(_softmax, lambda s: dataclasses.replace(s, formulations=("softmax=fast",)), "formulation")


def test_rule_same_statements_and_extents():
    s = pn.compile(_softmax(), target="emulator").schedule
    with pytest.raises(ScheduleError, match="subgraph changed"):
        pn.compile(pn.nn.softmax(pn.placeholder((8, 4096), name="x")), target="emulator", schedule=s)
    _refused(_sum_split, _kernel(statements=("S1",)), "subgraph changed")


def test_rule_launch_limits():
    _refused(_sum_split, _kernel(tx=96), "power-of-two")
    _refused(_sum_split, _kernel(tx=2048), "power-of-two")
    _refused(_sum_split, lambda s: _kernel(grid=(s.kernels[0].grid[0], 70000))(s), "CUDA's limits")
    _refused(_sum_split, lambda s: _kernel(split=s.kernels[0].split + 1)(s), "disagrees")
    # A split stitched group's blocks wait for each other: all of them must be co-resident.
    _refused(_softmax, lambda s: _kernel(split=4096, grid=(s.kernels[0].grid[0], 4096))(s), "co-resident")


def test_rule_vector_width():
    _refused(_sum_split, _kernel(vec=3), "does not divide")
    _refused(_sum_split, _kernel(vec=8), "16 bytes")
    # Aligned for 4 floats, not for 2 rows of 70001: a row's first element is not 4-aligned.
    odd = lambda: pn.sum(pn.placeholder((4, 70002), name="x"), axis=1)  # noqa: E731
    _refused(odd, _kernel(vec=2, access=((),)), "access kinds")


def test_rule_access_kinds():
    _refused(_sum_split, _kernel(access=(("gather",),)), "access kinds")


def test_rule_coverage():
    _refused(_sum_split, lambda s: _kernel(chunk=s.kernels[0].chunk // 2)(s), "do not cover")
    rows = lambda: pn.sum(pn.placeholder((64, 700), name="x"), axis=1)  # noqa: E731
    _refused(rows, lambda s: _kernel(grid=(s.kernels[0].grid[0] - 1, 1))(s), "do not cover")


def test_rule_merge_modes():
    _refused(_sum_split, _kernel(merges=("store",)), "merge modes")
    _refused(_sum_split, _kernel(merges=("atomic_ws",)), "merge modes", deterministic=True)
    var = lambda: pn.var(pn.placeholder((4, 70000), name="x"), axis=1)  # noqa: E731
    _refused(var, _kernel(merges=("atomic_ws",)), "merge modes")


def test_rule_stitching_levels():
    _refused(_softmax, _kernel(levels=(0, 0, 0)), "stitching levels")


def test_rule_unroll():
    _refused(_sum_split, _kernel(unroll=0), "at least 1")


@pytest.mark.parametrize(
    "build", [_sum_split, _softmax, lambda: pn.exp(_x((3, 1001))), lambda: pn.sum(_x((300, 64)), 0)]
)
def test_coverage_agrees_with_isl(build):
    """The arithmetic cover check against isl's image of the task mappings, for the model's
    decision and for every smaller chunk."""
    d = pn.compile(build(), target="emulator").schedule.kernels[0]
    for chunk in range(1, d.chunk + 1, max(1, d.chunk // 7)):
        e = dataclasses.replace(d, chunk=chunk)
        assert covers(e) == _isl_covers(e), chunk


def _isl_covers(d: Decision) -> bool:
    ctx = isl.Context()
    (e0, e1), (outer, inner), tasks = d.extents, d.loops, d.tasks
    serials = sorted({n for t in tasks.values() for n in t.serial_indices()})
    names = [outer, inner, *serials, "bx", "by", "tx", "ty"]
    v = isl.make_zero_and_vars(names, [], ctx=ctx)
    owned = isl.Set.universe(v[0].domain().space)
    for loop, t in tasks.items():
        owned = owned & v[loop].eq_set(t.affine(v)) & t.bounds(v)
    for name, bound in zip(names[-4:], (d.grid[0], d.grid[1], d.tx, d.ty)):
        owned = owned & v[name].ge_set(v[0]) & v[name].lt_set(v[0] + bound)
    dom = v[outer].ge_set(v[0]) & v[outer].lt_set(v[0] + e0) & v[inner].ge_set(v[0]) & v[inner].lt_set(v[0] + e1)
    drop = len(names) - 2
    return dom.project_out(isl.dim_type.set, 2, drop).is_subset(owned.project_out(isl.dim_type.set, 2, drop))


# -- the database -------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", [H100, A100], ids=["h100", "a100"])
def test_every_shipped_entry_replays(gpu):
    """Every workload replayed here has its entry on both GPUs; A100's entries replay to the fresh plan
    (H100's are replayed by `test_every_bench_workload_round_trips`, against the plan it saves)."""
    root = database.PACKAGE_DIR
    shipped = sorted(
        p.relative_to(root).as_posix() for p in root.glob(f"{entry_name(WORKLOADS[0], gpu).split('/')[0]}/*.json")
    )
    by_name = {entry_name(w, gpu): w for w in WORKLOADS}
    # every workload replayed here has its entry (the training rows not replayed here, for the
    # suite's time, and the symbolic workloads have theirs too: tests/test_dynamic_database.py)
    assert set(by_name) <= set(shipped), sorted(set(by_name) - set(shipped))
    for name in sorted(by_name) if gpu is not H100 else ():
        outs = by_name[name].build()
        k = pn.compile(outs, target="emulator", gpu=gpu)
        # a workload two suites share (norms' and long_rows' cross-entropy 1x131072) has one program:
        # either suite's entry answers it
        assert k.origin.startswith("from schedules/") and k.origin.split("--", 1)[1] == name.split("--", 1)[1], name
        _same(k, pn.compile(by_name[name].build(), target="emulator", gpu=gpu, use_database=False))


def test_explain_says_where_the_schedule_came_from():
    w = WORKLOADS[0]
    assert "schedule: from schedules/" in pn.compile(w.build(), target="emulator").explain()
    assert "schedule: chosen by the model" in pn.compile(w.build(), target="emulator", use_database=False).explain()
    assert (
        "chosen by the model" in pn.compile(w.build(), target="emulator", split=1).explain()
    )  # options the database does not answer


def test_a_stale_entry_is_skipped_with_a_notice(tmp_path, monkeypatch, rng):
    outs = _sum_split()
    good = dataclasses.replace(
        pn.compile(outs, target="emulator", use_database=False).schedule, subgraph=database.signature((outs,))
    )
    stale = dataclasses.replace(good, kernels=(dataclasses.replace(good.kernels[0], vec=3),))
    (tmp_path / "h100").mkdir()
    (tmp_path / "h100" / "sum.json").write_text(stale.to_json())
    (tmp_path / "h100" / "old.json").write_text('{"format": "panamera-schedule/1"}')
    monkeypatch.setenv(database.ENV, str(tmp_path))
    with pytest.warns(database.StaleScheduleWarning) as seen:
        k = pn.compile(_sum_split(), target="emulator")
    notices = [str(w.message) for w in seen]
    assert any("old.json" in n and "format" in n for n in notices)
    assert any("h100/sum.json: skipped" in n and "vector width 3" in n for n in notices)
    assert all("\n" not in n for n in notices)
    assert k.origin == "chosen by the model"
    x = rng.standard_normal((4, 70000)).astype(np.float32)
    np.testing.assert_allclose(k(x), x.astype(np.float64).sum(1), rtol=1e-4, atol=1e-3)
    # The good entry is replayed.
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "sum.json").write_text(good.to_json())
    monkeypatch.setenv(database.ENV, str(tmp_path / "fresh"))  # another directory: a fresh index
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", database.StaleScheduleWarning)
        assert pn.compile(_sum_split(), target="emulator").origin == "from schedules/sum.json"


def test_the_database_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(database.ENV, "off")
    assert pn.compile(WORKLOADS[0].build(), target="emulator").origin == "chosen by the model"
