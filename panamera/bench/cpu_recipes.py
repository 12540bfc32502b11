"""The CPU bench's workloads (docs/WORKLOADS.md's single, sub-graph and norm suites, float32, at
sizes that fit this machine), each written once as a *recipe* against a small backend interface
and so built four ways: a Panamera graph, numpy (and numpy in float64: the reference), PyTorch
(eager, and through torch.compile) and a small ONNX graph (onnx.helper) for onnxruntime. The
peers use their own fused operators where they have one (torch's softmax / layer_norm /
rms_norm / normalize / logsumexp / cross_entropy / batch_norm / group_norm, ONNX's Softmax,
LayerNormalization, RMSNormalization, LpNormalization, ReduceLogSumExp, BatchNormalization in
training mode, GroupNormalization; cross_entropy's loss per row is LogSoftmax then
GatherElements).

>>> w = next(w for w in cpu_workloads() if w.name == "softmax [6144x128]")
>>> w.suite, w.shapes
('norms', ((6144, 128),))
>>> import numpy as np
>>> x = np.zeros((2, 4), np.float32)
>>> w.recipe(NumpyBackend(), x).tolist()[0]
[0.25, 0.25, 0.25, 0.25]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LN_EPS, RMS_EPS, L2_EPS, BN_EPS, GN_EPS = 1e-5, 1e-6, 1e-12, 1e-5, 1e-5


@dataclass(frozen=True)
class CpuWorkload:
    """One workload: its name (as in panamera/bench/suites.py), suite, input shapes and dtypes, and recipe
    `recipe(backend, *inputs)`, which returns one output or a tuple of them."""

    name: str
    suite: str
    shapes: tuple[tuple[int, ...], ...]
    recipe: Callable
    dtypes: tuple[str, ...] = ()
    reduced: int = 1  # the longest reduction (for the result's tolerance)
    default: bool = False  # in the default (about 3-minute) set

    @property
    def input_dtypes(self) -> tuple[str, ...]:
        return self.dtypes or ("float32",) * len(self.shapes)

    @property
    def input_bytes(self) -> int:
        return sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in zip(self.shapes, self.input_dtypes))


class NumpyBackend:
    """numpy; `ref=True`: float64 throughout (a cast to a 16-bit type rounds, then widens back)."""

    def __init__(self, ref: bool = False):
        self.ref = ref

    def sum(self, x, axis=None):
        return np.sum(x, axis=axis)

    def max(self, x, axis=None):
        return np.max(x, axis=axis)

    def cast(self, x, dtype):
        if self.ref:
            return x.astype(dtype).astype(np.float64) if dtype == "float16" else x.astype(np.float64)
        return x.astype(dtype)

    def mul(self, x, c):
        return x * c

    def add(self, x, c):
        return x + c

    def neg(self, x):
        return -x

    def square(self, x):
        return x * x

    def reshape(self, x, shape):
        return x.reshape(shape)

    def softmax(self, x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def log_softmax(self, x):
        m = x.max(-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

    def logsumexp(self, x, axis):
        m = x.max(axis, keepdims=True)
        return (m + np.log(np.exp(x - m).sum(axis, keepdims=True))).squeeze(axis)

    def layer_norm(self, x, g, b):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + LN_EPS) * g + b

    def rms_norm(self, x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + RMS_EPS) * g

    def l2_normalize(self, x):
        return x / np.sqrt(np.maximum((x * x).sum(-1, keepdims=True), L2_EPS))

    def argmax(self, x, axis):
        return np.argmax(x, axis=axis)

    def cross_entropy(self, x, t):
        """The loss per row (reduction "none"); t holds class indices (float64 in the reference)."""
        m = x.max(-1, keepdims=True)
        lse = (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[:, 0]
        return lse - np.take_along_axis(x, t.astype(np.int64)[:, None], 1)[:, 0]

    def batch_norm(self, x, g, b):
        """Training mode over N, H, W: the normalized output (the batch statistics stay internal)."""
        axes = (0, *range(2, x.ndim))
        mu, var = x.mean(axes, keepdims=True), x.var(axes, keepdims=True)
        c = (1, -1) + (1,) * (x.ndim - 2)
        return (x - mu) / np.sqrt(var + BN_EPS) * g.reshape(c) + b.reshape(c)

    def group_norm(self, x, groups, g, b):
        n, c = x.shape[:2]
        v = x.reshape(n, groups, -1)
        y = (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + GN_EPS)
        shape = (1, c) + (1,) * (x.ndim - 2)
        return y.reshape(x.shape) * g.reshape(shape) + b.reshape(shape)

    def linear(self, x, w):
        return x @ w.T

    def dequant(self, w, s):
        return w.astype(np.float64 if self.ref else np.float32) * s


class TorchBackend:
    """PyTorch eager (torch.compile traces the same recipe)."""

    def __init__(self):
        import torch

        self.t = torch
        self.F = torch.nn.functional

    def sum(self, x, axis=None):
        return self.t.sum(x) if axis is None else self.t.sum(x, dim=axis)

    def max(self, x, axis=None):
        return self.t.amax(x) if axis is None else self.t.amax(x, dim=axis)

    def cast(self, x, dtype):
        return x.to(getattr(self.t, dtype))

    def mul(self, x, c):
        return x * c

    def add(self, x, c):
        return x + c

    def neg(self, x):
        return -x

    def square(self, x):
        return x * x

    def reshape(self, x, shape):
        return x.reshape(shape)

    def softmax(self, x):
        return self.t.softmax(x, -1)

    def log_softmax(self, x):
        return self.t.log_softmax(x, -1)

    def logsumexp(self, x, axis):
        return self.t.logsumexp(x, axis)

    def layer_norm(self, x, g, b):
        return self.F.layer_norm(x, g.shape, g, b, LN_EPS)

    def rms_norm(self, x, g):
        return self.F.rms_norm(x, g.shape, g, RMS_EPS)

    def l2_normalize(self, x):
        return self.F.normalize(x, dim=-1, eps=L2_EPS**0.5)

    def argmax(self, x, axis):
        return self.t.argmax(x, dim=axis)

    def cross_entropy(self, x, t):
        return self.F.cross_entropy(x, t, reduction="none")

    def batch_norm(self, x, g, b):
        return self.F.batch_norm(x, None, None, g, b, training=True, eps=BN_EPS)

    def group_norm(self, x, groups, g, b):
        return self.F.group_norm(x, groups, g, b, GN_EPS)

    def linear(self, x, w):
        return self.F.linear(x, w)

    def dequant(self, w, s):
        return w.to(self.t.float32) * s


class PanameraBackend:
    """Panamera's graph (frontend ops and nn)."""

    def __init__(self):
        from .. import nn
        from ..frontend import ops

        self.ops, self.nn = ops, nn

    def sum(self, x, axis=None):
        return self.ops.sum(x, axis=axis)

    def max(self, x, axis=None):
        return self.ops.max(x, axis=axis)

    def cast(self, x, dtype):
        return x.astype(dtype)

    def mul(self, x, c):
        return x * c

    def add(self, x, c):
        return x + c

    def neg(self, x):
        return -x

    def square(self, x):
        return x * x

    def reshape(self, x, shape):
        return x.reshape(shape)

    def softmax(self, x):
        return self.nn.softmax(x)

    def log_softmax(self, x):
        return self.nn.log_softmax(x)

    def logsumexp(self, x, axis):
        return self.nn.logsumexp(x, axis=axis)

    def layer_norm(self, x, g, b):
        return self.nn.layer_norm(x, g, b, eps=LN_EPS)

    def rms_norm(self, x, g):
        return self.nn.rms_norm(x, g, eps=RMS_EPS)

    def l2_normalize(self, x):
        return self.nn.l2_normalize(x, eps=L2_EPS)

    def argmax(self, x, axis):
        return self.ops.argmax(x, axis=axis)

    def cross_entropy(self, x, t):
        return self.nn.cross_entropy(x, t, reduction="none")

    def batch_norm(self, x, g, b):
        return self.nn.batch_norm(x, g, b, eps=BN_EPS)[0]

    def group_norm(self, x, groups, g, b):
        return self.nn.group_norm(x, groups, g, b, eps=GN_EPS)

    def linear(self, x, w):
        return x @ w.T

    def dequant(self, w, s):
        return w.astype("float32") * s


class OnnxBackend:
    """Nodes of one ONNX graph (opset 23); values are (name, onnx elem type, shape)."""

    OPSET = 23

    def __init__(self):
        from onnx import TensorProto, helper

        self.h, self.T = helper, TensorProto
        self.nodes, self.inits = [], []
        self.k = 0

    def _name(self) -> str:
        self.k += 1
        return f"v{self.k}"

    def _node(self, op, ins, elem, shape, **attrs):
        out = self._name()
        self.nodes.append(self.h.make_node(op, list(ins), [out], **attrs))
        return (out, elem, shape)

    def _const(self, value: np.ndarray):
        name = self._name()
        self.inits.append(self.h.make_tensor(name, self.h.np_dtype_to_tensor_dtype(value.dtype), value.shape,
                                             value.flatten().tolist()))  # fmt: skip
        return name

    def _reduce(self, op, x, axis, keep=0):
        name, elem, shape = x
        axes = tuple(range(len(shape))) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
        axes = tuple(a % len(shape) for a in axes)
        out_shape = tuple(s for k, s in enumerate(shape) if k not in axes)
        return self._node(op, [name, self._const(np.array(axes, np.int64))], elem, out_shape, keepdims=keep)

    def sum(self, x, axis=None):
        return self._reduce("ReduceSum", x, axis)

    def max(self, x, axis=None):
        return self._reduce("ReduceMax", x, axis)

    def logsumexp(self, x, axis):
        return self._reduce("ReduceLogSumExp", x, axis)

    def cast(self, x, dtype):
        elem = self.h.np_dtype_to_tensor_dtype(np.dtype(dtype))
        return self._node("Cast", [x[0]], elem, x[2], to=elem)

    def _scalar(self, x, c):
        return self._const(np.array(c, self.h.tensor_dtype_to_np_dtype(x[1])))

    def mul(self, x, c):
        return self._node("Mul", [x[0], self._scalar(x, c)], x[1], x[2])

    def add(self, x, c):
        return self._node("Add", [x[0], self._scalar(x, c)], x[1], x[2])

    def neg(self, x):
        return self._node("Neg", [x[0]], x[1], x[2])

    def square(self, x):
        return self._node("Mul", [x[0], x[0]], x[1], x[2])

    def reshape(self, x, shape):
        return self._node("Reshape", [x[0], self._const(np.array(shape, np.int64))], x[1], tuple(shape))

    def softmax(self, x):
        return self._node("Softmax", [x[0]], x[1], x[2], axis=-1)

    def log_softmax(self, x):
        return self._node("LogSoftmax", [x[0]], x[1], x[2], axis=-1)

    def layer_norm(self, x, g, b):
        return self._node("LayerNormalization", [x[0], g[0], b[0]], x[1], x[2], axis=-1, epsilon=LN_EPS)

    def rms_norm(self, x, g):
        return self._node("RMSNormalization", [x[0], g[0]], x[1], x[2], axis=-1, epsilon=RMS_EPS)

    def l2_normalize(self, x):
        return self._node("LpNormalization", [x[0]], x[1], x[2], axis=-1, p=2)

    def argmax(self, x, axis):
        shape = tuple(s for k, s in enumerate(x[2]) if k != axis % len(x[2]))
        return self._node("ArgMax", [x[0]], self.T.INT64, shape, axis=axis, keepdims=0)

    def cross_entropy(self, x, t):
        n = x[2][0]
        lsm = self._node("LogSoftmax", [x[0]], x[1], x[2], axis=-1)
        idx = self._node("Unsqueeze", [t[0], self._const(np.array([1], np.int64))], t[1], (n, 1))
        picked = self._node("GatherElements", [lsm[0], idx[0]], x[1], (n, 1), axis=1)
        flat = self._node("Squeeze", [picked[0], self._const(np.array([1], np.int64))], x[1], (n,))
        return self._node("Neg", [flat[0]], x[1], (n,))

    def batch_norm(self, x, g, b):
        c = x[2][1]
        zeros, ones = (self._const(np.full(c, v, self.h.tensor_dtype_to_np_dtype(x[1]))) for v in (0, 1))
        out = self._name()
        stats = [self._name(), self._name()]
        self.nodes.append(self.h.make_node("BatchNormalization", [x[0], g[0], b[0], zeros, ones], [out, *stats],
                                           epsilon=BN_EPS, training_mode=1))  # fmt: skip
        return (out, x[1], x[2])

    def group_norm(self, x, groups, g, b):
        return self._node("GroupNormalization", [x[0], g[0], b[0]], x[1], x[2], epsilon=GN_EPS, num_groups=groups)

    def linear(self, x, w):
        wt = self._node("Transpose", [w[0]], w[1], w[2][::-1], perm=[1, 0])
        return self._node("MatMul", [x[0], wt[0]], x[1], (*x[2][:-1], w[2][0]))

    def dequant(self, w, s):
        f = self._node("Cast", [w[0]], self.T.FLOAT, w[2], to=self.T.FLOAT)
        return self._node("Mul", [f[0], s[0]], self.T.FLOAT, w[2])

    def model(self, workload: CpuWorkload) -> bytes:
        """The serialized ONNX model of `workload`."""
        ins = []
        for k, (s, d) in enumerate(zip(workload.shapes, workload.input_dtypes)):
            ins.append((f"x{k}", self.h.np_dtype_to_tensor_dtype(np.dtype(d)), s))
        outs = workload.recipe(self, *ins)
        outs = outs if isinstance(outs[0], tuple) else (outs,)
        vi = self.h.make_tensor_value_info
        graph = self.h.make_graph(self.nodes, "w", [vi(n, e, s) for n, e, s in ins], [vi(*o) for o in outs],
                                  initializer=self.inits)  # fmt: skip
        return self.h.make_model(graph, opset_imports=[self.h.make_opsetid("", self.OPSET)]).SerializeToString()


def cpu_workloads() -> list[CpuWorkload]:
    """The CPU bench's workloads; `default` marks the roughly three-minute default set."""
    out: list[CpuWorkload] = []
    f32 = "float32"
    single = [("all", (128,), None), ("all", (65536,), None), ("all", (1024, 1024), None), ("all", (21128, 768), None),
              ("row", (768, 768), 1), ("row", (768, 21128), 1), ("column", (768, 768), 0), ("column", (21128, 768), 0)]  # fmt: skip
    defaults = {"sum all 65536", "sum all 1024x1024", "sum row 768x768", "sum column 768x768", "max row 768x768",
                "sum column 21128x768"}  # fmt: skip
    for op in ("sum", "max"):
        for form, shape, axis in single:
            name = f"{op} {form} {'x'.join(map(str, shape))}"
            n = int(np.prod(shape)) if axis is None else shape[axis]
            r = lambda B, x, op=op, axis=axis: getattr(B, op)(x, axis)  # noqa: E731
            out.append(CpuWorkload(name, "single", (shape,), r, reduced=n, default=name in defaults))

    def a2(k, shape, f, dtype=f32, default=False):
        name = f"A2#{k} {dtype[0]}{dtype[-2:]}[{'x'.join(map(str, shape))}]"
        red = int(np.prod(shape[:-1])) if len(shape) > 1 else shape[0]
        out.append(CpuWorkload(name, "subgraphs", (shape,), f, (dtype,), red, default))

    c16 = lambda B, x: B.cast(x, "float16")  # noqa: E731
    c32 = lambda B, x: B.cast(x, f32)  # noqa: E731
    a2(2, (1280, 21128), lambda B, x: B.sum(c16(B, x), 0))
    a2(4, (1280, 21128), lambda B, x: B.sum(B.mul(x, 0.5), 0))
    a2(5, (1280,), lambda B, x: B.sum(B.mul(B.neg(x), 0.5)), default=True)
    a2(6, (3072,), lambda B, x: B.sum(B.mul(B.mul(x, 0.5), 2.0)))
    a2(7, (64, 128, 768), lambda B, x: B.sum(B.mul(B.add(x, 1.0), 0.5), (0, 1)), default=True)
    a2(
        8,
        (64, 128, 768),
        lambda B, x: (B.sum(B.mul(B.add(x, 1.0), 0.5), (0, 1)), B.sum(B.mul(B.add(x, 2.0), 3.0), (0, 1))),
    )
    a2(9, (8192, 768), lambda B, x: (B.sum(x, 0), B.sum(B.square(x), 0)), default=True)
    a2(11, (64, 128, 768), lambda B, x: B.sum(c32(B, B.reshape(x, (64 * 128, 768))), 0), "float16")

    def norm(name, shapes, f, reduced, default=False):
        out.append(CpuWorkload(name, "norms", shapes, f, (), reduced, default))

    for s, d in (((4 * 12 * 128, 128), True), ((64, 30522), True), ((1, 131072), False), ((8, 128256), True)):
        norm(f"softmax [{s[0]}x{s[1]}]", (s,), lambda B, x: B.softmax(x), s[1], d)
    norm("log_softmax [64x30522]", ((64, 30522),), lambda B, x: B.log_softmax(x), 30522, True)
    norm("logsumexp [8x128256]", ((8, 128256),), lambda B, x: B.logsumexp(x, 1), 128256)
    for s, d in (((8 * 128, 768), True), ((4096, 4096), False)):
        norm(f"layer_norm [{s[0]}x{s[1]}]", (s, s[1:], s[1:]), lambda B, x, g, b: B.layer_norm(x, g, b), s[1], d)
    for s, d in (((16 * 64, 512), True), ((4096, 8192), False)):
        norm(f"rms_norm [{s[0]}x{s[1]}]", (s, s[1:]), lambda B, x, g: B.rms_norm(x, g), s[1], d)
    norm("l2_normalize [256x1000]", ((256, 1000),), lambda B, x: B.l2_normalize(x), 1000, True)
    for s, d in (((64, 30522), True), ((1, 10_000_000), False)):
        norm(f"argmax [{s[0]}x{s[1]}]", (s,), lambda B, x: B.argmax(x, 1), s[1], d)
    for s, d in (((65536, 64), True), ((802816, 256), False)):
        norm(f"bias_grad [{s[0]}x{s[1]}]", (s,), lambda B, x: B.sum(x, 0), s[0], d)
    ce = lambda B, x, t: B.cross_entropy(x, t)  # noqa: E731
    out.append(CpuWorkload("cross_entropy [64x30522]", "norms", ((64, 30522), (64,)), ce, (f32, "int64"), 30522, True))
    bn = (32, 64, 56, 56)
    norm(
        "batch_norm train [32x64x56x56]", (bn, bn[1:2], bn[1:2]), lambda B, x, g, b: B.batch_norm(x, g, b), 32 * 56 * 56
    )
    gn = (4, 64, 16, 16)
    norm("group_norm 8g [4x64x16x16]", (gn, gn[1:2], gn[1:2]), lambda B, x, g, b: B.group_norm(x, 8, g, b), 8 * 16 * 16)
    # 16-bit variants (docs/WORKLOADS.md's norms): float16 softmax and layer_norm, bfloat16 rms_norm
    for s in ((4 * 12 * 128, 128), (64, 30522)):
        out.append(
            CpuWorkload(
                f"softmax [{s[0]}x{s[1]}] float16", "norms", (s,), lambda B, x: B.softmax(x), ("float16",), s[1]
            )
        )
    s = (8 * 128, 768)
    out.append(CpuWorkload("layer_norm [1024x768] float16", "norms", (s, s[1:], s[1:]),
                           lambda B, x, g, b: B.layer_norm(x, g, b), ("float16",) * 3, s[1]))  # fmt: skip
    s = (16 * 64, 512)
    out.append(CpuWorkload("rms_norm [1024x512] bfloat16", "norms", (s, s[1:]), lambda B, x, g: B.rms_norm(x, g),
                           ("bfloat16",) * 2, s[1]))  # fmt: skip
    out += contractions()
    return out


# The contraction suite at CPU sizes (panamera/bench/suites.py's, float32 here: numpy, torch and
# onnxruntime have no fast 16-bit CPU GEMM to compare with): the paper's Table 1 (M x N x K) and
# GEMV / skinny products of decoding (N x K weights stored as torch's Linear, M rows), with float32
# weights and with int8 weights dequantized by a per-channel scale.
CPU_TABLE1 = ((128, 32, 64), (128, 32, 1024), (1024, 512, 1024))
CPU_GEMV = ((4096, 4096),)
CPU_GEMV_ROWS = (1, 4, 16)


def contractions() -> list[CpuWorkload]:
    """The CPU bench's contraction workloads (`x @ W.T`)."""
    out = []
    lin = lambda B, x, w: B.linear(x, w)  # noqa: E731
    for M, N, K in CPU_TABLE1:
        out.append(CpuWorkload(f"table1 {M}x{N}x{K}", "contractions", ((M, K), (N, K)), lin, reduced=K,
                               default=(M, N, K) == (128, 32, 1024)))  # fmt: skip
    for N, K in CPU_GEMV:
        for M in CPU_GEMV_ROWS:
            out.append(CpuWorkload(f"linear {M}x{N}x{K} w=float32", "contractions", ((M, K), (N, K)), lin, reduced=K))
            out.append(CpuWorkload(f"linear {M}x{N}x{K} w=int8", "contractions", ((M, K), (N, K), (N, 1)),
                                   lambda B, x, w, s: B.linear(x, B.dequant(w, s)), ("float32", "int8", "float32"),
                                   reduced=K))  # fmt: skip
    return out


def tiny_cpu() -> list[CpuWorkload]:
    """Four small workloads for tests and smoke runs (a row sum, a full sum, a softmax, a linear)."""
    return [
        CpuWorkload("sum row 64x256", "tiny", ((64, 256),), lambda B, x: B.sum(x, 1), reduced=256),
        CpuWorkload("sum all 4096", "tiny", ((4096,),), lambda B, x: B.sum(x), reduced=4096),
        CpuWorkload("softmax [8x512]", "tiny", ((8, 512),), lambda B, x: B.softmax(x), reduced=512),
        CpuWorkload("linear 4x64x128", "tiny", ((4, 128), (64, 128)), lambda B, x, w: B.linear(x, w), reduced=128),
    ]


NOT_COVERED = {
    "single": "float16, int32 and bool variants (numpy and onnxruntime have no fast path to compare fairly)",
    "subgraphs": "A2#1, #3, #10, #12 (tiny, or the same kernels as listed ones)",
    "norms": "bfloat16 long-row softmax and cross_entropy over 131072-256000 columns (the float32 ones stand for them)",
    "contractions": "16-bit and int4 weights, 14336-wide GEMVs and decode attention (float32 and int8 weights "
    "at CPU sizes instead)",
}
