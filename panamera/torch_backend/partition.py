"""Partitioning an ATen graph: Panamera's subgraphs, and the rest left to eager PyTorch.

`SUPPORT` says which nodes Panamera can compute (an op of aten.TABLE, on dtypes Panamera has,
with static, non-empty shapes on one device); torch's `CapabilityBasedPartitioner` groups them
into acyclic partitions; a partition becomes a Panamera subgraph only if it holds an ANCHOR (a
reduction, normalization, softmax-family op or loss): element-wise chains and views alone stay
in eager PyTorch, where they cost the same. Each subgraph is translated into Panamera ops
(`translate`), compiled with `pn.compile` (its in-memory cache makes a subgraph seen before cost
well under a millisecond) and called through `PanameraSubgraph`, which takes and returns torch
tensors (runtime/arrays.py). A subgraph Panamera cannot express stays eager, with its reason.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

import panamera as pn

from ..errors import PanameraError
from ..frontend.symbolic import Dim
from .aten import DTYPES, TABLE, OpKind, TranslationError, fit, meta
from .bounds import checked, index_bounds
from .foreach import fuse_total_norms
from .foreach_map import lower_foreach_maps
from .isolate import canonical_scatters, isolate_sorted_scatters
from .multitensor import lower_norms
from .mutations import write_back
from .symbolic import (
    DynamicSubgraph,
    PerShapeSubgraph,
    extent,
    number,
    retraced,
    shape_of,
    signature,
    specialized,
    split,
    why_not_symbolic,
)

PREFIX = "panamera_"
aten = torch.ops.aten
CONTRACTIONS = (aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.matmul, aten.convolution, aten.convolution_backward)
NO_ANCHOR = "element-wise or view ops with no reduction beside them: eager PyTorch runs them at the same cost"


@dataclass(frozen=True)
class EagerOp:
    """An ATen op left to eager PyTorch, and why."""

    op: str
    node: str
    reason: str


def _tensor_vals(v) -> list:
    if isinstance(v, (tuple, list)):
        return [x for item in v for x in _tensor_vals(item)]
    return [v] if isinstance(v, torch.Tensor) else []


def why_unsupported(node: torch.fx.Node) -> str | None:
    """Why Panamera cannot compute `node`, or None when it can."""
    if node.op != "call_function":
        return f"a {node.op} node"
    if node.target is operator.getitem:
        return why_unsupported(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else "getitem of a value"
    entry = TABLE.get(node.target)
    if entry is None:
        packet = getattr(node.target, "overloadpacket", None)
        if packet in CONTRACTIONS:
            return "a contraction: eager PyTorch runs it on cuBLAS/cuDNN (the backend takes reductions and their neighbours)"
        return f"{node.target} is not in the backend's vocabulary (torch_backend/aten.py)"
    out = meta(node)
    if out is None:
        return "no shape information"
    vals = [v for v in _tensor_vals(out) if v.numel() or not isinstance(out, (tuple, list))]  # batch norm's (0,)
    for a in node.all_input_nodes:
        v = meta(a)
        if isinstance(v, torch.SymInt):  # an extent of a dynamic graph (a view's size): built by `extent`
            reason = why_not_symbolic(v)
            if reason:
                return reason
            continue
        if not isinstance(v, torch.Tensor):
            return f"input {a.name} is not a tensor"
        vals.append(v)
    for v in vals:
        if v.dtype not in DTYPES:
            return f"dtype {v.dtype}"
        reason = why_not_symbolic(v)
        if reason:
            return reason
        if isinstance(v.numel(), int) and v.numel() == 0:
            return "an empty tensor"
        if v.device != vals[0].device:
            return "tensors on several devices"
    return entry.check(node) if entry.check is not None else None


class Support(OperatorSupportBase):
    """torch's operator-support interface over `why_unsupported`."""

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return why_unsupported(node) is None


def kind_of(node: torch.fx.Node) -> OpKind | None:
    entry = TABLE.get(node.target) if node.op == "call_function" else None
    return entry.kind if entry is not None else None


def anchored(nodes) -> set:
    """The nodes of a partition connected (by data edges inside it, either way) to an anchor op.
    torch's partitioner also merges independent nodes (a weight's transpose beside a layer norm);
    they stay eager, where a view is free. Dropping a component keeps the partition acyclic:
    nothing outside it lay on a path between two of its nodes."""
    nodes = set(nodes)
    seen = {n for n in nodes if kind_of(n) == OpKind.ANCHOR}
    stack = list(seen)
    while stack:
        n = stack.pop()
        for m in (*n.all_input_nodes, *n.users):
            if m in nodes and m not in seen:
                seen.add(m)
                stack.append(m)
    return seen


def convex_with(members: set, node: torch.fx.Node) -> bool:
    """Whether `members` plus `node` stays convex: no path leaves the set and comes back (a
    fused partition is one call in the graph, so such a path would be a cycle)."""
    grown = members | {node}
    stack = [u for m in grown for u in m.users if u not in grown]
    seen = set(stack)
    while stack:
        n = stack.pop()
        for u in n.users:
            if u in grown:
                return False
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return True


def grow(gm: torch.fx.GraphModule, parts: list) -> None:
    """Anchored partitions take the supported element-wise and view nodes no partition holds,
    producers first (a bias gradient's element-wise producer joins its column sum), then
    element-wise consumers (never a view: as the partition's output it would be a copy), wherever
    the partition stays convex; in place, until nothing moves.

    Preconditions for adding node n to partition P, each checked (negative tests in
    tests/test_torch_training.py):
      1. n is supported (`why_unsupported`) and in no partition;
      2. P plus n is convex (`convex_with`): no path from P ∪ {n} leaves it and comes back;
      3. a view n joins only a partition that reads it (as an output it would be a copy).

    torch's partitioner merges greedily: in a backward graph it often puts two independent
    reductions together and leaves each one's element-wise producers in another partition
    (which `anchored` then drops), because both producers could not join without a cycle
    through the eager matmul between them."""
    owner = {n: p for p in parts for n in p.nodes}
    free = [n for n in reversed(gm.graph.nodes) if n not in owner and why_unsupported(n) is None]
    moved = True
    while moved:
        moved = False
        for n in free:
            if n in owner:
                continue
            near = [owner[u] for u in n.users if u in owner]
            if kind_of(n) != OpKind.VIEW:  # a view joins as a producer only: as an output it would be a copy
                near += [owner[a] for a in n.all_input_nodes if a in owner]
            for p in dict.fromkeys(near):  # consumers' partitions first, each once
                if convex_with(set(p.nodes), n):
                    p.add_node(n)
                    owner[n] = p
                    moved = True
                    break


def propose(gm: torch.fx.GraphModule) -> tuple[CapabilityBasedPartitioner, list]:
    """The partitions worth a Panamera subgraph: those with an anchor op, less the nodes not
    connected to one, grown by the free element-wise neighbours that keep them convex."""
    partitioner = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True)
    parts = []
    for p in partitioner.propose_partitions():
        keep = anchored(p.nodes)
        for n in [n for n in p.nodes if n not in keep]:
            p.remove_node(n)
        if p.nodes:
            parts.append(p)
    grow(gm, parts)
    return partitioner, parts


def is_value(node: torch.fx.Node) -> bool:
    """Whether an integer argument of a partition is read as a number (an operand of element-wise
    arithmetic: a position `arange(n) + past_length`), not as an extent (a view's size). A dynamic
    graph's such SymInt becomes a 0-d int64 input (`symbolic.number` passes its value at each call)
    instead of a constant that would need a compilation per value."""
    return bool(node.users) and all(
        kind_of(u) is OpKind.ELEMENTWISE and any(a is node for a in (*u.args, *u.kwargs.values())) for u in node.users
    )


def translate(sub: torch.fx.GraphModule, vals: list, split_products: bool = False) -> tuple[list, bool, list]:
    """Panamera tensors of a fused partition: (outputs, whether it returns one value, the
    submodule's arguments as Panamera values: placeholders, or extents for integer arguments).
    `vals` are torch's values of the arguments (FakeTensors or real tensors; SymInts and ints for
    a dynamic graph's extents). `split_products`: a placeholder's product extents are split into
    their factors (symbolic.split) and reshaped back, so each symbol is bound by an axis."""
    env: dict = {}
    holders = []
    outputs, single = [], True
    for node in sub.graph.nodes:
        if node.op == "placeholder":
            v = vals[len(holders)]
            if isinstance(v, torch.SymInt) and is_value(node):  # a size read as a number: a 0-d input
                env[node] = holder = pn.placeholder((), DTYPES[torch.int64], name=node.name)
                holders.append(holder)
                continue
            if isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool):  # an extent (a view's size)
                env[node] = extent(v)
            elif not isinstance(v, torch.Tensor) or v.dtype not in DTYPES:
                raise TranslationError(f"argument {node.name} is not a tensor Panamera supports")
            else:
                shape = shape_of(v)
                holder = pn.placeholder(split(shape) if split_products else shape, DTYPES[v.dtype], name=node.name)
                env[node] = holder.reshape(shape) if holder.shape != shape else holder
                holders.append(holder)
                continue
            holders.append(env[node])
        elif node.op == "call_function" and node.target is operator.getitem:
            src = env[node.args[0]]
            env[node] = src[node.args[1]]
            if env[node] is None:
                raise TranslationError(f"{node.name}: output {node.args[1]} of {node.args[0].name} is not computed")
        elif node.op == "call_function":
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            try:
                built = TABLE[node.target].build(node, *args, **kwargs)
            except PanameraError as e:
                raise TranslationError(f"{node.name} ({node.target}): {e}") from None
            env[node] = fit(built, meta(node), f"{node.name} ({node.target})")
        elif node.op == "output":
            result = node.args[0]
            single = not isinstance(result, (tuple, list))
            outputs = [env[n] for n in ((result,) if single else result)]
        else:
            raise TranslationError(f"a {node.op} node ({node.name}) inside a partition")
    return outputs, single, holders


@dataclass(frozen=True)
class SubgraphReport:
    """One partition: its ATen ops, and what became of it."""

    name: str
    ops: tuple[str, ...]
    kernels: int  # Panamera kernels per call; 0 if it stayed eager (or is compiled per shape at call time)
    eager_reason: str = ""  # why it stayed eager, if it did
    modeled_us: float = 0.0  # the plan's modeled time per call on its GPU (model/); a symbolic one's at the size hint
    traffic: tuple[tuple[str, int, int], ...] = ()  # (op, bytes read, bytes written) of each op run alone (at the hint)
    mode: str = "static"  # "static", "symbolic" (one DynamicCompiled) or "per-shape" (symbolic path refused)
    program: object = field(default=None, compare=False, repr=False)  # the DynamicCompiled of a symbolic one
    symbolic_reason: str = ""  # of a per-shape one: why the symbolic path refused it

    @property
    def compiled(self) -> bool:
        """Whether Panamera runs it (else eager PyTorch does)."""
        return bool(self.kernels) or self.mode == "per-shape"


FREE = {aten._unsafe_view.default, aten.alias.default, aten.detach.default}  # views AOTAutograd emits


def hint(n) -> int:
    """An extent as an int: a dynamic graph's SymInt at its size hint (the sizes dynamo traced it
    at: torch's `optimization_hint`, which adds no guard)."""
    if isinstance(n, torch.SymInt):
        return int(torch.fx.experimental.symbolic_shapes.optimization_hint(n, fallback=0))
    return int(n)


def op_traffic(node: torch.fx.Node) -> tuple[str, int, int]:
    """(op, bytes read, bytes written) of one ATen node as eager PyTorch runs it, one kernel reading
    each tensor argument once and writing its outputs (from torch's FakeTensor metadata; a dynamic
    graph's at its size hint, `hint`); a view moves nothing. Bench's training-step table models
    these as eager's kernels."""

    def size(v) -> int:
        if isinstance(v, (tuple, list)):
            return sum(size(x) for x in v)
        return hint(v.numel()) * v.element_size() if isinstance(v, torch.Tensor) else 0

    if node.target in FREE or getattr(node.target, "is_view", False):
        return str(node.target), 0, 0
    return str(node.target), sum(size(meta(a)) for a in node.all_input_nodes), size(meta(node))


class PanameraSubgraph(torch.nn.Module):
    """A compiled partition in the eager graph: torch tensors in, torch tensors out."""

    def __init__(self, compiled: pn.Compiled, used: tuple[int, ...]):
        super().__init__()
        self.compiled, self.used = compiled, used

    def forward(self, *args):
        return self.compiled(*(number(args, k) for k in self.used))


def _values(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list:
    """torch's values of a call_module node's arguments (get_attr constants read from `gm`)."""
    out = []
    for a in node.args:
        v = meta(a) if isinstance(a, torch.fx.Node) else a
        if v is None and isinstance(a, torch.fx.Node) and a.op == "get_attr":
            v = getattr(gm, a.target)
        out.append(v)
    return out


def _is_dynamic(vals: list) -> bool:
    return any(
        isinstance(v, torch.SymInt)
        or (isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape))
        for v in vals
    )


def _symbolic(name: str, sub, vals, target: str, deterministic: bool, on_specialize):
    """A partition of a dynamic graph: (module, report) compiled once over its symbolic shapes
    (a DynamicSubgraph), else per concrete shape at call time (a PerShapeSubgraph, with why)."""
    from ..cache import placeholders
    from ..dynamic import DynamicCompiled, members

    calls = [n for n in sub.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    ops, traffic = tuple(str(n.target) for n in calls), tuple(op_traffic(n) for n in calls)  # traffic at the hint
    try:
        outputs, single, holders = translate(sub, vals, split_products=True)
    except Exception as e:  # noqa: BLE001 - refused symbolically: re-traced per shape at call time
        reason = str(e) if isinstance(e, PanameraError) else f"{type(e).__name__}: {e}"
        build = retraced(sub, translate)
    else:
        try:
            k = pn.compile(outputs[0] if single else list(outputs), target=target, deterministic=deterministic)
        except Exception as e:  # noqa: BLE001 - refused symbolically: compiled per concrete shape at call time
            reason = str(e) if isinstance(e, PanameraError) else f"{type(e).__name__}: {e}"
            build = specialized(outputs, single, holders)
        else:
            if isinstance(k, DynamicCompiled):
                # a program compiled before for the same graph has its own placeholders: they match by
                # position (both in creation order)
                index = {h.uid: i for i, h in enumerate(holders) if isinstance(h, pn.Tensor)}
                used = tuple(index[t.uid] for t in placeholders((outputs[0],) if single else tuple(outputs)))
                kernels = len(members(k.program))
                module = DynamicSubgraph(k, used, signature(vals), tuple(holders[i].shape for i in used))
                at = hints(vals)  # modeled at the size hint, as the traffic (0 if a symbol has no hint)
                us = k.modeled_us(**at) if set(k.symbols) <= set(at) else 0.0
                return module, SubgraphReport(name, ops, kernels, modeled_us=us, traffic=traffic, mode="symbolic",
                                              program=k)  # fmt: skip
            used_uids = {t.uid for t in k.inputs}
            used = tuple(i for i, h in enumerate(holders) if isinstance(h, pn.Tensor) and h.uid in used_uids)
            return PanameraSubgraph(k, used), SubgraphReport(
                name, ops, len(k.plan.kernels), modeled_us=k.plan.modeled_us, traffic=traffic
            )
    module = PerShapeSubgraph(name, build, target, deterministic, reason, on_specialize, eager=sub)
    return module, SubgraphReport(name, ops, 0, traffic=traffic, mode="per-shape", symbolic_reason=reason)


def hints(vals) -> dict[str, int]:
    """The symbols of a dynamic partition's arguments at their size hints (`hint`), by name: each
    from an extent that is the symbol times a constant (s0, 5*s0; a sum's own symbol, `extent`)."""
    out: dict[str, int] = {}
    for v in vals:
        for s in (v,) if isinstance(v, torch.SymInt) else v.shape if isinstance(v, torch.Tensor) else ():
            e = extent(s) if isinstance(s, torch.SymInt) and why_not_symbolic(s) is None else None
            if isinstance(e, Dim) and len(e.syms) == 1:
                out[e.syms[0]] = hint(s) // e.coef
    return out


def compile_partitions(gm: torch.fx.GraphModule, target: str, deterministic: bool = False, on_specialize=None):
    """Fuse `gm`'s Panamera partitions into PanameraSubgraph modules, in place; returns the
    graph module, a report per partition and every op left to eager PyTorch with its reason.
    A dynamic graph's partitions are compiled over their symbolic shapes (`_symbolic`);
    `on_specialize(name, shapes, reason)` hears of each per-shape fallback compiled at call time."""
    recorded = index_bounds(gm)  # the ranges eager PyTorch checks, read before any rewrite (bounds.py)
    fuse_total_norms(gm)  # clip_grad_norm_'s norm of per-tensor norms: one reduction over every tensor
    lowered = lower_norms(gm, target, deterministic) + lower_foreach_maps(gm, target)  # multi-tensor launches
    write_back(gm)  # the input mutations left: in place, or one _foreach_copy_
    multi = [SubgraphReport(n, ops, k, modeled_us=us) for n, ops, k, us in lowered]
    alone = deterministic or target == "cpu"  # the CPU has no atomic scatter: a large one takes sorted segments
    canonical_scatters(gm, alone)  # a large deterministic index_put / index_add: x + embedding gradient
    partitioner, parts = propose(gm)
    parts = isolate_sorted_scatters(parts, alone, anchored)  # a large deterministic scatter alone
    inside = {n for p in parts for n in p.nodes}
    eager = [
        EagerOp(str(n.target), n.name, why_unsupported(n) or NO_ANCHOR)
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target is not operator.getitem
        and n not in inside
        and not isinstance(meta(n), (torch.SymInt, int))  # a dynamic graph's arithmetic on extents
    ]
    if not parts:
        return gm, multi, tuple(eager)
    fused = partitioner.fuse_partitions(parts, prefix=PREFIX)
    reports = multi
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not str(node.target).startswith(PREFIX):
            continue
        sub = fused.get_submodule(node.target)
        calls = [n for n in sub.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
        ops = tuple(str(n.target) for n in calls)
        vals = _values(fused, node)
        if _is_dynamic(vals):
            module, report = _symbolic(node.target, sub, vals, target, deterministic, on_specialize)
            setattr(fused, node.target, checked(module, node, recorded))
            reports.append(report)
            continue
        try:
            outputs, single, holders = translate(sub, vals)
            k = pn.compile(outputs[0] if single else outputs, target=target, deterministic=deterministic)
        except Exception as e:  # noqa: BLE001 - a subgraph Panamera cannot take stays eager: never break the model
            reason = str(e) if isinstance(e, PanameraError) else f"{type(e).__name__}: {e}"
            reports.append(SubgraphReport(node.target, ops, 0, reason))
            eager += [
                EagerOp(str(n.target), n.name, f"its subgraph {node.target} stays eager: {reason}") for n in calls
            ]
            continue
        used_uids = {t.uid for t in k.inputs}
        used = tuple(i for i, h in enumerate(holders) if isinstance(h, pn.Tensor) and h.uid in used_uids)
        setattr(fused, node.target, checked(PanameraSubgraph(k, used), node, recorded))
        reports.append(SubgraphReport(node.target, ops, len(k.plan.kernels), modeled_us=k.plan.modeled_us,
                                      traffic=tuple(op_traffic(n) for n in calls)))  # fmt: skip
    fused.recompile()
    return fused, reports, tuple(eager)
