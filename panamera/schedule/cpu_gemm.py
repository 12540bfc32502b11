"""A BLAS contraction (cpu_blas.py's `MatmulForm`) as a few row-major gemm calls on its flat buffers.

np.matmul sees each operand as a 3-D view (batch, rows, cols); numpy copies where a view is not
strided (an attention output's heads merged back into its features: transpose, then reshape).
Here each operand's element offsets are taken as a function of its three axes, and each axis is
split into pieces of uniform stride (`pieces`): the (2, 8, 16) heads of a (8, 32) operand are
the features axis in pieces (2 of stride 128, 16 of stride 1). The pieces of one axis are refined
to a common split in every operand that has it (`refine`); the innermost piece of rows, columns
and the contracted axis make each gemm call, the other pieces its calls: batch and outer row and
column pieces write other blocks of the output, outer contracted pieces add into the same block
(beta 1 after the first). Where the output's inner block is column-major the product is computed
transposed (C^T = B^T A^T).

Preconditions of `gemm_calls` (None where one fails: numpy runs the product):
  1. every operand and the output is, along each of its three axes, a sum of uniform-stride pieces
     (its offsets separable by axis), read from a stand-in index array of at most `MAX_INDEX` elements
     where the view is not strided;
  2. the pieces of an axis shared by two operands refine to a common split (their lengths' products
     form one chain of divisors);
  3. each gemm's A, B and C block has a unit stride on one of its two axes, and a leading dimension
     at least its row length (BLAS's rule);
  4. at most `MAX_CALLS` gemm calls.

>>> from panamera.schedule.cpu_blas import matmul_form
>>> f = matmul_form("ab,bc->ac", ((8, 32), (32, 32)))
>>> heads = ((1, 2, 8, 16), (("transpose", (0, 2, 1, 3)), ("reshape", (8, 32))), f.a_perm, f.a_shape)
>>> w = ((32, 32), (), f.b_perm, f.b_shape)
>>> g = gemm_calls(f, (heads, w), None, (8, 32), 4)
>>> (g.m, g.n, g.k, g.lda, g.ldb, g.ldc), g.calls
((8, 32, 16, 16, 32, 32), ((0, 0, 0, 0), (128, 512, 0, 1)))
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

MAX_INDEX = 1 << 20  # elements of a stand-in index array (a non-strided view's offsets)
MAX_CALLS = 256  # gemm calls of one product

Pieces = tuple[tuple[int, int], ...]  # (length, stride in elements), outermost first


@dataclass(frozen=True)
class Gemm:
    """Row-major gemm calls `C[c] (+)= op(A)[a] @ op(B)[b]`, each (m x k) @ (k x n) with the leading
    dimensions given; `calls` holds (A offset, B offset, C offset, beta) in elements; `swap`: the
    first matrix is the contraction's second operand (the product computed transposed)."""

    m: int
    n: int
    k: int
    ta: bool
    lda: int
    tb: bool
    ldb: int
    ldc: int
    calls: tuple[tuple[int, int, int, int], ...]
    swap: bool = False


def pieces(offsets: np.ndarray) -> Pieces | None:
    """The uniform-stride pieces of a 1-D offset sequence starting at 0, or None.

    >>> pieces(np.array([0, 1, 2, 3, 128, 129, 130, 131]))
    ((2, 128), (4, 1))
    """
    n = len(offsets)
    if n == 1:
        return ()
    step = int(offsets[1] - offsets[0])
    run = 2
    while run < n and offsets[run] - offsets[run - 1] == step:
        run += 1
    inner = next(d for d in range(run, 0, -1) if n % d == 0)
    if inner == 1:
        return None
    blocks = offsets[::inner]
    if not np.array_equal(offsets.reshape(-1, inner), blocks[:, None] + step * np.arange(inner)):
        return None
    outer = pieces(blocks - blocks[0])
    return None if outer is None else (*outer, (inner, step))


def _axes(idx: np.ndarray) -> tuple[int, tuple[Pieces, ...]] | None:
    """(base offset, each axis's pieces) of a 3-D offset array, or None (precondition 1)."""
    o = int(idx[0, 0, 0])
    f = [idx[:, 0, 0] - o, idx[0, :, 0] - o, idx[0, 0, :] - o]
    if not np.array_equal(idx - o, f[0][:, None, None] + f[1][None, :, None] + f[2][None, None, :]):
        return None
    ps = tuple(pieces(x) for x in f)
    return None if None in ps else (o, ps)


def _index(shape, views, perm, shape3) -> np.ndarray | None:
    """The element offsets of an operand's matmul view, from a stand-in index array."""
    if math.prod(shape) > MAX_INDEX:
        return None
    v = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    for kind, arg in views:
        v = v.transpose(arg) if kind == "transpose" else v.reshape(arg)
    return v.squeeze(tuple(k for k, e in enumerate(v.shape) if e == 1)).transpose(perm).reshape(shape3)


def _strided_axes(strided, itemsize: int) -> tuple[int, tuple[Pieces, ...]] | None:
    shape, strides = strided
    if any(s % itemsize for s in strides):
        return None
    return 0, tuple(((n, s // itemsize),) if n > 1 else () for n, s in zip(shape, strides))


def refine(*splits: Pieces) -> tuple[Pieces, ...] | None:
    """The same axis's pieces in several operands split at every cut of any (precondition 2).

    >>> refine(((2, 128), (16, 1)), ((32, 32),))
    (((2, 128), (16, 1)), ((2, 512), (16, 32)))
    """
    cuts: set[int] = set()
    for sp in splits:
        p = 1
        for n, _ in reversed(sp):
            p *= n
            cuts.add(p)
    chain = sorted(cuts)
    if any(b % a for a, b in zip(chain, chain[1:])):
        return None
    out = []
    for sp in splits:
        got, p = [], 1
        for n, s in reversed(sp):
            q = p
            for c in (c for c in chain if p < c <= p * n):
                got.append((c // q, s * (q // p)))
                q = c
            p *= n
        out.append(tuple(reversed(got)))
    return tuple(out)


def _block(rows: tuple[int, int], cols: tuple[int, int]) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of a (rows x cols) block with those (length, stride)s
    (precondition 3)."""
    (r, sr), (c, sc) = rows, cols
    if c == 1 or sc == 1:
        ld = sr if r > 1 else c
        return (False, ld) if ld >= c else None
    if r == 1 or sr == 1:
        ld = sc if c > 1 else r
        return (True, ld) if ld >= r else None
    return None


def gemm_calls(form, views: tuple, strided: tuple | None, out_shape: tuple[int, ...], itemsize: int) -> Gemm | None:
    """The gemm calls of `form` (cpu_blas.py's MatmulForm) on the operands' flat buffers, `views` each
    operand's (shape, views, perm, 3-D shape), `strided` their strided (shape, byte strides) where
    known; None where a precondition (module docstring) fails."""
    ab = []
    for k, view in enumerate(views):
        if strided is not None:
            ab.append(_strided_axes(strided[k], itemsize))
        else:
            idx = _index(*view)
            ab.append(None if idx is None else _axes(idx))
    nb, m, _ = form.a_shape
    n = form.b_shape[2]
    if nb * m * n > MAX_INDEX or None in ab:
        return None
    squeezed = tuple(e for e in out_shape if e != 1)
    c_idx = np.arange(nb * m * n, dtype=np.int64).reshape(squeezed).transpose(np.argsort(form.perm))
    c = _axes(c_idx.reshape(nb, m, n))
    if c is None:
        return None
    (oa, (a_b, a_m, a_k)), (ob, (b_b, b_k, b_n)), (_, (c_b, c_m, c_n)) = ab[0], ab[1], c
    split = (refine(a_b, b_b, c_b), refine(a_m, c_m), refine(a_k, b_k), refine(b_n, c_n))
    if None in split:
        return None
    (a_b, b_b, c_b), (a_m, c_m), (a_k, b_k), (b_n, c_n) = split

    def inner(p: Pieces) -> tuple[int, int]:
        return p[-1] if p else (1, 0)

    mm, kk, nn = inner(a_m)[0], inner(a_k)[0], inner(b_n)[0]
    blocks = (_block(inner(a_m), inner(a_k)), _block(inner(b_k), inner(b_n)), _block(inner(c_m), inner(c_n)))
    if None in blocks:
        return None
    (ta, lda), (tb, ldb), (tc, ldc) = blocks
    # the outer pieces: (length, A stride, B stride, C stride, accumulates)
    loops = [(x[0], x[1], y[1], z[1], False) for x, y, z in zip(a_b, b_b, c_b)]
    loops += [(x[0], x[1], 0, z[1], False) for x, z in zip(a_m[:-1], c_m[:-1])]
    loops += [(x[0], x[1], y[1], 0, True) for x, y in zip(a_k[:-1], b_k[:-1])]
    loops += [(y[0], 0, y[1], z[1], False) for y, z in zip(b_n[:-1], c_n[:-1])]
    if math.prod(x[0] for x in loops) > MAX_CALLS:  # precondition 4
        return None
    calls, seen = [], set()
    for ix in itertools.product(*(range(x[0]) for x in loops)):
        a = oa + sum(i * x[1] for i, x in zip(ix, loops))
        b = ob + sum(i * x[2] for i, x in zip(ix, loops))
        co = sum(i * x[3] for i, x in zip(ix, loops))
        calls.append((a, b, co, int(co in seen)))
        seen.add(co)
    if tc:  # C^T = B^T A^T: the output's block is column-major
        calls = [(b, a, co, beta) for a, b, co, beta in calls]
        return Gemm(nn, mm, kk, not tb, ldb, not ta, lda, ldc, tuple(calls), swap=True)
    return Gemm(mm, nn, kk, ta, lda, tb, ldb, ldc, tuple(calls))
