"""The tensor-core template's operand staging (codegen/tc_kernel.py): each K slab's operands, their
fused producers evaluated in registers at canonical indices, converted to the MMA's type and
stored to shared memory in the layout the MMAs read (`slot`: wmma's 16 x 16 blocks or wgmma's core
matrices), zero outside the tile and the K range. Three ways, as schedule/tc_tiling.py decides:
`stage_operand` (loads in flight by unrolling; `_stage_raw` copies a raw operand as vectors), and for an
operand loaded first, double-buffered in registers, `stage_int4` (packed int4 weights) and
`stage_words` (raw words, then each lane's expression).
"""

from __future__ import annotations

from ..poly.access import AccessKind
from ..schedule.int4_dequant import Nibbles
from ..schedule.tc_tiling import raw_copy, staging_steps, tiles
from ..schedule.tensor_core import Mma
from ..schedule.warpgroup import MmaOp, wgmma_vec
from .expr import ExprRenderer
from .thread_loop import ThreadLoop


def _convert(kind: Mma, v: str) -> str:
    if kind is Mma.S8:
        return f"(signed char)({v})"
    return f"{'__float2half_rn' if kind is Mma.F16 else '__float2bfloat16_rn'}((float)({v}))"


def slot(m, buf: str, rows: int, x: str, k: str, lane: str = "") -> str:
    """Element (x, k) of an operand's slab of `rows` x BK in shared memory (plus `lane`, the
    consecutive k of a step's `vec` lanes, within k's 16, or a core matrix's row for wgmma): the one
    place the staging loops write the layout the MMAs read. For wmma each 16-wide K step is a
    contiguous `rows` x 16 block, row-major (fragments load it with ldm 16); for a warpgroup MMA
    (`m.mma_op`) the slab is wgmma's core matrices of 8 rows x 16 bytes (8 k of a 16-bit operand,
    16 of s8; 128 contiguous bytes each), the `rows` / 8 of each row's k consecutive: the
    descriptor's stride (SBO) between row groups is 128 bytes, its leading offset (LBO) between the
    two core matrices along K of one MMA `rows` x 16 bytes.

    >>> from types import SimpleNamespace as NS
    >>> slot(NS(mma_op="", mma="f16"), "pn_sa", 32, "pn_q", "pn_p", " + v")
    'pn_sa[(pn_p / 16 * 32 + pn_q) * 16 + pn_p % 16 + v]'
    >>> slot(NS(mma_op="wgmma", mma="f16"), "pn_sa", 64, "pn_q", "pn_p", " + v")
    'pn_sa[(pn_p / 8 * 8 + pn_q / 8) * 64 + pn_q % 8 * 8 + pn_p % 8 + v]'
    >>> slot(NS(mma_op="wgmma", mma="s8"), "pn_sa", 64, "pn_q", "pn_p")
    'pn_sa[(pn_p / 16 * 8 + pn_q / 8) * 128 + pn_q % 8 * 16 + pn_p % 16]'
    """
    if m.mma_op == MmaOp.WGMMA:
        c = wgmma_vec(Mma(m.mma))  # a core matrix's row: 16 bytes of k
        return f"{buf}[({k} / {c} * {rows // 8} + {x} / 8) * {8 * c} + {x} % 8 * {c} + {k} % {c}{lane}]"
    return f"{buf}[({k} / 16 * {rows} + {x}) * 16 + {k} % 16{lane}]"


def stage_operand(loop: ThreadLoop, kind: Mma, e, buf: str, rows: int, BK: int, threads: int, r0: str, extent: int,
           i_of: str, tag: str) -> list[str]:  # fmt: skip
    """The loop that fills one operand's slab: element (x, k) of the tile at
    buf[(k / 16 * rows + x) * 16 + k % 16]; each step a thread takes `vec` consecutive k (the
    operands' contiguous axis), its contiguous reads loaded as one vector each (the mapping's
    access kinds), the others per lane."""
    st, V = loop.g.statements[0], loop.m.vec
    reads = sorted({n.read for n in e.walk() if n.op == "load"})
    vector = [r for r in reads if V > 1 and loop.m.access[0][r] == AccessKind.CONTIG and st.reads[r].memory]
    if raw_copy(e, st, kind, V, loop.m.access[0]):
        return _stage_raw(loop, kind, e.read, buf, rows, BK, threads, r0, extent, i_of)
    lines: list[str] = []

    def load(read: int, index: str | None = None) -> str:
        r = st.reads[read]
        if read in vector:
            return f"pn_{tag}v{read}[v]"
        if not r.memory:  # iota: the index itself
            return f"((long long)({loop.address(r.addr)}))"
        return f"pn_ld(&{loop.in_name[r.tensor.uid]}[{loop.address(r.addr)}])"

    value = ExprRenderer(lines, f"pn_{tag}").render(e, load)
    zero = _convert(kind, "0")
    out = [
        f"    for (int pn_e = tx; pn_e < {rows * BK // V}; pn_e += {threads}) {{",
        f"      const int pn_q = pn_e / {BK // V}, pn_p = pn_e % {BK // V} * {V};",
        f"      const pn_idx pn_x = {r0} + pn_q, pn_k = pn_ks + pn_p;",
        f"      {kind.ctype} pn_val[{V}];",
        f"      if (pn_x < {extent} && pn_k < pn_k1) {{  // k1 and the vector width divide K: all lanes in range",
        f"        const pn_idx i = {i_of}; (void)i;",
    ]
    if vector:
        for r in vector:
            out.append(f"        {st.reads[r].tensor.dtype.compute} pn_{tag}v{r}[{V}];")
        out.append("        { const pn_idx j = pn_k;")
        for r in vector:
            addr = loop.address(st.reads[r].addr)
            out.append(f"          pn_ldv(&{loop.in_name[st.reads[r].tensor.uid]}[{addr}], pn_{tag}v{r});")
        out.append("        }")
    out += [
        "#pragma unroll",
        f"        for (int v = 0; v < {V}; ++v) {{",
        "          const pn_idx j = pn_k + v; (void)j;",
        *("          " + ln for ln in lines),
        f"          pn_val[v] = {_convert(kind, value)};",
        "        }",
        "      } else {",
        f"        for (int v = 0; v < {V}; ++v) pn_val[v] = {zero};",
        "      }",
        f"      for (int v = 0; v < {V}; ++v) {slot(loop.m, buf, rows, 'pn_q', 'pn_p', ' + v')} = pn_val[v];",
        "    }",
    ]
    return out


def _stage_raw(loop: ThreadLoop, kind: Mma, read: int, buf: str, rows: int, BK: int, threads: int, r0: str,
               extent: int, i_of: str) -> list[str]:  # fmt: skip
    """`stage_operand` for an operand that is a contiguous read of the MMA's type (`raw_copy`): each step
    copies its vec lanes' bytes from global to shared memory as one vector, no conversion."""
    r, V = loop.g.statements[0].reads[read], loop.m.vec
    vt = {4: "unsigned", 8: "uint2", 16: "uint4"}[V * kind.itemsize]
    dst = f"&{slot(loop.m, buf, rows, 'pn_q', 'pn_p')}"
    return [
        f"    for (int pn_e = tx; pn_e < {rows * BK // V}; pn_e += {threads}) {{",
        f"      const int pn_q = pn_e / {BK // V}, pn_p = pn_e % {BK // V} * {V};",
        f"      const pn_idx pn_x = {r0} + pn_q, pn_k = pn_ks + pn_p;",
        f"      {vt} pn_raw = {vt}{{}};  // zero outside the tile and the K range (the tails)",
        f"      if (pn_x < {extent} && pn_k < pn_k1) {{  // {V} lanes of {kind.ctype}, copied as they are",
        f"        const pn_idx i = {i_of}, j = pn_k; (void)i;",
        f"        pn_raw = pn_vload<{vt}>(&{loop.in_name[r.tensor.uid]}[{loop.address(r.addr)}]);",
        "      }",
        f"      pn_vstore({dst}, pn_raw);",
        "    }",
    ]


def stage_int4(loop: ThreadLoop, kind: Mma, nib: Nibbles, buf: str, rows: int, r0: str, extent: int, i_of: str,
                tag: str) -> tuple[list[str], list[str], list[str]]:  # fmt: skip
    """`stage_operand` for a packed int4 operand (schedule/int4_dequant.py): each step's vec / 8 words of
    packed bytes (one vector load) and its scale held in registers, double-buffered
    (`_double_buffered`); then `pn_i4x8` turns each word into 8 weights of the MMA's type (the
    exponent trick), in k order (`flip`: low nibble at odd k), stored to the slab."""
    st, m = loop.g.statements[0], loop.m
    V, BK = m.vec, tiles(m)[2]
    T, words = kind.ctype, V // 8
    pair = {Mma.F16: ("__half2", "pn_h2_bits", "__half2half2"), Mma.BF16: ("__nv_bfloat162", "pn_b2_bits",
            "__bfloat162bfloat162")}[kind]  # fmt: skip
    pk, sc = st.reads[nib.packed], st.reads[nib.scale]
    vtype = {1: "unsigned", 2: "uint2"}[words]
    fields = ["pn_wv"] if words == 1 else ["pn_wv.x", "pn_wv.y"]
    zero = _convert(kind, "0")
    total, steps = rows * BK // V, staging_steps(rows, m)

    def fill(into: str) -> list[str]:
        return [
            f"{into}w[pn_u] = pn_vload<{vtype}>(&{loop.in_name[pk.tensor.uid]}[{loop.address(pk.addr)}]);",
            f"{into}sc[pn_u] = {loop.in_name[sc.tensor.uid]}[{loop.address(sc.addr)}];",
        ]

    pre, top, where = _double_buffered(loop, tag, rows, r0, extent, i_of, [(vtype, "w"), (T, "sc")], fill)
    w, s = f"pn_{tag}w", f"pn_{tag}sc"
    convert = [
        f"    const {pair[0]} pn_z2 = {pair[1]}(0x{nib.bias_bits(str(kind)):08x}u);  // 1024 (fp16) or 128 (bf16) + zero point",
        "#pragma unroll",
        f"    for (int pn_u = 0; pn_u < {steps}; ++pn_u) {{  // the words by the exponent trick (pn_i4x8)",
        *("  " + ln for ln in where),
        f"      if (pn_e < {total}) {{",
        f"        {T} pn_val[{V}];",
        f"        const {vtype} pn_wv = {w}[pn_u];",
        f"        const {pair[0]} pn_s2 = {pair[2]}({s}[pn_u]);",
    ]
    for k, f in enumerate(fields):
        convert += [
            f"        {{ {T} pn_n[8];",
            f"          pn_i4x8({f}, pn_z2, pn_s2, pn_n);",
            "#pragma unroll",
            f"          for (int v = 0; v < 8; ++v) pn_val[{8 * k} + v] = pn_in ? pn_n[v ^ {nib.flip}] : {zero};",
            "        }",
        ]
    convert += [
        f"        for (int v = 0; v < {V}; ++v) {slot(loop.m, buf, rows, 'pn_q', 'pn_p', ' + v')} = pn_val[v];",
        "      }",
        "    }",
    ]
    return pre, top, convert


def _double_buffered(loop: ThreadLoop, tag: str, rows: int, r0: str, extent: int, i_of: str, held: list[tuple[str, str]],
                     fill) -> tuple[list[str], list[str], list[str]]:  # fmt: skip
    """The loads of a `loads_first` operand, double-buffered: `held` the (type, name) register
    arrays of a slab's steps, `fill(into)` the lines loading one step's values into
    `into{name}[pn_u]` where `pn_in`. Returns (before the slab loop: the first slab's loads into
    the next-slab buffer; at the top of the loop: this slab's values from it and the next slab's
    loads issued; the `where` lines that place step pn_u of this slab)."""
    m = loop.m
    V, BK, threads = m.vec, tiles(m)[2], m.threads
    total, steps = rows * BK // V, staging_steps(rows, m)

    def where(slab: str) -> list[str]:
        return [
            f"    const int pn_e = tx + pn_u * {threads};",
            f"    const int pn_q = pn_e / {BK // V}, pn_p = pn_e % {BK // V} * {V};",
            f"    const pn_idx pn_x = {r0} + pn_q, pn_k = {slab} + pn_p;",
            f"    const bool pn_in = pn_e < {total} && pn_x < {extent} && pn_k < pn_k1;  // the tails: zeros",
        ]

    def load(slab: str, into: str) -> list[str]:
        return [
            "#pragma unroll",
            f"    for (int pn_u = 0; pn_u < {steps}; ++pn_u) {{",
            *("  " + ln for ln in where(slab)),
            *(f"      {into}{n}[pn_u] = {t}{{}};" for t, n in held),
            "      if (pn_in) {",
            f"        const pn_idx i = {i_of}, j = pn_k; (void)i;",
            *("        " + ln for ln in fill(into)),
            "      }",
            "    }",
        ]

    cur, nxt = f"pn_{tag}", f"pn_{tag}n"  # this slab's values; the next slab's, loaded while this one is used
    decl = [f"    {t} {{0}}{n}[{steps}];" for t, n in held]
    pre = [ln[2:] if ln.startswith("  ") else ln for ln in [*(d.format(nxt) for d in decl), *load("pn_k0", nxt)]]
    top = [
        "    // the slab's loads, all in flight before any is used, double-buffered",
        *(d.format(cur) for d in decl),
        "#pragma unroll",
        f"    for (int pn_u = 0; pn_u < {steps}; ++pn_u) {{ "
        + " ".join(f"{cur}{n}[pn_u] = {nxt}{n}[pn_u];" for _, n in held)
        + " }",
        f"    if (pn_ks + {BK} < pn_k1) {{  // the next slab's loads in flight during this one",
        *("  " + ln for ln in load(f"(pn_ks + {BK})", nxt)),
        "    }",
    ]
    return pre, top, where("pn_ks")


def stage_words(loop: ThreadLoop, kind: Mma, e, buf: str, rows: int, r0: str, extent: int, i_of: str,
                 tag: str) -> tuple[list[str], list[str], list[str]]:  # fmt: skip
    """`stage_operand` for a `words_first` operand (schedule/tc_tiling.py): each step's contiguous reads
    loaded as raw vectors and its uniform reads as one value, double-buffered
    (`_double_buffered`); then each lane's expression over them, converted to the MMA's type."""
    st, m = loop.g.statements[0], loop.m
    V, BK = m.vec, tiles(m)[2]
    total, steps = rows * BK // V, staging_steps(rows, m)
    reads = sorted({n.read for n in e.walk() if n.op == "load"})
    contig = [r for r in reads if m.access[0][r] == AccessKind.CONTIG]
    vt = {4: "unsigned", 8: "uint2", 16: "uint4"}
    held = [(vt[V * st.reads[r].tensor.dtype.itemsize], f"c{r}") for r in contig]
    held += [(st.reads[r].tensor.dtype.c_type, f"u{r}") for r in reads if r not in contig]

    def fill(into: str) -> list[str]:
        out = []
        for r in reads:
            rd, name = st.reads[r], loop.in_name[st.reads[r].tensor.uid]
            if r in contig:
                out.append(
                    f"{into}c{r}[pn_u] = pn_vload<{vt[V * rd.tensor.dtype.itemsize]}>(&{name}[{loop.address(rd.addr)}]);"
                )
            else:
                out.append(f"{into}u{r}[pn_u] = {name}[{loop.address(rd.addr)}];")
        return out

    pre, top, where = _double_buffered(loop, tag, rows, r0, extent, i_of, held, fill)
    cur = f"pn_{tag}"

    def load(read: int, index: str | None = None) -> str:
        if read in contig:
            c = st.reads[read].tensor.dtype.c_type
            return f"pn_ld(&reinterpret_cast<const {c}*>(&{cur}c{read}[pn_u])[v])"
        return f"pn_ld(&{cur}u{read}[pn_u])"

    lines: list[str] = []
    value = ExprRenderer(lines, f"pn_{tag}").render(e, load)
    zero = _convert(kind, "0")
    convert = [
        "#pragma unroll",
        f"    for (int pn_u = 0; pn_u < {steps}; ++pn_u) {{  // each lane's value from the held loads",
        *("  " + ln for ln in where),
        f"      if (pn_e < {total}) {{",
        f"        {kind.ctype} pn_val[{V}];",
        "#pragma unroll",
        f"        for (int v = 0; v < {V}; ++v) {{",
        *("          " + ln for ln in lines),
        f"          pn_val[v] = pn_in ? {_convert(kind, value)} : {zero};",
        "        }",
        f"        for (int v = 0; v < {V}; ++v) {slot(loop.m, buf, rows, 'pn_q', 'pn_p', ' + v')} = pn_val[v];",
        "      }",
        "    }",
    ]
    return pre, top, convert
