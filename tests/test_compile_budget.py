"""Compile-time guards (issue 18): small programs that once sent isl into minutes of work compile
in seconds, and the mechanisms that keep them so (poly/bounded.py's cap on optional isl questions,
one-piece subscripts for masked and in-range remap reads, poly/movement.py).

The bound is generous (a guard against pathologies on a loaded machine, not a performance
assertion): the 3-D pools below took 204 s and over 600 s before; they take about 2 s now. It is
measured in CPU time of this process (isl runs in it; g++ does not count).
"""

import time

import islpy as isl
import numpy as np
import pytest
from conftest import tolerance
from test_pool import ref_pool

import panamera as pn
from panamera.compiler import lower
from panamera.frontend.tensor import placeholder
from panamera.poly import bounded
from panamera.poly.access import AccessKind, Read, access_kind
from panamera.poly.statement import box

BOUND_S = 30.0  # CPU seconds for every stage of one small program


def _lower_cpu_s(y) -> float:
    t = time.process_time()
    lower(y, target="emulator")
    return time.process_time() - t


POOLS = {  # (kind, shape, window attributes): 3-D windows whose clamped subscripts had 27 pieces
    "max-3d-ceil": ("max", (1, 2, 7, 7, 7), dict(kernel=(3, 3, 3), strides=(2, 2, 2), pads=(1,) * 6, ceil_mode=True)),
    "max-3d": ("max", (1, 2, 7, 7, 7), dict(kernel=(3, 3, 3), strides=(2, 2, 2), pads=(1,) * 6)),
    "avg-3d-ceil-include-pad": (
        "avg",
        (1, 2, 7, 7, 7),
        dict(kernel=(3, 3, 3), strides=(2, 2, 2), pads=(1,) * 6, ceil_mode=True, count_include_pad=True),
    ),
    "max-3d-k2": ("max", (2, 3, 8, 8, 8), dict(kernel=(2, 2, 2), strides=(2, 2, 2), pads=(1,) * 6, ceil_mode=True)),
}


@pytest.mark.parametrize("name", ["max-3d-ceil", "avg-3d-ceil-include-pad"])
def test_pool_3d_compiles_in_bounded_time_and_matches_numpy(name):
    kind, shape, kw = POOLS[name]
    x = pn.placeholder(shape, "float32", name="x")
    f = pn.max_pool if kind == "max" else pn.avg_pool
    args = {k: v for k, v in kw.items() if kind == "avg" or k != "count_include_pad"}
    y = f(x, **args)
    assert _lower_cpu_s(y) < BOUND_S
    a = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    got = pn.compile(y, target="emulator")(a)
    tol = tolerance("float32", int(np.prod(kw["kernel"])))
    np.testing.assert_allclose(got.astype(np.float64), ref_pool(a, kind, **kw), rtol=tol, atol=tol)


def test_max_pool_indices_3d_compiles_in_bounded_time():
    x = pn.placeholder((1, 2, 7, 7, 7), "float32", name="x")
    y = pn.frontend.pool.max_pool_indices(x, (3, 3, 3), strides=(2, 2, 2), pads=(1,) * 6, ceil_mode=True)
    assert _lower_cpu_s(y) < BOUND_S


@pytest.mark.parametrize("name", sorted(POOLS))
def test_window_reads_are_one_piece(name):
    """A padded window's read is masked off by a select, so its subscript is taken modulo the
    extent (one piece) rather than clamped (three per axis, 27 for a 3-D window)."""
    kind, shape, kw = POOLS[name]
    x = pn.placeholder(shape, "float32", name="x")
    f = pn.max_pool if kind == "max" else pn.avg_pool
    y = f(x, **{k: v for k, v in kw.items() if kind == "avg" or k != "count_include_pad"})
    for st in lower(y, stop_after="program", target="emulator").program.statements:
        assert [r.addr.n_piece() for r in st.origin.reads if r.tensor.op == "placeholder"] == [1]


def test_in_range_remap_needs_no_boundary():
    """A remap axis that stays inside its input on the domain gets no clamp (isl decides): the
    unpadded axes of a window, a concatenation's kept axes."""
    x = pn.placeholder((2, 3, 6, 6), "float32", name="x")
    y = pn.sum(pn.pad(x, ((0, 0), (0, 0), (1, 1), (0, 0)), mode="edge"), axis=(2, 3))
    (st,) = lower(y, stop_after="program", target="emulator").program.statements
    assert [r.addr.n_piece() for r in st.origin.reads] == [3]  # the padded axis' clamp only


def _contig_read(ctx):
    dom, v = box(ctx, ["i", "j"], [4, 8])
    return Read(placeholder((4, 8), "float32"), v["i"] * 8 + v["j"]), dom


def test_bounded_question_takes_the_conservative_answer_past_the_cap(monkeypatch):
    ctx = isl.Context()
    read, dom = _contig_read(ctx)
    assert access_kind(read, "j", 4, dom) == AccessKind.CONTIG
    monkeypatch.setattr(bounded, "MAX_OPERATIONS", 1)
    assert access_kind(read, "j", 4, dom) == AccessKind.GATHER  # cannot tell: a scalar load, never wrong
    assert ctx.get_max_operations() == 0  # the cap is lifted after the question
    assert not dom.is_empty()  # and the context still works


def test_bounded_question_passes_other_isl_errors_on():
    ctx = isl.Context()
    with pytest.raises(isl.Error):
        bounded.decide(ctx, lambda: isl.Set("{ [i] : i >> }", context=ctx).is_empty(), False)
    assert ctx.get_max_operations() == 0
