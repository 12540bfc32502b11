"""The workloads of docs/WORKLOADS.md: A1 (single reductions, every dtype, full sizes), A2
(the paper's Table 2 sub-graphs) and B (normalization subgraphs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import nn
from ..frontend import ops
from ..frontend.tensor import placeholder as P

# The paper's mean speedups of Panamera (docs/WORKLOADS.md), to stand next to ours.
PAPER_MEANS = {
    "single": "33.7x over cuDNN, 3.5x over CUB (2.1x without CUB's transpose), 5.4x over TVM, 9.6x over Ansor",
    "subgraphs": "9.5x over cuDNN, 2.6x over TVM, 2.7x over Ansor",
    "norms": "(beyond the paper)",
}


@dataclass(frozen=True)
class Workload:
    name: str
    suite: str
    dtype: str
    build: Callable  # () -> list of output tensors (fresh placeholders each call)


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
    return out


SUITES = {"single": single, "subgraphs": subgraphs, "norms": norms}


def tiny() -> list[Workload]:
    """A three-workload suite for tests and smoke runs."""
    return [
        Workload("sum row 64x256", "tiny", "float32", _reduce("sum", (64, 256), "float32", 1)),
        Workload("sum all 4096", "tiny", "float32", _reduce("sum", (4096,), "float32", None)),
        Workload("softmax [8x512]", "tiny", "float32", lambda: [nn.softmax(P((8, 512), "float32", name="x"))]),
    ]
