"""Output a person can read (issue 19 item 7): a short repr, a short default in help(pn.compile),
explain() in named sections, the bench's self-describing JSON and charts at README width with
linear axes and one colour per plan."""

from __future__ import annotations

import dataclasses
import pydoc

import pytest

import panamera as pn
from panamera.bench import plots
from panamera.errors import OptionError
from panamera.explain import DEFAULT, Section
from panamera.model.gpu import GPUS, H100


@pytest.fixture(scope="module")
def fused():
    """A softmax and a row sum of one input: two outputs, a multi-statement plan."""
    x = pn.placeholder((64, 256), "float32", name="x")
    return pn.compile([pn.nn.softmax(x), pn.sum(x, axis=1)], target="emulator")


def test_repr_is_a_few_lines_with_inputs_outputs_kernels_and_target(fused):
    text = repr(fused)
    assert len(text) < 400 and len(text.splitlines()) <= 3, text
    assert "x: float32[64, 256]" in text and "float32[64]" in text
    assert "target emulator" in text and H100.name in text and "kernel" in text
    assert len(fused.source) > 10 * len(text)  # what it used to print is not there


def test_repr_of_many_inputs_is_cut():
    xs = [pn.placeholder((8,), "float32", name=f"in{k}") for k in range(9)]
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    text = repr(pn.compile(pn.sum(total), target="emulator"))
    assert "(9 in all)" in text and "in8" not in text and len(text) < 400


def test_gpu_spec_repr_is_one_short_line_and_help_shows_it():
    for spec in GPUS.values():
        r = repr(spec)
        assert r.startswith(f"<GPUSpec {spec.name}:") and "\n" not in r and len(r) < 100
    doc = pydoc.render_doc(pn.compile, renderer=pydoc.plaintext)
    assert "sources" not in doc and len(doc) < 4000  # gpu= defaults to None (the detected GPU)


def test_explain_sections(fused):
    full = fused.explain()
    parts = {s: fused.explain(s) for s in Section}
    assert full == "\n".join(parts[s] for s in DEFAULT)  # the default: every section but schedule and source
    assert parts[Section.PLAN].startswith("Panamera plan:") and "schedule:" in parts[Section.PLAN]
    assert all(ln.startswith("  launch ") for ln in parts[Section.LAUNCHES].splitlines())
    assert "model (H100-SXM5, modeled)" in parts[Section.MODEL] and "limit" in parts[Section.MODEL]
    assert parts[Section.SOURCE] == fused.source.rstrip("\n")
    assert '"gpu"' in parts[Section.SCHEDULE]  # the replayable schedule as JSON
    assert "dependences (isl flow)" in parts[Section.DEPENDENCES]
    assert fused.explain(["launches", "plan"]) == parts[Section.LAUNCHES] + "\n" + parts[Section.PLAN]
    assert fused.explain("all").count("__global__") == fused.source.count("__global__")
    assert len(parts[Section.PLAN].splitlines()) == 3 and len(full.splitlines()) > 5


def test_explain_unknown_section_names_the_sections(fused):
    with pytest.raises(OptionError, match=r"unknown section 'plans'.*'plan', 'mapping'"):
        fused.explain("plans")


# -- the bench's charts, checked from their data ---------------------------------------------------
def _records():
    """Two suites, peers with a 1000x outlier and a loss, as run_bench writes them."""
    out = []
    for suite, rows in (("one", {"w1": 1.5, "w2": 0.8}), ("two", {"w3": 2.0})):
        for w, best in rows.items():
            pan = {"suite": suite, "workload": w, "dtype": "float32", "plan": "panamera", "gpu": "H100-SXM5",
                   "modeled_us": 10.0, "ratio_to_limit": 1.05, "best_peer": "cub", "speedup_over_best_peer": best}  # fmt: skip
            out.append(pan)
            for plan, sp in (("cub", best), ("tvm-default", 1000.0), ("pytorch-eager", best * 1.3)):
                out.append({**pan, "plan": plan, "modeled_us": 10.0 * sp, "ratio_to_limit": 1.05 * sp})
                del out[-1]["best_peer"], out[-1]["speedup_over_best_peer"]
    return out


def test_charts_are_readme_width_linear_and_clip_outliers():
    cs = plots.charts(_records())
    assert [c.name for c in cs] == ["headline", "speedup_one", "limit_one", "speedup_two", "limit_two"]
    for c in cs:
        assert 900 <= c.width_px <= 1000 and c.scale == "linear" and c.height_px < 2000
        assert c.lo <= 1.0 < c.hi <= plots.MAX_CAP and 1.0 in c.lines
    sp = cs[1]
    assert ("w1 float32", "tvm-default", 1000.0) in sp.clipped  # beyond the axis: written out, not a log axis
    assert sp.bars.values == (1.5, 0.8) and sp.notes[1] == "0.80x over cub"  # the loss is shown as one
    assert all(v <= sp.hi for s in sp.series if s.name != "tvm-default" for v in s.values)


def test_one_colour_per_plan_in_every_chart():
    cs = plots.charts(_records())
    seen: dict[str, set] = {}
    for c in cs:
        for s in c.series:
            seen.setdefault(s.name, set()).add(s.colour)
    assert all(len(v) == 1 for v in seen.values()) and len(seen["cub"]) == 1
    assert len({plots.colour(p) for p in plots.PALETTE}) == len(plots.PALETTE)  # no two plans share one
    assert plots.colour("a-peer-added-later") == plots.colour("a-peer-added-later")


def test_headline_is_the_geomean_over_the_best_peer_per_suite():
    head = plots.charts(_records())[0]
    assert head.rows == ("one", "two")
    assert head.bars.values == pytest.approx(((1.5 * 0.8) ** 0.5, 2.0))
    assert [s.values for s in head.series] == [(0.8, 2.0), (1.5, 2.0)]  # worst and best workload
    assert head.notes[0].startswith("1.10x geomean, 1/2 wins")


def test_render_draws_the_size_the_data_says(tmp_path):
    pytest.importorskip("matplotlib")
    c = plots.charts(_records())[1]
    path = plots.render(c, str(tmp_path))
    data = open(path, "rb").read(24)
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (c.width_px, c.height_px)


def test_gpu_fields_are_in_the_bench_meta():
    from panamera.bench.runner import run_meta

    meta = run_meta(H100, "panamera bench --suite tiny", measured=False)
    assert set(meta["gpu"]) == {f.name for f in dataclasses.fields(H100)} - {"sources"}
    assert meta["command"] == "panamera bench --suite tiny" and meta["panamera"] == pn.__version__


def test_artifacts_and_optimized_model_reprs_are_one_line():
    from onnx import TensorProto, helper

    from panamera.compiler import lower
    from panamera.subgraph import optimize

    a = lower(pn.sum(pn.placeholder((4, 100), name="x"), axis=1), stop_after="mappings", target="emulator")
    assert repr(a) == "<Artifacts of 1 output(s): stages formulations, program, groups, mappings done>"
    v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    g = helper.make_graph([helper.make_node("Exp", ["x"], ["y"])], "g", [v("x", [4, 8])], [v("y", [4, 8])])
    opt = optimize(helper.make_model(g).SerializeToString(), target="emulator")
    assert repr(opt).startswith("<OptimizedModel ") and "1 Panamera subgraph(s)" in repr(opt) and len(repr(opt)) < 200
