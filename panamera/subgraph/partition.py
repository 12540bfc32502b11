"""Partitioning an ONNX graph into subgraphs Panamera fuses and nodes left to the array library.

A node is Panamera's when it has a converter, its values have supported dtypes and static
shapes. Supported nodes are grouped by connectivity, but only within one *level*: the number of
library nodes on the longest path from the graph inputs. A path that leaves a group through a
library node comes back (if ever) at a higher level, so every group is convex: it can run as one
unit with all its inputs ready, and the units form a DAG.

>>> from onnx import helper, TensorProto
>>> from panamera.subgraph.model import load_model
>>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
>>> g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]),
...     helper.make_node("Softmax", ["h"], ["y"])], "g", [v("x", [2, 3]), v("w", [3, 4])], [v("y", [2, 4])])
>>> p = partition(load_model(helper.make_model(g).SerializeToString()))
>>> [[n.op_type for n in grp] for grp in p.groups], [(n.op_type, why[:13]) for n, why in p.library]
([['Softmax']], [('MatMul', 'compute-bound')])
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from .convert import CONVERTERS, VIEWS
from .library import ARRAY_OPS
from .model import DEFAULT_DOMAINS, Node, OnnxModel

# The ops Panamera takes: those it has a converter for (when their values fit, see why_library).
SUPPORTED = frozenset(CONVERTERS)
# Compute-bound ops the arrays' own module runs (cuBLAS through CuPy, numpy on the CPU).
NATIVE = frozenset(ARRAY_OPS)
# Compute-bound ops: never Panamera's (it parallelizes reductions, not GEMMs and convolutions).
COMPUTE_BOUND = NATIVE | {"Conv", "ConvTranspose", "MatMulInteger", "QLinearMatMul", "Einsum", "Attention"}


@dataclass(frozen=True)
class Partition:
    """The live nodes split into Panamera's groups and the array library's nodes."""

    groups: tuple[tuple[Node, ...], ...]  # Panamera subgraphs, each in graph order
    library: tuple[tuple[Node, str], ...]  # nodes left to the array library, with the reason


def why_library(node: Node, model: OnnxModel) -> str | None:
    """None when Panamera can take the node, else the reason it stays with the array library."""
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
        if v.dtype is None:
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


def partition(model: OnnxModel, compile_views: bool = False) -> Partition:
    """Group the live nodes. A group made only of views (Reshape, Squeeze, ...) moves no data and
    stays with the array library unless `compile_views` (conformance tests use it)."""
    g = graph(model)
    reasons = {n.index: why_library(n, model) for n in model.nodes}
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
    return Partition(tuple(groups), tuple(sorted(library, key=lambda nr: nr[0].index)))
