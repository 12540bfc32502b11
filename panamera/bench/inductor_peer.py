"""TorchInductor's launch rules for one reduction kernel, read from PyTorch 2.7.1 (the version the QuACK blog's
torch.compile rows name; paths below are inside the torch package, line numbers of that release). A decision
made here is data (`InductorConfig`) that peers.py and train_peers.py turn into a modeled launch, so the bench
suites and the calibration rows see one definition.

Rules (numbered as the tests are):

1. Persistent or looped (`choices.py` `InductorChoices.should_use_persistent_reduction`, l. 77-104): a reduction
   is persistent (the whole row in registers, one read) when its length is statically at most 1024 with the
   INNER hint, else at most 64.
2. Persistent configs (`runtime/triton_heuristics.py` `_persistent_reduction_configs`, l. 2044-2080): XBLOCK 1 for
   an INNER row of 256 or more, else the largest of 1, 8, 32, 128 with XBLOCK x rnumel <= 4096 (OUTER keeps that
   one; a short INNER row autotunes among them: the model takes it too); the warps of
   `triton_config_reduction` (l. 1719-1767) with `register_intensive=True`: XBLOCK x RBLOCK / 128, clamped to
   2..8 (`_num_warps` l. 1552, max 16 halved).
3. Looped configs (`_reduction_configs` l. 1904-1969): INNER is one config, XBLOCK 1 and R0_BLOCK
   rnumel if 256 <= rnumel < 2048 else 2048; its warps R0_BLOCK / 128 clamped to 2..**16** (not register
   intensive: fewer than 10 loads and reductions). OUTER: XBLOCK 64, R0_BLOCK 8. `num_stages=1`: one load in
   flight per thread per loop step (R0_BLOCK / threads elements).
4. Loops over the row of a looped kernel (`fx_passes/post_grad.py` `prepare_softmax_replacement` l. 226-235,
   `lowering.py` `prepare_softmax_online` l. 6970-6990, `codegen/triton.py` l. 2604-2645, config.online_softmax
   on by default, l. 142): softmax's max and sum-of-exp are one online loop (two exp per element:
   `triton_helpers.online_softmax_combine`), then a loop writes exp(x - max) / sum (one exp); cross-entropy's
   log-softmax is the same online loop and its loss only gathers x[target] in the epilogue: one loop, nothing
   re-read; RMSNorm and LayerNorm (Welford) reduce in one loop and normalize in a second.
5. Dependent steps (`triton_config_reduction` l. 1719, `num_stages=1`: Triton does not software-pipeline the loop;
   Inductor bakes r0_numel into the kernel, so LLVM may unroll it). Compiled here with Triton 3.3.1 (2.7.1's) for
   sm_90a, the kernels re-typed from the QuACK blog's listing (RBLOCK 2048, 16 warps; SASS by cuobjdump): a loop
   of at most 4 steps is unrolled whole, its loads issued together (one round trip per loop); beyond, the online
   softmax loop (96 instructions a step) stays a loop with one 8-byte load a step, each step a DRAM round trip in
   turn (`RowLoops.unroll` 1), while RMSNorm's loops are unrolled by 8 or wholly (8-36 loads in flight); the
   loads of unrolled steps are in flight together (`steps_together`), one round trip for them;
   cross-entropy's epilogue loads the target, then x[target], after the loop (L2 hits mostly: not charged). 24-32
   registers, no spills: 4 blocks of 512 threads per SM, as the thread rule gives (`registers`: ptxas -v of the same
   PTX, nvcc 13.0's ptxas, sm_90a: looped softmax, RMSNorm and cross-entropy kernels of 4096-262144 elements 24-32,
   taken as 32; the persistent softmax kernels of 256 and 1024 elements 18, taken for every persistent row kernel).
6. Dynamic shapes (`size_hint`): a function compiled again for a new shape is recompiled with the sizes that changed
   symbolic (`torch/_dynamo/config.py` `automatic_dynamic_shapes`, on by default). Its row length is then not
   statically known: no persistent kernel (rule 1 asks `statically_known_leq`), the looped config of rule 3 taken
   from the size hint (the example's length at that compile, `size_hints`), and its loop, of a symbolic trip count,
   is not unrolled (`symbolic`: every step a round trip, one step's loads in flight). QuACK's harnesses
   (Dao-AILab/quack benchmarks/benchmark_{softmax,cross_entropy,rmsnorm}.py, July 2025) run their command-line shape,
   then the sweep of the blog's shapes from (32768, 256) up (`MN_pairs`), each call wrapping the same lambda (one
   code object, one Dynamo cache) in torch.compile: every row of that sweep runs the kernel compiled at 256
   elements (`QUACK_SWEEP_HINT`). [assumed] that the blog's figures came from that sweep; they fit 7 RMSNorm, 2
   softmax and 2 cross-entropy rows more, and none leaves (tests/test_calibration.py).
7. Split rows (`ir.py` `Reduction.num_splits` l. 1128-1287, `choices.py` `InductorChoices.reduction_split_factor`
   l. 118-170; peers.py `inductor_num_splits`): a row pattern of fewer than 2 x SMs rows longer than 8192 is split
   like any INNER reduction: each reduction becomes two kernels (`ir.py` `Reduction.create_multilayer`, l. 1673:
   partials of M x split chunks into a workspace, then one per row over the split partials). Online softmax is kept only
   without a split (`lowering.py` `prepare_softmax_online` l. 6986-6993: `num_split == 1`); else max, then
   sum(exp(x - max)), are separate split reductions, each reading the row. What follows them (`SplitRows`):
   softmax's and log-softmax's output is a pointwise kernel over M x N (`codegen/simd.py` `SIMDScheduling.can_fuse`
   l. 1175-1201: a pointwise node fuses with a reduction only over the reduction's M x split or M elements), while
   cross-entropy's loss, M elements, fuses into the final sum kernel; a norm's one split reduction (sum of squares,
   Welford) is followed by the normalizing pointwise kernel.

>>> looped_config(65536, Hint.INNER)
InductorConfig(persistent=False, xblock=1, rblock=2048, warps=16, symbolic=False)
>>> persistent_config(32768, 512, Hint.INNER)
InductorConfig(persistent=True, xblock=1, rblock=512, warps=4, symbolic=False)
>>> dynamic_config(256, Hint.INNER)
InductorConfig(persistent=False, xblock=1, rblock=256, warps=2, symbolic=True)
>>> row_loops("softmax"), row_loops("cross_entropy")
(RowLoops(loops=2, exp_per_element=3, unroll=1), RowLoops(loops=1, exp_per_element=2, unroll=1))
>>> split_rows("softmax"), split_rows("cross_entropy").pointwise
(SplitRows(reductions=2, pointwise=True, sfu_per_element=2, outputs=1), False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum


class Hint(Enum):
    """The reduction hint of `ir.Reduction.num_splits`: the row contiguous (INNER) or strided (OUTER)."""

    INNER = "INNER"
    OUTER = "OUTER"


@dataclass(frozen=True)
class InductorConfig:
    """One reduction kernel's launch: persistent or looped, XBLOCK rows per program, RBLOCK elements of the row
    per step (the whole padded row when persistent) and num_warps."""

    persistent: bool
    xblock: int
    rblock: int
    warps: int
    symbolic: bool = False  # rule 6: the row length is symbolic, the loop not unrolled

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def round_trips(self, rnumel: int, loops: int = 1, unroll: int = 1) -> int:
        """Rule 5: dependent DRAM round trips one program waits for: one per loop when its steps are unrolled
        whole (at most `UNROLLED_STEPS`), else one per `unroll` steps in each of its `loops`; a persistent
        program's single load of its rows.

        >>> looped_config(16384, Hint.INNER).round_trips(16384, loops=2)
        16
        >>> looped_config(8192, Hint.INNER).round_trips(8192, loops=2)
        2
        """
        if self.persistent:
            return 1
        steps = -(-rnumel // self.rblock)
        if self.symbolic:
            return loops * steps
        return loops if steps <= UNROLLED_STEPS else loops * -(-steps // unroll)

    def steps_together(self, rnumel: int, unroll: int = 1) -> int:
        """Rule 5: loop steps whose loads are in flight at once: all of a loop unrolled whole, else `unroll`.

        >>> looped_config(8192, Hint.INNER).steps_together(8192), looped_config(65536, Hint.INNER).steps_together(65536, 8)
        (4, 8)
        """
        steps = -(-rnumel // self.rblock)
        if self.persistent or self.symbolic:
            return 1
        return steps if steps <= UNROLLED_STEPS else min(unroll, steps)

    def per_thread(self) -> int:
        """Elements of the row each thread loads per step: with num_stages=1 nothing else is in flight."""
        return max(self.xblock * self.rblock // self.threads, 1)


@dataclass(frozen=True)
class RowLoops:
    """Rule 4: passes of a looped row kernel over its row, and exponentials per element in all of them."""

    loops: int
    exp_per_element: int
    unroll: int = 8  # rule 5: steps whose loads one round trip carries (RMSNorm's, by its SASS)

    def exps(self, persistent: bool) -> int:
        """Exponentials per element: a persistent kernel holds the row and takes max, then sum of exp, in two
        register passes (`codegen/simd.py` `prepare_softmax_twopass_fallback`, l. 1048): one exp, reused."""
        return min(self.exp_per_element, 1) if persistent else self.exp_per_element


PERSISTENT_INNER_MAX = 1024  # rule 1
QUACK_SWEEP_HINT = 256  # rule 6: the row length QuACK's sweeps recompile at (their first shape, 32768 x 256)
PERSISTENT_OTHER_MAX = 64
MAX_R0_BLOCK = 2048  # rule 3
UNROLLED_STEPS = 4  # rule 5: loops of at most this many steps unrolled whole (Triton 3.3.1, sm_90a)


LOOPED_REGISTERS = 32  # rule 5: ptxas -v, the most of the compiled looped row kernels (24-32)
PERSISTENT_REGISTERS = 18  # rule 5: ptxas -v, the persistent softmax kernels (256 x 2 warps, 1024 x 8 warps)
COMPILED_ROWS = ("softmax", "rms_norm", "cross_entropy")  # the row kernels compiled here (rule 5)


def registers(c: InductorConfig) -> int:
    """Rule 5: registers per thread of a compiled row kernel of config `c` (they bound its residency as
    Panamera's registers bound its own, `GPUSpec.resident_blocks`; neither count binds below the thread rule).

    >>> registers(looped_config(65536, Hint.INNER)), registers(persistent_config(32768, 512, Hint.INNER))
    (32, 18)
    """
    return PERSISTENT_REGISTERS if c.persistent else LOOPED_REGISTERS


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _warps(n: int, register_intensive: bool) -> int:
    """`_num_warps(n, max_num_warps=16, min_num_warps=2)`, the maximum halved when register intensive."""
    return _pow2(min(max(n, 2), 8 if register_intensive else 16))


def is_persistent(rnumel: int, hint: Hint) -> bool:
    """Rule 1 (the reduction length known statically)."""
    return rnumel <= (PERSISTENT_INNER_MAX if hint is Hint.INNER else PERSISTENT_OTHER_MAX)


def persistent_config(xnumel: int, rnumel: int, hint: Hint) -> InductorConfig:
    """Rule 2: the first of the persistent configs Inductor keeps (one, for an INNER row of 256 or more)."""
    r = _pow2(rnumel)
    if hint is Hint.INNER and rnumel >= 256:
        xb = 1
    else:
        xb = max(x for x in (1, 8, 32, 128) if x == 1 or (r * x <= 4096 and x <= xnumel))
    return InductorConfig(True, xb, r, _warps(r * xb // 128, register_intensive=True))


def looped_config(rnumel: int, hint: Hint) -> InductorConfig:
    """Rule 3: the one looped config of an INNER or OUTER hint."""
    if hint is Hint.OUTER:
        return InductorConfig(False, 64, 8, _warps(64 * 8 // 128, register_intensive=False))
    rb = min(_pow2(rnumel), MAX_R0_BLOCK)  # the size hint is rnumel's power of 2; 256 <= it < 2048 kept whole
    return InductorConfig(False, 1, rb, _warps(rb // 128, register_intensive=False))


def dynamic_config(size_hint: int, hint: Hint) -> InductorConfig:
    """Rule 6: the looped config of a kernel compiled with its row length symbolic, `size_hint` at that compile."""
    return replace(looped_config(size_hint, hint), symbolic=True)


def reduction_config(xnumel: int, rnumel: int, hint: Hint, size_hint: int | None = None) -> InductorConfig:
    """Rules 1-3: the launch of one reduction kernel over `xnumel` rows of `rnumel` elements; rule 6 when it was
    compiled with the row length symbolic (`size_hint`: the length at that compile)."""
    if size_hint is not None:
        return dynamic_config(size_hint, hint)
    return persistent_config(xnumel, rnumel, hint) if is_persistent(rnumel, hint) else looped_config(rnumel, hint)


_LOOPS = {
    "softmax": RowLoops(2, 3, unroll=1),  # the online-softmax loop is kept: every step a round trip
    "log_softmax": RowLoops(2, 2, unroll=1),  # the online loop, then x - max - log(sum) written
    "cross_entropy": RowLoops(1, 2, unroll=1),
    "rms_norm": RowLoops(2, 0),
    "layer_norm": RowLoops(2, 0),  # [assumed] unrolled as RMSNorm's: small loop bodies (not compiled)
    "l2_normalize": RowLoops(2, 0),
    "group_norm": RowLoops(2, 0),
}


def row_loops(pattern: str) -> RowLoops:
    """Rule 4 for a row pattern; KeyError for a pattern that is not one of Inductor's row kernels here."""
    return _LOOPS[pattern]


ROW_PATTERNS = tuple(_LOOPS)


@dataclass(frozen=True)
class SplitRows:
    """Rule 7: the kernels of a row pattern whose reduction Inductor splits: `reductions` split reductions in turn
    (two kernels each, each reading the row), then a `pointwise` kernel over M x N or not (the output fused into
    the last reduction's final kernel), `sfu_per_element` (exp, log) over all of them, and `outputs` values per partial
    (Welford: mean, M2 and count)."""

    reductions: int
    pointwise: bool
    sfu_per_element: int
    outputs: int = 1


_SPLIT = {
    "softmax": SplitRows(2, True, 2),  # max; sum(exp(x - max)); exp(x - max) / sum
    "log_softmax": SplitRows(2, True, 2),  # max; sum(exp(x - max)); x - max - log(sum), a log per element
    "cross_entropy": SplitRows(2, False, 1),  # the loss gathers x[target] in the final sum kernel
    "rms_norm": SplitRows(1, True, 0),
    "layer_norm": SplitRows(1, True, 0, outputs=3),  # Welford's partials
    "l2_normalize": SplitRows(1, True, 0),
    "group_norm": SplitRows(1, True, 0, outputs=3),
}


def split_rows(pattern: str) -> SplitRows:
    """Rule 7 for a row pattern (one of `ROW_PATTERNS`)."""
    return _SPLIT[pattern]
