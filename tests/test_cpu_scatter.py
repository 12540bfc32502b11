"""The CPU target's deterministic scatter-add (cpu_segments.py, schedule/cpu_segments.py,
codegen/cpu_segments.py): privatized tables or sorted segments. Against numpy in float64
(`np.add.at`) with repeated ids, tolerances from the dtype and the longest segment; the bits at 1
and 2 threads (and, for the privatized form, at any chunk count the plan fixes); the model's
choice; the run-time index check naming the tensor; the preconditions."""

import numpy as np
import pytest
from conftest import tolerance

import panamera as pn
from panamera.cpu_segments import compile_pinned
from panamera.dtypes import as_dtype
from panamera.frontend.scatter import scatter_add_rows, scatter_add_sorted
from panamera.model.cpu import CpuModel
from panamera.schedule.cpu_segments import PRIVATE_MAX, CpuScatterForm, plan_cpu_scatter
from panamera.schedule.scatter_problem import ScatterProblem

FORMS = list(CpuScatterForm)


def reference(index, src, rows, skip=None):
    out = np.zeros((rows, *src.shape[1:]), np.float64)
    keep = (index != skip) & (index >= 0) & (index < rows)
    np.add.at(out, index[keep], src[keep].astype(np.float64))
    return out


def close(got, want, dtype, index):
    """Within the tolerance of the longest segment's sum (float32 sums for 16-bit sources, one
    rounding at the end), scaled by the largest magnitude."""
    tol = tolerance(dtype, int(np.bincount(index[index >= 0]).max()))
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * scale)


def scatter(n, rows, width, dtype="float32", ids_dtype="int64", skip=None, check=True):
    ids, g = pn.placeholder((n,), ids_dtype, name="ids"), pn.placeholder((n, width), dtype, name="g")
    return scatter_add_sorted(ids, g, rows, skip=skip, check=check)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("dtype", "ids_dtype"), [("float32", "int64"), ("float64", "int32"), ("float16", "int64")])
def test_repeated_ids_against_numpy(rng, form, dtype, ids_dtype):
    """400 ids into 30 rows of 70 (a row longer than one register block): id 3 fifty times, id 4
    skipped, row 7 named by none (zero, and still zero on the second call)."""
    index = rng.integers(0, 30, 400).astype(ids_dtype)
    index[:50], index[index == 7] = 3, 8
    src = rng.standard_normal((400, 70)).astype(dtype)
    k = compile_pinned(scatter(400, 30, 70, dtype, ids_dtype, skip=4), form=form, chunks=3)
    assert k.scatter.form == form and [ln.form for ln in k.plan.kernels] == [form.value.upper()]
    want = reference(index, src, 30, skip=4)
    for _ in range(2):
        got = k(index, src)
        assert got.dtype == np.dtype(dtype) and got.shape == (30, 70)
        close(got, want, dtype, index)
        assert not got[4].any() and not got[7].any()


@pytest.mark.parametrize("form", FORMS)
def test_integer_rows_are_exact(rng, form):
    index, src = rng.integers(0, 9, 200), rng.integers(-50, 50, (200, 5)).astype(np.int32)
    k = compile_pinned(scatter(200, 9, 5, "int32"), form=form)
    assert np.array_equal(k(index, src), reference(index, src, 9).astype(np.int32))


@pytest.mark.parametrize("form", FORMS)
def test_bits_do_not_move_with_threads(rng, form):
    """Deterministic: the same bits at 1 and 2 threads and run to run (the privatized form's chunks
    are fixed by the plan, never by the call's thread count); 3000 ids into 64 rows, so that
    every row sums ~47 terms in an order that would show."""
    index, src = rng.integers(0, 64, 3000), (rng.standard_normal((3000, 24)) * 1e3).astype(np.float32)
    k = compile_pinned(scatter(3000, 64, 24), form=form, chunks=2)
    one = k(index, src, threads=1)
    assert np.array_equal(one, k(index, src, threads=2)) and np.array_equal(one, k(index, src, threads=2))
    close(one, reference(index, src, 64), "float32", index)


def test_large_table_compiles_deterministic_and_the_model_chooses(rng):
    """A table too large for owner computes: on the CPU scatter_add_rows takes sorted segments
    (refused before), deterministic and bit-stable; the CPU model's choice between its two forms
    follows the sizes (many ids into a small table: privatized)."""
    index, src = rng.integers(0, 20000, 4096), rng.standard_normal((4096, 64)).astype(np.float32)
    index[::7] = 11
    ids, g = pn.placeholder((4096,), "int64", name="ids"), pn.placeholder((4096, 64), "float32", name="g")
    k = pn.compile(scatter_add_rows(ids, g, rows=20000), target="cpu", deterministic=True)
    assert [f.chosen for f in k.formulations] == ["sorted_segments"]
    assert k.scatter.form == CpuScatterForm.SORTED and "privatized" in k.explain()
    one = k(index, src, threads=1)
    assert np.array_equal(one, k(index, src, threads=2))
    close(one, reference(index, src, 20000), "float32", index)
    m, i64, f32 = CpuModel.nominal(2, 64), as_dtype("int64"), as_dtype("float32")
    assert plan_cpu_scatter(ScatterProblem(1 << 20, 16, 64, i64, f32), m).form == CpuScatterForm.PRIVATIZED
    assert plan_cpu_scatter(ScatterProblem(8192, 50257, 768, i64, f32), m).form == CpuScatterForm.SORTED


@pytest.mark.parametrize("form", FORMS)
def test_an_id_outside_the_table_names_the_tensor(rng, form):
    """`scatter_add_sorted` checks its ids: the least bad position, whatever the thread order;
    `scatter_add_rows`'s form drops them (its documented contract, every form alike)."""
    index, src = rng.integers(0, 10, 100), np.ones((100, 4), np.float32)
    index[[80, 40]] = [10, -1]
    k = compile_pinned(scatter(100, 10, 4), form=form)
    with pytest.raises(
        pn.IndexRangeError, match=r"scatter-add: index 'ids' holds -1 at position 40, outside \[0, 10\)"
    ):
        k(index, src, threads=2)
    lax = compile_pinned(scatter(100, 10, 4, check=False), form=form)
    close(lax(index, src), reference(index, src, 10), "float32", index)


def test_preconditions():
    """segments.py's precondition 1 on the CPU (the scatter alone), and a pinned form the plan
    does not offer (privatized tables over PRIVATE_MAX bytes)."""
    s = scatter(6, 4, 2)
    with pytest.raises(pn.PanameraError, match="whole computation \\(precondition 1\\)"):
        pn.compile([s, s.inputs[1] * 2.0], target="cpu")
    rows = PRIVATE_MAX // (4 * 2 * 64) + 1
    with pytest.raises(pn.OptionError, match="'privatized' is not offered"):
        problem = ScatterProblem(8, rows, 64, as_dtype("int64"), as_dtype("float32"))
        plan_cpu_scatter(problem, CpuModel.nominal(2, 64), form=CpuScatterForm.PRIVATIZED)


def test_preconditions_2_and_3_on_the_cpu():
    """segments.py's precondition 2 (index and source are the computation's inputs) refused on the
    CPU as on the emulator, naming the computed tensor; a float index (precondition 3) is refused
    before, by the frontend, naming the index."""
    ids, g = pn.placeholder((6,), "int64", name="ids"), pn.placeholder((6, 2), name="g")
    with pytest.raises(pn.PanameraError, match="source 'mul.*precondition 2"):
        pn.compile(scatter_add_sorted(ids, g * 2.0, 4), target="cpu")
    with pytest.raises(pn.DTypeError, match="index 'f' has dtype float32"):
        scatter_add_sorted(pn.placeholder((6,), "float32", name="f"), g, 4)


def test_the_cpu_and_gpu_plans_read_one_problem():
    """One ScatterProblem (n, rows, width, dtypes, skip) for both plans, read off the node once."""
    from panamera import cpu_segments, segments
    from panamera.model.gpu import H100

    node = segments.recognize((scatter(40, 7, 3, "float16", skip=2),))
    want = ScatterProblem(40, 7, 3, as_dtype("int64"), as_dtype("float16"), 2)
    cpu, gpu = cpu_segments.plan_of(node, CpuModel.nominal(2, 64)), segments.plan_of(node, H100)
    assert cpu.problem == gpu.problem == want and (cpu.n, cpu.acc) == (gpu.n, gpu.acc) == (40, "float")


@pytest.mark.parametrize("form", FORMS)
def test_a_one_thread_plan_opens_no_region_and_gives_the_same_bits(rng, form):
    """codegen/cpu_region.py's `one_thread` on the scatter: where the model finds one thread faster
    (here a machine whose region entry is dear) the plan's kernel has no `omp parallel` (the
    sorted form's `omp single` and both forms' `omp for` bind to a team of one), and its bits are
    those of the same form and chunks on two threads."""
    import dataclasses

    from panamera.codegen.cpu_segments import render_cpu_scatter
    from panamera.cpu_compiled import cpu_model
    from panamera.cpu_segments import compile_cpu_scatter
    from panamera.options import Options

    m = cpu_model()

    def compiled(fork_us):
        model = dataclasses.replace(m, cores=2, rates=dataclasses.replace(m.rates, fork_us=fork_us))
        graph = (scatter(300, 16, 8, skip=5),)
        return compile_cpu_scatter(graph, graph, Options.make(target="cpu"), True, (), model, form=form, chunks=2)

    one, two = compiled((0.2, 40.0)), compiled((40.0, 0.2))
    assert (one.scatter.threads, two.scatter.threads) == (1, 2)
    kernel = {k: render_cpu_scatter("pn_sc", c.scatter) for k, c in (("one", one), ("two", two))}
    assert "omp parallel" not in kernel["one"] and "omp parallel" in kernel["two"]
    assert "if (pn_nt > 1) pn_nt = 1;" in one.cpu_source  # the program runs that kernel
    assert "on 1 thread(s)" in one.scatter.describe()
    index, src = rng.integers(0, 16, 300), rng.standard_normal((300, 8)).astype(np.float32)
    index[:40] = 3  # a long segment (and id 5 skipped)
    got = one(index, src, threads=2)
    assert np.array_equal(got, two(index, src, threads=2)) and np.array_equal(got, two(index, src, threads=1))
    close(got, reference(index, src, 16, skip=5), "float32", index)
