"""Stitched row groups split across co-resident blocks (few long rows: LLM sampling).

A stitched group whose rows cannot fill the GPU is split along the row (schedule/mapping.py,
`_map_stitched`); its blocks exchange partials through a grid-wide wait after each pass with
reductions (codegen/stitched_kernel.py), in one cooperative launch (runtime/plan.py `Launch.
cooperative`), which the emulator runs with every block resident (runtime/cuda_emulation.h).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from conftest import np_dtype

import panamera as pn
from panamera.errors import BackendError
from panamera.model import H100, estimate
from panamera.runtime.executor import Executor
from panamera.schedule.mapping import co_resident, map_group

ORDERS = ("forward", "reverse", "shuffled")


def _softmax64(a):
    e = np.exp(a - a.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _lse64(a):
    m = a.max(1, keepdims=True)
    return (np.log(np.exp(a - m).sum(1, keepdims=True)) + m)[:, 0]


def case(op: str, shape, dtype: str, rng):
    """The op's outputs, its inputs, and numpy's float64 result."""
    x = pn.placeholder(shape, dtype, name="x")
    a = (rng.standard_normal(shape) * 3).astype(np_dtype(dtype))
    a64 = a.astype(np.float64)
    n = shape[1]
    if op == "softmax":
        return pn.nn.softmax(x), [a], _softmax64(a64)
    if op == "log_softmax":
        return pn.nn.log_softmax(x), [a], a64 - _lse64(a64)[:, None]
    if op == "logsumexp":
        return pn.nn.logsumexp(x, axis=1), [a], _lse64(a64)
    if op in ("cross_entropy", "cross_entropy_multipass"):  # the model's formulation, or a max pass then a sum pass
        t = rng.integers(0, n, shape[0]).astype(np.int64)
        method = "multipass" if op.endswith("multipass") else "auto"
        out = pn.nn.cross_entropy(x, pn.placeholder((shape[0],), "int64", name="t"), reduction="none", method=method)
        return out, [a, t], _lse64(a64) - a64[np.arange(shape[0]), t]
    if op == "layer_norm":
        g = rng.standard_normal(n).astype(a.dtype)
        b = rng.standard_normal(n).astype(a.dtype)
        out = pn.nn.layer_norm(x, pn.placeholder((n,), dtype, name="g"), pn.placeholder((n,), dtype, name="b"))
        mu, var = a64.mean(1, keepdims=True), a64.var(1, keepdims=True)
        return out, [a, g, b], (a64 - mu) / np.sqrt(var + 1e-5) * g.astype(np.float64) + b.astype(np.float64)
    if op == "rms_norm":
        g = rng.standard_normal(n).astype(a.dtype)
        out = pn.nn.rms_norm(x, pn.placeholder((n,), dtype, name="g"))
        return out, [a, g], a64 / np.sqrt((a64 * a64).mean(1, keepdims=True) + 1e-6) * g.astype(np.float64)
    raise ValueError(op)


def tolerance(dtype: str, n: int) -> float:
    """Relative error of a row op over n values: the result's rounding (2 ulps of its dtype)
    plus float32 accumulation over the row (sqrt(n) growth, a factor 8 of headroom) and the
    transcendentals' few ulps."""
    eps = {"float16": 2**-10, "bfloat16": 2**-7, "float32": 2**-23}[dtype]
    return 2 * eps + 2**-23 * (8 * n**0.5 + 16)


def assert_close(out, ref, dtype, n):
    tol = tolerance(dtype, n)
    out = np.asarray(out).astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * float(np.abs(ref).max()))


def compile_split(outputs, split: int | None = None):
    """Compiled as the model plans it on an A100 (no thread-block clusters: the cooperative plan),
    or with its stitched group split `split` ways into a cooperative launch (a replayed schedule:
    the same validation as any saved one; tests/test_cluster.py splits into clusters)."""
    if split is None:
        return pn.compile(outputs, target="emulator", use_database=False, gpu="a100")
    k = pn.compile(outputs, target="emulator", use_database=False)
    kernels = tuple(
        map_group(g, k.gpu, split=split, cluster=False).decision if g.stitched else m.decision
        for g, m in zip(k.groups, k.mappings)
    )
    return pn.compile(outputs, target="emulator", schedule=dataclasses.replace(k.schedule, kernels=kernels))


def counters(k) -> list[int]:
    res = k.resident["emulator"]
    return [int(v) for key, a in res.items() if k.plan.buffers[key].role == "counter" for v in a]


def split_launch(k):
    (ln,) = [ln for ln in k.plan.per_call if ln.cooperative]
    return ln


CASES = [
    ("softmax", (1, 32768), "float32", None),  # the model splits it
    ("softmax", (2, 8192), "bfloat16", 8),
    ("log_softmax", (2, 8192), "float32", 4),
    ("logsumexp", (3, 8192), "float16", 8),
    ("cross_entropy", (2, 8192), "float32", 8),
    ("layer_norm", (1, 16384), "float32", 16),
    ("rms_norm", (2, 8192), "bfloat16", 4),
]


@pytest.mark.parametrize("op,shape,dtype,split", CASES, ids=[f"{c[0]}-{c[1][0]}x{c[1][1]}-{c[2]}" for c in CASES])
def test_split_rows_match_numpy_in_every_order(op, shape, dtype, split, rng):
    outputs, arrays, ref = case(op, shape, dtype, rng)
    k = compile_split(outputs, split)
    (m,) = [m for m in k.mappings if m.stitched]
    assert m.split > 1 and m.cooperative and len(k.plan.per_call) == 1, k.explain()
    assert split_launch(k).grid[1] == m.split
    for order in ORDERS:
        assert_close(k(*arrays, order=order, seed=11), ref, dtype, shape[1])
        assert set(counters(k)) == {0}  # the last block to depart reset the row's counters


def test_repeated_calls_leave_the_residents_at_zero(rng):
    outputs, arrays, ref = case("softmax", (3, 8192), "float32", rng)
    k = compile_split(outputs, 8)
    first = k(*arrays)
    for call in range(5):
        out = k(*arrays, order=ORDERS[call % 3], seed=call)
        assert np.array_equal(out, first)  # every block combines the partials in one fixed order
        assert set(counters(k)) == {0}
    assert_close(first, ref, "float32", 8192)


def test_partials_are_written_before_they_are_read(rng):
    """Stale partials (poisoned with NaN between calls) are never read: each exchange waits for
    every block of the row."""
    outputs, arrays, ref = case("log_softmax", (2, 8192), "float32", rng)
    k = compile_split(outputs, 8)
    k(*arrays)
    for order in ORDERS:
        for key, buf in k.resident["emulator"].items():
            if k.plan.buffers[key].role == "partials":
                buf.view(np.float32)[:] = np.nan
        assert_close(k(*arrays, order=order, seed=5), ref, "float32", 8192)


def _broken(k, edit) -> Executor:
    """The same plan with its kernel source edited (a protocol broken on purpose)."""
    src, n = re.subn(r"pn_grid_sync\(&pn_counter\[bx\], (\d+)u\);", edit, k.source)
    assert n >= 1
    return Executor(k.plan, src, k.signatures, "emulator")


def test_the_emulator_sees_a_missing_wait(rng):
    outputs, arrays, ref = case("softmax", (2, 8192), "float32", rng)
    k = compile_split(outputs, 8)
    assert_close(k(*arrays), ref, "float32", 8192)
    ex = _broken(k, lambda mt: "__syncthreads();")  # no arrival, no wait: partials read too early
    ex(list(arrays))
    for key, buf in ex.resident["emulator"].items():
        if k.plan.buffers[key].role == "partials":
            buf.view(np.float32)[:] = np.nan  # what the other blocks have not written yet
    bad = ex(list(arrays), order="forward")
    assert not np.allclose(bad, ref, equal_nan=False)


def test_the_emulator_reports_a_wait_nobody_releases(rng):
    outputs, arrays, _ = case("softmax", (2, 8192), "float32", rng)
    k = compile_split(outputs, 8)
    ex = _broken(k, lambda mt: f"pn_grid_sync(&pn_counter[bx], {int(mt.group(1)) + 1}u);")
    with pytest.raises(BackendError, match="deadlock: every block waits at a grid-wide wait"):
        ex(list(arrays))
    assert "emulator" not in ex.resident  # a failed call starts over


def test_a_split_kernel_needs_a_cooperative_launch(rng):
    """Launched block after block (not all resident), the first block waits forever: the
    emulator reports it rather than hanging, as a GPU without the cooperative launch might."""
    outputs, arrays, _ = case("softmax", (2, 8192), "float32", rng)
    k = compile_split(outputs, 4)
    plain = dataclasses.replace(
        k.plan, launches=tuple(dataclasses.replace(ln, cooperative=False) for ln in k.plan.launches)
    )
    with pytest.raises(BackendError, match="deadlock"):
        Executor(plain, k.source, k.signatures, "emulator")(list(arrays))


def test_a_split_schedule_replays_byte_for_byte(rng):
    outputs, arrays, ref = case("cross_entropy", (2, 8192), "float32", rng)
    k = compile_split(outputs, 8)
    again = pn.compile(outputs, target="emulator", schedule=k.schedule)
    assert again.source == k.source and again.plan == k.plan
    assert_close(again(*arrays), ref, "float32", 8192)


# -- plans at full size: the model's choice ------------------------------------------------------
FULL = [
    ("softmax", (1, 131072), "float32"),
    ("log_softmax", (1, 131072), "float32"),
    ("softmax", (8, 128256), "float32"),
    ("softmax", (8, 128256), "bfloat16"),
    ("logsumexp", (8, 128256), "float32"),
    ("cross_entropy", (8, 128256), "float32"),
    ("layer_norm", (1, 131072), "float32"),
    ("rms_norm", (8, 128256), "bfloat16"),
    ("softmax", (32, 30522), "float32"),  # 64 rows of 30522: the calibrated model keeps whole rows
]


@pytest.mark.parametrize("op,shape,dtype", FULL, ids=[f"{c[0]}-{c[1][0]}x{c[1][1]}-{c[2]}" for c in FULL])
def test_long_rows_are_one_split_launch_at_full_size(op, shape, dtype):
    x = pn.placeholder(shape, dtype, name="x")
    n = shape[1]
    build = {
        "softmax": lambda: pn.nn.softmax(x),
        "log_softmax": lambda: pn.nn.log_softmax(x),
        "logsumexp": lambda: pn.nn.logsumexp(x, axis=1),
        "cross_entropy": lambda: pn.nn.cross_entropy(x, pn.placeholder((shape[0],), "int64"), reduction="none"),
        "layer_norm": lambda: pn.nn.layer_norm(x, pn.placeholder((n,), dtype), pn.placeholder((n,), dtype)),
        "rms_norm": lambda: pn.nn.rms_norm(x, pn.placeholder((n,), dtype)),
    }[op]
    k = pn.compile(build(), target="emulator", use_database=False)
    (m,) = k.mappings
    assert m.stitched and m.split > 1 and len(k.plan.per_call) == 1, k.explain()
    # on sm_90 the split row is one thread-block cluster (tests/test_cluster.py), else cooperative
    assert m.cluster == m.split or (m.cooperative and m.blocks <= co_resident(H100, m.threads))
    assert ("clusters of" if m.cluster > 1 else "cooperative") in k.explain() and "split across" in k.explain()
    (considered,) = k.considered
    assert considered.chosen and considered.stitched_us < considered.whole_rows_us
    e = estimate(k.plan, H100)
    print(f"{op} {shape} {dtype}: {m.describe()}: {e.total_us:.2f} us modeled, limit {e.limit_us:.2f} us "
          f"({e.ratio_to_limit:.2f}x); whole rows {considered.whole_rows_us:.2f} us, "
          f"unfused {considered.unfused_us:.2f} us in {considered.unfused_kernels} kernels")  # fmt: skip


def test_many_rows_keep_whole_rows_per_block():
    """Rows that fill the GPU need no exchange: the model keeps whole rows per block."""
    k = pn.compile(pn.nn.softmax(pn.placeholder((4096, 4096), "float32")), target="emulator", use_database=False)
    (m,) = k.mappings
    assert m.stitched and m.split == 1 and not k.plan.per_call[0].cooperative


def test_the_model_charges_grid_wide_waits():
    """T_sync, worked by hand: two waits at two L2 round trips (270 cycles) each, plus 1000 cycles
    of the kernel's own, at 1.98 GHz; and the passes add DRAM and L2 times instead of overlapping."""
    from panamera.model.kernel_cost import kernel_time

    base = dict(dram_bytes=64 << 20, blocks=264, threads=256, bytes_in_flight_per_thread=64, l2_bytes=32 << 20)
    plain = kernel_time(H100, **base)
    waits = kernel_time(H100, **base, grid_syncs=2, sync_cycles=1000)
    assert waits.sync_s == pytest.approx((2 * 2 * 270 + 1000) / 1.98e9)
    assert plain.total_s == pytest.approx(plain.launch_s + max(plain.dram_s, plain.l2_s) + plain.tail_s)
    assert waits.total_s == pytest.approx(waits.launch_s + waits.dram_s + waits.l2_s + waits.tail_s + waits.sync_s)
    assert dict(waits.features)["grid_syncs"] == 2 and "grid_syncs" not in dict(plain.features)
