"""target="cpu": row scans with W accumulator lanes (codegen/cpu_lanes.py `lanes_pass`), and
argmax/argmin kept per lane as (value, offset in the block) in the value's type. Every case against numpy:
argmax/argmin exactly (numpy's tie rule: the first index; the first NaN wins), sums within
conftest's tolerance. Shapes cover rows shorter than W (the tail alone), exactly W, several
blocks of `inner` iterations with a tail, and chunks of a split row."""

import numpy as np
import pytest
from conftest import random_array, tolerance

import panamera as pn
from panamera.codegen.cpu_lanes import LANE_VECTORS

# rows: shorter than W, W (float lanes 16 x 4), a tail past W, several 4096-blocks and a tail
LENGTHS = (5, 16 * LANE_VECTORS, 16 * LANE_VECTORS + 7, 2 * 4096 + 77)


def hard_rows(rng, n: int, dtype: str) -> np.ndarray:
    """Rows that test the tie and NaN rules: ties of the maximum and minimum, the extremes
    repeated late, -0.0 against 0.0, a NaN (twice), rows of -inf and of +inf."""
    a = random_array((9, n), dtype, rng)
    a[0, :] = 1.0  # all tied: index 0
    a[1, n // 2 :] = a[1].max() + 1  # the maximum from n // 2 on: its first index
    a[2, -1] = a[2].max() + 1  # the maximum last (in the tail)
    a[3, n // 3] = np.nan
    a[3, n - 1] = np.nan  # the first NaN wins, for argmax and argmin
    a[4, :] = -np.inf
    a[5, :] = np.inf
    a[6, :] = 0.0
    a[6, n // 2] = -0.0  # equal to 0.0: index 0
    a[7, ::2] = a[7].min() - 1  # the minimum at every even index: index 0
    a[8, n // 4 :] = a[8].min() - 1
    return a


@pytest.mark.parametrize("n", LENGTHS)
def test_argmax_argmin_rows_follow_numpy(n, rng):
    x = pn.placeholder((9, n), "float32", name="x")
    k = pn.compile([pn.argmax(x, axis=1), pn.argmin(x, axis=1), pn.argmax(x, axis=1, last=True)], target="cpu")
    a = hard_rows(rng, n, "float32")
    got = k(a)
    np.testing.assert_array_equal(got[0], a.argmax(1))
    np.testing.assert_array_equal(got[1], a.argmin(1))
    # last=True: the last index of the maximum (a NaN: the last NaN)
    flipped = a[:, ::-1]
    np.testing.assert_array_equal(got[2], n - 1 - flipped.argmax(1))


def test_argmax_16_bit_int_and_flat(rng):
    """float16 values (computed as float), int32 values with many ties, and axis=None over a 2-D
    array (an ALL scan of the flat index)."""
    n = 3 * 16 * LANE_VECTORS + 5
    h, i = pn.placeholder((9, n), "float16", name="h"), pn.placeholder((6, n), "int32", name="i")
    f = pn.placeholder((7, 300), "float32", name="f")
    k = pn.compile([pn.argmax(h, axis=1), pn.argmin(i, axis=1), pn.argmax(i, axis=1), pn.argmax(f)], target="cpu")
    a = hard_rows(rng, n, "float16")
    b = rng.integers(-3, 3, (6, n)).astype(np.int32)
    b[0, :] = np.iinfo(np.int32).min  # the identity of max itself, everywhere: index 0
    c = random_array((7, 300), "float32", rng)
    c[4, 17] = c.max() + 1
    c[6, 2] = c[4, 17]
    got = k(a, b, c)
    np.testing.assert_array_equal(got[0], a.argmax(1))
    np.testing.assert_array_equal(got[1], b.argmin(1))
    np.testing.assert_array_equal(got[2], b.argmax(1))
    assert int(got[3]) == int(c.argmax()) == 4 * 300 + 17


@pytest.mark.parametrize("deterministic", [False, True])
def test_argmax_split_rows(deterministic, rng):
    """A row split in chunks across tasks: each chunk's lanes give its (value, first index) key;
    the keys merge as numpy's rule says, on 1 and 2 threads."""
    n = 4 * 4096 + 333
    x = pn.placeholder((2, n), "float32", name="x")
    k = pn.compile([pn.argmax(x, axis=1), pn.argmin(x, axis=1)], target="cpu", split=4, deterministic=deterministic)
    assert all(d.split >= 2 for d in k.decisions)
    a = random_array((2, n), "float32", rng)
    a[0, [100, 9000, n - 2]] = a[0].max() + 1  # tied across chunks: the first
    a[1, [7000, 12000]] = np.nan
    for threads in (1, 2):
        got = k(a, threads=threads)
        np.testing.assert_array_equal(got[0], a.argmax(1))
        np.testing.assert_array_equal(got[1], a.argmin(1))


@pytest.mark.parametrize("n", LENGTHS)
def test_lane_sums_and_max(n, rng):
    """Sums (float32 within the tolerance of n terms; int8 exact in int64), max and min with a
    NaN (propagated), a fused producer and two reductions in one scan."""
    x = pn.placeholder((5, n), "float32", name="x")
    i8 = pn.placeholder((5, n), "int8", name="i")
    y = pn.placeholder((5, n), "float32", name="y")
    outs = [pn.sum(x, axis=1), pn.max(x, axis=1), pn.min(x * 2.0 + 1.0, axis=1), pn.sum(i8, axis=1), pn.prod(y, axis=1)]
    k = pn.compile(outs, target="cpu")
    a = random_array((5, n), "float32", rng)
    a[2, n // 2] = np.nan
    b = rng.integers(-100, 100, (5, n)).astype(np.int8)
    q = random_array((5, n), "float32", rng, "prod")  # values near 1
    with np.errstate(invalid="ignore"):
        got = k(a, b, q)
    a64 = a.astype(np.float64)
    tol = tolerance("float32", n)
    ok = ~np.isnan(a64).any(1)
    np.testing.assert_allclose(got[0][ok], a64.sum(1)[ok], rtol=tol, atol=tol * float(np.abs(a64[ok]).sum(1).max()))
    assert np.isnan(got[0][2]) and np.isnan(got[1][2]) and np.isnan(got[2][2])
    np.testing.assert_array_equal(got[1], a.max(1))
    np.testing.assert_array_equal(got[2], (a * np.float32(2) + np.float32(1)).min(1))
    np.testing.assert_array_equal(got[3], b.sum(1))
    np.testing.assert_allclose(got[4], q.astype(np.float64).prod(1), rtol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lane_fold_nan_and_extreme_in_every_lane(dtype, rng):
    """The fold of the W lanes (cpu_lanes.LANE_FOLD, a tree of vector halves): a NaN in any one
    lane, first or not, makes max and min NaN; an extreme in any one lane is the result."""
    W = LANE_VECTORS * 64 // np.dtype(dtype).itemsize  # the lanes of a 64-byte vector, LANE_VECTORS of them
    n = 2 * W + 3  # two W-steps, then a tail
    x = pn.placeholder((3 * W, n), dtype, name="x")
    k = pn.compile([pn.max(x, axis=1), pn.min(x, axis=1)], target="cpu")
    a = random_array((3 * W, n), dtype, rng)
    for q in range(W):
        a[q, W + q] = np.nan  # row q: a NaN in lane q (the second W-step)
        a[W + q, q] = a[W + q].max() + 1  # row W + q: the maximum in lane q
        a[2 * W + q, W + q] = a[2 * W + q].min() - 1  # row 2W + q: the minimum in lane q
    got = k(a)
    np.testing.assert_array_equal(got[0], a.max(1))
    np.testing.assert_array_equal(got[1], a.min(1))
    assert np.isnan(got[0][:W]).all() and np.isnan(got[1][:W]).all()


def test_lane_fold_is_a_vector_tree():
    """Float and integer reductions fold their lanes with pn_fold_lanes (no scalar w-loop); a float
    max also folds its lanes' sums, its NaN watch (cpu_lanes.py)."""
    x = pn.placeholder((4, 300), "float32", name="x")
    i = pn.placeholder((4, 300), "int32", name="i")
    k = pn.compile([pn.max(x, axis=1), pn.sum(x, axis=1), pn.sum(i, axis=1)], target="cpu")
    src = "\n".join(c.source for c in k.cpu_kernels)
    assert src.count("pn_fold_lanes<") == 4 and "w /= 2" not in src


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_flagged_max_min_rescan_only_a_block_with_a_nan(dtype, rng):
    """Float max/min lanes step with a plain compare and watch for NaNs by a sum a lane
    (LaneKind.FLAGGED): a NaN in the first or the second 4096-block or only in the tail makes the
    row NaN; +-inf without a NaN (row 3: the sums' fold is inf - inf, a block scanned again for
    nothing) and a maximum in a later block than a NaN-free first block are exact; integers keep
    the plain lanes. Equal to numpy bit for bit (assert_array_equal: NaN == NaN)."""
    n = 2 * 4096 + 77
    x = pn.placeholder((8, n), dtype, name="x")
    k = pn.compile([pn.max(x, axis=1), pn.min(x, axis=1), pn.max(x.astype("int32"), axis=1)], target="cpu")
    src = "\n".join(c.source for c in k.cpu_kernels)
    assert src.count("pn_fold_lanes<pn_op_max_num") == 1 and src.count("pn_fold_lanes<pn_op_min_num") == 1
    a = random_array((8, n), dtype, rng)
    a[0, 100] = np.nan  # the first block only
    a[1, 5000] = np.nan  # the second block only
    a[2, n - 3] = np.nan  # the tail only
    a[3, [10, 6000]] = np.inf
    a[3, [20, 7000]] = -np.inf  # both infinities, no NaN
    a[4, :] = -np.inf
    a[5, 6000] = a[5].max() + 1  # the maximum in the second block
    a[5, 50] = a[5].min() - 1  # the minimum in the first
    a[6, :] = 0.0
    a[6, 1::2] = -0.0
    a[7, 4096:] = np.nan  # the second block and the tail all NaN
    with np.errstate(invalid="ignore"):
        got = k(a)
        ints = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0).astype(np.int32)
    np.testing.assert_array_equal(got[0], a.max(1))
    np.testing.assert_array_equal(got[1], a.min(1))
    assert np.isnan(got[0][[0, 1, 2, 7]]).all() and np.isnan(got[1][[0, 1, 2, 7]]).all()
    assert not np.isnan(got[0][[3, 4, 5, 6]]).any()
    ok = [3, 5, 6]  # rows whose int32 cast is defined
    np.testing.assert_array_equal(got[2][ok], ints[ok].max(1))


@pytest.mark.parametrize(("dtype", "lanes"), [("float32", 8), ("float16", 8), ("int32", 8)])
def test_arg_lanes_are_the_values_width(dtype, lanes):
    """An argmax/argmin's lanes (LaneKind.ARG) hold (value, 32-bit offset in the block): as many
    SIMD lanes as its value's register type (float16: float) has on a 256-bit machine, not its
    8-byte key's, and the offsets are `int` (schedule/cpu_mapper.py `_lanes`,
    codegen/cpu_lanes.py `_offset_type`)."""
    from panamera.codegen.cpu_kernel import render_cpu
    from panamera.compiler import lower
    from panamera.schedule.cpu_mapper import CpuMachine, map_cpu

    x = pn.placeholder((4, 9000), dtype, name="x")
    g = lower(pn.argmax(x, axis=1), target="cpu", stop_after="groups").groups[0]
    d = map_cpu(g, CpuMachine(2, 32, "x"))
    assert d.lanes == lanes
    src = render_cpu("k", g, d).source
    assert f"int pn_lj0[{LANE_VECTORS * lanes}]" in src and "long long pn_li" not in src


def test_avx512_decisions_compile_and_follow_numpy(monkeypatch, rng):
    """A 512-bit machine's decisions (16 float lanes, W = 64: the fold's first steps are wider
    than a 256-bit register) give numpy's results here, and their source builds with AVX-512
    enabled (PN_VEC_BYTES 64 in LANE_FOLD): max/min with NaNs, argmax/argmin with ties, sums."""
    from panamera.runtime import cpu as cpu_runtime
    from panamera.runtime import emulator
    from panamera.schedule.cpu_mapper import CpuMachine

    monkeypatch.setattr(CpuMachine, "detect", staticmethod(lambda: CpuMachine(2, 64, "AVX-512 stand-in")))
    n = 2 * 4096 + 77
    x, y = pn.placeholder((9, n), "float32", name="x"), pn.placeholder((3, n), "float64", name="y")
    outs = [pn.max(x, axis=1), pn.argmax(x, axis=1), pn.argmin(x, axis=1), pn.min(y, axis=1), pn.sum(y, axis=1)]
    k = pn.compile(outs, target="cpu", cache=False)  # a stand-in machine: kept out of the compile cache
    assert "lanes=16" in k.explain() and "lanes=8" in k.explain()
    a, b = hard_rows(rng, n, "float32"), random_array((3, n), "float64", rng)
    b[1, 5000] = np.nan
    got = k(a, b)
    np.testing.assert_array_equal(got[0], a.max(1))
    np.testing.assert_array_equal(got[1], a.argmax(1))
    np.testing.assert_array_equal(got[2], a.argmin(1))
    np.testing.assert_array_equal(got[3], b.min(1))
    tol = tolerance("float64", n)
    ok = b[[0, 2]]
    np.testing.assert_allclose(got[4][[0, 2]], ok.sum(1), rtol=tol, atol=tol * float(np.abs(ok).sum(1).max()))
    assert np.isnan(got[4][1])
    fl = tuple(f for f in cpu_runtime.flags() if not f.startswith("-l"))
    assert emulator._compile(k.cpu_source, (*fl, "-mavx512f", "-mavx512vl", "-mavx512dq", "-mavx512bw"), "cpu")
