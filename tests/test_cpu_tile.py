"""target="cpu": the register-tiled contraction kernel (codegen/cpu_tile.py) and the model's routing
between it and numpy's BLAS (model/cpu_tile.py). Results against float64 numpy with tolerances from
K and the operands' magnitudes; tails in M, N and K; transposed operands (B packed) and batched calls
(accumulated K pieces); bit-stable across 1 and 2 threads."""

import dataclasses

import numpy as np
import pytest
from conftest import random_array, tolerance

import panamera as pn
import panamera.schedule.cpu_contraction as cpu_contraction
from panamera.codegen.cpu_tile import TileShape
from panamera.model.cpu import CpuModel
from panamera.model.cpu_gemm import GemmRates
from panamera.model.cpu_tile import (
    GATHER_NS,
    TRANSPOSE_NS,
    GemmKernel,
    gemm_choice,
    gemm_tile,
    pack_share,
    pack_us,
    tile_plan,
    tile_shape,
)
from panamera.schedule.cpu_gemm import Gemm


@pytest.fixture
def forced_tile(monkeypatch):
    """Compile every `Gemm` as the tile kernel, whatever this (loaded) machine's probe says."""
    monkeypatch.setattr(
        cpu_contraction, "gemm_tile", lambda gm, itemsize, m, threads=1: tile_shape(m.simd_bytes, itemsize)
    )


def _check(got, ref, k, scale):
    t = tolerance("float32", k)
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=t, atol=t * scale)


@pytest.mark.parametrize(
    ("m", "n", "k", "tb"),
    [
        (37, 45, 131, False),
        (5, 19, 300, True),
        (16, 32, 256, False),
        (1, 70, 150, False),
        (9, 33, 129, True),
        (16, 64, 100, True),
    ],
)
def test_tile_matches_numpy_with_tails(forced_tile, m, n, k, tb):
    """M, N, K off the tile (MR, NR, KC): the row tails, the zero-padded last panel, a short last K block;
    B transposed: copied (a tail panel) or gathered (whole panels)."""
    x = pn.placeholder((m, k), "float32")
    w = pn.placeholder((n, k) if tb else (k, n), "float32")
    f = pn.compile(x @ (w.T if tb else w), target="cpu", cache=False)
    assert "pn_tile_gemm<" in f.source and f.cpu_kernels[0].tile is not None
    a, b = (
        random_array((m, k), "float32", np.random.default_rng(1)),
        random_array(w.shape, "float32", np.random.default_rng(2)),
    )
    ref = a.astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    scale = np.abs(a).max() * np.abs(b).max() * np.sqrt(k)
    _check(f(a, b), ref, k, scale)


def test_tile_batched_and_bit_stable_across_threads(forced_tile):
    """A batched product (several gemm calls, one per batch); 1 and 2 threads give the same bits (each
    C element summed by one thread in K order)."""
    x, w = pn.placeholder((3, 20, 70), "float32"), pn.placeholder((3, 70, 50), "float32")
    f = pn.compile(pn.matmul(x, w) if hasattr(pn, "matmul") else x @ w, target="cpu", cache=False)
    assert f.cpu_kernels[0].tile is not None
    a, b = (
        random_array((3, 20, 70), "float32", np.random.default_rng(3)),
        random_array((3, 70, 50), "float32", np.random.default_rng(4)),
    )
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    one, two = f(a, b, threads=1), f(a, b, threads=2)
    _check(one, ref, 70, np.abs(a).max() * np.abs(b).max() * np.sqrt(70))
    assert np.array_equal(one, two)


@pytest.mark.parametrize(("m", "n", "k"), [(37, 45, 131), (50, 40, 300)])
def test_threads_pack_the_panels_they_read(forced_tile, m, n, k):
    """B transposed, N a tail past whole panels: each thread packs the pieces its own share of the tasks
    reads (a panel straddling two shares packed by both, into their own buffers; no barrier before the
    tiles): against float64 numpy, and the same bits on 1 and 2 threads."""
    x, w = pn.placeholder((m, k), "float32"), pn.placeholder((n, k), "float32")
    f = pn.compile(x @ w.T, target="cpu", cache=False)
    assert f.cpu_kernels[0].tile is not None
    a, b = (
        random_array((m, k), "float32", np.random.default_rng(11)),
        random_array((n, k), "float32", np.random.default_rng(12)),
    )
    ref = a.astype(np.float64) @ b.T.astype(np.float64)
    one, two = f(a, b, threads=1), f(a, b, threads=2)
    _check(one, ref, k, np.abs(a).max() * np.abs(b).max() * np.sqrt(k))
    assert np.array_equal(one, two)


def test_pack_share_is_the_largest_threads_pieces():
    """The model's pack on `t` threads: the most (K chunk x panel) pieces one thread's contiguous share of
    the tasks reads, over all pieces (codegen/cpu_tile.py: each thread packs its own)."""
    assert pack_share(44, 2, 22, 2) == 0.5  # table1 on AVX2: a panel each
    assert pack_share(21, 2, 7, 3) == 2 / 3  # 11 + 10 tasks of 7 a panel: the middle one packed by both
    assert pack_share(8, 2, 8, 1) == 1.0  # one panel, both threads read it
    assert pack_share(16, 4, 2, 8) == 0.25 and pack_share(5, 8, 5, 1) == 1.0  # more threads than tasks


def test_model_routes_small_to_tile_and_large_to_blas():
    """The model picks the tile for table1's 128x32x1024 (x @ w.T) and the BLAS for 1024^3, on 1 and
    2 threads of a nominal AVX-512 machine with this machine's BLAS rate, scaling to 2 threads; no `Gemm`: no tile."""
    m = CpuModel.nominal(cores=2, simd_bytes=64)
    m = dataclasses.replace(m, gemm=GemmRates((165.0, 72.0), 0.9, threads=2, gflops_all=(300.0, 130.0)))
    small = Gemm(128, 32, 1024, False, 1024, True, 1024, 32, ((0, 0, 0, 0),))
    big = Gemm(1024, 1024, 1024, False, 1024, False, 1024, 1024, ((0, 0, 0, 0),))
    for t in (1, 2):
        assert gemm_choice(small, 4, m, t)[0] is GemmKernel.TILE
        assert gemm_choice(big, 4, m, t)[0] is GemmKernel.BLAS
    assert gemm_tile(small, 4, m, 1) == tile_shape(64, 4)
    assert gemm_tile(None, 4, m, 1) is None and gemm_tile(big, 4, m, 1) is None


@pytest.mark.parametrize(("m", "n", "k", "ksplit", "tb"), [(3, 20, 1000, 2, False), (8, 32, 700, 4, True)])
def test_k_split_merges_partials_in_order(monkeypatch, m, n, k, ksplit, tb):
    """K cut into chunks (the last one short, or (4 chunks of 256 over 700) one empty), each chunk's
    partial a task, added in chunk order: against float64 numpy, and with `deterministic=True` the
    same bits on 1 and 2 threads (plan_gemm keeps one kernel and K split for every count). The tile
    and its threads are forced: the host's probe would otherwise decide them (a contended probe
    runs the tile on one thread)."""
    monkeypatch.setattr(
        cpu_contraction,
        "gemm_tile",
        lambda gm, i, md, t=1: dataclasses.replace(tile_shape(md.simd_bytes, i), ksplit=ksplit),
    )
    monkeypatch.setattr(cpu_contraction, "tile_threads", lambda gm, i, md, t: t)
    x = pn.placeholder((m, k), "float32")
    w = pn.placeholder((n, k) if tb else (k, n), "float32")
    f = pn.compile(x @ (w.T if tb else w), target="cpu", cache=False, deterministic=True)
    (d,) = f.decisions
    assert d.gemm.fewer == ()
    assert f"pn_nt, {ksplit})" in f.source
    a, b = (
        random_array((m, k), "float32", np.random.default_rng(5)),
        random_array(w.shape, "float32", np.random.default_rng(6)),
    )
    ref = a.astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    one, two = f(a, b, threads=1), f(a, b, threads=2)
    _check(one, ref, k, np.abs(a).max() * np.abs(b).max() * np.sqrt(k))
    assert np.array_equal(one, two)


def test_model_splits_k_only_where_tiles_cannot_occupy_the_threads():
    """8x32x8192: one C tile, two threads: K in 2 chunks; on one thread, or with 16 tiles
    (128x32x8192), no split."""
    m = dataclasses.replace(
        CpuModel.nominal(cores=2, simd_bytes=64),
        gemm=GemmRates((165.0, 72.0), 0.9, threads=2, gflops_all=(300.0, 130.0)),
    )
    skinny = Gemm(8, 32, 8192, False, 8192, False, 32, 32, ((0, 0, 0, 0),))
    wide = Gemm(128, 32, 8192, False, 8192, False, 32, 32, ((0, 0, 0, 0),))
    assert tile_plan(skinny, 4, m, 2)[0].ksplit == 2 and tile_plan(skinny, 4, m, 1)[0].ksplit == 1
    assert tile_plan(wide, 4, m, 2)[0].ksplit == 1
    t = tile_plan(skinny, 4, m, 2)[1]
    assert t.merge_us > 0 and t.threads == 2


def test_tile_float64(forced_tile):
    """dgemm's shape: float64 lanes (half as many a vector), against float64 numpy at float64's tolerance."""
    x, w = pn.placeholder((13, 300), "float64"), pn.placeholder((300, 21), "float64")
    f = pn.compile(x @ w, target="cpu", cache=False)
    assert "pn_tile_gemm<double" in f.source
    a, b = (
        random_array((13, 300), "float64", np.random.default_rng(7)),
        random_array((300, 21), "float64", np.random.default_rng(8)),
    )
    t = tolerance("float64", 300)
    np.testing.assert_allclose(f(a, b), a @ b, rtol=t, atol=t * np.abs(a).max() * np.abs(b).max() * np.sqrt(300))


@pytest.mark.parametrize(("n", "k"), [(32, 301), (21, 300)])
def test_tile_float64_transposed_b(forced_tile, n, k):
    """float64 with B transposed: whole panels (N = 32, any NR of 8 or 16 doubles) packed by 4 x 4 register
    transposes, a K tail (301: masked loads); a tail panel (N = 21) by the scalar copy. Against float64
    numpy at float64's tolerance, the same bits on 1 and 2 threads; the model prices the transposes."""
    x, w = pn.placeholder((13, k), "float64"), pn.placeholder((n, k), "float64")
    f = pn.compile(x @ w.T, target="cpu", cache=False)
    assert "pn_tile_gemm<double" in f.source
    a, b = (
        random_array((13, k), "float64", np.random.default_rng(9)),
        random_array((n, k), "float64", np.random.default_rng(10)),
    )
    t = tolerance("float64", k)
    one, two = f(a, b, threads=1), f(a, b, threads=2)
    np.testing.assert_allclose(one, a @ b.T, rtol=t, atol=t * np.abs(a).max() * np.abs(b).max() * np.sqrt(k))
    assert np.array_equal(one, two)
    whole, tail = (Gemm(13, c, k, False, k, True, k, c, ()) for c in (32, 20))
    assert pack_us(whole, 8, TileShape(6, 2, 4), None, "L2") == k * 32 * GATHER_NS / 1e3
    assert pack_us(tail, 8, TileShape(6, 2, 4), None, "L2") == k * 24 * TRANSPOSE_NS / 1e3


def test_tile_time_overlaps_memory_and_compute_as_every_kernel():
    """The tile's memory and compute overlap by the probe's `overlap` (model/cpu.py `Rates.both`), not
    max(): with overlap 0.5 the time grows by half the shorter part; a K split pays a barrier (half a
    region's entry) before its merge."""
    m = dataclasses.replace(
        CpuModel.nominal(cores=2, simd_bytes=32),
        gemm=GemmRates((82.0, 37.0), 2.5, threads=2, gflops_all=(142.0, 71.0)),
    )
    g = Gemm(128, 32, 1024, False, 1024, False, 32, 32, ((0, 0, 0, 0),))  # B row-major, whole panels: no pack
    full, half = (dataclasses.replace(m, rates=dataclasses.replace(m.rates, overlap=o)) for o in (1.0, 0.5))
    a, b = tile_plan(g, 4, full, 1)[1], tile_plan(g, 4, half, 1)[1]
    assert b.total_us - a.total_us == pytest.approx(0.5 * min(a.memory_us, a.compute_us))
    skinny = Gemm(8, 32, 8192, False, 8192, False, 32, 32, ((0, 0, 0, 0),))
    split = tile_plan(skinny, 4, full, 2, ksplit=2)[1]
    assert split.merge_us > full.rates.fork(2) / 2
