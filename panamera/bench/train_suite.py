"""The `training` suite (docs/WORKLOADS.md D; issue 23 item 3): backward-pass reductions written as
torch's decompositions write them, from what the forward saved, so Panamera plans exactly the graph
AOTAutograd hands it. Each workload carries its `Backward` description, which the training peers
(train_peers.py) plan from their own rules: the generic peers of peers.py read a graph's reductions
only, and would count neither dx's write nor the second tensor a backward reads.

>>> ws = training()
>>> len(ws), sorted({w.backward.pattern.value for w in ws if w.backward})[:3]
(35, ['batch_norm', 'cross_entropy', 'embedding'])
"""

from __future__ import annotations

from ..frontend import ops
from ..frontend.scatter import scatter_add_rows
from ..frontend.tensor import placeholder as P
from ..frontend.tensor import where
from .suites import Workload
from .train_peers import Backward, Pattern

LIGER_ROWS = 4096
LIGER_N = (1024, 2048, 4096, 8192, 16384)  # Liger's benchmark shapes (4096 x 1K...16K)
LIGER_DTYPES = ("float32", "bfloat16")


def layer_norm_backward(M: int, N: int, dtype: str):
    """(dx, dgamma, dbeta) from x, dy, gamma and the saved fp32 mean and rstd (torch's decomposition
    of native_layer_norm_backward)."""
    x, dy, g = P((M, N), dtype, name="x"), P((M, N), dtype, name="dy"), P((N,), dtype, name="g")
    mean, rstd = P((M, 1), name="mean"), P((M, 1), name="rstd")
    xhat = (x.astype("float32") - mean) * rstd
    d32 = dy.astype("float32")
    wdy = d32 * g.astype("float32")
    c1 = ops.sum(wdy * xhat, axis=1, keepdims=True) / N
    c2 = ops.sum(wdy, axis=1, keepdims=True) / N
    dx = ((wdy - xhat * c1 - c2) * rstd).astype(dtype)
    return [dx, ops.sum(d32 * xhat, axis=0).astype(dtype), ops.sum(d32, axis=0).astype(dtype)]


def rms_norm_backward(M: int, N: int, dtype: str):
    """(dx, dgamma) from x, dy, gamma and the saved fp32 rstd."""
    x, dy, g, rstd = P((M, N), dtype, name="x"), P((M, N), dtype, name="dy"), P((N,), dtype, name="g"), P((M, 1), name="rstd")  # fmt: skip
    x32, d32 = x.astype("float32"), dy.astype("float32")
    gd = d32 * g.astype("float32")
    c = ops.sum(gd * x32, axis=1, keepdims=True) / N
    dx = (rstd * (gd - x32 * rstd * rstd * c)).astype(dtype)
    return [dx, ops.sum(d32 * x32 * rstd, axis=0).astype(dtype)]


def softmax_backward(M: int, N: int, dtype: str):
    """dx = y * (dy - sum(dy * y)) from the saved output y (_softmax_backward_data)."""
    y, dy = P((M, N), dtype, name="y"), P((M, N), dtype, name="dy")
    y32, d32 = y.astype("float32"), dy.astype("float32")
    return [(y32 * (d32 - ops.sum(d32 * y32, axis=1, keepdims=True))).astype(dtype)]


def cross_entropy_backward(M: int, N: int, dtype: str):
    """Mean cross-entropy's dx from the saved log-probabilities, as AOTAutograd decomposes it:
    nll_loss_backward (-dloss / M at each row's target), then _log_softmax_backward_data
    (g - exp(logp) * sum(g))."""
    logp, t, dloss = P((M, N), dtype, name="logp"), P((M, 1), "int64", name="t"), P((1, 1), name="dloss")
    g = where(ops.arange(N).astype("int64").reshape((1, N)) == t, -dloss / M, 0.0)
    return [(g - ops.exp(logp.astype("float32")) * ops.sum(g, axis=1, keepdims=True)).astype(dtype)]


def batch_norm_backward(shape: tuple[int, ...], channels_last: bool, dtype: str = "float32"):
    """Training BatchNorm's (dx, dgamma, dbeta) from x, dy, gamma and the saved mean and invstd:
    per-channel sums over N, H, W, then dx (native_batch_norm_backward's decomposition)."""
    c_axis = 3 if channels_last else 1
    C = shape[c_axis]
    axes = tuple(a for a in range(4) if a != c_axis)
    cshape = tuple(C if a == c_axis else 1 for a in range(4))
    count = 1
    for a in axes:
        count *= shape[a]
    x, dy = P(shape, dtype, name="x"), P(shape, dtype, name="dy")
    g, mean, invstd = P((C,), name="g"), P((C,), name="mean"), P((C,), name="invstd")
    mean_, inv_, g_ = mean.reshape(cshape), invstd.reshape(cshape), g.reshape(cshape)
    xhat = (x - mean_) * inv_
    dbeta = ops.sum(dy, axis=axes)
    dgamma = ops.sum(dy * xhat, axis=axes)
    dx = (dy - dbeta.reshape(cshape) / count - xhat * (dgamma.reshape(cshape) / count)) * inv_ * g_
    return [dx, dgamma, dbeta]


def embedding_backward(tokens: int, vocab: int, dim: int):
    """The embedding table's gradient: dy's rows scatter-added at their token ids (repeated ids add)."""
    ids, dy = P((tokens,), "int64", name="ids"), P((tokens, dim), "float32", name="dy")
    return [scatter_add_rows(ids, dy, vocab)]


def _w(name, dtype, build, backward=None) -> Workload:
    return Workload(name, "training", dtype, build, backward)


def training() -> list[Workload]:
    """docs/WORKLOADS.md D, the rows issue 23 item 3 names."""
    out = []
    rows = (
        ("layer_norm_bwd", Pattern.LAYER_NORM, layer_norm_backward),
        ("rms_norm_bwd", Pattern.RMS_NORM, rms_norm_backward),
        ("softmax_bwd", Pattern.SOFTMAX, softmax_backward),
    )
    for name, pattern, f in rows:
        for dt in LIGER_DTYPES:
            for N in LIGER_N if pattern is not Pattern.SOFTMAX else (1024, 4096, 16384):
                e = 4 if dt == "float32" else 2
                out.append(_w(f"{name} [{LIGER_ROWS}x{N}]", dt, lambda f=f, N=N, dt=dt: f(LIGER_ROWS, N, dt),
                              Backward(pattern, LIGER_ROWS, N, e)))  # fmt: skip
    for N in (4096, 16384):
        out.append(_w(f"cross_entropy_bwd [{LIGER_ROWS}x{N}]", "float32",
                      lambda N=N: cross_entropy_backward(LIGER_ROWS, N, "float32"),
                      Backward(Pattern.CROSS_ENTROPY, LIGER_ROWS, N, 4)))  # fmt: skip
    # the paper's Table 2 sub-graphs 7 (one column sum) and 8 (two) over [64, 128, 768], read as the
    # backward they come from: RMSNorm's (dgamma) and LayerNorm's (dgamma, dbeta) over 8192 x 768 rows
    out.append(_w("A2#7 as rms_norm_bwd [8192x768]", "float32", lambda: rms_norm_backward(8192, 768, "float32"),
                  Backward(Pattern.RMS_NORM, 8192, 768, 4)))  # fmt: skip
    out.append(_w("A2#8 as layer_norm_bwd [8192x768]", "float32", lambda: layer_norm_backward(8192, 768, "float32"),
                  Backward(Pattern.LAYER_NORM, 8192, 768, 4)))  # fmt: skip
    for shape in ((65536, 64), (802816, 256)):  # Linear's bias gradient: a column sum (generic peers)
        out.append(_w(f"bias_grad [{shape[0]}x{shape[1]}]", "float32",
                      lambda s=shape: [ops.sum(P(s, "float32", name="dy"), axis=0)]))  # fmt: skip
    out.append(_w("batch_norm_bwd NHWC [256x56x56x256]", "float32",
                  lambda: batch_norm_backward((256, 56, 56, 256), True),
                  Backward(Pattern.BATCH_NORM, 256 * 56 * 56, 256, 4, channels_last=True)))  # fmt: skip
    out.append(_w("batch_norm_bwd NCHW [32x64x56x56]", "float32",
                  lambda: batch_norm_backward((32, 64, 56, 56), False),
                  Backward(Pattern.BATCH_NORM, 32 * 56 * 56, 64, 4, channels_last=False)))  # fmt: skip
    out.append(_w("embedding_bwd [8192 ids into 50257x768]", "float32", lambda: embedding_backward(8192, 50257, 768),
                  Backward(Pattern.EMBEDDING, 8192, 768, 4, rows=50257)))  # fmt: skip
    return out
