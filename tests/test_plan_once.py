"""Each distinct program is planned once per optimize (subgraph/plans.py): the router's routes
and the report's per-node baseline share one memo keyed by structure, not by value names or
weights. Calls are counted, not timed."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from panamera.subgraph import optimize
from panamera.subgraph.report import build_report

F = TensorProto.FLOAT


def _convs() -> bytes:
    """x -> Conv(w1) -> Conv(w2) -> Conv(w3): the first two the same program (3x3, 4 -> 4
    channels, other weights), the third another (1x1, 4 -> 2)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
        for n, s in (("w1", (4, 4, 3, 3)), ("w2", (4, 4, 3, 3)), ("w3", (2, 4, 1, 1)))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a", "w2"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b", "w3"], ["y"]),
    ]
    v = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "g", [v("x", F, [1, 4, 5, 5])], [v("y", F, [1, 2, 5, 5])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()


def test_router_and_baseline_plan_each_distinct_conv_once():
    opt = optimize(_convs(), target="emulator", routing="panamera")
    plans = opt.partition.plans
    first, second, third = (r for _, r in opt.partition.routes)
    assert (plans.asked, plans.planned) == (3, 2)  # three routes, two distinct programs
    assert first.panamera_us == second.panamera_us != third.panamera_us
    build_report(opt)  # the per-node baseline plans each Conv alone: the router's figures
    assert (plans.asked, plans.planned) == (6, 2)
    assert all(r.ok for r in opt.verify())


def test_planner_maps_each_statement_alone_once(monkeypatch):
    """A row sum and its scaling are both a stitched candidate and an epilogue candidate: the
    planner weighs each against the same statements mapped alone, and maps each alone once."""
    import panamera as pn
    from panamera.compiler import lower
    from panamera.model.gpu import H100
    from panamera.schedule import planner

    x = pn.placeholder((64, 256), name="x")
    y = pn.sum(x, axis=1, keepdims=True) * 2.0
    prog = lower(y, stop_after="program", target="emulator").program
    alone = []
    real = planner.map_group

    def counted(group, *args, **kwargs):
        if len(group.statements) == 1 and not group.stitched and not group.epilogue:
            alone.append((group.statements[0].name, kwargs.get("deterministic", False)))
        return real(group, *args, **kwargs)

    monkeypatch.setattr(planner, "map_group", counted)
    _, considered = planner.plan_groups(prog, H100)
    assert [type(c).__name__ for c in considered] == ["Considered", "EpilogueConsidered"]
    assert sorted(alone) == [("S0", False), ("S1", False)]  # each once, not once per candidate
