"""Routing a contraction node (MatMul, Gemm, MatMulInteger) by the model: Panamera or the library.

The partitioner asks `route_contraction` once per contraction node whose values Panamera
supports; the answer is data (a `Route`) carried on the partition and shown, both figures in
its reason, in the report and `panamera explain`:

    library:  T_lib = model/library.py's cuBLAS roofline (tensor cores, 128/64 tiles, no split-K)
                      + T(its element-wise neighbours planned alone, as Panamera kernels)
    Panamera: T_pn  = the modeled plan of the node fused with those neighbours (compiler.compile:
                      split-K chosen by the mapper's model, gpu.py)
    runner   = Panamera  if T_pn < T_lib  else the library

The neighbours are the chains of element-wise nodes (or views) Panamera takes that feed the
operands (a dequantizing Cast -> Sub -> Mul, DequantizeLinear) or consume the result (bias,
activation, residual add), each link the only consumer of what it reads from the chain, and no
epilogue link reading what a library node writes (the partitioner's levels would cut there).
An approximation: the levels are the partitioner's, decided after every route, so a chain can
still be cut by a library node further upstream; the route then counted a fusion that the
partition does not make.
A compute-bound GEMM (large M, N and K) keeps the library; a GEMV or a skinny product, which
streams its weights once, goes to Panamera and fuses with those neighbours.

When the CPU target runs the subgraphs (`host=True`), one rule comes first (`host_rule`):
a Conv of at least `HOST_CONV_MIN_MACS` multiply-adds (M N K batch of its implicit GEMM) runs in
the library's host convolution (conv.host_conv: numpy copies and BLAS matmuls, no per-MAC index
arithmetic). The CPU target has no convolution template: its generated kernel evaluates the
im2col address arithmetic (divisions, modulos and padding tests) at every multiply-add, about
8 ns each on the exported ResNet's convolutions (1.2 M multiply-adds: 9.8 ms), 10-70x the host
convolution's time on the exported ResNet, VGG and UNet. The host convolution (pointwise: one
matmul; depthwise: one window copy and a per-channel matmul; else one strided column copy
and a matmul) costs 15-50 us of numpy calls at these sizes and splits the subgraph around
it, so the threshold, 2^14 (a generated conv of that size costs ~130 us), keeps only the
smallest convolutions (squeeze-excite 1x1s, a 2x16x8x8 depthwise) generated: measured,
interleaved, 1 thread, MobileNetV3 1050 -> 674 us and EfficientNet 935 -> 595 us against 2^17,
2^15, 2^13 and 2^12 worse or no better. That threshold paid for ~15 us of Python per library
unit; since a model whose units all have C forms runs as one C call (cpu_chain.py), every float32
2-D Conv goes to the host convolution's C kernels whatever its size (`host_c_conv`); the threshold
still decides the others (1-D, 3-D, other dtypes: numpy's host convolution).
A MatMul or Gemm Panamera can plan goes to Panamera (`HOST_PANAMERA`): on the CPU the library's
is a numpy call per node (5-10 us of Python on the exported transformers' 8 x 32 x 96 products),
where Panamera's program calls the same BLAS from C (runtime/cpu_gemm.py) or fuses a small one
with its neighbours.
The GPU figures are still computed for the report.

>>> from onnx import helper, TensorProto
>>> from panamera.model import H100
>>> from panamera.subgraph.model import load_model
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
...     [v("x", [1, 1024]), v("w", [1024, 1024])], [v("y", [1, 1024])])
>>> m = load_model(helper.make_model(g).SerializeToString())
>>> r = route_contraction(m, m.nodes[0], H100)
>>> r.runner, r.shape
(<Runner.PANAMERA: 'Panamera'>, (1, 1024, 1024, 1))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..errors import PanameraError
from ..model.gpu import GPUSpec
from ..model.library import library_matmul
from .model import Node, OnnxModel
from .plans import Plans

HOST_CONV_MIN_MACS = 1 << 14  # a Conv's multiply-adds from which the CPU target's library runs it
# With the CPU target, the float products Panamera can plan: its program calls the BLAS from C
# (runtime/cpu_gemm.py) or fuses a small one, where the library's is a numpy call (5-10 us) per node.
HOST_PANAMERA = frozenset({"MatMul", "Gemm"})
HOST_PANAMERA_RULE = "the CPU target: Panamera's program runs it (BLAS from C, or fused), no numpy call per node"

# The contraction ops the router decides (the rest of the compute-bound ops stay with the library).
ROUTED = frozenset({"MatMul", "Gemm", "MatMulInteger", "Conv"})
# Element-wise ops (and views) that fuse into a contraction's operand read or its store.
ELEMENTWISE = frozenset(
    {"Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Erf", "Gelu", "Cast", "Clip", "Pow", "Sqrt", "Neg",
     "Exp", "Abs", "Reciprocal", "LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Softplus", "Where",
     "DequantizeLinear", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "BatchNormalization"}
)  # fmt: skip


class Runner(Enum):
    """Who runs a routed node."""

    PANAMERA = "Panamera"
    LIBRARY = "library"


class Routing(Enum):
    """Who decides: the model (the default), or a caller that pins every contraction Panamera
    can plan to one side (conformance tests, experiments); the figures are computed either way."""

    MODEL = "model"
    PANAMERA = "panamera"
    LIBRARY = "library"


@dataclass(frozen=True)
class Route:
    """The router's decision for one contraction node, with the modeled figures behind it."""

    runner: Runner
    shape: tuple[int, int, int, int]  # (M, N, K, batch)
    library_us: float
    panamera_us: float | None  # None when Panamera could not plan the node
    split: int = 1  # Panamera's blocks per reduction (split-K)
    compute_bound: bool = False  # the roofline's verdict (model/library.py)
    note: str = ""  # why Panamera could not plan it
    neighbours: tuple[str, ...] = ()  # the element-wise nodes both figures include
    neighbours_us: float = 0.0  # their plan alone, added to the library's figure
    routing: Routing = Routing.MODEL  # who decided
    host: str = ""  # the CPU target's rule that decided instead of the model (host_rule), if one did

    @property
    def reason(self) -> str:
        """Both figures and the verdict, e.g. 'library: 22.52 us modeled (tensor cores),
        Panamera: 14.35 us modeled (split-K 8): Panamera runs it'."""
        m, n, k, b = self.shape
        lib = f"library: {self.library_us:.2f} us modeled (tensor cores)"
        with_ = ""
        if self.neighbours:
            lib += f" + {self.neighbours_us:.2f} us for its neighbours alone"
            with_ = f", fused with {', '.join(self.neighbours)}"
        if self.panamera_us is None:
            pn = f"Panamera cannot plan it ({self.note})"
        else:
            how = f"split-K {self.split}" if self.split > 1 else "one block per output tile"
            pn = f"Panamera: {self.panamera_us:.2f} us modeled ({how}{with_})"
        size = f"M={m} N={n} K={k}" + (f" batch={b}" if b > 1 else "")
        bound = "compute-bound" if self.compute_bound else "memory-bound"
        who = "Panamera" if self.runner is Runner.PANAMERA else "the library"
        pinned = (
            f" (pinned by routing={self.routing.value}, not the model)" if self.routing is not Routing.MODEL else ""
        )
        pinned = f" ({self.host})" if self.host else pinned
        return f"{bound} {size}: {lib}, {pn}: {who} runs it{pinned}"


def contraction_shape(model: OnnxModel, node: Node) -> tuple[int, int, int, int]:
    """(M, N, K, batch) of a MatMul / MatMulInteger (numpy's matmul) or a Gemm node; of a Conv,
    its implicit GEMM per group (M = N * output positions, N = M / G, K = Cg * window, batch G)."""
    a, b = (model.values[node.inputs[k]].shape for k in (0, 1))
    if node.op_type == "Conv":
        from .conv import geometry

        win, group = geometry(a, b, node.attrs)
        return a[0] * math.prod(win.out), b[0] // group, b[1] * math.prod(win.kernel), group
    if node.op_type == "Gemm":
        m, k = a[::-1] if node.attrs.get("transA", 0) else a
        n = b[0] if node.attrs.get("transB", 0) else b[1]
        return m, n, k, 1
    m = a[-2] if len(a) > 1 else 1
    n = b[-1] if len(b) > 1 else 1
    batch = math.prod(np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])))
    return m, n, a[-1], batch


def neighbours(
    model: OnnxModel, node: Node, takes: Callable[[Node], bool]
) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    """(prologue, epilogue): the element-wise chains Panamera `takes` that feed `node`'s operands
    and consume its result, each link the only consumer of the chain value it reads."""
    producer = {o: n for n in model.nodes for o in n.outputs if o}
    users: dict[str, list[Node]] = {}
    for n in model.nodes:
        for i in dict.fromkeys(n.inputs):
            users.setdefault(i, []).append(n)

    def fits(n: Node) -> bool:
        return n.op_type in ELEMENTWISE and takes(n)

    pro: list[Node] = []
    stack = [i for i in node.inputs[:2] if i]
    while stack:
        p = producer.get(stack.pop())
        if p is not None and fits(p) and p not in pro and all(len(users.get(o, [])) == 1 for o in p.outputs if o):
            if all(o not in model.outputs for o in p.outputs):
                pro.append(p)
                stack += [i for i in p.inputs if i]
    epi: list[Node] = []
    last = node
    while len(last.outputs) == 1 and last.outputs[0] not in model.outputs:
        nxt = users.get(last.outputs[0], [])
        if len(nxt) != 1 or not fits(nxt[0]):
            break
        # a link that also reads what a library node writes (a residual after a Conv) would sit
        # beyond that node: the partitioner would not put it in the contraction's group
        others = [producer.get(i) for i in nxt[0].inputs if i and i != last.outputs[0]]
        if any(p is not None and not takes(p) for p in others):
            break
        last = nxt[0]
        epi.append(last)
    return tuple(sorted(pro, key=lambda n: n.index)), tuple(epi)


def host_rule(model: OnnxModel, node: Node) -> str:
    """Why the CPU target's library runs `node` whatever the model says ("" where the model decides):
    a float32 2-D Conv (the host step's C kernels, whatever its size: `host_c_conv`), or another
    Conv of at least HOST_CONV_MIN_MACS, runs in the host convolution (module docstring)."""
    if node.op_type != "Conv":
        return ""
    if host_c_conv(model, node):
        return "the CPU target: the host convolution's C kernels (any size: one step of the model's C chain)"
    if math.prod(contraction_shape(model, node)) >= HOST_CONV_MIN_MACS:
        return "the CPU target: the host convolution (numpy window view + BLAS), no generated conv template"
    return ""


def host_c_conv(model: OnnxModel, node: Node) -> bool:
    """Whether a Conv runs in the host step's C kernels (conv_step.HostConvStep `fast`): float32,
    4-D input and weights, no negative pad. On the CPU target such a Conv costs no Python per run
    once the model runs as one C call (cpu_chain.py), so even a squeeze-excite 1x1 goes there:
    its generated kernel (im2col index arithmetic per multiply-add) cost 14-21 us on the exported
    MobileNetV3's 8-16 K multiply-add convs, the C step 1-3 us."""
    x, w = (model.values.get(i) for i in node.inputs[:2])
    if x is None or w is None or x.dtype != "float32" or len(x.shape or ()) != 4 or len(w.shape or ()) != 4:
        return False
    return min(node.attrs.get("pads", [0]), default=0) >= 0


def route_contraction(
    model: OnnxModel,
    node: Node,
    gpu: GPUSpec,
    takes: Callable[[Node], bool] = lambda n: False,
    routing: Routing = Routing.MODEL,
    plans: Plans | None = None,
    host: bool = False,
) -> Route:
    """Panamera's modeled plan of `node` with its element-wise neighbours (those `takes` accepts)
    against the library's roofline on `gpu` plus those neighbours planned alone; the faster runs
    it, unless `routing` pins the side (a node Panamera cannot plan stays with the library), or,
    with `host` (the CPU target runs the subgraphs), `host_rule` gives it to the library.
    `plans` (plans.py, on `gpu`): the memo shared by every route of one partition, so that a
    program repeated under other names (a repeated block) is planned once."""
    plans = Plans(gpu) if plans is None else plans
    shape = contraction_shape(model, node)
    m, n, k, batch = shape
    dtype = model.values[node.inputs[0]].dtype or "int8"
    cost = library_matmul(gpu, m, n, k, batch, dtype)
    lib, bound = cost.total_s * 1e6, cost.compute_bound
    pro, epi = neighbours(model, node, takes)
    last = epi[-1] if epi else node
    outs = tuple(o for o in last.outputs if o)
    names = tuple(f"{x.op_type} {x.label}" for x in pro + epi)
    try:
        plan = plans.figures(model, (*pro, node, *epi), outs)
        alone = 0.0
        if pro:  # the prologue alone writes the operands the library reads
            fed = tuple(i for i in node.inputs if any(i in p.outputs for p in pro))
            alone += plans.figures(model, pro, fed).modeled_us
        if epi:
            alone += plans.figures(model, epi, outs).modeled_us
    except PanameraError as e:
        return Route(Runner.LIBRARY, shape, lib, None, compute_bound=bound, note=str(e))
    split = plan.split
    runner = Runner.PANAMERA if plan.modeled_us < lib + alone else Runner.LIBRARY
    if routing is not Routing.MODEL:
        runner = Runner.PANAMERA if routing is Routing.PANAMERA else Runner.LIBRARY
    rule = host_rule(model, node) if host and routing is Routing.MODEL else ""
    runner = Runner.LIBRARY if rule else runner
    if host and routing is Routing.MODEL and not rule and node.op_type in HOST_PANAMERA:
        rule, runner = HOST_PANAMERA_RULE, Runner.PANAMERA
    return Route(runner, shape, lib, plan.modeled_us, split, bound, "", names, alone, routing, rule)
