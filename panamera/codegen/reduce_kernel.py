"""The reduction template: registers, then warp shuffles and shared memory, then the merge.

Each thread accumulates its iterations in registers (`vec` accumulators per output for COLUMN,
whose vector runs along the kept extent); the block combines them (pn_reduce_x across a row,
pn_reduce_y down a column tile); then each output is stored, merged into its resident workspace
with one atomic per block, or written as the block's partial, as its merge mode says. With a
split, the last block to arrive (counter + __threadfence) finishes: it stores the workspace's
value and resets it, or combines the partials, and resets the counter.

The last block combines partials with every one of its threads, as the main loop reduces: a
ROW/ALL output's partials lie contiguous (`ws[o * split + b]`), and the tx threads of its row
stride over them and reduce across the row; a COLUMN tile's partials lie split-major
(`ws[b * M + o]`), and the ty threads of each column stride over them and reduce down the
column. Loads are coalesced and the order is fixed by the code, not by block arrival, so
partials stay bit-identical run to run (`deterministic=True`).

An epilogue group (mapping's `epilogue`, poly/epilogue.py) holds one reduction and element-wise
statements over its outputs: wherever output o becomes final — the leader's store without a
split, the last block's read-back of the atomic workspace (`__ldcg` after the counter's
`__threadfence`), or its combine of the partials — that thread keeps the value in a register,
stores it only if something else reads it, and evaluates the epilogue statements at index o
(scalar loads of their other inputs), storing their results: one launch.

A statement whose accumulator is another's (`KernelGroup.accumulator_of`: LayerNorm's mean and
variance) has no accumulator, reduction or merge of its own: it stores its finish of the
owner's value wherever the owner stores.
"""

from __future__ import annotations

from ..algebra import AtomicStrategy
from ..poly.statement import Form, Statement, StatementKind
from ..schedule.decision import Completion
from ..schedule.mapping import MergeMode
from . import mbarrier
from .expr import convert
from .pipeline import emit_pipeline
from .thread_loop import ThreadLoop, c_ident, identity_expr, post, post_dtype


def emit_reduce(loop: ThreadLoop) -> list[str]:
    g, m = loop.g, loop.m
    col = g.form == Form.COLUMN
    V = m.vec
    lines = _cluster_start(loop) if m.cluster > 1 and m.completion == Completion.MBARRIER else []
    reductions = [k for k, s in enumerate(g.statements) if s.kind == StatementKind.REDUCE]
    for k, s in enumerate(g.statements):
        if g.accumulator_of[k] != k or k not in reductions:
            continue
        if col and V > 1 or _tile(m) > 1:
            n = _tile(m) if _tile(m) > 1 else V  # a register tile's rows (ROW/ALL) or a COLUMN thread's lanes
            lines.append(f"  {s.acc.compute} acc{k}[{n}];")
            lines.append(f"  for (int v = 0; v < {n}; ++v) acc{k}[v] = {identity_expr(s)};")
        else:
            lines.append(f"  {s.acc.compute} acc{k} = {identity_expr(s)};")
    if m.stages > 1:  # K slabs of the block-shared operand through shared memory
        lines += emit_pipeline(loop, reductions)
    else:
        lines += loop.loops(lambda call: loop.iteration(call, reductions))
    return lines + _epilogue(loop)


def _epilogue(loop: ThreadLoop) -> list[str]:
    g, m = loop.g, loop.m
    col = g.form == Form.COLUMN
    V = m.vec if col else 1
    out = []
    size = m.tx * m.ty if col else m.ty * max(1, m.tx // 32) * _tile(m)
    for ct in dict.fromkeys(s.acc.compute for s in g.statements if s.kind == StatementKind.REDUCE):
        out.append(f"  __shared__ {ct} pn_smem_{c_ident(ct)}[{size}];")
    for k, s in enumerate(g.statements):
        if g.accumulator_of[k] != k or s.kind != StatementKind.REDUCE:
            continue
        safe = c_ident(s.acc.compute)
        fn = "pn_reduce_y" if col else "pn_reduce_x"
        tmpl = f"<{s.combiner.functor}, {m.tx}, {m.ty}>"
        if _tile(m) > 1:  # the tile's rows reduce together
            out.append(f"  pn_reduce_x_n<{s.combiner.functor}, {m.tx}, {m.ty}, {_tile(m)}>(acc{k}, pn_smem_{safe});")
        elif col and V > 1:
            out.append(f"  for (int v = 0; v < {V}; ++v) acc{k}[v] = {fn}{tmpl}(acc{k}[v], pn_smem_{safe});")
        else:
            out.append(f"  acc{k} = {fn}{tmpl}(acc{k}, pn_smem_{safe});")
    clustered = m.cluster > 1
    if clustered:  # sm_90 only: compiled for an older GPU the kernel traps
        out = [
            "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900",
            "  __trap();  // a thread-block cluster needs sm_90",
            "#else",
            *out,
        ]
        out += _cluster_combine(loop) + ["  if (pn_cluster.block_rank() == 0) {"]
    out += _vector_atomics(loop)
    out += _per_output(
        loop, lambda k, s, o, a: _finish(loop, k, s, o, a, m.merges[k], g.accumulator_of[k], m.atomic_vec[k])
    )
    if m.needs_last_block:
        out += last_block_open("pn_counter[bx]", _sn(m))
        own = g.accumulator_of
        out += ["  " + ln for ln in _per_output(loop, lambda k, s, o, a: _final(loop, k, s, o, m.merges[k], own[k]))]
        out += ["  " + ln for ln in _per_output(loop, lambda k, s, o, a: _reset(k, s, o, m.merges[k], own[k]))]
        out += ["  " + ln for ln in _combine_partials(loop)]
        out += last_block_close("pn_counter[bx]")
    if clustered:
        out += ["  }", "#endif"]
    return out


def last_block_open(counter: str, merged: str) -> list[str]:
    """The last block's protocol, its arrival: every block fences its merges, one thread counts
    the block on `counter`, and the block whose arrival makes `merged` (the partials merged per
    output, a C expression) goes on, fenced again, into the block `last_block_close` ends. The
    static and the parametric (codegen/param_kernel.py) reduce kernels print it.

    >>> last_block_open("cnt[bx]", "(pn_idx)gridDim.y")[3]
    '  if (tx == 0 && ty == 0) pn_is_last = atomicAdd(&cnt[bx], 1u) == (pn_idx)gridDim.y - 1;'
    """
    return [
        "  __threadfence();",
        "  __syncthreads();",
        "  __shared__ int pn_is_last;",
        f"  if (tx == 0 && ty == 0) pn_is_last = atomicAdd(&{counter}, 1u) == {merged} - 1;",
        "  __syncthreads();",
        "  if (pn_is_last) {",
        "    __threadfence();",
    ]


def last_block_close(counter: str) -> list[str]:
    """The last block's departure: the counter back to zero for the next call (it is resident)."""
    return [f"    if (tx == 0 && ty == 0) {counter} = 0u;  // resident: ready for the next call", "  }"]


def _sb(m) -> str:
    """The index of the block's partial among the merged ones: its cluster's under clusters."""
    return "pn_sb" if m.cluster > 1 else "by"


def _sn(m) -> str:
    """How many partials merge: the clusters' under clusters (schedule/cluster.py), else gridDim.y."""
    return "pn_sn" if m.cluster > 1 else "(pn_idx)gridDim.y"


def _owners(g) -> list[int]:
    """The statements with an accumulator of their own (a shared one merges once, by its owner)."""
    return [k for k, s in enumerate(g.statements) if s.kind == StatementKind.REDUCE and g.accumulator_of[k] == k]


def _cluster_start(loop: ThreadLoop) -> list[str]:
    """Under mbarriers (`Completion.MBARRIER`), the kernel's start: rank 0's slots for the C x ty
    partials of each accumulator and its mbarrier, armed with their bytes (codegen/mbarrier.py),
    then the arrival of the split cluster barrier whose wait comes before the first push (the
    main loop hides it). Printed for sm_90 only, as the combine is."""
    g, m = loop.g, loop.m
    C = m.cluster
    types = [g.statements[k].acc.compute for k in _owners(g)]
    out = [
        "#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900",
        "  const cooperative_groups::cluster_group pn_cluster = cooperative_groups::this_cluster();",
        *[f"  PN_BLOCK_SHARED({ct}, pn_csm{k}, [{C}][{m.ty}]);" for k, ct in zip(_owners(g), types)],
        *mbarrier.setup([mbarrier.expected(types, C * m.ty)], where="pn_cluster.block_rank() == 0"),
        "  pn_cluster.barrier_arrive();  // this block has started, rank 0's mbarrier is armed",
        "#endif",
    ]
    return out


def _cluster_combine(loop: ThreadLoop) -> list[str]:
    """A cluster's blocks combine their partials in its rank-0 block (schedule/cluster.py): each
    block's partial into its own shared memory, the cluster barrier, rank 0's output threads read
    the C partials in rank order through distributed shared memory, and a second barrier keeps
    every block's shared memory alive until then. Only rank 0 goes on to merge (its cluster's
    partial is the cluster's one partial: `pn_sb` of `pn_sn`). Under mbarriers
    (`_cluster_mbarrier`) no cluster-wide barrier follows the partials."""
    g, m = loop.g, loop.m
    C = m.cluster
    if m.completion == Completion.MBARRIER:
        return _cluster_mbarrier(loop)
    out = [
        f"  // the {C} blocks of the cluster combine their partials in rank 0 (distributed shared memory)",
        "  const cooperative_groups::cluster_group pn_cluster = cooperative_groups::this_cluster();",
    ]
    owners = _owners(g)
    for k in owners:
        ct = g.statements[k].acc.compute
        out.append(f"  PN_BLOCK_SHARED({ct}, pn_csm{k}, [{m.ty}]);")
        out.append(f"  if (tx == 0) pn_csm{k}[ty] = acc{k};")
    out.append("  pn_cluster.sync();  // every block's partials are written")
    out.append("  if (pn_cluster.block_rank() == 0 && tx == 0) {")
    for k in owners:
        s = g.statements[k]
        out.append(f"    acc{k} = {identity_expr(s)};")
        out.append(
            f"    for (unsigned b = 0; b < {C}u; ++b) "
            f"acc{k} = {s.combiner.functor}::apply(acc{k}, *pn_cluster.map_shared_rank(&pn_csm{k}[ty], b));"
        )
    out.append("  }")
    out.append("  pn_cluster.sync();  // rank 0 has read them: the other blocks may exit")
    out.append(f"  const pn_idx pn_sb = by / {C}, pn_sn = gridDim.y / {C};")
    return out


def _cluster_mbarrier(loop: ThreadLoop) -> list[str]:
    """The cluster combine completed by rank 0's mbarrier (schedule/cluster.py, as QuACK's
    exchange): after the start's split barrier (every block started, rank 0's mbarrier armed:
    `_cluster_start`), each row's tx == 0 thread pushes its block's partial into slot [rank][ty]
    of rank 0 with st.async, whose bytes complete on rank 0's mbarrier; rank 0's threads wait for
    all C x ty of them and fold them in rank order (the barrier plan's order: bit-identical). The
    other blocks exit after their pushes: nobody reads their shared memory."""
    g, m = loop.g, loop.m
    C = m.cluster
    out = [
        f"  // the {C} blocks of the cluster push their partials into rank 0 (st.async onto its mbarrier)",
        "  pn_cluster.barrier_wait();  // every block has started and rank 0's mbarrier is armed",
        "  const unsigned pn_rank = pn_cluster.block_rank();",
    ]
    out += [f"  if (tx == 0) pn_push(&pn_csm{k}[pn_rank][ty], acc{k}, &pn_mbar[0], 0u);" for k in _owners(g)]
    out.append("  if (pn_rank == 0) {")
    out.append("  " + mbarrier.wait(1).replace("every block's", "the cluster's"))
    out.append("    if (tx == 0) {")
    for k in _owners(g):
        s = g.statements[k]
        out.append(f"      acc{k} = {identity_expr(s)};")
        fold = f"{s.combiner.functor}::apply(acc{k}, pn_csm{k}[b][ty])"
        out.append(f"      for (unsigned b = 0; b < {C}u; ++b) acc{k} = {fold};")
    out += ["    }", "  }", f"  const pn_idx pn_sb = by / {C}, pn_sn = gridDim.y / {C};"]
    return out


def _tile(m) -> int:
    """Rows of the thread's register tile (schedule/rtile.py)."""
    return m.rtile * m.ctile


def _per_output(loop: ThreadLoop, emit) -> list[str]:
    """`emit(k, statement, output index, accumulator)` for every output the thread holds: one
    guard per form around the same emits (an epilogue statement is its reduction's emit)."""
    g, m = loop.g, loop.m
    if g.form == Form.COLUMN:
        V = m.vec
        head = [
            f"  if (ty == 0) for (int v = 0; v < {V}; ++v) {{",
            f"    const pn_idx o = (bx * {m.tx} + tx) * {V} + v;",
            f"    if (o < {g.M}) {{",
        ]
        lane, pad, tail = "[v]" if V > 1 else "", "      ", ["    }", "  }"]
    elif _tile(m) > 1:  # every row of the thread's register tile, v = r * ctile + c
        row, valid = loop.tile_row("pn_t", f"v / {m.ctile}", f"v % {m.ctile}")
        head = [
            f"  for (int v = 0; v < {_tile(m)}; ++v) {{ const pn_idx pn_t = bx * {m.ty} + ty;",
            f"  const pn_idx o = {row};",
            f"  if (tx == 0 && {valid}) {{",
        ]
        lane, pad, tail = "[v]", "    ", ["  } }"]
    else:
        head = [f"  {{ const pn_idx o = bx * {m.ty} + ty;", f"  if (tx == 0 && o < {g.M}) {{"]
        lane, pad, tail = "", "    ", ["  } }"]
    body = [
        pad + ln
        for k, s in enumerate(g.statements)
        if s.kind == StatementKind.REDUCE
        for ln in emit(k, s, "o", f"acc{g.accumulator_of[k]}{lane}")
    ]
    return head + body + tail


def _vector_atomics(loop: ThreadLoop) -> list[str]:
    """A COLUMN thread's adjacent outputs merged by one float2/float4 atomicAdd (mapping's
    `atomic_vec`): its outputs are all in range or all out, since the width divides M."""
    g, m = loop.g, loop.m
    out = []
    for k, width in enumerate(m.atomic_vec):
        if width > 1:
            out.append(f"  {{ const pn_idx o = (bx * {m.tx} + tx) * {width};")
            out.append(f"    if (ty == 0 && o < {g.M}) pn_atomic_v(&ws{k}[o], acc{k}); }}")
    return out


def _finish(loop: ThreadLoop, k, s, o, a, mode, owner, width) -> list[str]:
    """Output o of statement k from this block: final (STORE) and applied, or merged."""
    if mode == MergeMode.STORE and loop.m.epilogue:
        return apply_epilogue(loop, k, s, o, post(s, a))
    return _write(k, s, o, a, mode, owner, width, _sb(loop.m), _sn(loop.m))


def apply_epilogue(loop: ThreadLoop, k: int, s: Statement, o: str, final: str) -> list[str]:
    """Reduction k's final value `final` (the post dtype) of output o, in a register: stored if
    read elsewhere, then every epilogue statement at index o, each stored (a later one reads an
    earlier one's register)."""
    g = loop.g
    reg = f"pn_r{k}"
    out = [f"const {s.result.dtype.compute} {reg} = {convert(final, post_dtype(s), s.result.dtype)};"]
    if s.result.uid in g.external:
        out.append(f"pn_st(&out{k}[{o}], {reg});")
    loop.regs[s.result.uid] = reg
    out.append(f"{{ const pn_idx i = {o}; const pn_idx j = 0; (void)j;")
    for e, st in enumerate(g.statements):
        if st.kind != StatementKind.MAP:
            continue
        body, val = loop.body_lines(e, None)
        out += ["  " + ln for ln in body]
        out.append(f"  const {st.result.dtype.compute} pn_r{e} = {convert(val, st.body.dtype, st.result.dtype)};")
        out.append(f"  pn_st(&out{e}[{loop.address(st.write)}], pn_r{e});")
        loop.regs[st.result.uid] = f"pn_r{e}"
    return out + ["}"]


def _write(
    k: int,
    s: Statement,
    o: str,
    a: str,
    mode: MergeMode,
    owner: int,
    width: int = 1,
    sb: str = "by",
    sn: str = "(pn_idx)gridDim.y",
) -> list[str]:
    if mode == MergeMode.STORE:
        return [f"pn_st(&out{k}[{o}], {post(s, a)});"]
    if owner != k or width > 1:
        return []  # the owner merges the shared accumulator; vector atomics merged already
    return merge_write(s, f"ws{k}", o, a, mode, str(s.M), sb, sn)


def merge_write(s, ws: str, o: str, a: str, mode: MergeMode, m: str, sb: str = "by", sn: str = "(pn_idx)gridDim.y"):
    """Block partial `a` of output o of statement `s` (static or parametric) merged into workspace
    `ws` (`m`: the outputs M, a C expression): one atomic (an ordered one for float max/min), or
    written as the block's partial `sb` of `sn` (COLUMN partials split-major, the others
    output-major: codegen/reduce_kernel.py's last block reads them coalesced)."""
    if mode == MergeMode.ATOMIC_WS and _ordered(s):
        return [f"pn_atomic_ordered({s.combiner.functor}(), &{ws}[{o}], {a});"]
    if mode == MergeMode.ATOMIC_WS:
        return [f"pn_atomic({s.combiner.functor}(), &{ws}[{o}], {a});"]
    if s.form == Form.COLUMN:
        return [f"{ws}[(pn_idx){sb} * {m} + {o}] = {a};"]
    return [f"{ws}[{o} * {sn} + {sb}] = {a};"]


def merged_value(s, loaded: str) -> str:
    """An output's merged accumulator from its atomic workspace word `loaded` (the last block
    reads it past its fence, from L2: `pn_ldcg`): the float of an integer image for float max/min."""
    return f"pn_unordered({loaded})" if _ordered(s) else loaded


def _final(loop: ThreadLoop, k: int, s: Statement, o: str, mode: MergeMode, owner: int, merged: str = "") -> list[str]:
    """`merged`: the merged workspace value where the caller loaded it already (tc_kernel.py)."""
    if mode == MergeMode.ATOMIC_WS:  # the output from the merged workspace (the owner's)
        final = post(s, merged_value(s, merged or f"pn_ldcg(&ws{owner}[{o}])"))
        if loop.m.epilogue:
            return apply_epilogue(loop, k, s, o, final)
        return [f"pn_st(&out{k}[{o}], {final});"]
    return []


def _ordered(s: Statement) -> bool:
    """Float max/min merge through integer images (algebra.AtomicStrategy.ORDERED)."""
    return s.combiner.atomic(s.acc) == AtomicStrategy.ORDERED


def workspace_identity(s: Statement) -> str:
    """The identity a merge workspace holds: the combiner's, or its integer image."""
    if _ordered(s):
        return f"pn_ordered({identity_expr(s)}, {'true' if s.combiner.ordered_top else 'false'})"
    return identity_expr(s)


def _reset(k: int, s: Statement, o: str, mode: MergeMode, owner: int) -> list[str]:
    if mode == MergeMode.ATOMIC_WS and owner == k:  # back to the identity for the next call
        return [f"ws{k}[{o}] = {workspace_identity(s)};"]
    return []


def fold_partials(
    s, a: str, inside: str, first: str, n: str, step: str, load: str, reduce: str, smem: str
) -> list[str]:
    """The last block's fold of output o's `n` partials into `a` (static or parametric statement
    `s`): where `inside`, each thread from partial `first` on (`step`) folds `load` (read past the
    fence, from L2), in a fixed order, then the block reduces (`reduce`, through `smem`): coalesced
    loads, bit-identical results run to run."""
    return [
        f"  {s.acc.compute} {a} = {identity_expr(s)};",
        f"  if ({inside}) for (pn_idx b = {first}; b < {n}; {step}) {a} = {s.combiner.functor}::apply({a}, pn_ldcg(&{load}));",
        f"  {a} = {reduce}({a}, {smem});",
    ]


def _combine_partials(loop: ThreadLoop) -> list[str]:
    """The last block's combine of every PARTIALS output: all threads load, then reduce; the
    outputs that share the accumulator store their finishes of the same combined value."""
    g, m = loop.g, loop.m
    col = g.form == Form.COLUMN
    out = []
    for k, s in enumerate(g.statements):
        if m.merges[k] != MergeMode.PARTIALS or g.accumulator_of[k] != k:
            continue
        tmpl = f"<{s.combiner.functor}, {m.tx}, {m.ty}>"
        smem = f"pn_smem_{c_ident(s.acc.compute)}"
        a = f"pn_p{k}"
        sharing = [j for j, o in enumerate(g.accumulator_of) if o == k]
        inside = f"o < {g.M}"
        if col:
            leader, step, index, reduce = "ty == 0", f"b += {m.ty}", f"b * {s.M} + o", "pn_reduce_y"
            out += [f"for (int v = 0; v < {m.vec}; ++v) {{", f"  const pn_idx o = (bx * {m.tx} + tx) * {m.vec} + v;"]
            first = "ty"
        elif _tile(m) > 1:  # per row of the register tile
            leader, step, index, reduce = "tx == 0", f"b += {m.tx}", f"o * {_sn(m)} + b", "pn_reduce_x"
            row, inside = loop.tile_row("pn_t", f"pn_v / {m.ctile}", f"pn_v % {m.ctile}")
            out += [
                f"for (int pn_v = 0; pn_v < {_tile(m)}; ++pn_v) {{",
                f"  const pn_idx pn_t = bx * {m.ty} + ty; const pn_idx o = {row};",
            ]
            first = "tx"
        else:
            leader, step, index, reduce = "tx == 0", f"b += {m.tx}", f"o * {_sn(m)} + b", "pn_reduce_x"
            out += ["{", f"  const pn_idx o = bx * {m.ty} + ty;"]
            first = "tx"
        out += fold_partials(s, a, inside, first, _sn(m), step, f"ws{k}[{index}]", reduce + tmpl, smem)
        if m.epilogue:  # one reduction: its finish, then the epilogue statements
            out.append(f"  if ({leader} && {inside}) {{")
            out += ["    " + ln for ln in apply_epilogue(loop, k, s, "o", post(s, a))]
            out.append("  }")
        else:
            out += [f"  if ({leader} && {inside}) pn_st(&out{j}[o], {post(g.statements[j], a)});" for j in sharing]
        out.append("}")
    return out
