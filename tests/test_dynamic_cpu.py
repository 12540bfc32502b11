"""Symbolic programs on the CPU target (issues 22 and 24): C++ kernels whose extents are arguments,
the split chosen per size class by the CPU model, one g++ library per distinct class source;
torch.compile's dynamic graphs on CPU tensors and ONNX dim_params on the CPU.

Tolerances: `conftest.tolerance` of the dtype and the reduced extent (4x where a program chains a
reduction into a second one or an exp, as tests/test_dynamic_shapes.py), against numpy in float64.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import tolerance
from test_dynamic_shapes import PROGRAMS

import panamera as pn
from panamera.dynamic_cpu import DynamicCpuCompiled
from panamera.errors import EmptyReductionError, OptionError
from panamera.runtime import cpu as cpu_backend


def _arrays(shapes, sizes, rng):
    return [
        (rng.random([z if isinstance(z, int) else sizes[z] for z in s]) * 2 - 0.7).astype(np.float32) for s in shapes
    ]


def _reference(ref, arrays):
    with warnings.catch_warnings():  # numpy's mean of nothing warns (and is NaN, as ours)
        warnings.simplefilter("ignore", RuntimeWarning)
        return ref(*[a.astype(np.float64) for a in arrays])


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_every_symbolic_program_runs_on_the_cpu(name, rng):
    build, ref, shapes, reduced, sizes_list = PROGRAMS[name]
    holders = [pn.placeholder(s, name=f"p{k}") for k, s in enumerate(shapes)]
    k = pn.compile(build(*holders), target="cpu", cache=False)
    assert isinstance(k, DynamicCpuCompiled)
    for sizes in sizes_list:
        arrays = _arrays(shapes, sizes, rng)
        want = _reference(ref, arrays)
        tol = 4 * tolerance("float32", reduced(sizes))
        got = k(*arrays)
        assert got.shape == want.shape, sizes
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"{name} at {sizes}")
    classes = {k.size_class(s) for s in sizes_list}
    assert k.stats()["classes_compiled"] == len(classes) and k.stats()["calls"] == len(sizes_list)
    assert all(c.describe() in k.explain() for c in classes)


# row sum, column sum, row var and layer_norm of one (B, N) input: every form at once
def _forms(x):
    return [pn.sum(x, axis=1), pn.sum(x, axis=0), pn.var(x, axis=1), pn.nn.layer_norm(x)]


def _forms_ref(a):
    ln = (a - a.mean(1, keepdims=True)) / np.sqrt(a.var(1, keepdims=True) + 1e-5)
    return [a.sum(1), a.sum(0), a.var(1), ln]


@pytest.mark.parametrize("b, n", [(0, 5), (1, 1), (3, 0), (1, 37), (17, 31), (2, 1031)])
def test_sizes_zero_one_prime_and_not_a_multiple_of_the_simd_width(b, n, rng):
    x = pn.placeholder(("B", "N"), name="x")
    k = pn.compile(_forms(x), target="cpu")
    a = (rng.random((b, n)) * 2 - 0.7).astype(np.float32)
    got, want = k(a), _reference(lambda v: _forms_ref(v), [a])
    for g, w, m in zip(got, want, (n, b, n, n)):
        assert g.shape == w.shape
        tol = 4 * tolerance("float32", m)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"({b}, {n})")


SPLITS = {
    "row sum": (lambda x: pn.sum(x, axis=1), lambda a: a.sum(1)),
    "everything's max": (lambda x: pn.max(x), lambda a: a.max()),
    "column sum": (lambda x: pn.sum(x, axis=0), lambda a: a.sum(0)),
    "row var (Welford)": (lambda x: pn.var(x, axis=1), lambda a: a.var(1)),
    "column var (Welford)": (lambda x: pn.var(x, axis=0), lambda a: a.var(0)),
    "row rms (epilogue after the merge)": (
        lambda x: pn.sqrt(pn.mean(x * x, axis=1)),
        lambda a: np.sqrt((a * a).mean(1)),
    ),
}


@pytest.mark.parametrize("merge", [None, "atomic"], ids=["rule", "atomic"])
@pytest.mark.parametrize("name", list(SPLITS))
def test_split_reductions_in_every_merge_mode(name, merge, rng, monkeypatch):
    """A split of 4 merged as cpu_mapper.merge_mode says under `deterministic` (LAST: the same bits
    on 1 and 2 threads), or ATOMIC forced through it (Welford's struct cannot be compare-and-swapped)."""
    from panamera.schedule import cpu_param_mapping
    from panamera.schedule.cpu_mapper import CpuMerge

    build, ref = SPLITS[name]
    if merge == "atomic" and "Welford" in name:
        pytest.skip("a struct accumulator has no compare-and-swap merge")
    if merge is not None:
        monkeypatch.setattr(
            cpu_param_mapping, "merge_mode", lambda g, s, d, price: CpuMerge(merge) if s > 1 else CpuMerge.NONE
        )
    k = DynamicCpuCompiled((build(pn.placeholder(("B", "N"), name="x")),), True, merge is None, None, split=4)
    for shape in [(1, 1), (3, 37), (2, 4099)]:  # chunks past N are empty; N not a multiple of the lanes
        a = (rng.random(shape) * 2 - 0.7).astype(np.float32)
        (d,) = k.plan(k.size_class({"B": shape[0], "N": shape[1]})).decisions
        assert d.split == 4 and str(d.merge) == (merge or "last")
        want = ref(a.astype(np.float64))
        tol = 4 * tolerance("float32", max(shape))
        one, two = k(a, threads=1), k(a, threads=2)
        np.testing.assert_allclose(one, want, rtol=tol, atol=tol, err_msg=f"{name} at {shape}")
        if str(d.merge) == "last":  # the partition is the decision's: same bits on any threads
            np.testing.assert_array_equal(one, two)
        else:
            np.testing.assert_allclose(two, want, rtol=tol, atol=tol)


def test_one_library_per_class_source_and_none_per_size(monkeypatch, rng):
    builds = []
    real = cpu_backend.build
    monkeypatch.setattr(cpu_backend, "build", lambda source: builds.append(source) or real(source))
    x = pn.placeholder(("B", 96), name="x")
    k = pn.compile(pn.nn.softmax(x * 0.5 + 1.0), target="cpu", cache=False)
    for b in (16, 17, 31, 24, 5, 6, 7):  # two classes: [16, 32) and [4, 8)
        a = rng.random((b, 96)).astype(np.float32)
        k(a)
    s = k.stats()
    assert (s["classes_planned"], s["classes_compiled"], s["calls"]) == (2, 2, 7), s
    # one build per distinct class source, none per size: the two classes plan the same kernel unless the
    # probe's figures part them (a short class on one thread where a wake-up measured dear under load)
    assert s["sources_built"] == len(builds) == len(set(builds)) <= 2, s
    assert "class B in [16, 32)" in k.explain() and "class B in [4, 8)" in k.explain()
    assert "split=1" in k.explain() and "machine:" in k.explain()


def test_the_split_is_decided_per_class_by_the_cpu_model():
    from panamera.model.cpu import CpuModel
    from panamera.poly.params import build
    from panamera.schedule.cpu_param_mapping import map_cpu_group
    from panamera.schedule.size_class import SizeClass

    p = build((pn.sum(pn.placeholder(("B", "N"), name="x"), axis=1),))
    m = CpuModel.nominal(8, 32)

    def split(b: int, n: int) -> int:
        return map_cpu_group(p.statements, "single", SizeClass.of({"B": b, "N": n}, frozenset(), 1), m, False).split

    assert split(1, 1 << 20) > 1  # one row: split across the cores
    assert split(1024, 1 << 12) == 1  # rows enough for every core
    assert split(1, 100) == 1  # too short to pay for a fork
    col = build((pn.sum(pn.placeholder(("N", 768), name="y"), axis=0),))  # 768 outputs: one task's block
    assert map_cpu_group(col.statements, "single", SizeClass.of({"N": 1024}, frozenset(), 1), m, False).split > 1


def test_options_and_errors_name_the_cpu_target(rng):
    x = pn.placeholder(("B", 8), name="x")
    k = pn.compile(pn.max(x, axis=1), target="cpu")
    with pytest.raises(OptionError, match="threads must be a positive int"):
        k(np.ones((2, 8), np.float32), threads=0)
    with pytest.raises(OptionError, match="no replayable schedule"):
        k.schedule  # noqa: B018
    with pytest.raises(EmptyReductionError, match="max"):
        pn.compile(pn.max(pn.placeholder((3, "N"), name="y"), axis=1), target="cpu")(np.ones((3, 0), np.float32))
    e = pn.compile(pn.sum(x, axis=1), target="emulator")
    with pytest.raises(OptionError, match="threads="):
        e(np.ones((2, 8), np.float32), threads=1)
    assert k.specialize(B=3)(np.ones((3, 8), np.float32)).tolist() == [1.0] * 3


@pytest.mark.auto_default
def test_auto_without_a_gpu_is_the_cpu_target():
    from panamera.runtime import cuda

    if cuda.available():
        pytest.skip("a GPU: auto is cuda")
    k = pn.compile(pn.sum(pn.placeholder(("B", 8), name="x"), axis=1))
    assert isinstance(k, DynamicCpuCompiled) and k.target == "cpu"
    assert k(np.ones((3, 8), np.float32)).tolist() == [8.0] * 3


@pytest.mark.auto_default
def test_torch_compile_dynamic_on_cpu_tensors_compiles_one_cpu_program():
    torch = pytest.importorskip("torch")
    from test_torch_dynamic import Block, check_close

    import panamera.torch_backend as tb

    torch._dynamo.reset()
    tb.reset_stats()
    try:
        torch.manual_seed(0)
        m = Block().eval()
        f = torch.compile(m, backend="panamera")  # CPU tensors: the host target, cpu without a GPU
        with torch.no_grad():
            for batch in (8, 16, 24, 40):
                x = torch.randn(batch, 5, 16)
                check_close(m, x, f(x), 32)
        s = tb.stats()
        # batch 8: dynamo's static graph; then its dynamic graph: one symbolic CPU program for 16, 24 and 40
        assert (s.graphs, s.symbolic_programs, s.specializations) == (2, 1, []), s.describe()
        (sub,) = s.reports[1].subgraphs
        assert sub.mode == "symbolic" and isinstance(sub.program, DynamicCpuCompiled), s.describe()
        assert sub.program.stats()["calls"] == 3 and 1 <= s.size_classes <= 2
    finally:
        torch._dynamo.reset()


def test_an_onnx_model_with_dim_params_runs_at_two_sizes_on_the_cpu():
    ort = pytest.importorskip("onnxruntime")
    from test_onnx_dynamic import feeds, model

    from panamera.subgraph.dynamic_model import optimize_dynamic

    data, rng = model(False), np.random.default_rng(1)
    dm = optimize_dynamic(data, target="cpu", hints={"seq": 4})
    session = ort.InferenceSession(data)
    for batch, seq in ((2, 3), (5, 7)):
        f = feeds(rng, batch, seq, False)
        got, ref = dm.run(f)["y"], session.run(None, f)[0]
        tol = tolerance("float32", 16) * 4  # as tests/test_onnx_dynamic.py says why
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    s = dm.stats()
    assert (s["symbolic_subgraphs"], s["per_shape_compiles"], s["sizes"]) == (1, 0, 2), dm.describe()
    assert all(isinstance(u.compiled, DynamicCpuCompiled) for u in dm.units if u.compiled), dm.describe()


def test_formulations_are_ranked_by_the_cpu_model():
    x = pn.placeholder(("B", 1024), name="x")
    k = pn.compile(pn.nn.softmax(x), target="cpu", cache=False)
    assert k.program.formulations == ("softmax=multipass",) and "softmax=multipass" in k.explain()
    # the GPU path keeps the fewest reductions (one pass: the online form)
    assert pn.compile(pn.nn.softmax(x), target="emulator", cache=False).program.formulations == ("softmax=online",)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "int8", "bool"])
def test_every_dtype_on_the_cpu(dtype, rng):
    from conftest import random_array

    x = pn.placeholder(("B", "N"), dtype, name="x")
    logical = dtype == "bool"
    outs = [pn.all(x, axis=1), pn.any(x, axis=0)] if logical else [pn.sum(x, axis=1), pn.max(x, axis=0)]
    k = pn.compile(outs, target="cpu", cache=False)
    a = random_array((3, 37), dtype, rng)
    wide = a if logical or dtype == "int8" else a.astype(np.float64)
    refs = [wide.all(1), wide.any(0)] if logical else [wide.sum(1), wide.max(0)]
    for got, want, n in zip(k(a), refs, (37, 3)):
        tol = tolerance(dtype, n) * max(1.0, float(np.max(np.abs(want))))  # the result rounded to the dtype
        if tol:
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(got, want)


@pytest.mark.auto_default
def test_a_symbolic_fused_attention_is_refused_by_the_cpu_and_auto_runs_it_on_the_emulator():
    from panamera.dynamic_attention import DynamicAttention
    from panamera.errors import TargetRefused
    from panamera.runtime import cuda

    if cuda.available():
        pytest.skip("a GPU: auto is cuda")
    q = pn.placeholder(("B", 2, 1, 8), name="q")
    kv = [pn.placeholder(("B", 2, "T", 8), name=n) for n in ("k", "v")]
    with pytest.raises(TargetRefused, match="fused attention has no CPU kernels"):
        pn.compile(pn.nn.attention(q, *kv), target="cpu", cache=False)
    with pytest.warns(pn.EmulatorWarning, match="refuses this symbolic program"):
        k = pn.compile(pn.nn.attention(q, *kv), cache=False)
    assert isinstance(k, DynamicAttention) and k.target == "emulator"


def test_a_split_stitched_or_map_kernel_is_a_schedule_error():
    import dataclasses

    from panamera.codegen.cpu_param_kernel import render_cpu_group
    from panamera.errors import ScheduleError
    from panamera.poly.params import build
    from panamera.schedule.cpu_param_mapping import CpuParamDecision

    p = build((pn.nn.layer_norm(pn.placeholder(("B", 64), name="x")),))
    d = CpuParamDecision("S0+S1+S2", p.statements[0].form, "stitched", 1, 1, 16)
    members = tuple(p.statements[k] for k in p.groups[0])
    assert "pn_c0" in render_cpu_group(members, d, p, "pn_c0").source
    with pytest.raises(ScheduleError, match="cannot be split"):
        render_cpu_group(members, dataclasses.replace(d, split=2), p, "pn_c0")


def test_a_one_thread_class_decision_opens_no_parallel_region(monkeypatch, rng):
    """codegen/cpu_region.py's `one_thread` on the symbolic path: every kernel form (MAP, rows,
    split rows with each merge, COLUMN, stitched) under a one-thread decision prints no `omp
    parallel` (no team, no closing futex wake) and computes what the parallel form computes."""
    import dataclasses

    from panamera import dynamic_cpu

    real = dynamic_cpu.map_cpu_group
    monkeypatch.setattr(dynamic_cpu, "map_cpu_group", lambda *a, **kw: dataclasses.replace(real(*a, **kw), threads=1))
    x = pn.placeholder(("B", "N"), name="x")
    for split, deterministic in ((None, False), (4, False), (4, True)):
        k = DynamicCpuCompiled((*_forms(x), pn.exp(x)), False, deterministic, None, split=split)
        for b, n in ((1, 1), (3, 37), (17, 1031)):
            a = (rng.random((b, n)) * 2 - 0.7).astype(np.float32)
            got, want = k(a, threads=2), _reference(lambda v: [*_forms_ref(v), np.exp(v)], [a])
            for g, w, m in zip(got, want, (n, b, n, n, 1)):
                tol = 4 * tolerance("float32", m)
                np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"split={split} ({b}, {n})")
        for ck in k._classes.values():
            assert all(d.threads == 1 for d in ck.plan.decisions)
            assert "omp parallel" not in ck.source and "if (pn_nt > 1) pn_nt = 1;" in ck.source
            assert ck.plan.decisions[0].describe().count("threads=1") == 1


def test_a_decision_on_more_threads_keeps_its_regions_and_clamps_the_call():
    import dataclasses

    from panamera.codegen.cpu_param_kernel import render_cpu_group
    from panamera.poly.params import build
    from panamera.schedule.cpu_param_mapping import CpuParamDecision

    p = build((pn.sum(pn.placeholder(("B", 64), name="x"), axis=1),))
    d = CpuParamDecision("S0", p.statements[0].form, "single", 1, 1, 8, threads=2)
    src = render_cpu_group(p.statements, d, p, "pn_c0").source
    assert "#pragma omp parallel for schedule(static) num_threads(pn_nt)" in src and "if (pn_nt > 2) pn_nt = 2;" in src
    assert "omp parallel" not in render_cpu_group(p.statements, dataclasses.replace(d, threads=1), p, "pn_c0").source


def test_the_class_decision_has_the_static_decisions_lanes_and_at_most_the_cores():
    """What the static mapper decides from the machine (schedule/cpu_mapper.py: the SIMD width of
    its flags, AVX2 32 bytes, AVX-512 64) is what a class decision uses: the same lanes per form
    and dtype, the threads within the cores."""
    from panamera.compiler import lower
    from panamera.cpu_target import cpu_model
    from panamera.poly.params import build
    from panamera.schedule.cpu_mapper import CpuMachine, map_cpu
    from panamera.schedule.cpu_param_mapping import map_cpu_group
    from panamera.schedule.size_class import SizeClass

    machine = CpuMachine.detect()
    model = cpu_model(machine)
    for dtype in ("float32", "float64", "bfloat16"):
        for f in (lambda v: pn.sum(v, axis=1), lambda v: pn.sum(v, axis=0), lambda v: pn.exp(v)):
            static = lower(f(pn.placeholder((64, 768), dtype)), stop_after="groups", target="emulator").groups[0]
            p = build((f(pn.placeholder(("B", 768), dtype, name="x")),))
            d = map_cpu_group(p.statements, p.kinds[0], SizeClass.of({"B": 64}, frozenset(), 1), model, False)
            assert d.lanes == map_cpu(static, machine, model=model).lanes, (dtype, d.describe())
            assert 1 <= d.threads <= machine.cores


def test_a_call_at_a_key_seen_before_skips_the_checks_but_not_their_refusals(rng):
    """The fast call (plain C-contiguous numpy arrays at a (shape, dtype) key a call ran at): the
    same values as the general path and counted; anything else takes the general path, whose
    refusals stand (a wrong dtype, a bad threads=, a symbol bound twice)."""
    from panamera.errors import DTypeError, SymbolBindingError

    x, y = pn.placeholder(("B", "N"), name="x"), pn.placeholder(("N",), name="y")
    k = pn.compile(pn.sum(x * y, axis=1), target="cpu", cache=False)
    a, b = rng.random((5, 33)).astype(np.float32), rng.random(33).astype(np.float32)
    want = (a.astype(np.float64) * b).sum(1)
    tol = tolerance("float32", 33)
    first = k(a, b)
    assert len(k._fast) == 1
    for got in (k(a, b), k(a, b, threads=1), k(a.copy(), b.copy(), threads=2), k(x=a, y=b)):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_array_equal(k(a, b), first)
    assert k.stats()["calls"] == 6 and len(k._fast) == 1
    np.testing.assert_allclose(k(np.asfortranarray(a), b), want, rtol=tol, atol=tol)  # not C order: general path
    with pytest.raises(DTypeError, match="'x'"):
        k(a.astype(np.float64), b)
    for bad in (0, True, 1.0):
        with pytest.raises(OptionError, match="threads"):
            k(a, b, threads=bad)
    with pytest.raises(SymbolBindingError, match="'N'"):
        k(a, b[:32])


def test_an_input_named_threads_is_an_input_on_the_fast_call_too(rng):
    t = pn.placeholder(("B",), name="threads")
    k = pn.compile(pn.sum(t), target="cpu", cache=False)
    a = rng.random(9).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(k(threads=a), a.astype(np.float64).sum(), rtol=tolerance("float32", 9))


def test_long_cheap_rows_scan_in_lane_accumulators_short_or_exp_rows_in_one(rng):
    """schedule/cpu_param_mapping.py `lane_scan`: W lane accumulators where every row of the class
    has LANE_MIN_GROUPS groups of W and the reduced body is cheap; the values numpy's (a tail of
    N % W iterations, a NaN reaching a lane's max)."""
    from panamera.cpu_target import cpu_model
    from panamera.model.cpu import LANE_VECTORS
    from panamera.poly.params import build
    from panamera.schedule.cpu_mapper import CpuMachine
    from panamera.schedule.cpu_param_mapping import LANE_MIN_GROUPS, map_cpu_group
    from panamera.schedule.size_class import SizeClass

    model = cpu_model(CpuMachine.detect())
    w = LANE_VECTORS * model.simd_bytes // 4
    x = pn.placeholder(("B", "N"), name="x")

    def scan(y, n: int) -> int:
        p = build((y,))
        return map_cpu_group(
            p.statements, p.kinds[0], SizeClass.of({"B": 8, "N": n}, frozenset(), 1), model, False
        ).lane_scan

    long = LANE_MIN_GROUPS * w
    assert scan(pn.sum(x, axis=1), long) == scan(pn.max(x, axis=1), long) == w
    assert scan(pn.sum(x, axis=1), long // 2) == 0  # a class whose smallest rows are short
    assert scan(pn.sum(pn.exp(x), axis=1), long) == scan(pn.var(x, axis=1), long) == 0  # exp-bound; Welford
    k = pn.compile([pn.sum(x * x, axis=1), pn.max(x, axis=1)], target="cpu", cache=False)
    a = (rng.random((3, long + 5)) * 2 - 0.7).astype(np.float32)
    a[1, 37] = np.nan
    (d0, d1) = k.plan(k.size_class({"B": 3, "N": long + 5})).decisions
    assert d0.lane_scan == d1.lane_scan == w
    s, m = k(a)
    tol = tolerance("float32", long)
    np.testing.assert_allclose(s, (a.astype(np.float64) ** 2).sum(1), rtol=tol, atol=tol)
    np.testing.assert_array_equal(m, a.max(1))  # NaN in row 1, as numpy


@pytest.mark.parametrize("axis", [0, 1], ids=["column", "row"])
def test_split_partials_are_chunk_major(axis):
    """A split's partials sit at chunk p's slot p * M + i, as the static kernels' (codegen/cpu_merge.py):
    a COLUMN task's block of outputs writes one contiguous run that shares no cache line with another
    chunk's task (interleaved slots i * split + p did); combined in chunk order, output by output."""
    from panamera.codegen.cpu_param_kernel import render_cpu_group
    from panamera.poly.params import build
    from panamera.schedule.cpu_mapper import CpuMerge
    from panamera.schedule.cpu_param_mapping import CpuParamDecision

    p = build((pn.sum(pn.placeholder(("B", "N"), name="x"), axis=axis),))
    block = 64 if axis == 0 else 1
    d = CpuParamDecision("S0", p.statements[0].form, "single", 2, block, 8, CpuMerge.LAST, threads=2)
    src = render_cpu_group(p.statements, d, p, "pn_c0").source
    assert "pn_part[pn_p * pn_M + i] = " in src and "pn_part[q * pn_M + i]" in src and "pn_part[i * 2" not in src


def test_a_column_class_is_priced_at_the_probes_column_rate():
    """`param_work` marks a COLUMN kernel as cpu_cost.work marks a static one (`CpuWork.column`): its
    reads stream at the probe's `Rates.column` share of a plain sum's rate on both paths."""
    import dataclasses

    from panamera.model.cpu import CpuModel
    from panamera.poly.params import build
    from panamera.schedule.cpu_param_mapping import param_work, time_at

    col, row = (build((pn.sum(pn.placeholder(("B", "N"), name="x"), axis=a),)) for a in (0, 1))
    sizes = {"B": 4096, "N": 768}
    assert param_work(col.statements, col.kinds[0], sizes).column
    assert not param_work(row.statements, row.kinds[0], sizes).column
    m = CpuModel.nominal(cores=1, simd_bytes=32)
    slow = dataclasses.replace(m, rates=dataclasses.replace(m.rates, column=0.5))
    plain, halved = (time_at(col.statements, col.kinds[0], sizes, 1, 64, 8, x, 1).memory_us for x in (m, slow))
    assert halved > 1.9 * plain  # the reads at half the rate; the 768 outputs' writes aside
