"""The element-wise epilogue a tiled contraction applies at its store (schedule/cpu_epilogue.py): the
consumer's body as a C++ lambda `pn_ep(offset, values, n)` over `n` consecutive elements of the
product (flat offsets `offset`..), the values the tile just summed; passed to `pn_tile_gemm`
(codegen/cpu_tile.py), which calls it once per row of each finished tile (per merged row where K
is split). The body is the CPU codegen's (thread_loop.py `body_lines`), the product read from the
lambda's argument in place of memory.

>>> import panamera as pn
>>> from panamera.compiler import lower
>>> from panamera.schedule.cpu_epilogue import tile_epilogue
>>> from panamera.schedule.mapping import MergeMode, kernel_buffers
>>> x, w, b = pn.placeholder((64, 128)), pn.placeholder((32, 128)), pn.placeholder((32,))
>>> g = lower(pn.maximum(x @ w.T + b, 0.0), stop_after="groups", target="emulator").groups[0]
>>> params = kernel_buffers(g, "k", (MergeMode.STORE,) * 2, 1, (1, 1))
>>> epilogue_lambda(g, params, tile_epilogue(g))[0]
'auto pn_ep = [&](pn_idx pn_o, const float* pn_v, int pn_n) {'
"""

from __future__ import annotations

from dataclasses import dataclass

from ..poly.program import KernelGroup
from ..runtime.plan import BufferRole, BufferSpec
from ..schedule.cpu_epilogue import TileEpilogue
from .cpu_runs import RunLoop, row_run, split_invariant
from .expr import convert


@dataclass(frozen=True)
class _Params:  # what ThreadLoop reads of a mapping for loads: the buffers
    buffers: tuple[BufferSpec, ...]


def epilogue_lambda(group: KernelGroup, params: tuple[BufferSpec, ...], ep: TileEpilogue) -> list[str]:
    """The lines of `pn_ep` for `ep`, the consumer (statement 1 of `group`) storing to its buffer
    in `params` (named as the kernel's pointers: `in`k / `out`k). Where an address divides the
    element index (a bias: `i mod N`), a segment inside one run of codegen/cpu_runs.py's `row_run`
    (a tile's row inside an output row) scans with that run's division-free addresses, its
    invariant loads hoisted, so that it vectorizes; any other segment scans element by element."""
    k = group.statements.index(ep.consumer)
    st = ep.consumer
    product = group.statements[0].result.dtype.compute
    loop = RunLoop(group, _Params(params), "long long")
    loop.regs[ep.product_uid] = "pn_p"
    out = next(p for p in params if p.role == BufferRole.OUTPUT and p.statement == k)

    def body() -> list[str]:
        lines, val = loop.body_lines(k, None)
        store = f"pn_st(&{out.param}[{loop.address(st.write)}], {convert(val, st.body.dtype, st.result.dtype)});"
        return [f"const {product} pn_p = pn_v[i - pn_o];", *lines, store]

    scan = ["#pragma omp simd", "for (pn_idx i = pn_o; i < pn_o + pn_n; ++i) {"]
    general = [*scan, *("  " + ln for ln in body()), "}"]
    dom = st.domain.reset_tuple_id()
    run = row_run([st.write, *(r.addr for r in st.reads)], dom, ep.elements, dim="i")
    lines = general
    if run is not None:
        with loop.over(run):
            hoisted, kept = split_invariant(body())
        lines = [
            f"const pn_idx pn_q = pn_o / {run.m}LL;",
            f"if ((pn_o + pn_n - 1) / {run.m}LL == pn_q) {{  // inside one run: no division per element",
            *("  " + ln for ln in hoisted),
            *("  " + ln for ln in scan),
            *("    " + ln for ln in kept),
            "  }",
            "} else {",
            *("  " + ln for ln in general),
            "}",
        ]
    return [
        f"auto pn_ep = [&](pn_idx pn_o, const {product}* pn_v, int pn_n) {{",
        "  const pn_idx j = 0; (void)j;",
        *("  " + ln for ln in lines),
        "};",
    ]
