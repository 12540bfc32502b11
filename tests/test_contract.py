"""Contractions (issue 13, item 1): pn.matmul / pn.einsum against numpy in float64 on the emulator.

Tolerances are derived, never blanket: a dot product of K terms accumulated in precision u_acc
errs by at most gamma_K = K u / (1 - K u) times sum |a_k b_k| (Higham, Accuracy and Stability,
3.1), plus one rounding of the stored result in its dtype (u_out |ref|). Exact for integers.
"""

import ml_dtypes
import numpy as np
import pytest

import panamera as pn
from panamera.frontend.contract import memory_order
from panamera.model.gpu import H100

U = {"float32": 2.0**-24, "float64": 2.0**-53, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def bound(a, b, sub: str, acc: str, out: str) -> np.ndarray:
    """gamma_K * sum|a b| + u_out |ref| + a denormal's worth, elementwise over the result."""
    mag = np.einsum(sub, np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    k = max(1, a.size * b.size // max(1, mag.size))  # terms per output, an upper bound of K
    k = min(k, max(a.shape + b.shape + (1,)))
    gamma = k * U[acc] / (1 - k * U[acc])
    ref = np.einsum(sub, a.astype(np.float64), b.astype(np.float64))
    return gamma * mag + U.get(out, 0.0) * np.abs(ref) + 1e-30


def array(shape, dtype, rng):
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype.startswith(("int", "uint")):
        lo = 0 if dtype.startswith("uint") else -100
        return rng.integers(lo, 100, shape).astype(dtype)
    npd = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return rng.standard_normal(shape).astype(npd)


def run(y, *arrays, **kw):
    return pn.compile(y, target="emulator", **kw)(*arrays)


MATMUL_SHAPES = [
    ((4, 64), (64, 32)),
    ((4, 64), (64,)),
    ((64,), (64, 32)),
    ((64,), (64,)),
    ((3, 1, 4, 16), (2, 16, 8)),
    ((2, 5, 16), (16,)),
    ((1, 300), (300, 7)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul_shapes_and_broadcasting(sa, sb, rng):
    a, b = array(sa, "float32", rng), array(sb, "float32", rng)
    y = pn.placeholder(sa, name="a") @ pn.placeholder(sb, name="b")
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert y.shape == ref.shape
    out = run(y, a, b)
    assert out.shape == ref.shape and out.dtype == np.float32
    sub = "...k,kn->...n" if len(sb) > 1 and len(sa) > 1 else None
    if sub is None:
        assert np.allclose(out, ref, rtol=len(sa) * 64 * U["float32"] * 8, atol=64 * 64 * U["float32"])
    else:
        # batch broadcasting: the bound of each output from its own terms
        tol = 200 * U["float32"] * np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
        assert (np.abs(out - ref) <= tol + 1e-30).all()


EINSUMS = [
    ("mk,nk->mn", (4, 64), (32, 64)),
    ("bhd,bnd->bhn", (2, 8, 16), (2, 100, 16)),
    ("bhn,bnd->bhd", (2, 8, 100), (2, 100, 16)),
    ("ij,jk", (8, 16), (16, 4)),
    ("...d,d", (2, 8, 16), (16,)),
    ("ij,ij->", (8, 16), (8, 16)),
    ("i,j->ij", (8,), (16,)),
    ("kn,mk->nm", (32, 16), (4, 32)),
]


@pytest.mark.parametrize("sub,sa,sb", EINSUMS)
def test_einsum_matches_numpy(sub, sa, sb, rng):
    a, b = array(sa, "float32", rng), array(sb, "float32", rng)
    y = pn.einsum(sub, pn.placeholder(sa, name="a"), pn.placeholder(sb, name="b"))
    out = run(y, a, b)
    ref = np.einsum(sub, a.astype(np.float64), b.astype(np.float64))
    assert out.shape == ref.shape
    assert (np.abs(out - ref) <= bound(a, b, sub, "float32", "float32")).all()


def test_einsum_one_and_three_operands(rng):
    a = array((4, 5, 6), "float32", rng)
    out = run(pn.einsum("ijk->ki", pn.placeholder((4, 5, 6), name="a")), a)
    assert np.allclose(out, np.einsum("ijk->ki", a.astype(np.float64)), rtol=1e-6, atol=1e-6)
    xs = [array(s, "float64", rng) for s in [(4, 8), (8, 6), (6, 3)]]
    ts = [pn.placeholder(s, "float64") for s in [(4, 8), (8, 6), (6, 3)]]
    out = run(pn.einsum("ab,bc,cd->ad", *ts), *xs)
    assert np.allclose(out, xs[0] @ xs[1] @ xs[2], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("da,db", [("float16", "float16"), ("bfloat16", "bfloat16"), ("float64", "float64"),
                                   ("int8", "int8"), ("uint8", "uint8"), ("int32", "int32"), ("bool", "bool"),
                                   ("int8", "float32")])  # fmt: skip
def test_matmul_dtypes_follow_numpy(da, db, rng):
    a, b = array((4, 40), da, rng), array((40, 8), db, rng)
    y = pn.placeholder((4, 40), da) @ pn.placeholder((40, 8), db)
    out = run(y, a, b)
    if "bfloat16" in (da, db):
        assert out.dtype == ml_dtypes.bfloat16
    else:
        with np.errstate(over="ignore"):
            ref_native = np.matmul(a, b)
        assert out.dtype == ref_native.dtype
        if not ref_native.dtype.kind == "f":  # integers wrap as numpy's, bool is any(a & b): exact
            assert (out == ref_native).all()
            return
    res = out.dtype.name if da == db else "float32"
    acc = "float64" if res == "float64" else "float32"
    tol = bound(a, b, "mk,kn->mn", acc, res)
    assert (np.abs(out.astype(np.float64) - np.matmul(a.astype(np.float64), b.astype(np.float64))) <= tol).all()


def test_iteration_order_follows_the_streamed_operands_storage():
    x = pn.placeholder((4, 256), "float16", name="x")
    w_nk = pn.placeholder((128, 256), "float16", name="w_nk")  # torch Linear weight: K contiguous
    w_kn = pn.placeholder((256, 128), "float16", name="w_kn")  # K x N: N contiguous
    rows = pn.compiler.lower(x @ w_nk.T, stop_after="program", target="emulator").program
    cols = pn.compiler.lower(x @ w_kn, stop_after="program", target="emulator").program
    assert rows.statements[0].form == "ROW" and cols.statements[0].form == "COLUMN"
    assert memory_order(w_nk.T) == (1, 0) and memory_order(w_kn) == (0, 1)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("weights", ["nk", "kn"])
def test_split_k(weights, deterministic, rng):
    """Few outputs, long K: K split across blocks, merged by atomics or by the last block."""
    K, N = 8192, 8
    x = pn.placeholder((2, K), "float32", name="x")
    w = pn.placeholder((N, K) if weights == "nk" else (K, N), "float32", name="w")
    y = x @ (w.T if weights == "nk" else w)
    k = pn.compile(y, target="emulator", deterministic=deterministic, split=8)
    assert k.plan.kernels[0].blocks_per_reduction >= 2
    X, W = array((2, K), "float32", rng), array(w.shape, "float32", rng)
    Wm = W.T if weights == "nk" else W
    ref = X.astype(np.float64) @ Wm.astype(np.float64)
    tol = bound(X, Wm, "mk,kn->mn", "float32", "float32")
    outs = [k(X, W, order=o) for o in ("forward", "shuffled")]
    for out in outs:
        assert (np.abs(out - ref) <= tol).all()
    if deterministic:
        assert outs[0].tobytes() == outs[1].tobytes()
        assert all(m == "partials" for m in k.plan.kernels[0].modes)
    else:
        assert all(m == "atomic_ws" for m in k.plan.kernels[0].modes)


def dequant_reference(q, scale, group):
    s = np.repeat(scale.astype(np.float64), group, axis=1) if group else scale.astype(np.float64)[:, None]
    return q.astype(np.float64) * s


@pytest.mark.parametrize("group", [0, 32])
def test_int8_weights_dequantized_in_registers(group, rng):
    """y = x @ (w_int8 * scale).T with per-channel (group 0) or per-group scales; one kernel."""
    M, N, K = 3, 64, 256
    x = pn.placeholder((M, K), "float16", name="x")
    w = pn.placeholder((N, K), "int8", name="w")
    sshape = (N, K // group) if group else (N,)
    sc = pn.placeholder(sshape, "float16", name="scale")
    if group:
        wd = (w.reshape(N, K // group, group).astype("float32") * sc.reshape(N, K // group, 1)).reshape(N, K)
    else:
        wd = w.astype("float32") * sc.reshape(N, 1)
    y = x @ wd.T
    k = pn.compile(y, target="emulator")
    assert len(k.plan.kernels) == 1 and y.dtype.name == "float32"
    X, Q = array((M, K), "float16", rng), array((N, K), "int8", rng)
    S = (rng.random(sshape) * 0.01).astype(np.float16)
    Wd = dequant_reference(Q, S, group)
    out = k(X, Q, S)
    assert (np.abs(out - X.astype(np.float64) @ Wd.T) <= bound(X, Wd.T, "mk,kn->mn", "float32", "float32")).all()


def int4_weight(N, K, G, rng):
    """Two int4 weights per uint8 (low nibble = even k), zero point 8, fp16 scales per group of G:
    the placeholders, the dequantized weight as a Panamera expression, and the float64 arrays
    (packed, scales, dequantized) of one random draw."""
    packed = pn.placeholder((N, K // 2), "uint8", name="packed")
    sc = pn.placeholder((N, K // G), "float16", name="scale")
    lo = (packed & 0xF).astype("float32") - 8.0
    hi = ((packed >> 4) & 0xF).astype("float32") - 8.0
    # interleave: k = 2 c + (0 for lo, 1 for hi), as a broadcast over a new axis
    nib = pn.where(pn.arange(2).reshape(1, 1, 2) == 0, lo.reshape(N, K // 2, 1), hi.reshape(N, K // 2, 1))
    wd = (nib.reshape(N, K // G, G) * sc.reshape(N, K // G, 1).astype("float32")).reshape(N, K)
    P = rng.integers(0, 256, (N, K // 2)).astype(np.uint8)
    S = (rng.random((N, K // G)) * 0.01).astype(np.float16)
    q = np.stack([(P & 0xF).astype(np.float64) - 8, ((P >> 4) & 0xF).astype(np.float64) - 8], axis=2).reshape(N, K)
    return wd, P, S, dequant_reference(q, S, G)


def test_int4_nibbles_unpacked_in_registers(rng):
    """Two int4 weights per uint8 (low nibble = even k), zero point 8, per-group fp16 scales."""
    M, N, K, G = 2, 32, 256, 128
    x = pn.placeholder((M, K), "float16", name="x")
    wd, P, S, Wd = int4_weight(N, K, G, rng)
    y = pn.einsum("mk,nk->mn", x, wd)
    X = array((M, K), "float16", rng)
    k = pn.compile(y, target="emulator")
    assert len(k.plan.kernels) == 1
    out = k(X, P, S)
    assert (np.abs(out - X.astype(np.float64) @ Wd.T) <= bound(X, Wd.T, "mk,kn->mn", "float32", "float32")).all()


def test_epilogue_bias_activation_residual(rng):
    """relu(x @ W.T + bias) + residual: the epilogue is stitched to the contraction (one kernel)."""
    M, N, K = 4, 128, 256
    x, w = pn.placeholder((M, K), "float32", name="x"), pn.placeholder((N, K), "float32", name="w")
    bias, res = pn.placeholder((N,), "float32", name="bias"), pn.placeholder((M, N), "float32", name="res")
    z = pn.maximum(x @ w.T + bias, 0.0) + res
    k = pn.compile(z, target="emulator")
    assert len(k.plan.kernels) == 1
    X, W, B, R = (array(s, "float32", rng) for s in [(M, K), (N, K), (N,), (M, N)])
    mm = X.astype(np.float64) @ W.T.astype(np.float64)
    ref = np.maximum(mm + B, 0) + R
    tol = bound(X, W.T, "mk,kn->mn", "float32", "float32") + 3 * U["float32"] * (np.abs(mm) + np.abs(B) + np.abs(R))
    assert (np.abs(k(X, W, B, R) - ref) <= tol).all()


def test_bit_operations_follow_numpy(rng):
    q = pn.placeholder((8, 64), "int8", name="q")
    u = pn.placeholder((8, 64), "uint8", name="u")
    ys = [(q >> 2) + q, (u >> 4) & 0xF, u << 1, (u | 1) ^ 3, q.sum(axis=1), q.max(axis=1)]
    Q, Uu = array((8, 64), "int8", rng), array((8, 64), "uint8", rng)
    outs = pn.compile(ys, target="emulator")(Q, Uu)
    with np.errstate(over="ignore"):
        refs = [(Q >> 2) + Q, (Uu >> 4) & 0xF, Uu << 1, (Uu | 1) ^ 3, Q.sum(axis=1), Q.max(axis=1)]
    for o, r in zip(outs, refs):
        assert o.dtype == r.dtype and (o == r).all()


# -- clear errors: one negative test per precondition of frontend/contract.py -------------------
def test_operand_must_be_a_tensor():
    with pytest.raises(pn.DTypeError, match="operand 1"):
        pn.matmul(pn.placeholder((2, 3)), np.ones((3, 2)))


def test_contracted_axes_must_agree():
    with pytest.raises(pn.ShapeError, match=r"'a'.*axis -1 has 3.*'b'.*axis -2 has 4"):
        pn.matmul(pn.placeholder((2, 3), name="a"), pn.placeholder((4, 5), name="b"))
    with pytest.raises(pn.ShapeError, match=r"axis 0 of 'b' \('j'\) has extent 4"):
        pn.einsum("ij,jk->ik", pn.placeholder((2, 3), name="a"), pn.placeholder((4, 5), name="b"))


def test_repeated_label_is_refused():
    with pytest.raises(pn.AxisError, match="repeats in operand 0"):
        pn.einsum("ii,ij->j", pn.placeholder((3, 3), name="a"), pn.placeholder((3, 2)))


def test_dtypes_must_promote():
    with pytest.raises(pn.DTypeError, match="matmul of 'a' and 'b'"):
        pn.matmul(pn.placeholder((2, 3), "bfloat16", name="a"), pn.placeholder((3, 2), "float16", name="b"))


def test_subscripts_errors():
    a = pn.placeholder((2, 3), name="a")
    with pytest.raises(pn.ShapeError, match="2 subscript terms for 1 operands"):
        pn.einsum("ij,jk->ik", a)
    with pytest.raises(pn.ShapeError, match="subscripts 'ijk' name 3"):
        pn.einsum("ijk->i", a)
    with pytest.raises(pn.AxisError, match="output label 'z'"):
        pn.einsum("ij->z", a)
    with pytest.raises(pn.ShapeError, match="scalar"):
        pn.matmul(a, pn.placeholder(()))


def test_bit_operations_need_integers():
    with pytest.raises(pn.DTypeError, match="integer operands"):
        pn.placeholder((2,), "float32", name="f") >> 1
    with pytest.raises(pn.DTypeError, match="uint64"):
        pn.sum(pn.placeholder((2,), "uint8"))


# -- full-size plans: modeled, never run -------------------------------------------------------
def plan(y, **kw):
    a = pn.compiler.lower(y, stop_after="mappings", target="emulator", **kw)
    return a.groups[0], a.mappings[0]


def test_few_outputs_split_k_across_blocks():
    """8 outputs cannot fill 132 SMs: K = 131072 is split, merged by one atomic per block per
    output, or by partials and the last block when deterministic."""
    x, w = pn.placeholder((1, 131072), name="x"), pn.placeholder((8, 131072), name="w")
    _, m = plan(x @ w.T)
    assert m.split >= 16 and all(mode == "atomic_ws" for mode in m.merges)
    _, m = plan(x @ w.T, deterministic=True)
    assert m.split >= 16 and all(mode == "partials" for mode in m.merges)


def test_gemv_plan_streams_the_weights_near_the_limit():
    from panamera.model import estimate

    x, w = pn.placeholder((1, 4096), "float16", name="x"), pn.placeholder((4096, 4096), "float16", name="w")
    k = pn.compile(x @ w.T, target="emulator", use_database=False)
    e = estimate(k.plan, H100)
    assert e.ratio_to_limit <= 1.15 and k.mappings[0].vec == 8  # 16-byte loads of the weights


def test_explain_gives_both_figures_and_the_verdict():
    from panamera.compiler import contraction_lines

    big = pn.placeholder((4096, 4096), "float16") @ pn.placeholder((4096, 4096), "float16")
    line = contraction_lines(*plan(big), H100)[0]
    assert "compute-bound" in line and "the library is modeled faster" in line and "cuBLAS roofline" in line
    gemv = pn.placeholder((1, 4096), "float16") @ pn.placeholder((4096, 4096), "float16", name="w").T
    line = contraction_lines(*plan(gemv), H100)[0]
    assert "memory-bound" in line and "Panamera is modeled faster" in line
