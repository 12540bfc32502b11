"""The compile path of a sorted-segment scatter-add (frontend/scatter.py `scatter_add_sorted`):
recognized by the program stage as the whole computation, planned by schedule/segments.py,
rendered by codegen/segment_kernel.py, run through the same LaunchPlan and executor as every
compiled computation (stages.py's stages call the four functions below).

Preconditions of the recognition (else `Unsupported`, and the formulation stage costs the
alternative at infinity): (1) the computation has one output, the sorted scatter (a reshape of
it); (2) its index and source are placeholders (reshapes of them): the kernels read the
caller's arrays; (3) the index is an integer tensor.

>>> import numpy as np, panamera as pn
>>> from panamera.frontend.scatter import scatter_add_sorted
>>> ids = pn.placeholder((4,), "int64", name="ids")
>>> k = pn.compile(scatter_add_sorted(ids, pn.placeholder((4, 2), name="g"), rows=3), target="emulator")
>>> k(np.array([2, 0, 2, 2]), np.ones((4, 2), np.float32)).tolist()
[[1.0, 1.0], [0.0, 0.0], [3.0, 3.0]]
"""

from __future__ import annotations

import hashlib

from .codegen.header import prelude
from .codegen.islast import HELPERS
from .codegen.segment_kernel import merge_runs, render_segments
from .dtypes import as_dtype
from .errors import Unsupported
from .frontend.tensor import Tensor, topological
from .model.gpu import H100, GPUSpec
from .poly.program import Program, tensor_graph
from .runtime.executor import Executor
from .runtime.plan import BufferRole, BufferSpec, IndexCheck, InputSpec, Launch, LaunchPlan, LaunchRole, ResultSpec
from .schedule.segments import ScatterProblem, SegmentPlan, plan_segments

OP = "scatter_sorted"


def _source(t: Tensor) -> Tensor:
    while t.op == "reshape":
        t = t.inputs[0]
    return t


def recognize_any(graph: tuple[Tensor, ...]) -> bool:
    """Whether the graph holds a sorted scatter anywhere."""
    return any(t.op == OP for t in topological(graph))


def fits(graph: tuple[Tensor, ...], alternative: tuple[Tensor, ...]) -> bool:
    """Whether `alternative`, a formulation of one choice point of `graph`, can be compiled there:
    it holds no sorted scatter, or the choice point is the whole of `graph` (precondition 1; the
    formulation stage costs a form that cannot at infinity, so that `x + scatter_add_rows(...)`
    keeps a form that can).

    >>> import panamera as pn
    >>> from panamera.frontend.scatter import scatter_add_rows
    >>> ids, g = pn.placeholder((4,), "int64"), pn.placeholder((4, 2))
    >>> s = scatter_add_rows(ids, g, rows=1000)  # owner computes, atomic or sorted segments
    >>> [fits((s,), (alt,)) for alt in s.inputs], [fits((s * 2.0,), (alt,)) for alt in s.inputs]
    ([True, True, True], [True, True, False])
    """
    if not recognize_any(alternative):
        return True
    top = _source(graph[0]) if len(graph) == 1 else None
    return top is not None and top.op == "choose" and any(t.uid == alternative[0].uid for t in top.inputs)


def recognize(graph: tuple[Tensor, ...]) -> Tensor | None:
    """The sorted scatter node when it is the whole computation (preconditions 1-3), None when
    the graph has none; `Unsupported` when it has one elsewhere."""
    if not recognize_any(graph):
        return None
    node = _source(graph[0]) if len(graph) == 1 else None
    if node is None or node.op != OP:
        raise Unsupported(
            f"a sorted-segment scatter-add must be the whole computation (precondition 1), here part of a larger "
            f"one ({len(graph)} output(s), the first computed by op {_source(graph[0]).op!r}): compile the scatter alone"
        )
    for what, t in zip(("index", "source"), node.inputs):
        if _source(t).op != "placeholder":
            raise Unsupported(
                f"sorted-segment scatter-add: its {what} {t.label!r} is computed (op {_source(t).op}); it must be an "
                "input of the compiled computation (precondition 2)"
            )
    if node.inputs[0].dtype.is_float or node.inputs[0].dtype.name == "bool":
        raise Unsupported(f"sorted-segment scatter-add: index of dtype {node.inputs[0].dtype} (precondition 3)")
    return node


def program_of(node: Tensor, graph: tuple[Tensor, ...]) -> Program:
    """The Program of a sorted scatter: its placeholders and tensor graph, no statements (the
    node is lowered by its own kernels)."""
    inputs = tuple(sorted({_source(t).uid: _source(t) for t in node.inputs}.values(), key=lambda t: t.uid))
    return Program(graph, inputs, (), (), None, tensor_graph(graph))


def problem_of(node: Tensor) -> ScatterProblem:
    """The ScatterProblem of sorted-scatter node `node` (the GPU plan's and the CPU plan's input)."""
    ids, src = node.inputs
    rows, width = node.shape
    return ScatterProblem(ids.shape[0], rows, width, ids.dtype, src.dtype, node.attr("skip"))


def plan_of(node: Tensor, gpu: GPUSpec, **pinned) -> SegmentPlan:
    return plan_segments(problem_of(node), gpu, **pinned)


def executor_of(outputs, target: str = "emulator", gpu: GPUSpec = H100, **pinned) -> Executor:
    """The Executor of a sorted scatter compiled on its own with the plan's choices `pinned`
    (`tile`, `groups_per_block`, `threads`: schedule/segments.py): the tests show the bits do
    not move with them. `executor(executor.bind(arrays, {}))` returns [the table].
    """
    graph = tuple(outputs) if isinstance(outputs, list | tuple) else (outputs,)
    node = recognize(graph)
    if node is None:
        raise Unsupported("executor_of: the computation holds no sorted-segment scatter-add")
    p = plan_of(node, gpu, **pinned)
    plan, source, signatures = launch_plan(node, p, graph, program_of(node, graph).inputs)
    return Executor(plan, source, signatures, target)


def launch_plan(
    node: Tensor, p: SegmentPlan, graph: tuple[Tensor, ...], inputs: tuple[Tensor, ...]
) -> tuple[LaunchPlan, str, tuple]:
    """(the LaunchPlan, the source, the kernels' C signatures) of plan `p`."""
    ids, src = (_source(t) for t in node.inputs)
    acc = p.problem.acc_dtype
    digest = hashlib.sha1(repr((p.n, p.rows, p.width, p.ids.name, p.src.name, p.skip, p.tile)).encode()).hexdigest()
    name = f"pn_seg_{digest[:8]}"
    body = HELPERS + render_segments(name, p)
    ids_key, src_key, out_key = f"in:{ids.uid}", f"in:{src.uid}", f"out:{node.uid}"
    i64 = key64 = as_dtype("int64")  # the keys are unsigned 64-bit words in int64-sized buffers
    buffers = {
        ids_key: BufferSpec(ids_key, ids.dtype.c_type, ids.dtype, p.n, BufferRole.INPUT, "ids", uid=ids.uid),
        src_key: BufferSpec(src_key, src.dtype.c_type, src.dtype, p.n * p.width, BufferRole.INPUT, "src", uid=src.uid),
        out_key: BufferSpec(out_key, p.src.c_type, p.src, p.rows * p.width, BufferRole.OUTPUT, "out", uid=node.uid),
        "seg:bad": BufferSpec("seg:bad", "long long", i64, 1, BufferRole.PARTIALS, "bad"),
        "seg:keys0": BufferSpec("seg:keys0", "unsigned long long", key64, p.n, BufferRole.PARTIALS, "keys0"),
        "seg:keys1": BufferSpec("seg:keys1", "unsigned long long", key64, p.n, BufferRole.PARTIALS, "keys1"),
        "seg:part": BufferSpec("seg:part", acc.c_type, acc, p.n * p.width, BufferRole.PARTIALS, "part"),
        # a byte per row: set by `tile` for the rows some id names, cleared by `own` (zeroed once)
        "seg:mark": BufferSpec("seg:mark", "unsigned char", as_dtype("uint8"), p.rows, BufferRole.COUNTER, "mark"),
    }
    runs = merge_runs(p.n, p.tile)
    sorted_key = "seg:keys0" if len(runs) % 2 == 0 else "seg:keys1"
    args = {
        "tile": ((ids_key, True), ("seg:keys0", False), ("seg:mark", False), ("seg:bad", False)),
        **{
            f"merge{L}": ((f"seg:keys{k % 2}", True), (f"seg:keys{(k + 1) % 2}", False), (out_key, False),
                          ("seg:mark", True))
            for k, L in enumerate(runs)
        },
        "part": ((sorted_key, True), (src_key, True), (ids_key, True), (out_key, False), ("seg:part", False),
                 ("seg:bad", False), ("seg:mark", True)),
        "own": ((sorted_key, True), ("seg:part", True), (out_key, False), ("seg:mark", False)),
    }  # fmt: skip
    signatures = [(f"{name}_clear", ("unsigned char*",))]
    launches = [Launch(f"{name}_clear", (max(1, min(-(-p.rows // 256), 1024)), 1, 1), (256, 1, 1),
                       (("buf", "seg:mark"),), LaunchRole.INIT_ONCE)]  # fmt: skip
    for suffix, (grid, block), cost, (read, written) in p.launches:
        kargs = args[suffix]
        sig = tuple(f"{'const ' if ro else ''}{buffers[key].ctype}*" for key, ro in kargs)
        signatures.append((f"{name}_{suffix}", sig))
        launches.append(
            Launch(
                f"{name}_{suffix}",
                (grid, 1, 1),
                (block, 1, 1),
                tuple(("buf", key) for key, _ in kargs),
                LaunchRole.MAP,
                form="SORTED_SEGMENTS",
                bytes_read=read,
                bytes_written=written,
                mapping=f"{suffix}: {p.describe()}",
                modeled_us=cost.total_s * 1e6,  # launch_plan.py's _queued takes the queued gap off
                cost_features=cost.features,
            )
        )
    order = [t.uid for t in inputs]
    aligns = {src.uid: p.vec * src.dtype.itemsize}  # the source's rows are loaded as vectors
    specs = tuple(InputSpec(t.name, f"in:{t.uid}", t.shape, t.dtype, aligns.get(t.uid, 1)) for t in inputs)
    check = IndexCheck("seg:bad", order.index(ids.uid), node.attr("index") or ids.label, p.rows, p.n, "scatter-add")
    out = graph[0]
    checks = (check,) if node.attr("check", True) else ()  # scatter_add_rows's form: ids outside drop
    plan = LaunchPlan(tuple(launches), buffers, specs, (ResultSpec(out.shape, out.size, out_key),), checks)
    return plan, prelude(body) + body, tuple(signatures)
