"""Multi-tensor kernels: one launch over a list of tensors of different shapes.

`compile_norms` plans the norms of a list of tensors (what `_foreach_norm` and
`clip_grad_norm_`'s total norm compute) as ONE launch: the multi-tensor statement set of
poly/multitensor.py (the union of the pieces' domains and the block-range table), rendered by
codegen/multitensor_kernel.py, run through the same LaunchPlan and executor as every compiled
computation. The model chooses the chunk (elements per block) from `CHUNKS`; the merge is one
atomic per block into its piece's slot, or ordered partials when deterministic.

>>> import numpy as np
>>> k = compile_norms([(300,), (4, 5)], "float64")
>>> total, each = k(np.ones(300), np.ones((4, 5)))
>>> round(float(total) ** 2, 9), np.allclose(each, [300 ** 0.5, 20 ** 0.5]), k.launches
(320.0, True, 1)
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from .codegen.multitensor_kernel import (
    THREADS,
    UNROLL,
    MapList,
    NormKernel,
    NormMerge,
    map_signature,
    render_map,
    render_norms,
)
from .dtypes import as_dtype
from .errors import DTypeError, LegalityError, OptionError
from .model.gpu import H100, GPUSpec
from .model.kernel_cost import kernel_time
from .poly.multitensor import PARAM_BYTES, POINTER_BYTES, MultiTensorSet
from .runtime.executor import Executor
from .runtime.plan import BufferRole, BufferSpec, InputSpec, Launch, LaunchPlan, LaunchRole, ResultSpec

CHUNKS = (2048, 8192, 32768, 65536)  # elements per block the model chooses from (torch: 65536)


class _Launched:
    """What a compiled multi-tensor program says of itself, from its `plan` and `executor`."""

    plan: LaunchPlan
    executor: Executor

    @property
    def source(self) -> str:
        return self.executor.source

    @property
    def launches(self) -> int:
        """Launches per call (the first call also initialises the resident workspace)."""
        return len(self.plan.per_call)

    @property
    def modeled_us(self) -> float:
        return self.plan.modeled_us


@dataclass(frozen=True)
class MultiTensorNorm(_Launched):
    """A compiled multi-tensor norm: `k(*tensors)` returns (the total norm, each tensor's norm)."""

    set: MultiTensorSet
    order: float
    merge: NormMerge
    kernel: NormKernel
    plan: LaunchPlan
    target: str
    executor: Executor = field(compare=False, repr=False)

    def __call__(self, *arrays, order: str = "forward", seed: int = 0):
        scalars, each = self.executor(self.executor.bind(arrays, {}), order=order, seed=seed)
        split = [scalars[i : i + 1].reshape(()) for i in range(scalars.shape[0])]
        return (split[0], each, *split[1:])


def _cost(s: MultiTensorSet, merge: NormMerge, order: float, itemsize: int, gpu: GPUSpec):
    n = sum(p.size for p in s.pieces)
    written = (len(s.pieces) + 1) * itemsize
    partials = s.blocks if merge is NormMerge.PARTIALS else len(s.pieces)
    return kernel_time(
        gpu,
        dram_bytes=n * itemsize + written + partials * itemsize,
        write_bytes=written,
        blocks=s.blocks,
        threads=THREADS,
        bytes_in_flight_per_thread=UNROLL * itemsize,
        atomics=(2 if merge is NormMerge.ATOMIC_WS else 1) * s.blocks,
        same_address=max(s.chunks(k) for k in range(len(s.pieces))),
        cas_atomics=s.blocks if merge is NormMerge.ATOMIC_WS and abs(order) == math.inf else 0,
        fp32_ops=2.0 * n if itemsize == 4 else 0.0,
        fp64_ops=2.0 * n if itemsize == 8 else 0.0,
        atomic_dtype="float32" if itemsize == 4 else "float64",
    )


def compile_norms(
    shapes,
    dtype: str,
    order: float = 2.0,
    deterministic: bool = False,
    target: str = "emulator",
    gpu: GPUSpec = H100,
    chunk: int | None = None,
    epilogues: tuple[str, ...] = (),
) -> MultiTensorNorm:
    """The `order`-norm of each tensor of shapes `shapes` and of all of them together, in one launch.

    `chunk` pins the elements per block (else the model's choice among CHUNKS); `epilogues` are
    scalar C expressions of the total `tn` (and earlier ones `e0`, ...) the last block computes,
    returned after the total: `k(...)` gives (total, each, e0, e1, ...)."""
    if dtype not in ("float32", "float64"):
        raise DTypeError(f"multi-tensor norm: dtype {dtype!r} (float32 or float64; 16-bit lists stay eager)")
    order = float(order)
    if order == 0 or order != order:
        raise OptionError(f"multi-tensor norm: order {order} (a positive order, inf or -inf)")
    if target not in ("emulator", "cuda"):
        raise OptionError(f"multi-tensor norm: target {target!r} ('emulator' or 'cuda')")
    shapes = [tuple(int(d) for d in sh) for sh in shapes]
    sizes = [(f"t{k}", math.prod(sh)) for k, sh in enumerate(shapes)]
    merge = NormMerge.PARTIALS if deterministic else NormMerge.ATOMIC_WS
    dt = as_dtype(dtype)
    candidates = [chunk] if chunk is not None else list(CHUNKS)
    sets = [MultiTensorSet.of(sizes, dtype, c) for c in candidates]
    costs = [_cost(s, merge, order, dt.itemsize, gpu) for s in sets]
    best = min(range(len(sets)), key=lambda i: (costs[i].total_s, -candidates[i]))
    s, cost = sets[best], costs[best]
    digest = hashlib.sha1(repr((sizes, dtype, order, merge, s.chunk, epilogues)).encode()).hexdigest()[:8]
    kern = render_norms(f"pn_mt_norm_{digest}", s, order, merge, tuple(epilogues))
    from .codegen.header import prelude
    from .codegen.islast import HELPERS

    body = HELPERS + kern.init_source + kern.source
    source = prelude(body) + body
    ws_role = BufferRole.WORKSPACE if merge is NormMerge.ATOMIC_WS else BufferRole.PARTIALS
    buffers = {
        f"in:{k}": BufferSpec(f"in:{k}", dt.c_type, dt, n, BufferRole.INPUT, f"in{k}", uid=k)
        for k, (_, n) in enumerate(sizes)
    }
    buffers["out:each"] = BufferSpec("out:each", dt.c_type, dt, len(sizes), BufferRole.OUTPUT, "each")
    buffers["out:total"] = BufferSpec("out:total", dt.c_type, dt, 1 + len(epilogues), BufferRole.OUTPUT, "total")
    buffers["ws"] = BufferSpec("ws", dt.c_type, dt, kern.ws_size, ws_role, "ws")
    buffers["cnt"] = BufferSpec("cnt", "unsigned", None, 1, BufferRole.COUNTER, "pn_counter")
    args = tuple(("buf", f"in:{k}") for k in range(len(sizes))) + (
        ("buf", "out:each"),
        ("buf", "out:total"),
        ("buf", "ws"),
        ("buf", "cnt"),
    )
    init = Launch(kern.init_name, (1, 1, 1), (THREADS, 1, 1), (("buf", "ws"), ("buf", "cnt")), LaunchRole.INIT_ONCE)
    main = Launch(
        kern.name,
        (s.blocks, 1, 1),
        (THREADS, 1, 1),
        args,
        LaunchRole.REDUCE,
        form="MULTI_TENSOR",
        atomic_outputs=(("ws", 0.0),) if merge is NormMerge.ATOMIC_WS else (),
        bytes_read=sum(n for _, n in sizes) * dt.itemsize,
        bytes_written=(len(sizes) + 1) * dt.itemsize,
        mapping=f"MULTI_TENSOR pieces={len(sizes)} chunk={s.chunk} blocks={s.blocks} merge={merge}",
        modeled_us=cost.total_s * 1e6,
        cost_features=cost.features,
    )
    inputs = tuple(InputSpec(f"t{k}", f"in:{k}", sh, dt, dt.itemsize) for k, sh in enumerate(shapes))
    scalars = 1 + len(epilogues)  # the total, then each epilogue's scalar
    results = (ResultSpec((scalars,), scalars, "out:total"), ResultSpec((len(sizes),), len(sizes), "out:each"))
    plan = LaunchPlan((init, main), buffers, inputs, results)
    signatures = ((kern.init_name, kern.init_signature), (kern.name, kern.signature))
    return MultiTensorNorm(s, order, merge, kern, plan, target, Executor(plan, source, signatures, target))


CTYPE_DTYPES = {"float": "float32", "double": "float64"}


@dataclass(frozen=True)
class MultiTensorMap(_Launched):
    """A compiled element-wise multi-tensor statement set: `k(*inputs)` takes every input list's
    pieces (list by list) and returns every output list's pieces (list by list), in ONE launch."""

    sets: tuple[MultiTensorSet, ...]  # one per launch (groups of pieces within the parameter space)
    lists: tuple[MapList, ...]
    plan: LaunchPlan
    target: str
    executor: Executor = field(compare=False, repr=False)

    def __call__(self, *arrays, order: str = "forward", seed: int = 0):
        return tuple(self.executor(self.executor.bind(arrays, {}), order=order, seed=seed))


def _out_key(m: MapList, k: int) -> str:
    return f"in:{m.into}:{k}" if m.into else f"out:{m.name}:{k}"


def _check_in_place(lists: tuple[MapList, ...]) -> None:
    """An output written in place (`MapList.into`), each a LegalityError: (a) into an input
    list (b) of element pieces, not scalars (every thread reads a scalar piece: another block
    could read it after the write), (c) of the output's C type, (d) one output per input list.
    Each element of an element list is read and then written by the one thread that owns it,
    so the other elements' values are never read after they change."""
    ins = {m.name: m for m in lists if m.expr is None}
    taken: set[str] = set()
    for m in lists:
        if not m.into:
            continue
        src = ins.get(m.into)
        why = (
            "is not an input list (a)" if src is None or not m.output
            else "is a list of scalars (b)" if src.scalar or m.scalar
            else f"has C type {src.ctype}, not {m.ctype} (c)" if src.ctype != m.ctype
            else "already takes another output (d)" if m.into in taken
            else ""
        )  # fmt: skip
        if why:
            raise LegalityError(f"multi-tensor map: output list {m.name!r} in place into {m.into!r}, which {why}")
        taken.add(m.into)


def compile_map(
    shapes, lists, target: str = "emulator", gpu: GPUSpec = H100, chunk: int | None = None
) -> MultiTensorMap:
    """One element-wise launch over pieces of shapes `shapes` and the lists `lists` (MapList:
    inputs, expressions, outputs), e.g. an AdamW step over params, grads and states; one launch
    per group of pieces whose pointers fit a kernel's parameters (torch splits its lists likewise).

    >>> import numpy as np
    >>> from panamera.codegen.multitensor_kernel import MapList as L
    >>> k = compile_map([(3,), (2, 2)], [L("p", "double"), L("g", "double"), L("r", "double", expr="p - 0.5 * g", output=True)])
    >>> [a.tolist() for a in k(np.ones(3), np.ones((2, 2)), np.ones(3), np.ones((2, 2)))]
    [[0.5, 0.5, 0.5], [[0.5, 0.5], [0.5, 0.5]]]
    """
    if target not in ("emulator", "cuda"):
        raise OptionError(f"multi-tensor map: target {target!r} ('emulator' or 'cuda')")
    lists = tuple(lists)
    for m in lists:
        if m.ctype not in CTYPE_DTYPES:
            raise DTypeError(f"multi-tensor map: list {m.name!r} of C type {m.ctype!r} (float or double)")
    _check_in_place(lists)
    shapes = [tuple(int(d) for d in sh) for sh in shapes]
    ins, outs = [m for m in lists if m.expr is None], [m for m in lists if m.output]
    pointers = len(ins) + len(outs)
    item = {m.name: as_dtype(CTYPE_DTYPES[m.ctype]) for m in lists}
    # precondition 4 per launch: as torch's multi_tensor_apply, a list too long for one kernel's
    # parameters is split into consecutive groups of pieces, one launch each
    per = max(1, (PARAM_BYTES - 64) // (POINTER_BYTES * pointers))
    groups = [list(range(g, min(g + per, len(shapes)))) for g in range(0, len(shapes), per)]
    from .codegen.header import prelude
    from .codegen.islast import HELPERS

    bodies, launches, signatures, sets = [HELPERS], [], [], []
    for gi, group in enumerate(groups):
        sizes = [(f"t{k}", math.prod(shapes[k])) for k in group]
        n = sum(sz for _, sz in sizes)
        nbytes = sum(n * item[m.name].itemsize for m in ins + outs if not m.scalar)
        written = sum(n * item[m.name].itemsize for m in outs if not m.scalar)

        def cost(st, n=n, nbytes=nbytes, written=written):
            return kernel_time(
                gpu,
                dram_bytes=nbytes,
                write_bytes=written,
                blocks=st.blocks,
                threads=THREADS,
                bytes_in_flight_per_thread=sum(item[m.name].itemsize for m in ins if not m.scalar),
                fp32_ops=float(n * sum(1 for m in lists if m.expr and m.ctype == "float")),
                fp64_ops=float(n * sum(1 for m in lists if m.expr and m.ctype == "double")),
            )

        candidates = [chunk] if chunk is not None else list(CHUNKS)
        # every list's pieces share the element set's block table (precondition 6: the lists are aligned)
        options = [MultiTensorSet.of(sizes, "float32", c, lists=pointers, extra_params=0) for c in candidates]
        costs = [cost(st) for st in options]
        best = min(range(len(options)), key=lambda i: (costs[i].total_s, -candidates[i]))
        st, c = options[best], costs[best]
        sets.append(st)
        digest = hashlib.sha1(repr((sizes, lists, st.chunk)).encode()).hexdigest()[:8]
        name = f"pn_mt_map_{digest}_{gi}"
        bodies.append(render_map(name, st, lists))
        keys = [f"in:{m.name}:{k}" for m in ins for k in group] + [_out_key(m, k) for m in outs for k in group]
        queued = 0.0 if gi == 0 else (gpu.launch_s - gpu.queued_s) * 1e6
        launches.append(
            Launch(
                name,
                (st.blocks, 1, 1),
                (THREADS, 1, 1),
                tuple(("buf", key) for key in keys),
                LaunchRole.MAP,
                form="MULTI_TENSOR",
                bytes_read=nbytes - written,
                bytes_written=written,
                mapping=f"MULTI_TENSOR MAP pieces={len(sizes)} lists={len(lists)} chunk={st.chunk} blocks={st.blocks}",
                modeled_us=c.total_s * 1e6 - queued,
                cost_features=c.features,
            )
        )
        signatures.append((name, map_signature(lists, len(group))))
    body = "".join(bodies)
    source = prelude(body) + body
    buffers, inputs, results = {}, [], []
    for m in ins:
        for k, sh in enumerate(shapes):
            key, shape = f"in:{m.name}:{k}", () if m.scalar else sh
            buffers[key] = BufferSpec(key, item[m.name].c_type, item[m.name], math.prod(shape), BufferRole.INPUT)
            inputs.append(InputSpec(f"{m.name}{k}", key, shape, item[m.name], item[m.name].itemsize))
    for m in outs:
        for k, sh in enumerate(shapes):
            key, shape = _out_key(m, k), () if m.scalar else sh
            if not m.into:  # in place: the input's buffer, the caller's own memory where it needs no copy
                buffers[key] = BufferSpec(key, item[m.name].c_type, item[m.name], math.prod(shape), BufferRole.OUTPUT)
            results.append(ResultSpec(shape, math.prod(shape), key))
    plan = LaunchPlan(tuple(launches), buffers, tuple(inputs), tuple(results))
    return MultiTensorMap(tuple(sets), lists, plan, target, Executor(plan, source, tuple(signatures), target))
