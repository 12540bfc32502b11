"""The end of a stitched row pass, one printer for the static and the symbolic stitched kernels
(codegen/stitched_kernel.py, codegen/param_stitched.py): the pass's accumulators all-reduced
across the row's `tx` threads (every thread of the row gets the row's value: `pn_allreduce_x`,
codegen/header.py), each reduction's finished value in a register `r<k>` that later passes and
the row's MAP read, and the values the kernel stores written by the row's leader.

A kernel declares the reduction's shared buffers once (`shared_buffers`), names the row a thread
works on `o`, and keeps each accumulator in `acc<k>`, k its owner's index in the group.

>>> import panamera as pn
>>> from panamera.poly.params import build
>>> s = build((pn.sum(pn.placeholder(("B", 64), name="x"), axis=1),)).statements[0]
>>> lines, regs = finish_pass([s], [0], [0], 32, 4, "tx == 0", "pn_M", {s.result.uid}, lambda s, a: a)
>>> for ln in lines: print(ln)
  acc0 = pn_allreduce_x<pn_op_sum, 32, 4>(acc0, pn_smem_float, pn_bcast_float);
  const float r0 = acc0;
  if (tx == 0 && o < pn_M) pn_st(&out0[o], r0);
>>> list(regs.values())
['r0']
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from ..poly.statement import StatementKind
from .expr import convert
from .thread_loop import c_ident, post_dtype


def shared_buffers(statements: Sequence, tx: int, ty: int) -> list[str]:
    """The shared memory of the row reductions, per accumulator type: the warps' partials and the
    row's broadcast slot (pn_allreduce_x's `smem` and `bcast`)."""
    out = []
    for ct in dict.fromkeys(s.acc.compute for s in statements if s.kind == StatementKind.REDUCE):
        safe = c_ident(ct)
        out.append(f"  __shared__ {ct} pn_smem_{safe}[{ty * max(1, tx // 32)}];")
        out.append(f"  __shared__ {ct} pn_bcast_{safe}[{ty}];")
    return out


def finish_pass(
    statements: Sequence,
    reduces: Sequence[int],
    owner: Sequence[int],
    tx: int,
    ty: int,
    leader: str,
    rows: object,
    external: Collection[int],
    value: Callable[[object, str], str],
    reduced: bool = False,
) -> tuple[list[str], dict[int, str]]:
    """The lines finishing the reductions `reduces` (indices into `statements`) of one pass, and
    the registers that now hold their values (by result uid). `owner[k]`: the reduction whose
    accumulator k reads; `leader`: the condition of the thread that stores a row's values; `rows`:
    the rows' bound (`o < rows`); `external`: the result uids the kernel stores; `value(s, acc)`:
    the reduction's value from its accumulator (static `post`, symbolic `finish`), in `post_dtype(s)`;
    `reduced`: every thread of the row already holds its value (a cluster's exchange), no all-reduce."""
    out: list[str] = []
    regs: dict[int, str] = {}
    for k in reduces:
        s = statements[k]
        if owner[k] == k and not reduced:
            safe = c_ident(s.acc.compute)
            tmpl = f"<{s.combiner.functor}, {tx}, {ty}>"
            out.append(f"  acc{k} = pn_allreduce_x{tmpl}(acc{k}, pn_smem_{safe}, pn_bcast_{safe});")
        reg = f"r{k}"
        final = convert(value(s, f"acc{owner[k]}"), post_dtype(s), s.result.dtype)
        out.append(f"  const {s.result.dtype.compute} {reg} = {final};")
        regs[s.result.uid] = reg
        if s.result.uid in external:
            out.append(f"  if ({leader} && o < {rows}) pn_st(&out{k}[o], {reg});")
    return out, regs
