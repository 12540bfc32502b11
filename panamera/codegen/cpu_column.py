"""A COLUMN task's scan of j in [pn_lo, pn_hi) when its decision adds R = `column_rows` > 1
input rows per load and store of its blocks (model/cpu.py `column_rows`: the blocks in L1).

Before (codegen/cpu_kernel.py's isl scan, R = 1): every row loads and stores each vector of
the block: ``for j: for i (simd): blk[i] = apply(blk[i], f(x[j, i]))``.
After: ``for j in steps of R: for i (simd): c = blk[i]; c = apply(c, f(x[j, i])); ...;
c = apply(c, f(x[j + R - 1, i])); blk[i] = c``, then the rows left (fewer than R) one at a time
as before. The combines run in the same order on the same values, so the bits are those of
one row a step; only the loads and stores of the block between rows go. The scan is the task's
whole box [pn_lo, pn_hi) x [pn_i0, min(M, pn_i0 + B)), each (j, i) once, as the isl scan's.
Preconditions (model/cpu.py `column_rows` decides, the mapper carries it as `CpuDecision.column_rows`;
tests/test_cpu_column_rows.py, one negative test each):

1. the group's form is COLUMN (other forms scan rows of their own);
2. its blocks are not held in registers (`column_held`: g++ keeps them there, no load or store
   to save).

Why: one row a step read a 768-wide column sum at 0.52-0.63 of a plain sum's rate from DRAM,
eight rows 0.92-0.94 (model/cpu.py COLUMN_ROWS gives the measurement).
"""

from __future__ import annotations


def column_steps(k, owners: list[int], block: int) -> list[str]:
    """Kernel `k`'s (a codegen/cpu_kernel.py `_Kernel`) scan of its task's rows into `pn_blk`
    blocks of `block` outputs for its reductions, `owners` the accumulators, rows in steps of
    `k.d.column_rows` and the rest one at a time."""
    d, g = k.d, k.g
    R = d.column_rows
    assert R > 1, "cpu_column: one row a step is the isl scan's (codegen/cpu_kernel.py emit_column)"
    end = f"pn_i0 + {block}" if d.M % block == 0 else f"pn_imin({d.M}LL, pn_i0 + {block})"

    def rows(n: int, acc) -> list[str]:
        out = []
        for r in range(n):
            out += ["{", f"  const pn_idx j = pn_j{f' + {r}' if r else ''};"]
            out += ["  " + ln for ln in k.body(k.reductions, acc)] + ["}"]
        return out

    step = [f"{g.statements[q].acc.compute} pn_c{q} = pn_blk{q}[i - pn_i0];" for q in owners]
    step += rows(R, lambda q: f"pn_c{q}")
    step += [f"pn_blk{q}[i - pn_i0] = pn_c{q};" for q in owners]
    loop = "for (pn_idx i = pn_i0; i < pn_iend; ++i) {"
    out = [f"const pn_idx pn_iend = {end};", "pn_idx pn_j = pn_lo;"]
    out += [f"for (; pn_j + {R} <= pn_hi; pn_j += {R}) {{", "  #pragma omp simd", "  " + loop]
    out += ["    " + ln for ln in step] + ["  }", "}"]
    out += ["for (; pn_j < pn_hi; ++pn_j) {", "  #pragma omp simd", "  " + loop]
    out += ["    " + ln for ln in rows(1, lambda q: f"pn_blk{q}[i - pn_i0]")] + ["  }", "}"]
    return out
