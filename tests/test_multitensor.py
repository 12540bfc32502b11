"""Multi-tensor kernels (poly/multitensor.py, codegen/multitensor_kernel.py, panamera/multitensor.py):
the norms of a list of tensors of different shapes in ONE launch, against numpy float64."""

import math

import numpy as np
import pytest

from panamera.errors import DTypeError, LegalityError, OptionError
from panamera.multitensor import compile_norms
from panamera.poly.multitensor import MultiTensorSet, Piece

# ~20 tensors of mixed shapes, a few spanning several chunks of 2048
SHAPES = [(3,), (64, 33), (5000,), (7, 3, 5), (1,), (128,), (2, 2050), (9, 9), (300,), (4100,)]
SHAPES += [(17,), (8, 8, 8), (33, 65), (1000,), (2,), (250, 3), (6,), (2049,), (31, 31), (12, 1)]


def _arrays(rng, dtype):
    return [rng.standard_normal(s).astype(dtype) for s in SHAPES]


def _ref(xs, order):
    each = np.array([np.linalg.norm(x.astype(np.float64).ravel(), order) for x in xs])
    return np.linalg.norm(each, order), each


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("order", [2.0, 1.0, math.inf])
def test_norms_of_twenty_tensors_in_one_launch_float64(rng, deterministic, order):
    xs = _arrays(rng, np.float64)
    k = compile_norms(SHAPES, "float64", order, deterministic=deterministic, chunk=2048)
    assert k.launches == 1 and k.set.blocks > len(SHAPES)  # several blocks on the larger pieces
    total, each = k(*xs)
    ref_total, ref_each = _ref(xs, order)
    n = max(x.size for x in xs)
    eps = np.finfo(np.float64).eps
    # a sum of n terms in any order: n * eps relative to the sum of |terms| (norms: positive terms)
    np.testing.assert_allclose(each, ref_each, rtol=4 * n * eps, atol=0)
    np.testing.assert_allclose(total, ref_total, rtol=4 * sum(x.size for x in xs) * eps, atol=0)
    again = k(*xs)  # the resident workspace was reset by the last block
    np.testing.assert_allclose(again[0], total, rtol=4 * sum(x.size for x in xs) * eps)


def test_float32_with_derived_tolerance(rng):
    xs = _arrays(rng, np.float32)
    k = compile_norms(SHAPES, "float32", 2.0, chunk=2048)
    total, each = k(*xs)
    ref_total, ref_each = _ref(xs, 2.0)
    eps = float(np.finfo(np.float32).eps)
    chunk_terms = 2048 // 256 + 256 + k.set.blocks  # per-thread run, block tree, merges
    np.testing.assert_allclose(each, ref_each, rtol=2 * chunk_terms * eps)
    np.testing.assert_allclose(total, ref_total, rtol=2 * (chunk_terms + len(SHAPES)) * eps)


def test_deterministic_is_bitwise_across_thread_orders(rng):
    xs = _arrays(rng, np.float32)
    k = compile_norms(SHAPES, "float32", 2.0, deterministic=True, chunk=2048)
    runs = [k(*xs, order=o) for o in ("forward", "reverse", "shuffled", "forward")]
    for total, each in runs[1:]:
        assert total.tobytes() == runs[0][0].tobytes() and each.tobytes() == runs[0][1].tobytes()


def test_many_pieces_one_launch(rng):
    """GPT-2 small has 148 gradients: no 8-tensor cap here (a balanced lookup tree, no spill)."""
    shapes = [(int(s),) for s in rng.integers(1, 40, size=148)]
    xs = [rng.standard_normal(s) for s in shapes]
    k = compile_norms(shapes, "float64", 2.0)
    assert k.launches == 1 and k.set.blocks == 148
    total, each = k(*xs)
    ref_total, ref_each = _ref(xs, 2.0)
    np.testing.assert_allclose(each, ref_each, rtol=1e-13)
    np.testing.assert_allclose(total, ref_total, rtol=1e-13)


def test_model_chooses_the_chunk():
    small = compile_norms([(100,)] * 4, "float32")
    big = compile_norms([(1 << 20,)] * 4, "float32")
    assert small.set.blocks == 4 and big.set.chunk <= 65536 and big.set.blocks >= 64
    assert "MULTI_TENSOR pieces=4" in big.plan.kernels[0].mapping and big.modeled_us > small.modeled_us


def test_nvcc_sm80_sm90_no_spills():
    from panamera.runtime import nvcc

    try:
        nvcc.find_nvcc()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no nvcc: {e}")
    res = nvcc.compile_cuda(compile_norms(SHAPES, "float32", 2.0).source)
    res += nvcc.compile_cuda(compile_norms(SHAPES, "float64", 3.0, deterministic=True).source)
    assert {r.arch for r in res} == {"sm_80", "sm_90"}
    assert all(r.spill_stores == 0 and r.spill_loads == 0 for r in res), res


# -- preconditions (poly/multitensor.py), one negative test each --------------------------------
def test_precondition_1_no_or_empty_pieces():
    with pytest.raises(LegalityError, match="no tensors"):
        MultiTensorSet.of([], "float32", 256)
    with pytest.raises(LegalityError, match="precondition 1"):
        MultiTensorSet.of([("a", 4), ("b", 0)], "float32", 256)


def test_precondition_2_one_dtype():
    with pytest.raises(LegalityError, match="several dtypes"):
        MultiTensorSet((Piece("a", 4, "float32"), Piece("b", 4, "float64")), 256, (0, 1)).check()


def test_precondition_3_table_is_a_bijection():
    pieces = (Piece("a", 600, "float32"), Piece("b", 4, "float32"))
    with pytest.raises(LegalityError, match="not a bijection"):
        MultiTensorSet(pieces, 256, (0, 2)).check()  # b's block overlaps a's third chunk
    with pytest.raises(LegalityError, match="not a bijection"):
        MultiTensorSet(pieces, 256, (0, 4)).check()  # block 3 owns nothing
    assert MultiTensorSet(pieces, 256, (1, 0)).check().blocks == 4  # another order is fine


def test_precondition_4_parameter_space():
    with pytest.raises(LegalityError, match="4096"):
        MultiTensorSet.of([(f"t{k}", 4) for k in range(130)], "float32", 256, lists=4)


def test_precondition_5_int_indices():
    with pytest.raises(LegalityError, match="overflow int"):
        MultiTensorSet.of([("a", 2**31 - 10)], "float32", 65536)


def test_precondition_6_aligned_lists():
    a = MultiTensorSet.of([("p0", 4), ("p1", 9)], "float32", 256)
    b = MultiTensorSet.of([("g0", 4), ("g1", 8)], "float32", 256)
    with pytest.raises(LegalityError, match="not aligned"):
        a.check_aligned(b)


def test_bad_options():
    with pytest.raises(DTypeError, match="float16"):
        compile_norms([(4,)], "float16")
    with pytest.raises(OptionError, match="order 0"):
        compile_norms([(4,)], "float32", 0)


# -- through torch.compile (torch_backend/multitensor.py) ------------------------------------------
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_foreach_norm_of_twenty_tensors_is_one_launch_in_torch(rng, deterministic):
    """`_foreach_norm` alone (it stayed eager before: no Panamera formulation): one multi-tensor
    launch, float64 against eager. (The total norm: tests/test_torch_training_ops.py, clip.)"""
    import warnings

    import torch

    import panamera.torch_backend as tb

    ts = [torch.from_numpy(x) for x in _arrays(rng, np.float64)]

    def norms(ts):
        return torch._foreach_norm(ts, 2.0)

    tb.reset_stats()
    f = torch.compile(norms, backend="panamera", options={"target": "emulator", "deterministic": deterministic})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        each = f(ts)
    ref_each = norms(ts)
    eps = np.finfo(np.float64).eps
    n = sum(t.numel() for t in ts)
    torch.testing.assert_close(torch.stack(list(each)), torch.stack(list(ref_each)), rtol=4 * n * eps, atol=0)
    (r,) = tb.stats().reports
    kernels = [s for s in r.subgraphs if s.kernels]
    assert sum(s.kernels for s in kernels) == 1 and not r.eager, (r.subgraphs, r.eager)
