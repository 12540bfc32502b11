"""Multi-tensor kernels (poly/multitensor.py, codegen/multitensor_kernel.py, panamera/multitensor.py):
the norms of a list of tensors of different shapes in ONE launch, against numpy float64."""

import math
import re

import numpy as np
import pytest

from panamera.codegen.multitensor_kernel import MapList
from panamera.errors import DTypeError, LegalityError, OptionError
from panamera.multitensor import compile_map, compile_norms
from panamera.poly.multitensor import MultiTensorSet, Piece

# ~20 tensors of mixed shapes, a few spanning several chunks of 2048
SHAPES = [(3,), (64, 33), (5000,), (7, 3, 5), (1,), (128,), (2, 2050), (9, 9), (300,), (4100,)]
SHAPES += [(17,), (8, 8, 8), (33, 65), (1000,), (2,), (250, 3), (6,), (2049,), (31, 31), (12, 1)]


# an AdamW-like list set: params, grads, the two moments, 0-d float32 steps -> 4 output lists
ADAM = (
    MapList("p", "double"),
    MapList("g", "double"),
    MapList("m", "double"),
    MapList("v", "double"),
    MapList("t", "float", scalar=True),
    MapList("t1", "float", True, "t + 1.0f", output=True),
    MapList("m1", "double", False, "m + 0.1 * (g - m)", output=True),
    MapList("v1", "double", False, "0.999 * v + 0.001 * g * g", output=True),
    MapList("c2", "float", True, "sqrtf(1.0f - powf(0.999f, t1))"),
    MapList(
        "p1", "double", False, "p * 0.999 - 0.01 * m1 / (1.0f - powf(0.9f, t1)) / (sqrt(v1) / c2 + 1e-8)", output=True
    ),
)


def test_adamw_like_map_against_numpy(rng):
    shapes = [(5, 3), (7,), (1,), (300,)]
    ins = {n: [rng.standard_normal(s) for s in shapes] for n in "pgm"}
    ins["v"] = [rng.random(s) for s in shapes]
    ins["t"] = [np.array(3.0, np.float32) for _ in shapes]
    k = compile_map(shapes, ADAM, chunk=256)
    assert k.launches == 1 and k.sets[0].blocks == 1 + 1 + 1 + 2
    out = k(*(a for n in "pgmvt" for a in ins[n]))
    t1, m1, v1, p1 = (out[j * len(shapes) : (j + 1) * len(shapes)] for j in range(4))
    eps = np.finfo(np.float64).eps
    for i in range(len(shapes)):
        p, g, m, v = (ins[n][i] for n in "pgmv")
        assert float(t1[i]) == 4.0 and t1[i].shape == ()
        np.testing.assert_allclose(m1[i], m + 0.1 * (g - m), rtol=4 * eps, atol=4 * eps)
        np.testing.assert_allclose(v1[i], 0.999 * v + 0.001 * g * g, rtol=4 * eps)
        c2 = np.sqrt(np.float32(1) - np.float32(0.999) ** np.float32(4))  # float32, as the kernel
        want = p * 0.999 - 0.01 * m1[i] / (1.0 - np.float32(0.9) ** np.float32(4)) / (np.sqrt(v1[i]) / c2 + 1e-8)
        np.testing.assert_allclose(p1[i], want, rtol=64 * eps)


def test_a_map_writes_in_place(rng):
    """An output list `into` an input list: the kernel writes the caller's arrays (the results
    are those arrays), under every thread order; one negative test per rule (a)-(d)."""
    shapes = [(5, 3), (700,), (1,)]
    lists = (MapList("p", "double"), MapList("g", "double"), MapList("r", "double", False, "p - 0.5 * g", True, "p"))
    k = compile_map(shapes, lists, chunk=256)
    for order in ("reverse", "shuffled"):
        p, g = [rng.standard_normal(s) for s in shapes], [rng.standard_normal(s) for s in shapes]
        want = [a - 0.5 * b for a, b in zip(p, g)]
        out = k(*p, *g, order=order, seed=4)
        assert [o.ctypes.data for o in out] == [a.ctypes.data for a in p]
        for a, w in zip(p, want):
            np.testing.assert_array_equal(a, w)  # one rounding, as numpy's
    t = MapList("t", "float", scalar=True)
    bad = {
        "(a)": (lists[:2] + (MapList("r", "double", False, "p - g", True, "q"),)),
        "(b)": (t, MapList("t1", "float", True, "t + 1.0f", True, "t")),
        "(c)": (MapList("f", "float"), MapList("r", "double", False, "f * 2.0", True, "f")),
        "(d)": lists + (MapList("s", "double", False, "p + g", True, "p"),),
    }
    for rule, case in bad.items():
        with pytest.raises(LegalityError, match=re.escape(rule)):
            compile_map(shapes, case)


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
    res += nvcc.compile_cuda(compile_map([(k * 31 + 1,) for k in range(40)], ADAM).source)  # 40 x 9 pointers
    in_place = tuple(MapList(m.name, m.ctype, m.scalar, m.expr, m.output, m.name[0] if m.name in ("m1", "v1", "p1") else "")
                     for m in ADAM)  # fmt: skip
    res += nvcc.compile_cuda(compile_map([(k * 31 + 1,) for k in range(40)], in_place).source)
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


# -- a foreach optimizer step in one launch (torch_backend/foreach_map.py) -------------------------
def _mlp():
    import torch

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3)).double()
    m(torch.randn(4, 6, dtype=torch.float64)).square().sum().backward()
    return m


def test_adamw_step_is_one_launch_and_matches_torch():
    """torch.compile(opt.step) of a foreach AdamW: its 19 `_foreach_*` ops over params, grads,
    exp_avg, exp_avg_sq and the 0-d steps are ONE multi-tensor launch. In place: the launch writes
    the parameters and both moments into their own memory (data_ptr unchanged, no copy op left);
    the 0-d steps alone are copied back, by one `_foreach_copy_`. Two steps, float64: parameters
    and states match torch's own compiled step (aot_eager) within a few ulps, and eager's within
    the float32 step tensor's precision (the captured bias corrections are powers of a float32
    step: torch's capture, not Panamera's)."""
    import warnings

    import torch

    import panamera.torch_backend as tb

    models = [_mlp() for _ in range(3)]
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1, foreach=True) for m in models]
    tb.reset_stats()
    ours = torch.compile(opts[0].step, backend="panamera", options={"target": "emulator"})
    theirs = torch.compile(opts[1].step, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours(), theirs(), opts[2].step()  # the states exist after the first step
        where = [t.data_ptr() for p in models[0].parameters() for t in (p, *opts[0].state[p].values())]
        ours(), theirs(), opts[2].step()
    assert [t.data_ptr() for p in models[0].parameters() for t in (p, *opts[0].state[p].values())] == where
    eps64, eps32 = np.finfo(np.float64).eps, float(np.finfo(np.float32).eps)
    for p, q, e in zip(*(m.parameters() for m in models)):
        s, r, t = (o.state[x] for o, x in zip(opts, (p, q, e)))
        assert float(s["step"]) == float(r["step"]) == 2.0
        for key in ("exp_avg", "exp_avg_sq"):  # a few ops each: a few ulps of their magnitude
            torch.testing.assert_close(s[key], r[key], rtol=8 * eps64, atol=8 * eps64 * float(r[key].abs().max()))
        # the update lr * m_hat / (sqrt(v_hat) + eps) is O(lr): ~20 ops of float64 rounding
        torch.testing.assert_close(p, q, rtol=0, atol=32 * eps64 * (1 + float(q.detach().abs().max())))
        # against eager: the bias corrections' float32 rounding, relative eps32, on an O(lr) update
        # (1 - beta^t rounded in float32: relative eps32 * beta^t / (1 - beta^t); v's enters under a sqrt)
        rel = eps32 * (0.9**2 / (1 - 0.9**2) + 0.5 * 0.999**2 / (1 - 0.999**2))
        torch.testing.assert_close(p, e, rtol=0, atol=2 * 2 * 0.01 * rel + 32 * eps64)
    (r,) = [r for r in tb.stats().reports if r.subgraphs]
    assert [s.kernels for s in r.subgraphs] == [1], r.subgraphs
    # every op outside Panamera is listed: no copy_ is left but the steps' one _foreach_copy_
    assert [e.op for e in r.eager] == ["aten._foreach_copy_.default"], r.eager
    assert "aten._foreach_addcdiv.Scalar" in r.subgraphs[0].ops


def _fx(fn, *tensors):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*tensors)


def test_foreach_map_preconditions():
    """One negative test per precondition of torch_backend/foreach_map.py: the ops stay as they were."""
    import torch

    from panamera.torch_backend.foreach_map import lower_foreach_maps

    a, b, c = torch.ones(3), torch.ones(2, 2), torch.ones(5)
    cases = {
        "1. lists of several lengths": (
            lambda a, b: (torch._foreach_add([a], 1.0), torch._foreach_add([a, b], 1.0)),
            (a, b),
        ),
        "2. a list of computed tensors": (lambda a, b: torch._foreach_add([a * 2, b], 1.0), (a, b)),
        "3. a 16-bit list": (lambda a, b: torch._foreach_add([a, b], 1.0), (a.half(), b.half())),
        "3. element lists not aligned": (
            lambda a, b, c: (torch._foreach_add([a, b], 1.0), torch._foreach_add([c, b], 1.0)),
            (a, b, c),
        ),
    }
    for why, (fn, args) in cases.items():
        gm = _fx(fn, *args)
        before = [str(n.target) for n in gm.graph.nodes]
        assert lower_foreach_maps(gm, "emulator") == [], why
        assert [str(n.target) for n in gm.graph.nodes] == before, why
    ok = _fx(lambda a, b: torch._foreach_sqrt(torch._foreach_add([a, b], 1.0)), a, b)
    assert lower_foreach_maps(ok, "emulator")[0][2] == 1


def test_foreach_map_splits_a_long_list_into_launches():
    """300 tensors x 2 lists of pointers exceed one kernel's 4 KiB of parameters: two launches
    (groups of 252 and 48 pieces), as torch's multi_tensor_apply splits its lists."""
    import torch

    from panamera.torch_backend.foreach_map import lower_foreach_maps

    ts = [torch.full((k % 5 + 1,), float(k)) for k in range(300)]

    def fn(*ts):
        return torch._foreach_mul(list(ts), 0.5)

    gm = _fx(fn, *ts)
    ((_, _, launches, _),) = lower_foreach_maps(gm, "emulator")
    assert launches == 2
    for got, want in zip(gm(*ts), fn(*ts)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_write_back_of_the_mutations_left():
    """torch_backend/mutations.py: (1) a functional foreach op copied back into its own first list
    becomes its in-place overload, unless something reads that list after it; (2) copies that end
    the graph become one `_foreach_copy_`."""
    import torch

    from panamera.torch_backend.mutations import write_back

    def ops(fn, *tensors):
        gm = _fx(fn, *tensors)
        write_back(gm)
        return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]

    def scaled(a, b):
        new = torch.ops.aten._foreach_mul.Scalar([a, b], 0.5)
        a.copy_(new[0]), b.copy_(new[1])

    def read_after(a, b):
        new = torch.ops.aten._foreach_mul.Scalar([a, b], 0.5)
        s = a + 1  # reads a's old value after the op
        a.copy_(new[0]), b.copy_(new[1])
        return s

    def two(a, b):
        x, y = b * 2, b + 1
        a.copy_(x), b.copy_(y)

    def between(a, b):
        a.copy_(b * 2), b.copy_(b + 1)  # the add runs between the copies

    a, b = torch.ones(3), torch.ones(3)
    assert ops(scaled, a, b) == ["aten._foreach_mul_.Scalar"]
    assert "aten._foreach_mul_.Scalar" not in ops(read_after, a, b)
    assert ops(two, a, b) == ["aten.mul.Tensor", "aten.add.Tensor", "aten._foreach_copy_.default"]
    assert ops(between, a, b).count("aten.copy_.default") == 2
