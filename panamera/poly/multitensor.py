"""A multi-tensor statement set: one kernel over a list of tensors of different shapes.

torch's `multi_tensor_apply` (aten/src/ATen/native/cuda/MultiTensorApply.cuh) launches one grid
over a list of tensors: a host-built table says, for each block, which tensor and which chunk of
it the block works on. Here that table is a polyhedral object. Each tensor is a named *piece*
with a 1-D domain `T_k[i] : 0 <= i < n_k` (a contiguous tensor, flattened), and the statement
set's domain is their union. The block-range table is the isl map

    { B[b] -> T_k[c] : start_k <= b < start_k + chunks_k and c = b - start_k }

(chunks_k = ceil(n_k / chunk)), so that block b reads elements `c*chunk ... c*chunk + chunk - 1`
of piece k. A reduction per piece (a norm) folds each block's chunk into one partial, then one
atomic per block into its piece's workspace (or ordered partials when deterministic); an
element-wise statement set over aligned lists (an optimizer step) writes each element once.

Preconditions, each checked by `MultiTensorSet.check` and raising `LegalityError`
(one negative test each in tests/test_multitensor.py):
  1. at least one piece, every piece non-empty, names unique;
  2. every piece of one list has one dtype (the kernel's loads share a C type);
  3. the block table is a bijection from the launched blocks onto the pieces' chunks (isl: the
     map is injective, its domain is `0 <= b < blocks` and its range covers every chunk);
  4. the kernel's parameters fit CUDA's 4 KiB parameter space (one pointer per piece per list);
  5. every index fits a 32-bit int (each piece, and the number of blocks);
  6. aligned lists (element-wise statement sets): piece k of every list has the same extent, so
     each statement's accesses are the identity on the piece.

>>> s = MultiTensorSet.of([("w", 300), ("v", 10)], dtype="float32", chunk=128)
>>> s.starts, s.blocks
((0, 3), 4)
>>> str(s.block_table())
'{ B[b = 3] -> v[c = 0]; B[b] -> w[c = b] : 0 <= b <= 2 }'
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from ..errors import LegalityError

PARAM_BYTES = 4096  # CUDA's kernel parameter space (sm_70 and later, before CUDA 12.1's 32 KiB)
POINTER_BYTES = 8
INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class Piece:
    """One tensor of the list: its name (an isl tuple name), extent (flattened) and dtype."""

    name: str
    size: int
    dtype: str


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class MultiTensorSet:
    """The union of the pieces' domains and the block-range table (tensor, chunk) -> block.

    `starts[k]` is the first block of piece k; by default the pieces' chunk ranges follow each
    other in list order. `lists` is how many aligned lists share the table (1 for a norm; 4 for
    AdamW: params, grads, exp_avg, exp_avg_sq), `extra_params` the kernel's other parameters in bytes.
    """

    pieces: tuple[Piece, ...]
    chunk: int
    starts: tuple[int, ...]
    lists: int = 1
    extra_params: int = 64

    @classmethod
    def of(cls, named_sizes, dtype: str, chunk: int, lists: int = 1, extra_params: int = 64) -> MultiTensorSet:
        """The set of pieces `(name, size)` of `dtype`, chunks laid out in list order; checked."""
        pieces = tuple(Piece(n, int(s), dtype) for n, s in named_sizes)
        starts, b = [], 0
        for p in pieces:
            starts.append(b)
            b += _ceil(max(p.size, 1), chunk)
        return cls(pieces, chunk, tuple(starts), lists, extra_params).check()

    def chunks(self, k: int) -> int:
        return _ceil(self.pieces[k].size, self.chunk)

    @property
    def blocks(self) -> int:
        """Blocks launched: one per chunk of every piece."""
        return max((s + self.chunks(k) for k, s in enumerate(self.starts)), default=0)

    @property
    def ends(self) -> tuple[int, ...]:
        return tuple(s + self.chunks(k) for k, s in enumerate(self.starts))

    # -- the polyhedral objects -------------------------------------------------------------------
    def domain(self) -> isl.UnionSet:
        """The union of the pieces' domains, one named piece each."""
        parts = [f"{p.name}[i] : 0 <= i < {p.size}" for p in self.pieces]
        return isl.UnionSet("{ " + "; ".join(parts) + " }")

    def chunk_domain(self) -> isl.UnionSet:
        """Every (piece, chunk) a block must own."""
        return isl.UnionSet(
            "{ " + "; ".join(f"{p.name}[c] : 0 <= c < {self.chunks(k)}" for k, p in enumerate(self.pieces)) + " }"
        )

    def block_table(self) -> isl.UnionMap:
        """The block-range table: block b -> (piece k, chunk b - start_k)."""
        parts = [
            f"B[b] -> {p.name}[c] : {s} <= b < {s + self.chunks(k)} and c = b - {s}"
            for k, (p, s) in enumerate(zip(self.pieces, self.starts))
        ]
        return isl.UnionMap("{ " + "; ".join(parts) + " }")

    def owner(self) -> isl.UnionMap:
        """Element -> the block that loads it: the table's inverse composed with the chunking."""
        chunking = isl.UnionMap(
            "{ "
            + "; ".join(
                f"{p.name}[i] -> {p.name}[c] : {self.chunk}c <= i < {self.chunk}c + {self.chunk}" for p in self.pieces
            )
            + " }"
        ).intersect_domain(self.domain())
        return chunking.apply_range(self.block_table().reverse())

    # -- legality ---------------------------------------------------------------------------------
    def check(self) -> MultiTensorSet:
        """Raise LegalityError unless preconditions 1-5 hold; returns self."""
        names = [p.name for p in self.pieces]
        if not self.pieces:
            raise LegalityError("multi-tensor set: no tensors (precondition 1)")
        empty = [p.name for p in self.pieces if p.size <= 0]
        if empty or len(set(names)) != len(names):
            raise LegalityError(f"multi-tensor set: empty or repeated pieces {empty or names} (precondition 1)")
        dtypes = sorted({p.dtype for p in self.pieces})
        if len(dtypes) != 1:
            raise LegalityError(f"multi-tensor set: pieces of several dtypes {dtypes} in one list (precondition 2)")
        if len(self.starts) != len(self.pieces) or self.chunk < 1:
            raise LegalityError("multi-tensor set: one start block per piece and a positive chunk (precondition 3)")
        table = self.block_table()
        blocks = isl.UnionSet(f"{{ B[b] : 0 <= b < {self.blocks} }}")
        if not (
            table.is_single_valued()
            and table.is_injective()
            and table.domain().is_equal(blocks)
            and table.range().is_equal(self.chunk_domain())
        ):
            raise LegalityError(
                f"multi-tensor set: the block table (starts {self.starts}) is not a bijection from the "
                f"{self.blocks} blocks onto the pieces' chunks (precondition 3)"
            )
        need = len(self.pieces) * self.lists * POINTER_BYTES + self.extra_params
        if need > PARAM_BYTES:
            raise LegalityError(
                f"multi-tensor set: {len(self.pieces)} tensors x {self.lists} lists of pointers need {need} bytes of "
                f"kernel parameters, over CUDA's {PARAM_BYTES} (precondition 4): split the list"
            )
        big = [p.name for p in self.pieces if p.size + self.chunk > INT_MAX]
        if big or self.blocks > INT_MAX:
            raise LegalityError(f"multi-tensor set: indices of {big or 'the blocks'} overflow int (precondition 5)")
        return self

    def check_aligned(self, *others: MultiTensorSet) -> MultiTensorSet:
        """Precondition 6: piece k of every other list has piece k's extent (identity accesses)."""
        for o in others:
            if [p.size for p in o.pieces] != [p.size for p in self.pieces]:
                bad = (
                    next((a.name, b.name) for a, b in zip(self.pieces, o.pieces) if a.size != b.size)
                    if len(o.pieces) == len(self.pieces)
                    else (len(self.pieces), len(o.pieces))
                )
                raise LegalityError(f"multi-tensor set: lists not aligned at {bad} (precondition 6)")
        return self
