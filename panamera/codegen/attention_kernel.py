"""The fused attention template: CUDA C of an `AttentionPlan` (schedule/attention.py).

Codegen decides nothing: the plan says the vector width, the lanes per key, the rows per tile,
the split and the merge; the accumulator's merge is algebra.ONLINE_SOFTMAX_VEC's functor
(codegen/header.py `vector_functor_source`, in the prelude). One block, rows r of its tile, keys of its chunk:

    q[r] (scaled) and acc[r] = identity in registers, `slots` vectors of `vec` per thread
    for each step: load `unroll` key rows and value rows (16-byte loads), then per key and row
        x = q[r] . k[l]  (a shuffle all-reduce over the key's lanes) + mask
        acc[r] = merge(acc[r], lift(x, v[l]))      # weights(): the max, two rescaling factors
    the groups' accumulators merge through shared memory, in group order
    split = 1: out[r] = o / s;  else partial[block][r] = acc[r], then
      launches = 1: the last block of the row tile to arrive (a counter, reset by that block for
      the next call) merges the partials in split order and stores out[r]
      launches = 2: a merge kernel does it

Every merge runs in a fixed order, so the result is the same in every thread order.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..algebra import ONLINE_SOFTMAX_VEC
from ..poly.attention import MaskKind
from ..runtime.plan import BufferRole, BufferSpec, Fill
from ..schedule.attention import AttentionPlan
from .expr import literal
from .kernel import InitKernel, render_init


@dataclass(frozen=True)
class AttentionKernels:
    """The rendered kernels of one fused attention: the main kernel, the merge kernel (two
    launches), the first call's counter init (one launch), and every buffer they touch."""

    source: str
    main: str
    merge: str  # "" unless the plan has two launches
    params: dict  # kernel name -> tuple of BufferSpec, in argument order
    init: InitKernel | None


def _buffers(p: AttentionPlan, name: str) -> tuple[list[BufferSpec], list[BufferSpec]]:
    c = p.chain
    ins = [BufferSpec(f"in:{t.uid}", t.dtype.c_type, t.dtype, t.size, BufferRole.INPUT, n, uid=t.uid)
           for n, t in zip(("q", "k", "v", "mask"), (c.q, c.k, c.v, c.mask)) if t is not None]  # fmt: skip
    out = BufferSpec(f"out:{c.node.uid}", c.node.dtype.c_type, c.node.dtype, c.node.size, BufferRole.OUTPUT, "out")
    ws = []
    if p.split > 1:
        n = p.partials
        ws = [
            BufferSpec(f"ws:{name}:m", c.acc.c_type, c.acc, n, BufferRole.PARTIALS, "ws_m"),
            BufferSpec(f"ws:{name}:s", c.acc.c_type, c.acc, n, BufferRole.PARTIALS, "ws_s"),
            BufferSpec(f"ws:{name}:o", c.acc.c_type, c.acc, n * c.D, BufferRole.PARTIALS, "ws_o"),
        ]
    if p.split > 1 and p.launches == 1:
        ws.append(BufferSpec(f"cnt:{name}", "unsigned", None, p.row_tiles * c.B * c.Hkv, BufferRole.COUNTER, "cnt"))
    return ins + [out], ws


def _signature(specs) -> str:
    return ", ".join(
        f"{'const ' if b.role == BufferRole.INPUT else ''}{b.ctype}* __restrict__ {b.param}" for b in specs
    )


def _constants(p: AttentionPlan, lk_arg: bool = False) -> list[str]:
    c = p.chain
    a = c.acc.c_type
    vals = dict(D=c.D, VEC=p.vec, LANES=p.lanes, NV=p.slots, U=p.unroll, RT=p.rows_per_tile, S=p.split,
                CHUNK=p.chunk, G=c.G, LQ=c.Lq, ROWS=c.rows, TILES=p.row_tiles, HKV=c.Hkv, HQ=c.Hq, LK=c.Lk,
                NG=p.groups, T=p.threads)  # fmt: skip
    if lk_arg:  # the key length is the call's (the argument pn_LK); the chunk follows from it
        del vals["CHUNK"], vals["LK"]
    out = [f"  constexpr int {k} = {v};" for k, v in vals.items()]
    if lk_arg:
        out.append("  const int LK = (int)pn_LK;")
    out.append(f"  typedef {a} acc_t;")
    out.append(f"  const acc_t scale = {literal(c.scale, c.acc)};")
    out.append("  const acc_t ninf = pn_lim<acc_t>::lowest();")
    return out


def _merge_partials(p: AttentionPlan) -> list[str]:
    """Threads stride over (row, d) of the tile; each merges the S partials in split order and
    stores o / s; then the tile's partials are discarded from L2. Needs `tile`, `bh`, `b`, `hkv` and
    the partial index base `pbase`, every thread of the block."""
    f = ONLINE_SOFTMAX_VEC.functor
    return [
        "  for (int e = threadIdx.x; e < RT * D; e += T) {",
        "    const int r = e / D, d = e % D, row = tile * RT + r;",
        "    if (row >= ROWS) continue;",
        "    acc_t m = ninf, s = 0, o = 0;",
        "    for (int z = 0; z < S; ++z) {",
        "      const long long w = (pbase + z) * RT + r;",
        "      acc_t mn, fa, fb;",
        f"      {f}::weights(m, pn_ldcg(&ws_m[w]), mn, fa, fb);",
        "      s = s * fa + pn_ldcg(&ws_s[w]) * fb;",
        "      o = o * fa + pn_ldcg(&ws_o[w * D + d]) * fb;",
        "      m = mn;",
        "    }",
        "    const int g = row / LQ, i = row % LQ;",
        f"    pn_st(&out[(((long long)b * HQ + hkv * G + g) * LQ + i) * D + d], {f}::finish(o, s));",
        "  }",
        "  // every partial of the tile read: their L2 lines dropped, never written back (the next call",
        "  // writes them all before any is read; model/workspace.py `discarded`)",
        "  __syncthreads();",
        "  pn_discard_range(&ws_m[pbase * RT], &ws_m[(pbase + S) * RT], threadIdx.x, T);",
        "  pn_discard_range(&ws_s[pbase * RT], &ws_s[(pbase + S) * RT], threadIdx.x, T);",
        "  pn_discard_range(&ws_o[pbase * RT * D], &ws_o[(pbase + S) * RT * D], threadIdx.x, T);",
    ]


def _load(ptr: str, dst: str, vec: int) -> str:
    """`vec` consecutive elements into registers: one vector load (codegen/header.py pn_ldv)."""
    return f"pn_ldv({ptr}, {dst});" if vec > 1 else f"{dst}[0] = pn_ld({ptr});"


def _main(p: AttentionPlan, name: str, specs, lk_arg: bool = False) -> list[str]:
    c = p.chain
    f = ONLINE_SOFTMAX_VEC.functor
    sb, sh, si, sl = c.mask_strides
    sig = _signature(specs) + (", long long pn_LK" if lk_arg else "")
    if lk_arg:  # the call's keys split evenly: every block owns at least one where LK >= S
        chunk = [
            "  const int l0 = (int)((long long)z * LK / S), l1 = (int)((long long)(z + 1) * LK / S);",
            "  // uniform trip count: every lane of a warp reaches every shuffle",
            "  for (int it = 0; it < (l1 - l0 + NG * U - 1) / (NG * U); ++it) {",
        ]
    else:
        chunk = [
            "  const int l0 = z * CHUNK, l1 = l0 + CHUNK < LK ? l0 + CHUNK : LK;",
            "  // uniform trip count: every lane of a warp reaches every shuffle",
            "  for (int it = 0; it < (CHUNK + NG * U - 1) / (NG * U); ++it) {",
        ]
    lines = [
        f'extern "C" __global__ void __launch_bounds__({p.threads}, {max(1, 512 // p.threads)}) {name}({sig}) {{',
        *_constants(p, lk_arg),
        "  const int tid = threadIdx.x, lane = tid % LANES, grp = tid / LANES;",
        "  const int z = blockIdx.x % S, tile = blockIdx.x / S, bh = blockIdx.y, b = bh / HKV, hkv = bh % HKV;",
        "  const long long kbase = (long long)bh * LK * D;",
        "  acc_t qf[RT][NV][VEC], o[RT][NV][VEC], m[RT], s[RT];",
        "  #pragma unroll",
        "  for (int r = 0; r < RT; ++r) {",
        "    const int row = tile * RT + r, g = row / LQ, i = row % LQ;",
        "    const long long qoff = (((long long)b * HQ + hkv * G + g) * LQ + i) * D;",
        "    m[r] = ninf;",
        "    s[r] = 0;",
        "    #pragma unroll",
        "    for (int t = 0; t < NV; ++t) {",
        "      const int d0 = (t * LANES + lane) * VEC;",
        "      acc_t x[VEC];",
        f"      if (row < ROWS && d0 < D) {_load('q + qoff + d0', 'x', p.vec)}",
        "      else for (int e = 0; e < VEC; ++e) x[e] = 0;",
        "      for (int e = 0; e < VEC; ++e) { qf[r][t][e] = x[e] * scale; o[r][t][e] = 0; }",
        "    }",
        "  }",
        *chunk,
        "    acc_t kf[U][NV][VEC], vf[U][NV][VEC];",
        "    #pragma unroll",
        "    for (int u = 0; u < U; ++u) {",
        "      const int l = l0 + (it * NG + grp) * U + u;",
        "      #pragma unroll",
        "      for (int t = 0; t < NV; ++t) {",
        "        const int d0 = (t * LANES + lane) * VEC;",
        "        if (l < l1 && d0 < D) {",
        f"          {_load('k + kbase + (long long)l * D + d0', 'kf[u][t]', p.vec)}",
        f"          {_load('v + kbase + (long long)l * D + d0', 'vf[u][t]', p.vec)}",
        "        } else {",
        "          for (int e = 0; e < VEC; ++e) { kf[u][t][e] = 0; vf[u][t][e] = 0; }",
        "        }",
        "      }",
        "    }",
        "    #pragma unroll",
        "    for (int u = 0; u < U; ++u) {",
        "      const int l = l0 + (it * NG + grp) * U + u;",
        "      #pragma unroll",
        "      for (int r = 0; r < RT; ++r) {",
        "        acc_t x = 0;",
        "        #pragma unroll",
        "        for (int t = 0; t < NV; ++t)",
        "          #pragma unroll",
        "          for (int e = 0; e < VEC; ++e) x += qf[r][t][e] * kf[u][t][e];",
        "        #pragma unroll",
        "        for (int off = LANES / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off, LANES);",
        "        const int row = tile * RT + r;",
        "        if (l >= l1 || row >= ROWS) continue;",
    ]
    if c.mask_kind != MaskKind.NONE:
        lines.append("        const int g = row / LQ, i = row % LQ;")
        lines.append(
            f"        const long long mi = (long long)b * {sb} + (long long)(hkv * G + g) * {sh} + (long long)i * {si} + (long long)l * {sl};"
        )
        if c.mask_kind == MaskKind.BOOLEAN:
            lines.append("        if (!pn_ld(mask + mi)) x = ninf;")
        else:
            lines.append("        x += pn_ld(mask + mi);")
    lines += [
        "        if (x == ninf) continue;  // a masked key lifts to the identity",
        "        acc_t mn, fa, fb;",
        f"        {f}::weights(m[r], x, mn, fa, fb);",
        "        m[r] = mn;",
        "        s[r] = s[r] * fa + fb;",
        "        #pragma unroll",
        "        for (int t = 0; t < NV; ++t)",
        "          for (int e = 0; e < VEC; ++e) o[r][t][e] = o[r][t][e] * fa + vf[u][t][e] * fb;",
        "      }",
        "    }",
        "  }",
        "  // the groups' accumulators through shared memory, merged in group order",
        "  __shared__ acc_t sm_m[NG][RT], sm_s[NG][RT], sm_o[NG][RT][D];",
        "  #pragma unroll",
        "  for (int r = 0; r < RT; ++r) {",
        "    if (lane == 0) { sm_m[grp][r] = m[r]; sm_s[grp][r] = s[r]; }",
        "    #pragma unroll",
        "    for (int t = 0; t < NV; ++t) {",
        "      const int d0 = (t * LANES + lane) * VEC;",
        "      if (d0 < D) for (int e = 0; e < VEC; ++e) sm_o[grp][r][d0 + e] = o[r][t][e];",
        "    }",
        "  }",
        "  __syncthreads();",
        "  const long long pbase = ((long long)bh * TILES + tile) * S;",
        "  for (int e = tid; e < RT * D; e += T) {",
        "    const int r = e / D, d = e % D, row = tile * RT + r;",
        "    acc_t mm = ninf, ss = 0, oo = 0;",
        "    for (int h = 0; h < NG; ++h) {",
        "      acc_t mn, fa, fb;",
        f"      {f}::weights(mm, sm_m[h][r], mn, fa, fb);",
        "      ss = ss * fa + sm_s[h][r] * fb;",
        "      oo = oo * fa + sm_o[h][r][d] * fb;",
        "      mm = mn;",
        "    }",
        "    if (row >= ROWS) continue;",
    ]
    if p.split == 1:
        lines += [
            "    const int g = row / LQ, i = row % LQ;",
            f"    pn_st(&out[(((long long)b * HQ + hkv * G + g) * LQ + i) * D + d], {ONLINE_SOFTMAX_VEC.functor}::finish(oo, ss));",
            "  }",
        ]
    else:
        lines += [
            "    const long long w = (pbase + z) * RT + r;",
            "    ws_o[w * D + d] = oo;",
            "    if (d == 0) { ws_m[w] = mm; ws_s[w] = ss; }",
            "  }",
        ]
    if p.split > 1 and p.launches == 1:
        lines += [
            "  // arrival: the last block of the row tile merges every partial, then resets the counter",
            "  __shared__ int last;",
            "  __threadfence();",
            "  __syncthreads();",
            "  if (tid == 0) last = atomicAdd(&cnt[bh * TILES + tile], 1u) == S - 1;",
            "  __syncthreads();",
            "  if (!last) return;",
            "  __threadfence();",
            *_merge_partials(p),
            "  if (tid == 0) cnt[bh * TILES + tile] = 0u;",
        ]
    lines.append("}")
    return lines


def _merge_kernel(p: AttentionPlan, name: str, specs, lk_arg: bool = False) -> list[str]:
    return [
        f'extern "C" __global__ void __launch_bounds__({p.threads}) {name}({_signature(specs)}) {{',
        *[line for line in _constants(p, lk_arg) if "pn_LK" not in line],  # the merge needs no key length
        "  const int tile = blockIdx.x, bh = blockIdx.y, b = bh / HKV, hkv = bh % HKV;",
        "  const long long pbase = ((long long)bh * TILES + tile) * S;",
        *_merge_partials(p),
        "}",
    ]


def render_attention(p: AttentionPlan, name: str, lk_arg: bool = False) -> AttentionKernels:
    """The CUDA C of plan `p`, its kernels named after `name`. `lk_arg`: the key length is the main
    kernel's last argument (`long long pn_LK`, symbolic programs: panamera/dynamic_attention.py),
    its keys divided evenly among the plan's `split` blocks; else the plan's constants."""
    io, ws = _buffers(p, name)
    main_specs = tuple(io + ws)
    parts = ["\n".join(_main(p, name, main_specs, lk_arg))]
    params = {name: main_specs}
    merge = ""
    if p.split > 1 and p.launches == 2:
        merge = f"{name}_merge"
        out = [b for b in io if b.role == BufferRole.OUTPUT]
        merge_specs = tuple(out + ws)
        parts.append("\n".join(_merge_kernel(p, merge, merge_specs, lk_arg)))
        params[merge] = merge_specs
    init = None
    counters = [b for b in ws if b.role == BufferRole.COUNTER]
    if counters:
        fills = tuple(Fill(b.key, b.ctype, 0, "0u") for b in counters)
        init = render_init(f"{name}_init", fills, {b.key: b for b in counters})
    return AttentionKernels("\n".join(parts), name, merge, params, init)
