"""CUDA C of a multi-tensor norm: every tensor of a list reduced in ONE launch (poly/multitensor.py).

Each block looks itself up in the block-range table (a balanced tree of comparisons against the
pieces' first blocks, constants: no table in memory), folds its chunk of its piece into one
partial (|x|, x*x, |x|^p, or max/min |x|), reduces it across the block (warp shuffles, shared
memory), then merges it:

- ATOMIC_WS: one atomic per block into its piece's slot of a resident workspace;
- PARTIALS (deterministic): the partial lands in `ws[b]`; the last block sums each piece's
  partials in block order.

The last block to arrive (counter + fence) finishes every piece where its value becomes final,
as epilogues do: the per-tensor norms (`each`, what `_foreach_norm` returns) and the total norm
(their combine, finished), then resets the workspace and the counter for the next call.
Compare torch: `_foreach_norm` (aten/src/ATen/native/cuda/ForeachReduceOp.cu) launches the
multi-tensor partials, then a second kernel per list for the per-tensor finish, and
clip_grad_norm_ a third for the total.

>>> from panamera.poly.multitensor import MultiTensorSet
>>> s = MultiTensorSet.of([("t0", 300), ("t1", 10)], "float32", chunk=256)
>>> print(table_tree(s, "b", lambda k: f"k = {k};"))
if (b < 2) { k = 0; } else { k = 1; }
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..enums import StrEnum
from ..poly.multitensor import MultiTensorSet

THREADS = 256
UNROLL = 4  # independent loads per thread per step of the norm's loop (the model: bytes in flight)


class NormMerge(StrEnum):
    """How a block's partial reaches its piece."""

    ATOMIC_WS = "atomic_ws"
    PARTIALS = "partials"


CTYPES = {"float32": "float", "float64": "double"}


@dataclass(frozen=True)
class NormKernel:
    """The rendered kernels: the norm (grid = the set's blocks) and its first-call init."""

    name: str
    source: str
    init_name: str
    init_source: str
    signature: tuple[str, ...]
    init_signature: tuple[str, ...]
    ws_size: int


def _tree(lo: int, hi: int, key: str, bound, leaf) -> str:
    """A balanced if-tree over the indices lo..hi-1: index k where bound(k) <= key < bound(k+1)."""
    if hi - lo == 1:
        return leaf(lo)
    mid = (lo + hi) // 2
    return f"if ({key} < {bound(mid)}) {{ {_tree(lo, mid, key, bound, leaf)} }} else {{ {_tree(mid, hi, key, bound, leaf)} }}"


def table_tree(s: MultiTensorSet, key: str, leaf) -> str:
    """The block-range table as code: the piece k whose blocks hold block `key`, then `leaf(k)`."""
    return _tree(0, len(s.pieces), key, lambda k: s.starts[k], leaf)


def _ops(order: float, c: str) -> tuple[str, str, str]:
    """(functor, the fold of |x| named `x`, the finish of a folded `v`) of a norm of `order`."""
    suffix = "f" if c == "float" else ""
    if order == math.inf:
        return "pn_op_max", "x", "v"
    if order == -math.inf:
        return "pn_op_min", "x", "v"
    if order == 1:
        return "pn_op_sum", "x", "v"
    if order == 2:
        return "pn_op_sum", "x * x", f"sqrt{suffix}(v)"
    return "pn_op_sum", f"pow{suffix}(x, ({c}){order!r})", f"pow{suffix}(v, ({c})1 / ({c}){order!r})"


def render_norms(
    name: str, s: MultiTensorSet, order: float, merge: NormMerge, epilogues: tuple[str, ...] = ()
) -> NormKernel:
    """The norm kernel of every piece of `s` and the total, merged by `merge`. `epilogues`: C
    expressions of scalars the last block computes once the total `tn` is final (each may read
    `tn` and the earlier ones, `e0`, `e1`, ...: clip_grad_norm_'s coefficient), stored after the
    total in `total[1 + i]`."""
    c = CTYPES[s.pieces[0].dtype]
    op, fold, finish = _ops(order, c)
    suffix = "f" if c == "float" else ""
    k_count = len(s.pieces)
    ident = f"{op}::template identity<{c}>()"
    params = [f"const {c}* __restrict__ in{k}" for k in range(k_count)]
    params += [
        f"{c}* __restrict__ each",
        f"{c}* __restrict__ total",
        f"{c}* __restrict__ ws",
        "unsigned* __restrict__ pn_counter",
    ]
    atomic = merge is NormMerge.ATOMIC_WS
    lookup = table_tree(s, "b", lambda k: f"p = in{k}; n = {s.pieces[k].size}; k = {k}; c = b - {s.starts[k]};")
    if atomic:
        gather = [
            f"      const {c} v = pn_ldcg(&ws[j]);",
            f"      ws[j] = {ident};  // resident: ready for the next call",
        ]
    else:
        start = _tree(0, k_count, "j", lambda q: q, lambda q: f"lo = {s.starts[q]}; hi = {s.ends[q]};")
        gather = [
            "      pn_idx lo, hi;",
            f"      {start}",
            f"      {c} v = {ident};",
            "      for (pn_idx q = lo; q < hi; ++q) v = " + f"{op}::apply(v, pn_ldcg(&ws[q]));  // block order",
        ]
    body = [
        f'extern "C" __global__ void __launch_bounds__({THREADS}) {name}({", ".join(params)}) {{',
        "  typedef int pn_idx;",
        "  const pn_idx b = blockIdx.x, tx = threadIdx.x;",
        f"  const {c}* p; pn_idx n, k, c;",
        "  // the block-range table (poly/multitensor.py): block b owns chunk c of piece k",
        f"  {lookup}",
        f"  {c} acc = {ident};",
        f"  const pn_idx end = pn_imin(n, (c + 1) * {s.chunk});",
        f"  pn_idx i = c * {s.chunk} + tx;",
        f"  for (; i + {(UNROLL - 1) * THREADS} < end; i += {UNROLL * THREADS}) {{  // {UNROLL} loads in flight",
        *(f"    const {c} x{u} = p[i + {u * THREADS}];" for u in range(UNROLL)),
        *(f"    {{ const {c} x = fabs{suffix}(x{u}); acc = {op}::apply(acc, ({c})({fold})); }}" for u in range(UNROLL)),
        "  }",
        f"  for (; i < end; i += {THREADS}) {{",
        f"    const {c} x = fabs{suffix}(p[i]);",
        f"    acc = {op}::apply(acc, ({c})({fold}));",
        "  }",
        f"  __shared__ {c} pn_smem[{THREADS // 32}];",
        f"  acc = pn_reduce_x<{op}, {THREADS}, 1>(acc, pn_smem);",
        f"  if (tx == 0) pn_atomic({op}(), &ws[k], acc);" if atomic else "  if (tx == 0) ws[b] = acc;",
        "  __threadfence();",
        "  __syncthreads();",
        "  __shared__ int pn_is_last;",
        "  if (tx == 0) pn_is_last = atomicAdd(&pn_counter[0], 1u) == gridDim.x - 1;",
        "  __syncthreads();",
        "  if (pn_is_last) {",
        "    __threadfence();",
        f"    {c} t = {ident};",
        f"    for (pn_idx j = tx; j < {k_count}; j += {THREADS}) {{",
        *gather,
        f"      each[j] = {finish};  // piece j's norm is final here",
        f"      t = {op}::apply(t, v);",
        "    }",
        f"    t = pn_reduce_x<{op}, {THREADS}, 1>(t, pn_smem);",
        "    if (tx == 0) {",
        f"      const {c} v = t, tn = {finish};",
        "      total[0] = tn;",
        *(
            f"      const {c} e{i} = ({c})({e}); total[{i + 1}] = e{i};  // an epilogue of the total"
            for i, e in enumerate(epilogues)
        ),
        "      pn_counter[0] = 0u;  // resident: ready for the next call",
        "    }",
        "  }",
        "}",
    ]
    ws_size = k_count if atomic else s.blocks
    init_name = f"{name}_init"
    init = [
        f'extern "C" __global__ void {init_name}({c}* __restrict__ ws, unsigned* __restrict__ pn_counter) {{',
        f"  for (int i = threadIdx.x; i < {ws_size}; i += blockDim.x) ws[i] = {ident};",
        "  if (threadIdx.x == 0) pn_counter[0] = 0u;",
        "}",
    ]
    sig = tuple([f"const {c}*"] * k_count + [f"{c}*"] * 3 + ["unsigned*"])
    return NormKernel(
        name, "\n".join(body) + "\n", init_name, "\n".join(init) + "\n", sig, (f"{c}*", "unsigned*"), ws_size
    )


@dataclass(frozen=True)
class MapList:
    """One list of an element-wise multi-tensor statement set (an optimizer step's params, grads,
    states, steps). `scalar`: one value per piece (a 0-d tensor each, read at [0], broadcast over
    the piece), else the piece's extent. `expr`: None for an input list, else the C expression of
    its element over the earlier lists' names. `output`: written (fresh buffers, one per piece),
    or, `into` an input list's name, in place into that list's buffers (an optimizer step's new
    params and moments: panamera/multitensor.py `compile_map` checks that it may)."""

    name: str
    ctype: str
    scalar: bool = False
    expr: str | None = None
    output: bool = False
    into: str = ""


def map_signature(lists: tuple[MapList, ...], pieces: int) -> tuple[str, ...]:
    """The kernel's parameters: every input list's pieces, then every output list's."""
    ins = [f"const {m.ctype}*" for m in lists if m.expr is None for _ in range(pieces)]
    return tuple(ins + [f"{m.ctype}*" for m in lists if m.output for _ in range(pieces)])


def render_map(name: str, s: MultiTensorSet, lists: tuple[MapList, ...]) -> str:
    """The element-wise kernel over every piece of `s`: each thread evaluates every list's
    element at its indices of its block's chunk and stores the output lists; a scalar output
    is stored once per piece (by the thread at index 0 of chunk 0). An output written in place
    aliases its input list's pointers: then no pointer is `__restrict__` (each element is still
    loaded, by the thread that owns it, before that thread stores it)."""
    k_count = len(s.pieces)
    ins = [m for m in lists if m.expr is None]
    outs = [m for m in lists if m.output]
    r = "" if any(m.into for m in outs) else " __restrict__"
    params = [f"const {m.ctype}*{r} {m.name}_{k}" for m in ins for k in range(k_count)]
    params += [f"{m.ctype}*{r} {m.name}_o{k}" for m in outs for k in range(k_count)]

    def leaf(k: int) -> str:
        ptrs = " ".join(f"{m.name}_p = {m.name}_{k};" for m in ins)
        ptrs += " " + " ".join(f"{m.name}_q = {m.name}_o{k};" for m in outs)
        return f"n = {s.pieces[k].size}; c = b - {s.starts[k]}; {ptrs.strip()}"

    body = [
        f'extern "C" __global__ void __launch_bounds__({THREADS}) {name}({", ".join(params)}) {{',
        "  typedef int pn_idx;",
        "  const pn_idx b = blockIdx.x, tx = threadIdx.x;",
        "  pn_idx n, c;",
        *(f"  const {m.ctype}* {m.name}_p;" for m in ins),
        *(f"  {m.ctype}* {m.name}_q;" for m in outs),
        "  // the block-range table (poly/multitensor.py): block b owns chunk c of piece k",
        f"  {table_tree(s, 'b', leaf)}",
        *(f"  const {m.ctype} {m.name} = {m.name}_p[0];  // one value per piece" for m in ins if m.scalar),
        f"  const pn_idx end = pn_imin(n, (c + 1) * {s.chunk});",
        f"  for (pn_idx i = c * {s.chunk} + tx; i < end; i += {THREADS}) {{",
        *(f"    const {m.ctype} {m.name} = {m.name}_p[i];" for m in ins if not m.scalar),
        *(f"    const {m.ctype} {m.name} = ({m.ctype})({m.expr});" for m in lists if m.expr is not None),
        *(f"    {m.name}_q[i] = {m.name};" for m in outs if not m.scalar),
        *(f"    if (i == 0) {m.name}_q[0] = {m.name};  // once per piece" for m in outs if m.scalar),
        "  }",
        "}",
    ]
    return "\n".join(body) + "\n"
