"""The workloads of docs/WORKLOADS.md: A1 (single reductions, every dtype, full sizes), A2
(the paper's Table 2 sub-graphs), B (normalization subgraphs) and C (contractions: the paper's
Table 1, GEMV / skinny GEMMs with 16-bit, int8 and int4 weights, decode attention)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import nn
from ..frontend import ops
from ..frontend.tensor import placeholder as P
from .train_peers import Backward

# The paper's mean speedups of Panamera (docs/WORKLOADS.md), to stand next to ours.
PAPER_MEANS = {
    "single": "33.7x over cuDNN, 3.5x over CUB (2.1x without CUB's transpose), 5.4x over TVM, 9.6x over Ansor",
    "subgraphs": "9.5x over cuDNN, 2.6x over TVM, 2.7x over Ansor",
    "norms": "(beyond the paper)",
    "training": "(the paper's Table 2 sub-graphs 7 and 8 are read as LayerNorm/RMSNorm backward; the rest is beyond the paper)",
    "long_rows": "(beyond the paper: issue 25, QuACK's long rows)",
    "contractions": "Table 1: 2.7x over the vendor tensor-core path on 128x32x1024 (GEMV and decode attention are beyond the paper)",
}


@dataclass(frozen=True)
class Workload:
    name: str
    suite: str
    dtype: str
    build: Callable  # () -> list of output tensors (fresh placeholders each call)
    backward: Backward | None = None  # what a training workload computes: its peers plan from that


A1_F32_I32 = [("ALL", (128,), None), ("ALL", (65536,), None), ("ALL", (1024, 1024), None), ("ALL", (21128, 768), None),
              ("ROW", (768, 768), 1), ("ROW", (768, 21128), 1), ("ROW", (256, 256, 56, 56), (0, 2, 3)),
              ("COLUMN", (768, 768), 0), ("COLUMN", (21128, 768), 0), ("COLUMN", (256, 56, 56, 256), (0, 1, 2))]  # fmt: skip
A1_F16_BOOL = [("ALL", (128,), None), ("ALL", (1024,), None), ("ALL", (8192,), None), ("ALL", (32768,), None),
               ("ROW", (1024, 1024), 1), ("ROW", (1024, 8192), 1), ("ROW", (1024, 32768), 1),
               ("COLUMN", (1024, 1024), 0), ("COLUMN", (8192, 1024), 0), ("COLUMN", (32768, 1024), 0)]  # fmt: skip


def _shape(s) -> str:
    return "x".join(map(str, s))


def _reduce(op, shape, dtype, axis):
    return lambda: [getattr(ops, op)(P(shape, dtype, name="x"), axis=axis)]


def single() -> list[Workload]:
    out = []
    for dtypes, shapes in ((("float32", "int32"), A1_F32_I32), (("float16", "bool"), A1_F16_BOOL)):
        for dt in dtypes:
            for op in ("all",) if dt == "bool" else ("sum", "max"):
                for form, shape, axis in shapes:
                    out.append(
                        Workload(f"{op} {form.lower()} {_shape(shape)}", "single", dt, _reduce(op, shape, dt, axis))
                    )
    return out


def subgraphs() -> list[Workload]:
    """docs/WORKLOADS.md A2. Where the paper does not give the reduced axis, the leading axes are reduced
    down to the last one (the bias-gradient pattern of BERT training); 1-D inputs reduce fully."""

    def lead(t):
        return tuple(range(t.ndim - 1)) if t.ndim > 1 else None

    def w(k, shape, dt, f):
        return Workload(f"A2#{k} {dt[0]}{dt[-2:]}[{_shape(shape)}]", "subgraphs", dt, lambda: f(P(shape, dt, name="x")))

    c16, c32 = (lambda t: t.astype("float16")), (lambda t: t.astype("float32"))
    return [
        w(1, (64, 2), "float32", lambda x: [ops.sum(c16(c32(c16(x))), axis=lead(x))]),
        w(2, (1280, 21128), "float32", lambda x: [ops.sum(c16(x), axis=lead(x))]),
        w(3, (64, 768), "float16", lambda x: [ops.sum(c32(x), axis=lead(x))]),
        w(4, (1280, 21128), "float32", lambda x: [ops.sum(x * 0.5, axis=lead(x))]),
        w(5, (1280,), "float32", lambda x: [ops.sum(-x * 0.5, axis=None)]),
        w(6, (3072,), "float32", lambda x: [ops.sum(x * 0.5 * 2.0, axis=None)]),
        w(7, (64, 128, 768), "float32", lambda x: [ops.sum((x + 1.0) * 0.5, axis=lead(x))]),
        w(8, (64, 128, 768), "float32", lambda x: [ops.sum((x + 1.0) * 0.5, axis=lead(x)), ops.sum((x + 2.0) * 3.0, axis=lead(x))]),
        w(9, (8192, 768), "float32", lambda x: [ops.sum(x, axis=0), ops.sum(x * x, axis=0)]),
        w(10, (64, 128, 12, 64), "float16", lambda x: [ops.sum(c32(x.reshape((64 * 128, 768))), axis=0)]),
        w(11, (64, 128, 768), "float16", lambda x: [ops.sum(c32(x.reshape((64 * 128, 768))), axis=0)]),
        w(12, (64, 20), "float16", lambda x: [ops.sum(x.reshape((64 * 20,)), axis=None)]),
    ]  # fmt: skip


def norms() -> list[Workload]:
    out = []

    def add(name, dt, f):
        out.append(Workload(name, "norms", dt, f))

    for dt in ("float32", "float16"):
        for shape in ((4 * 12 * 128, 128), (64, 30522)):
            add(f"softmax [{_shape(shape)}]", dt, lambda s=shape, d=dt: [nn.softmax(P(s, d, name="x"))])
    add("log_softmax [64x30522]", "float32", lambda: [nn.log_softmax(P((64, 30522), "float32", name="x"))])
    add("cross_entropy [64x30522]", "float32",
        lambda: [nn.cross_entropy(P((64, 30522), "float32", name="x"), P((64,), "int64", name="t"), reduction="none")])  # fmt: skip
    for dt in ("float32", "float16"):
        for shape in ((8 * 128, 768), (4096, 4096)):
            add(f"layer_norm [{_shape(shape)}]", dt,
                lambda s=shape, d=dt: [nn.layer_norm(P(s, d, name="x"), P(s[1:], d, name="g"), P(s[1:], d, name="b"))])  # fmt: skip
    for dt in ("float32", "bfloat16"):
        for shape in ((16 * 64, 512), (4096, 8192)):
            add(
                f"rms_norm [{_shape(shape)}]",
                dt,
                lambda s=shape, d=dt: [nn.rms_norm(P(s, d, name="x"), P(s[1:], d, name="g"))],
            )
    add("batch_norm train [32x64x56x56]", "float32",
        lambda: list(nn.batch_norm(P((32, 64, 56, 56), "float32", name="x"), P((64,), "float32", name="g"), P((64,), "float32", name="b"))))  # fmt: skip
    add("group_norm 8g [4x64x16x16]", "float32",
        lambda: [nn.group_norm(P((4, 64, 16, 16), "float32", name="x"), 8, P((64,), "float32", name="g"), P((64,), "float32", name="b"))])  # fmt: skip
    add("l2_normalize [256x1000]", "float32", lambda: [nn.l2_normalize(P((256, 1000), "float32", name="x"))])
    for shape in ((64, 30522), (1, 10_000_000)):
        add(f"argmax [{_shape(shape)}]", "float32", lambda s=shape: [ops.argmax(P(s, "float32", name="x"), axis=1)])
    for shape in ((65536, 64), (802816, 256)):
        add(f"bias_grad [{_shape(shape)}]", "float32", lambda s=shape: [ops.sum(P(s, "float32", name="x"), axis=0)])
    # Long rows (LLM sampling: batch 1-64 over a 32k-256k vocabulary): too few rows to fill the GPU.
    for dt in ("float32", "bfloat16"):
        for shape in ((1, 131072), (8, 128256), (64, 256000)):
            add(f"softmax [{_shape(shape)}]", dt, lambda s=shape, d=dt: [nn.softmax(P(s, d, name="x"))])
    add("log_softmax [8x128256]", "float32", lambda: [nn.log_softmax(P((8, 128256), "float32", name="x"))])
    add("logsumexp [8x128256]", "float32", lambda: [nn.logsumexp(P((8, 128256), "float32", name="x"), axis=1)])
    for shape in ((1, 131072), (64, 256000)):
        add(f"cross_entropy [{_shape(shape)}]", "float32",
            lambda s=shape: [nn.cross_entropy(P(s, "float32", name="x"), P(s[:1], "int64", name="t"), reduction="none")])  # fmt: skip
    return out


LONG_ROW_SHAPES = ((32768, 65536), (16384, 131072), (8192, 262144), (1, 131072), (8, 128256), (64, 256000))
LONG_ROW_PATTERNS = ("softmax", "log_softmax", "cross_entropy", "rms_norm")


def long_row(pattern: str, shape: tuple[int, int], dt: str) -> Callable:
    """The outputs of one long-row workload (issue 25: QuACK's shapes and LLM vocabularies)."""
    M, N = shape
    return {
        "softmax": lambda: [nn.softmax(P(shape, dt, name="x"))],
        "log_softmax": lambda: [nn.log_softmax(P(shape, dt, name="x"))],
        "cross_entropy": lambda: [
            nn.cross_entropy(P(shape, dt, name="x"), P((M,), "int64", name="t"), reduction="none")
        ],
        "rms_norm": lambda: [nn.rms_norm(P(shape, dt, name="x"), P((N,), dt, name="g"))],
    }[pattern]


def long_rows() -> list[Workload]:
    """Rows of 65K-262K columns (issue 25): QuACK's three measured shapes, whose rows stay on chip
    only across a thread-block cluster, and the LLM-sampling batches; bf16 and fp32."""
    return [
        Workload(f"{p} [{_shape(s)}]", "long_rows", dt, long_row(p, s, dt))
        for p in LONG_ROW_PATTERNS
        for dt in ("bfloat16", "float32")
        for s in LONG_ROW_SHAPES
    ]


def tiny() -> list[Workload]:
    """A three-workload suite for tests and smoke runs."""
    return [
        Workload("sum row 64x256", "tiny", "float32", _reduce("sum", (64, 256), "float32", 1)),
        Workload("sum all 4096", "tiny", "float32", _reduce("sum", (4096,), "float32", None)),
        Workload("softmax [8x512]", "tiny", "float32", lambda: [nn.softmax(P((8, 512), "float32", name="x"))]),
    ]


# -- contractions (issue 13): modeled against the limit and the library's tensor-core roofline ----
TABLE1 = ((128, 32, 64), (128, 32, 1024), (1024, 512, 1024))  # the paper's Table 1, M x N x K
GEMV_WEIGHTS = ((4096, 4096), (4096, 14336), (14336, 4096))  # (N out, K in), stored N x K (torch Linear)
GEMV_ROWS = (1, 4, 16)
# issue 25 (tensor cores): skinny GEMMs past a few tokens, (N out, K in) x M rows, bf16 / int8 / int4
TC_WEIGHTS = ((4096, 4096), (12288, 5376), (14336, 4096))
TC_ROWS = (1, 4, 16, 32, 64)


def _linear(M: int, N: int, K: int, weights: str, act: str = "float16"):
    """x[M, K] @ W.T with W stored N x K: fp16/bf16, int8 with per-channel fp16 scales, or int4
    (two per uint8, zero point 8) with fp16 scales per group of 128, dequantized in registers."""
    from ..frontend.contract import matmul

    def build():
        x = P((M, K), act, name="x")
        if weights in ("float16", "bfloat16"):
            return [matmul(x, P((N, K), weights, name="w").T)]
        if weights == "int8":
            w, s = P((N, K), "int8", name="w"), P((N, 1), "float16", name="scale")
            return [matmul(x, (w.astype("float32") * s.astype("float32")).T)]
        g = 128
        packed, s = P((N, K // 2), "uint8", name="w4"), P((N, K // g, 1), "float16", name="scale")
        lo = (packed & 0xF).astype("float32") - 8.0
        hi = ((packed >> 4) & 0xF).astype("float32") - 8.0
        both = ops.arange(2).reshape((1, 1, 2)) == 0
        from ..frontend.tensor import where

        nib = where(both, lo.reshape((N, K // 2, 1)), hi.reshape((N, K // 2, 1))).reshape((N, K // g, g))
        return [matmul(x, (nib * s.astype("float32")).reshape((N, K)).T)]

    return build


ATTENTION_BATCH = (1, 4, 16)
ATTENTION_KEYS = (4096, 32768, 131072)


def _decode_attention(B: int, L: int, dtype: str, Hq: int = 32, Hkv: int = 8, D: int = 128):
    """One decoding step's attention: q (B, Hq, 1, D) against the cached K, V (B, Hkv, L, D), the
    Hq / Hkv query heads of a group sharing one KV head, through `nn.attention` (the model chooses
    the fused split-key plan or the einsum -> softmax -> einsum chain)."""

    def build():
        q, k, v = (
            P((B, Hq, 1, D), dtype, name="q"),
            P((B, Hkv, L, D), dtype, name="k"),
            P((B, Hkv, L, D), dtype, name="v"),
        )
        return [nn.attention(q, k, v)]

    return build


def contractions() -> list[Workload]:
    """docs/WORKLOADS.md C: the paper's Table 1, the GEMV / skinny GEMMs of LLM decoding (16-bit,
    int8 and int4 weights; bf16 / int8 / int4 also at 32 and 64 rows and 12288 x 5376, issue 25)
    and decode attention."""
    out = [Workload(f"table1 {M}x{N}x{K}", "contractions", "float16", _linear(M, N, K, "float16"))
           for M, N, K in TABLE1]  # fmt: skip
    for wt in ("float16", "bfloat16", "int8", "int4"):
        act = "bfloat16" if wt == "bfloat16" else "float16"
        for N, K in GEMV_WEIGHTS:
            for M in GEMV_ROWS:
                out.append(Workload(f"linear {M}x{N}x{K} w={wt}", "contractions", wt, _linear(M, N, K, wt, act)))
    have = {w.name for w in out}
    for wt in ("bfloat16", "int8", "int4"):  # issue 25: up to 64 rows, where tensor cores pay
        act = "bfloat16" if wt == "bfloat16" else "float16"
        for N, K in TC_WEIGHTS:
            for M in TC_ROWS:
                name = f"linear {M}x{N}x{K} w={wt}"
                if name not in have:
                    out.append(Workload(name, "contractions", wt, _linear(M, N, K, wt, act)))
    for dt in ("float16", "bfloat16"):
        for B in ATTENTION_BATCH:
            for L in ATTENTION_KEYS:
                out.append(
                    Workload(f"decode_attention b{B} 32/8 heads L{L}", "contractions", dt, _decode_attention(B, L, dt))
                )
    return out


def training() -> list[Workload]:
    """docs/WORKLOADS.md D: backward-pass reductions (train_suite.py)."""
    from .train_suite import training as build

    return build()


SUITES = {
    "single": single,
    "subgraphs": subgraphs,
    "norms": norms,
    "contractions": contractions,
    "training": training,
    "long_rows": long_rows,
}


def model_contraction(w: Workload, gpu=None) -> dict:
    """Panamera's modeled plan of one contraction workload (planned, not run) against the limit
    and the library's tensor-core roofline (model/library.py)."""
    from ..compiler import compile as pn_compile
    from ..model import H100, estimate
    from ..model.library import library_matmul
    from ..schedule.contraction import contraction_info

    gpu = gpu or H100
    k = pn_compile(w.build(), target="emulator", gpu=gpu, use_database=False, cache=False)
    e = estimate(k.plan, gpu)
    info = next(i for i in (contraction_info(g) for g in k.groups) if i is not None)
    lib = library_matmul(gpu, info.M, info.N, info.K, 1, "float16" if w.dtype in ("int8", "int4") else w.dtype)
    m = next(m for g, m in zip(k.groups, k.mappings) if contraction_info(g) is not None)
    return {
        "workload": w.name,
        "dtype": w.dtype,
        "modeled_us": round(e.total_us, 2),
        "limit_us": round(e.limit_us, 2),
        "ratio_to_limit": round(e.ratio_to_limit, 2),
        "library_us": round(lib.total_s * 1e6, 2),
        "library_over_panamera": round(lib.total_s * 1e6 / e.total_us, 2),
        "compute_bound": lib.compute_bound,
        "kernels": len(k.plan.kernels),
        "split": m.split,
        "merge": str(m.merges[0]),
        "plan": m.describe(),
    }
