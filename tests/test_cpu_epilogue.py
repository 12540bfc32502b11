"""target="cpu": element-wise epilogues (a Linear's bias, GELU / ReLU, a residual add) applied by the register
tile at its store (schedule/cpu_epilogue.py), one kernel instead of the tile and a MAP pass over its output.
Results against float64 numpy with tolerances from K and the operands' magnitudes; one negative test per
precondition of `check_tile_epilogue`."""

import dataclasses
import math

import numpy as np
import pytest
from conftest import random_array, tolerance

import panamera as pn
import panamera.schedule.cpu_contraction as cpu_contraction
from panamera.codegen.cpu_tile import TileShape
from panamera.compiler import lower
from panamera.errors import LegalityError
from panamera.frontend.tensor import iota
from panamera.model.cpu_tile import GemmKernel
from panamera.poly.statement import Read
from panamera.schedule.cpu_epilogue import check_tile_epilogue, tile_epilogue

_erf = np.vectorize(math.erf)


def _gelu(y: np.ndarray) -> np.ndarray:
    return 0.5 * y * (1.0 + _erf(y / math.sqrt(2.0)))


def _force_tile(monkeypatch, tile: TileShape | None) -> None:
    """The tile (or, None, the BLAS) for every contraction, on the threads asked for (the K split kept)."""
    monkeypatch.setattr(cpu_contraction, "gemm_tile", lambda gm, i, m, t=1: tile)
    monkeypatch.setattr(cpu_contraction, "tile_threads", lambda gm, i, m, t: t)


def _linear(m: int, n: int, k: int, act=pn.gelu, residual: bool = False):
    x, w = pn.placeholder((m, k), "float32", name="x"), pn.placeholder((n, k), "float32", name="w")
    b = pn.placeholder((n,), "float32", name="b")
    y = x @ w.T + b
    if residual:
        y = y + pn.placeholder((m, n), "float32", name="r")
    return act(y)


def _arrays(m: int, n: int, k: int, residual: bool = False) -> list[np.ndarray]:
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    shapes = [(m, k), (n, k), (n,)] + ([(m, n)] if residual else [])
    return [random_array(s, "float32", rng) for s in shapes]


def _check(got: np.ndarray, arrays: list[np.ndarray], k: int, act) -> None:
    """`got` against act(x @ w.T + b (+ r)) in float64: the product's K-derived tolerance, carried through
    the activation (slope at most 1.13 for GELU, 1 for ReLU) and its own rounding."""
    x, w, b, *r = (a.astype(np.float64) for a in arrays)
    y = x @ w.T + b + (r[0] if r else 0.0)
    ref = act(y)
    t = tolerance("float32", k)
    atol = 1.13 * t * np.abs(x).max() * np.abs(w).max() * math.sqrt(k) + 4 * 2**-23 * np.abs(ref).max()
    np.testing.assert_allclose(got, ref, rtol=t, atol=atol)


def test_table1_with_bias_and_gelu_is_one_kernel_matching_numpy(monkeypatch):
    """table1 128x32x1024 `gelu(x @ w.T + b)` on the tile: one kernel (the plan carries the epilogue), no
    MAP pass; float64 numpy within K's tolerance; the same bits on 1 and 2 threads."""
    _force_tile(monkeypatch, TileShape(8, 2, 16))
    f = pn.compile(_linear(128, 32, 1024), target="cpu", cache=False)
    assert len(f.cpu_kernels) == 1
    plan = f.decisions[0].gemm
    assert plan.kernel is GemmKernel.TILE and plan.epilogue is not None and "epilogue" in plan.describe()
    arrays = _arrays(128, 32, 1024)
    one, two = f(*arrays, threads=1), f(*arrays, threads=2)
    _check(one, arrays, 1024, _gelu)
    assert np.array_equal(one, two)


@pytest.mark.parametrize("residual", [False, True])
def test_bias_broadcast_on_n_with_tails_and_a_residual(monkeypatch, residual):
    """M = 13 and N = 40 (a row tail and a padded panel), K = 300 (a short K block): the bias broadcast
    along the rows reads b[j] at each column, a residual r[i, j] at each element; ReLU."""
    _force_tile(monkeypatch, TileShape(8, 2, 16))
    relu = lambda y: pn.maximum(y, 0.0)  # noqa: E731
    f = pn.compile(_linear(13, 40, 300, relu, residual), target="cpu", cache=False)
    assert len(f.cpu_kernels) == 1 and f.decisions[0].gemm.epilogue is not None
    arrays = _arrays(13, 40, 300, residual)
    _check(f(*arrays, threads=2), arrays, 300, lambda y: np.maximum(y, 0.0))


def test_k_split_applies_the_epilogue_after_the_merge_bit_identical_on_2_threads(monkeypatch):
    """K in 2 chunks (8x32x2048: one C tile, fewer than the threads): the epilogue runs on each merged
    row, and the result's bits do not depend on the thread count."""
    _force_tile(monkeypatch, TileShape(8, 2, 16, ksplit=2))
    f = pn.compile(_linear(8, 32, 2048), target="cpu", cache=False)
    assert f.decisions[0].gemm.tile.ksplit == 2 and f.decisions[0].gemm.epilogue is not None
    arrays = _arrays(8, 32, 2048)
    one, two = f(*arrays, threads=1), f(*arrays, threads=2)
    _check(two, arrays, 2048, _gelu)
    assert np.array_equal(one, two)


def test_blas_route_keeps_the_epilogue_a_separate_pass(monkeypatch):
    """Where the BLAS runs the contraction, the consumer stays a MAP kernel over the stored product."""
    _force_tile(monkeypatch, None)
    monkeypatch.setattr(cpu_contraction, "_fused_tile", lambda *args: None)  # the BLAS even with the pass
    f = pn.compile(_linear(128, 32, 1024), target="cpu", cache=False)
    assert len(f.cpu_kernels) == 2 and f.decisions[0].gemm.kernel is GemmKernel.BLAS
    assert f.decisions[0].gemm.epilogue is None
    arrays = _arrays(128, 32, 1024)
    _check(f(*arrays, threads=1), arrays, 1024, _gelu)


def test_model_counts_the_saved_pass(monkeypatch):
    """The fused plan's modeled time is the tile's plus the consumer's arithmetic: below the tile and the
    MAP kernel the unfused plan runs."""
    _force_tile(monkeypatch, TileShape(8, 2, 16))
    fused = pn.compile(_linear(128, 32, 1024), target="cpu", cache=False)
    monkeypatch.setattr(cpu_contraction, "tile_epilogue", lambda g: None)
    split = pn.compile(_linear(128, 32, 1024), target="cpu", cache=False)
    assert len(split.cpu_kernels) == 2
    assert fused.modeled(1).total_us < split.modeled(1).total_us


# -- one negative test per precondition (schedule/cpu_epilogue.py) -----------------------------------
def _group(y):
    return lower(y, stop_after="groups", target="emulator").groups


def _refused(groups, n: int) -> None:
    with pytest.raises(LegalityError, match=f"precondition {n}"):
        for g in groups:
            check_tile_epilogue(g)


def test_precondition_1_a_consumer_reducing_over_the_product_stays_separate(monkeypatch):
    """A row sum of the product is no element-wise consumer: refused, and compiled as its own kernel."""
    x, w = pn.placeholder((128, 1024), "float32"), pn.placeholder((32, 1024), "float32")
    y = pn.sum(x @ w.T, axis=1)
    _refused(_group(y), 1)
    _force_tile(monkeypatch, TileShape(8, 2, 16))
    f = pn.compile(y, target="cpu", cache=False)
    assert all(d.gemm is None or d.gemm.epilogue is None for d in f.decisions)


def test_precondition_2_a_contraction_the_blas_rule_refuses():
    """A producer fused into an operand (exp(x) @ w.T): no gemm call, nothing for the tile to fuse into."""
    x, w = pn.placeholder((128, 1024), "float32"), pn.placeholder((32, 1024), "float32")
    groups = [g for g in _group(pn.maximum(pn.exp(x) @ w.T, 0.0)) if len(g.statements) == 2]
    assert groups
    _refused(groups, 2)


def test_precondition_3_the_product_read_off_its_element():
    """The consumer reading the product at another element (here: the next one) is refused."""
    (g,) = _group(_linear(128, 32, 1024))
    assert tile_epilogue(g) is not None
    product, consumer = g.statements
    reads = tuple(
        dataclasses.replace(r, addr=r.addr.add_constant_val(1)) if r.tensor.uid == product.result.uid else r
        for r in consumer.reads
    )
    bad = dataclasses.replace(g, statements=(product, dataclasses.replace(consumer, reads=reads)))
    _refused([bad], 3)


def test_precondition_4_a_value_that_is_not_stored():
    """The consumer reading an iota (no memory: its address is the value) is refused."""
    (g,) = _group(_linear(128, 32, 1024))
    product, consumer = g.statements
    reads = tuple(Read(iota((128, 32)), r.addr) if r.tensor.uid != product.result.uid else r for r in consumer.reads)
    bad = dataclasses.replace(g, statements=(product, dataclasses.replace(consumer, reads=reads)))
    _refused([bad], 4)


@pytest.mark.parametrize("pass_us", [0.0, 1e6])
def test_tile_taken_over_the_blas_only_where_the_consumers_pass_outweighs_it(monkeypatch, pass_us):
    """The BLAS faster alone (`gemm_tile` None): the group stays whole on the tile (the consumer at its
    store) only where the BLAS plus the consumer's own MAP kernel is modeled slower; else it is split."""
    import panamera.model.cpu_tile as model_tile
    import panamera.schedule.cpu_cost as cpu_cost
    from panamera.model.cpu import CpuModel, KernelTime

    monkeypatch.setattr(cpu_contraction, "gemm_tile", lambda gm, i, m, t=1: None)
    monkeypatch.setattr(model_tile, "TILE_SHARE", 0.3)  # the tile modeled slower than the BLAS, as gemm_tile says
    monkeypatch.setattr(cpu_cost, "time_of", lambda g, d, m, t=None: KernelTime(pass_us, 0, pass_us, 0, 0, "L1", 1))
    (g,) = _group(_linear(128, 32, 1024))
    m = CpuModel.nominal(cores=1, simd_bytes=64)
    plan, groups = cpu_contraction.plan_gemm(g, m, 1), cpu_contraction.cpu_groups(g, m, 1)
    if pass_us:
        assert plan.kernel is GemmKernel.TILE and plan.epilogue is not None and groups == (g,)
    else:
        assert plan is None and len(groups) == 2


def test_product_also_an_output_is_stored_whole(monkeypatch):
    """`(y, relu(y + b))` with y = x @ w.T, float64: the tile stores the product (a program output) and
    applies the consumer; both against numpy."""
    _force_tile(monkeypatch, TileShape(8, 2, 8))
    x, w = pn.placeholder((24, 200), "float64", name="x"), pn.placeholder((40, 200), "float64", name="w")
    b = pn.placeholder((40,), "float64", name="b")
    y = x @ w.T
    f = pn.compile([y, pn.maximum(y + b, 0.0)], target="cpu", cache=False)
    assert len(f.cpu_kernels) == 1 and f.decisions[0].gemm.epilogue is not None
    rng = np.random.default_rng(5)
    a, c, bias = (random_array(s, "float64", rng) for s in ((24, 200), (40, 200), (40,)))
    got_y, got = f(a, c, bias, threads=2)
    ref = a @ c.T
    t = tolerance("float64", 200)
    atol = t * np.abs(a).max() * np.abs(c).max() * math.sqrt(200)
    np.testing.assert_allclose(got_y, ref, rtol=t, atol=atol)
    np.testing.assert_allclose(got, np.maximum(ref + bias, 0.0), rtol=t, atol=atol)
