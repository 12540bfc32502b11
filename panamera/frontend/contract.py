"""Contractions as reductions: `matmul` and `einsum` with numpy's semantics.

A contraction is a sum, over the contracted indices, of the product of two loads with different
access relations. Panamera lowers it to exactly that: one `reduce` node over a broadcast product
of two views, so loop coalescing (ROW/COLUMN), isl's dependences, producer fusion (a dequantized
operand `w.astype("float32") * scale[:, None]` is evaluated in registers at the load) and
consumer stitching apply unchanged.

Before (numpy's `einsum("mk,nk->mn", a, w)`, the contracted index k)::

    for m < M, n < N, k < K:   out[m, n] += a[m, k] * w[n, k]

After (`contract`): the iteration space holds the output indices then the contracted ones, so
the reduction runs along the contiguous axis of the operand that streams (the larger one) and
coalesces to ROW; when that operand's contiguous axis is the last output index instead
(`x @ W` with W stored K x N), the contracted indices go before it and the statement coalesces
to COLUMN (the kept, contiguous extent vectorized)::

    reduce[sum](mul(broadcast(view(a)), broadcast(view(w))), axes=contracted)

Preconditions (each a `PanameraError` naming the operand and axis; one negative test each in
tests/test_contract.py):
  1. every operand is a Tensor and the subscripts name each of its axes once (no diagonals);
  2. a label's extents agree across operands (or one is 1, broadcast as numpy does);
  3. the operands' dtypes promote (numpy's rules).
16-bit floats multiply and accumulate in float32 (cuBLAS's and numpy's float32 accumulation);
8-bit integers in int32, the result wrapped to numpy's result dtype; bool is any(a & b).

>>> import panamera as pn
>>> a, w = pn.placeholder((4, 64), name="a"), pn.placeholder((32, 64), name="w")
>>> y = pn.einsum("mk,nk->mn", a, w)
>>> y.shape, y.op, y.attr("contraction")
((4, 32), 'reduce', 'mk,nk->mn')
>>> pn.matmul(pn.placeholder((3, 1, 4, 5)), pn.placeholder((2, 5, 6))).shape
(3, 2, 4, 6)
"""

from __future__ import annotations

import math
import string

from .. import algebra, dtypes
from ..dtypes import DType, promote
from ..errors import AxisError, DTypeError, ShapeError
from . import symbolic
from .tensor import ARG_OPS, BINARY_ARITH, BITWISE, COMPARE, LOGICAL, UNARY, Tensor, binary, transpose

Labels = tuple[str, ...]
_LETTERS = frozenset(string.ascii_letters)
_ELEMENTWISE = frozenset(UNARY + BINARY_ARITH + COMPARE + LOGICAL + BITWISE + ARG_OPS + ("where", "cast"))


def _tensor(x, op: str, k: int) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: operand {k} must be a Tensor, got {type(x).__name__}")
    return x


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """numpy.matmul: a 1-D operand is a vector (a row on the left, a column on the right, its
    axis dropped from the result); leading batch axes broadcast.

    >>> import panamera as pn
    >>> pn.matmul(pn.placeholder((5,)), pn.placeholder((5, 3))).shape
    (3,)
    >>> pn.matmul(pn.placeholder((2, 4, 5)), pn.placeholder((5,))).shape
    (2, 4)
    """
    a, b = _tensor(a, "matmul", 0), _tensor(b, "matmul", 1)
    if a.ndim == 0 or b.ndim == 0:
        who = a if a.ndim == 0 else b
        raise ShapeError(f"matmul of {a.label!r} and {b.label!r}: operand {who.label!r} is a scalar (numpy refuses it)")
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        axis_b = "0" if b.ndim == 1 else "-2"
        raise ShapeError(
            f"matmul of {a.label!r} {a.shape} and {b.label!r} {b.shape}: the contracted axes differ "
            f"({a.label!r} axis -1 has {ka}, {b.label!r} axis {axis_b} has {kb})"
        )
    batch_rank = max(a.ndim - 2, b.ndim - 2, 0)
    batch = tuple(f"B{k}" for k in range(batch_rank))
    la: Labels = (*batch[batch_rank - max(a.ndim - 2, 0) :], "m", "k") if a.ndim > 1 else ("k",)
    lb: Labels = (*batch[batch_rank - max(b.ndim - 2, 0) :], "k", "n") if b.ndim > 1 else ("k",)
    out = batch + (("m",) if a.ndim > 1 else ()) + (("n",) if b.ndim > 1 else ())
    sub = f"{_render(la)},{_render(lb)}->{_render(out)}"
    return contract(a, la, b, lb, out, "matmul", sub)


def _render(labels: Labels) -> str:
    return "".join(lab if len(lab) == 1 else f"[{lab}]" for lab in labels)


def einsum(subscripts: str, *operands: Tensor) -> Tensor:
    """numpy.einsum: explicit (`"ij,jk->ik"`) or implicit (`"ij,jk"`: the labels seen once, in
    alphabetical order) output, `...` for broadcast leading axes; one operand (a sum and a
    transpose), two, or more contracted left to right.

    >>> import panamera as pn
    >>> q, k = pn.placeholder((2, 8, 16)), pn.placeholder((2, 100, 16))
    >>> pn.einsum("bhd,bnd->bhn", q, k).shape
    (2, 8, 100)
    >>> pn.einsum("...d,d", q, pn.placeholder((16,))).shape
    (2, 8)
    """
    if not isinstance(subscripts, str):
        raise DTypeError(f"einsum: subscripts must be a string, got {type(subscripts).__name__}")
    ops = tuple(_tensor(x, "einsum", k) for k, x in enumerate(operands))
    if not ops:
        raise ShapeError("einsum: no operands")
    spec = subscripts.replace(" ", "")
    lhs, arrow, rhs = spec.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ops):
        raise ShapeError(f"einsum {subscripts!r}: {len(terms)} subscript terms for {len(ops)} operands")
    ell_rank = max((t.ndim - len(term.replace("...", "")) for term, t in zip(terms, ops) if "..." in term), default=0)
    ell = tuple(f"E{k}" for k in range(ell_rank))
    labels = [_parse(term, t, ell, subscripts, k) for k, (term, t) in enumerate(zip(terms, ops))]
    if arrow:
        out = _parse(rhs, None, ell, subscripts, -1)
    else:
        seen = [lab for ls in labels for lab in ls]
        out = ell + tuple(sorted(lab for lab in dict.fromkeys(seen) if len(lab) == 1 and seen.count(lab) == 1))
    known = {lab for ls in labels for lab in ls}
    for lab in out:
        if lab not in known:
            raise AxisError(f"einsum {subscripts!r}: output label {lab!r} appears in no operand")
    if len(ops) == 1:
        return _single(ops[0], labels[0], out, subscripts)
    acc, acc_labels = ops[0], labels[0]
    for k in range(1, len(ops)):
        later = {lab for ls in labels[k + 1 :] for lab in ls} | set(out)
        keep = tuple(lab for lab in dict.fromkeys(acc_labels + labels[k]) if lab in later)
        if k == len(ops) - 1:
            keep = out
        sub = subscripts if len(ops) == 2 else f"{_render(acc_labels)},{_render(labels[k])}->{_render(keep)}"
        acc = contract(acc, acc_labels, ops[k], labels[k], keep, "einsum", sub)
        acc_labels = keep
    return acc


def _parse(term: str, t: Tensor | None, ell: Labels, subscripts: str, k: int) -> Labels:
    """The labels of one subscript term; `...` stands for the trailing `ell` labels the operand has."""
    where = "the output" if k < 0 else f"operand {k} ({t.label!r})"
    head, dots, tail = term.partition("...")
    for ch in head + tail:
        if ch not in _LETTERS:
            raise AxisError(f"einsum {subscripts!r}: {ch!r} in {where} is not a letter")
    if t is None:
        labels = tuple(head) + (ell if dots else ()) + tuple(tail)
    else:
        n_ell = t.ndim - len(head) - len(tail)
        if (not dots and n_ell != 0) or n_ell < 0:
            raise ShapeError(
                f"einsum {subscripts!r}: {where} has {t.ndim} axes, the subscripts {term!r} name {len(head) + len(tail)}"
            )
        labels = tuple(head) + ell[len(ell) - n_ell :] + tuple(tail)
    for lab in labels:
        if labels.count(lab) > 1:
            raise AxisError(
                f"einsum {subscripts!r}: label {lab!r} repeats in {where} (a diagonal); Panamera contracts "
                "distinct axes only"
            )
    return labels


def _extents(pairs, op: str) -> dict[str, int]:
    """Each label's extent, numpy's broadcasting between operands (1 stretches)."""
    ext: dict[str, int] = {}
    for t, labels in pairs:
        for axis, (lab, e) in enumerate(zip(labels, t.shape)):
            have = ext.get(lab)
            if have is None or have == 1:
                ext[lab] = e
            elif e not in (1, have):
                raise ShapeError(
                    f"{op}: axis {axis} of {t.label!r} ({lab!r}) has extent {e}, another operand has {have}"
                )
    return ext


def _view(t: Tensor, labels: Labels, order: Labels) -> Tensor:
    """`t` with its axes permuted into `order` and extent-1 axes for the labels it lacks: an
    access relation of the product, never a statement."""
    own = [lab for lab in order if lab in labels]
    v = transpose(t, tuple(labels.index(lab) for lab in own))
    shape = tuple(v.shape[own.index(lab)] if lab in own else 1 for lab in order)
    return v.reshape(shape) if shape != v.shape else v


def iteration_order(a: Tensor, la: Labels, b: Tensor, lb: Labels, out: Labels, ext: dict[str, int]) -> Labels:
    """The axes of the contraction's iteration space: the output labels, with the contracted
    labels last (ROW: the reduction runs along the streamed operand's contiguous axis), or just
    before the last output label when that is the streamed operand's contiguous axis (COLUMN).
    The streamed operand is the larger one (b on a tie: the weights of `x @ W`).

    >>> iteration_order(Tensor("placeholder", (), (4, 8), dtypes.float32), ("m", "k"),
    ...                 Tensor("placeholder", (), (8, 16), dtypes.float32), ("k", "n"), ("m", "n"),
    ...                 {"m": 4, "k": 8, "n": 16})
    ('m', 'k', 'n')
    """
    contracted = [lab for lab in dict.fromkeys(la + lb) if lab not in out]
    s, s_labels = (a, la) if symbolic.larger(a.size, b.size) else (b, lb)
    mem = [s_labels[k] for k in memory_order(s)]  # its labels, outermost to contiguous in storage
    live = [lab for lab in mem if ext[lab] != 1]
    contracted.sort(key=lambda lab: mem.index(lab) if lab in mem else -1)
    if live and out and live[-1] == out[-1] and contracted:
        return out[:-1] + tuple(contracted) + out[-1:]
    return out + tuple(contracted)


def memory_order(t: Tensor) -> tuple[int, ...]:
    """The axes of `t` from outermost to contiguous in the storage it is read from: through
    transposes (a view) and element-wise ops (to their operand of the same shape) down to a
    stored tensor, whose order is its own.

    >>> w = Tensor("placeholder", (), (32, 64), dtypes.int8)
    >>> memory_order(transpose(w.astype("float32") * 2.0))
    (1, 0)
    """
    if t.op == "transpose":
        inner = memory_order(t.inputs[0])
        perm = t.attr("perm")
        return tuple(perm.index(a) for a in inner)
    if t.op in _ELEMENTWISE:
        same = [x for x in t.inputs if x.shape == t.shape and x.op != "const"]
        if same:
            return memory_order(max(same, key=lambda x: x.dtype.itemsize if x.op == "placeholder" else 0))
    return tuple(range(t.ndim))


def contract(a: Tensor, la: Labels, b: Tensor, lb: Labels, out: Labels, op: str = "einsum", sub: str = "") -> Tensor:
    """sum over the labels not in `out` of a[la] * b[lb], as one reduce node (module docstring)."""
    ext = _extents(((a, la), (b, lb)), f"{op} {sub!r} of {a.label!r} and {b.label!r}")
    d = promote(a.dtype, b.dtype, what=f"{op} of {a.label!r} and {b.label!r}")
    order = iteration_order(a, la, b, lb, out, ext)
    axes = tuple(k for k, lab in enumerate(order) if lab not in out)
    out_shape = tuple(ext[lab] for lab in out)
    if d.name == "bool":
        prod = binary("and", _view(a, la, order), _view(b, lb, order))
        comb, acc, res = algebra.ANY, dtypes.int32, dtypes.bool_
    else:
        acc = _accumulator(d)
        prod = binary("mul", _view(a, la, order).astype(acc), _view(b, lb, order).astype(acc))
        comb, res = algebra.SUM, d if d.itemsize > 1 else acc
    attrs = (("combiner", comb), ("axes", axes), ("keepdims", False), ("mean", False), ("acc", acc),
             ("contraction", sub or f"{_render(la)},{_render(lb)}->{_render(out)}"))  # fmt: skip
    kept = tuple(lab for lab in order if lab in out)
    r = Tensor("reduce", (prod,), tuple(ext[lab] for lab in kept), res, attrs=attrs)
    if kept != out:  # only when the output labels are not in the order of the iteration space
        r = transpose(r, tuple(kept.index(lab) for lab in out))
    if res != d:  # 8-bit integers: accumulated in int32, wrapped to numpy's result dtype
        r = r.astype(d)
    assert r.shape == out_shape
    return r


def _accumulator(d: DType) -> DType:
    """16-bit floats in float32, 8-bit integers in int32, else the result dtype."""
    if d.is_16bit_float:
        return dtypes.float32
    if d.itemsize == 1:
        return dtypes.int32
    return d


def _single(t: Tensor, labels: Labels, out: Labels, subscripts: str) -> Tensor:
    """One operand: a sum over the labels not in `out`, then the output's order."""
    from .reduce import reduction

    gone = tuple(k for k, lab in enumerate(labels) if lab not in out)
    kept = tuple(lab for lab in labels if lab in out)
    if not gone:
        r = t
    elif t.dtype.itemsize == 1 and t.dtype.name != "bool":  # 8-bit: accumulated in int32, then wrapped
        r = reduction("sum", t, gone, False, res=dtypes.int32).astype(t.dtype)
    else:
        r = reduction("sum", t, gone, False, res=t.dtype if t.dtype.name != "bool" else None)
    return transpose(r, tuple(kept.index(lab) for lab in out)) if kept != out else r


def flops(t: Tensor) -> int:
    """Multiply-adds x 2 of a contraction node (0 for anything else).

    >>> import panamera as pn
    >>> flops(pn.matmul(pn.placeholder((4, 8)), pn.placeholder((8, 16))))
    1024
    """
    node = t
    while node.op in ("cast", "transpose"):
        node = node.inputs[0]
    if node.op != "reduce" or node.attr("contraction") is None:
        return 0
    return 2 * math.prod(node.inputs[0].shape)
