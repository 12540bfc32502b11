"""Partitioning an ONNX graph into subgraphs Panamera fuses and nodes left to the array library.

A node is Panamera's when it has a converter, its values have supported dtypes and static
shapes. Supported nodes are grouped by connectivity, but only within one *level*: the number of
library nodes on the longest path from the graph inputs. A path that leaves a group through a
library node comes back (if ever) at a higher level, so every group is convex: it can run as one
unit with all its inputs ready, and the units form a DAG.

Two decisions are made here, once, and carried as data on the `Partition`: the route of every
contraction (route.py: Panamera or the library, both modeled figures in the reason), and, for a
group holding a single data-moving node, why it is alone (`why_alone`: its library neighbours,
and the library nodes a fusion with another group would wait on); the report and `panamera
explain` print them.

>>> from onnx import helper, TensorProto
>>> from panamera.subgraph.model import load_model
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> def mm(m):  # x (m x 1024) @ w (1024 x 1024), then a softmax
...     g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["y"])],
...         "g", [v("x", [m, 1024]), v("w", [1024, 1024])], [v("y", [m, 1024])])
...     return partition(load_model(helper.make_model(g).SerializeToString()))
>>> p = mm(1024)  # a compute-bound GEMM keeps the library (route.py: both figures in the reason)
>>> [[n.op_type for n in grp] for grp in p.groups], [(n.op_type, why[:13]) for n, why in p.library]
([['Softmax']], [('MatMul', 'compute-bound')])
>>> p.alone  # the softmax is alone: why
('its producer(s) MatMul MatMul_0 run in the library',)
>>> [[n.op_type for n in grp] for grp in mm(1).groups]  # a GEMV is Panamera's, fused with its consumer
[['MatMul', 'Softmax']]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from ..model.gpu import H100, GPUSpec
from .build import QUANTIZED
from .conv_fuse import FusedConv, fuse_epilogues
from .convert import CONVERTERS, VIEWS
from .library import ARRAY_OPS
from .model import DEFAULT_DOMAINS, Node, OnnxModel
from .plans import Plans
from .route import ROUTED, Route, Routing, Runner, route_contraction

# The ops Panamera takes: those it has a converter for (when their values fit, see why_library).
SUPPORTED = frozenset(CONVERTERS)
# Compute-bound ops the arrays' own module runs (cuBLAS through CuPy, numpy on the CPU); the
# contractions among them (route.py's ROUTED) are Panamera's where the model says it is faster.
NATIVE = frozenset(ARRAY_OPS) - ROUTED
# Compute-bound ops never Panamera's (it parallelizes reductions, not convolutions).
COMPUTE_BOUND = NATIVE | {"ConvTranspose", "QLinearMatMul", "Einsum", "Attention"}
# The ops that widen quantized (int8 / uint8, build.py's QUANTIZED) inputs in registers as they
# read them: only they may read such values; no other node may produce or consume one.
WIDENING = frozenset({"Cast", "DequantizeLinear", "MatMulInteger"})


@dataclass(frozen=True)
class Partition:
    """The live nodes split into Panamera's groups and the array library's nodes."""

    groups: tuple[tuple[Node, ...], ...]  # Panamera subgraphs, each in graph order
    library: tuple[tuple[Node, str], ...]  # nodes left to the array library, with the reason
    routes: tuple[tuple[Node, Route], ...] = ()  # every contraction the model routed, either way
    alone: tuple[str, ...] = ()  # per group: why its one data-moving node could not join others ("" if it has more)
    fused: tuple[FusedConv, ...] = ()  # host Convs with their epilogue nodes (conv_fuse.py; the CPU target)
    # the router's modeled plans (plans.py), which the report's baseline reuses: a memo, not a decision
    plans: Plans | None = field(default=None, compare=False, repr=False)

    def route(self, node: Node) -> Route | None:
        """The router's decision for `node` (None when it is no routed contraction)."""
        return next((r for n, r in self.routes if n == node), None)


def why_library(node: Node, model: OnnxModel) -> str | None:
    """None when Panamera can take the node, else the reason it stays with the array library
    (a contraction Panamera can take is then routed by the model: `partition`)."""
    if node.domain not in DEFAULT_DOMAINS:
        return f"domain {node.domain!r} is not the ONNX standard domain"
    if node.op_type in NATIVE:
        return "compute-bound: the array library runs it (CuPy's cuBLAS on a GPU, numpy on the CPU)"
    if node.op_type in COMPUTE_BOUND:
        return "compute-bound: left to the library (onnx's reference evaluator, on the host)"
    if node.op_type not in SUPPORTED:
        return f"op {node.op_type} is not supported by Panamera"
    refuse = CONVERTERS[node.op_type].refuse
    why = refuse(node) if refuse is not None else None
    if why:
        return why
    for name in node.inputs + node.outputs:
        if not name:
            continue
        v = model.values.get(name)
        if v is None or v.shape is None:
            return f"the shape of {name!r} is not static"
        if v.dtype is None and not (v.elem in QUANTIZED and node.op_type in WIDENING and name in node.inputs):
            return f"dtype {v.elem_name} of {name!r} is not a Panamera dtype"
    return None


def graph(model: OnnxModel) -> nx.DiGraph:
    """The node graph: an edge producer -> consumer per value."""
    g = nx.DiGraph()
    producer = {o: n.index for n in model.nodes for o in n.outputs if o}
    for n in model.nodes:
        g.add_node(n.index)
        for i in n.inputs:
            if i in producer:
                g.add_edge(producer[i], n.index)
    return g


def partition(
    model: OnnxModel,
    compile_views: bool = False,
    gpu: GPUSpec = H100,
    routing: Routing = Routing.MODEL,
    host: bool = False,
) -> Partition:
    """Group the live nodes. A group made only of views (Reshape, Squeeze, ...) moves no data and
    stays with the array library unless `compile_views` (conformance tests use it). Each
    contraction Panamera can take is routed by the model on `gpu` (route.py): the library keeps
    it where its tensor-core roofline is modeled faster, with both figures in the reason
    (`routing` may pin the side instead; `host`: the CPU target runs the subgraphs, and
    route.host_rule comes first, and the library Convs take their element-wise epilogues: conv_fuse.py)."""
    g = graph(model)
    reasons = {n.index: why_library(n, model) for n in model.nodes}
    plans = Plans(gpu)
    routes = tuple(
        (n, route_contraction(model, n, gpu, lambda m: reasons[m.index] is None, routing, plans, host))
        for n in model.nodes
        if n.op_type in ROUTED and reasons[n.index] is None
    )
    for n, r in routes:
        if r.runner is Runner.LIBRARY:
            reasons[n.index] = r.reason
    fused = ()
    if host:  # the library's Convs run in the host convolution: their epilogues go with them
        fused = fuse_epilogues(model, tuple(n for n, r in routes if r.runner is Runner.LIBRARY))
        for f in fused:
            for n in f.nodes:
                reasons[n.index] = f"in the epilogue of host Conv {f.conv.label} (conv_fuse.py)"
    level = {}
    for k in nx.topological_sort(g):
        level[k] = max((level[p] + (reasons[p] is not None) for p in g.predecessors(k)), default=0)
    supported = [n.index for n in model.nodes if reasons[n.index] is None]
    sub = nx.Graph()
    sub.add_nodes_from(supported)
    sub.add_edges_from((a, b) for a, b in g.edges if a in sub and b in sub and level[a] == level[b])
    by_index = {n.index: n for n in model.nodes}
    groups, library = [], []
    for comp in sorted(nx.connected_components(sub), key=min):
        nodes = tuple(by_index[k] for k in sorted(comp))
        if not compile_views and all(n.op_type in VIEWS for n in nodes):  # views move no data: no kernel to make
            library += [(n, "a view: no data movement, no kernel") for n in nodes]
        else:
            groups.append(nodes)
    library += [(by_index[k], r) for k, r in reasons.items() if r is not None]
    alone = tuple(why_alone(g, model, groups, k, {n.index for n, _ in library}) for k in range(len(groups)))
    library = tuple(sorted(library, key=lambda nr: nr[0].index))
    return Partition(tuple(groups), library, routes, alone, fused, plans)


def _names(nodes) -> str:
    return ", ".join(f"{n.op_type} {n.label}" for n in nodes)


def why_alone(g: nx.DiGraph, model: OnnxModel, groups: list, k: int, library: set[int]) -> str:
    """Why group `k`, if it holds one data-moving node, is alone: the library nodes it reads from
    and writes to (library views are looked through: they move no data), and for every Panamera
    neighbour in another group the library nodes on the paths between them (one unit with it
    would not be convex: it would wait on a library node that waits on it)."""
    mine = {n.index for n in groups[k]}
    if sum(n.op_type not in VIEWS for n in groups[k]) != 1:
        return ""
    by_index = {n.index: n for n in model.nodes}
    group_of = {n.index: j for j, grp in enumerate(groups) for n in grp}
    lib_nb: dict[str, list[Node]] = {"producer": [], "consumer": []}
    pn_nb: dict[int, int] = {}
    for role, step in (("producer", g.predecessors), ("consumer", g.successors)):
        stack, seen = [b for a in mine for b in step(a) if b not in mine], set()
        while stack:
            b = stack.pop()
            if b in seen:
                continue
            seen.add(b)
            if b in library and by_index[b].op_type in VIEWS:
                stack += list(step(b))  # a view the library keeps moves no data: look through it
            elif b in library:
                lib_nb[role].append(by_index[b])
            elif group_of.get(b) is not None and group_of[b] != k:
                pn_nb.setdefault(b, group_of[b])
    parts = []
    for role, nodes in lib_nb.items():
        if nodes:
            parts.append(f"its {role}(s) {_names(sorted(set(nodes), key=lambda n: n.index))} run in the library")
    for b, j in sorted(pn_nb.items()):
        a = min(mine)
        between = (nx.descendants(g, a) & nx.ancestors(g, b)) | (nx.descendants(g, b) & nx.ancestors(g, a))
        via = sorted(
            (by_index[x] for x in between if x in library and by_index[x].op_type not in VIEWS), key=lambda n: n.index
        )
        parts.append(
            f"joining {by_index[b].op_type} {by_index[b].label} (subgraph {j}) would wait on library node(s) "
            f"{_names(via) or '-'}: not one convex unit"
        )
    if not parts:
        parts.append("it reads only graph inputs and constants and writes only graph outputs: nothing to fuse with")
    return "; ".join(parts)
