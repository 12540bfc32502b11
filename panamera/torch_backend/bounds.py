"""Index range checks at the compiled partitions' boundary: an id outside the range eager PyTorch
accepts is an `IndexRangeError` naming the op, the index tensor, the id and its position, as eager
raises its IndexError, never a silently wrong result.

Panamera's kernels cannot raise: a gather clamps an id outside [0, n) (frontend/movement.py `take`)
and a scatter-add of rows drops it (frontend/scatter.py), so an out-of-range token id used to give
a wrong embedding or a wrong gradient. Eager torch checks every id on the CPU (IndexError, or
RuntimeError for gather, index_add and scatter_add) and with a device assert on CUDA. Here each
index op's id tensor is found in the FX graph **before** any rewrite (`index_bounds`), with the
range eager enforces:

- [-n, n) where torch wraps a negative id: `x[idx]` (aten.index) and `index_put` (accumulate);
- [0, n) elsewhere: embedding, index_select, gather, index_add, scatter_add, scatter_reduce
  (n: the indexed tensor's extent on the indexed axis);
- [0, C) or ignore_index for nll_loss's targets (cross-entropy; C the classes: a target outside
  picked no class and counted as a valid one).

A partition that takes such a tensor as an argument checks it before it runs (`IndexChecked`):
one min/max pass over the ids (torch.aminmax), on the ids' device, never a copy of them; nll_loss's
ignored -100 takes a second pass over ids ^ ~ignore once an id is below 0 (`_only_ignored`). The
masked copy this replaced cost 140-160 us per call at 8192 ids; now 60-70 us with -100 among them
and 8-12 us without (CPU, medians of 21 interleaved repeats at load 9.5 on 2 cores, 2026-11-25).
On CUDA that reads two or three numbers back, a synchronisation per call of that partition. Not checked, where no host
check can see the ids: an id computed inside the partition that uses it (it never crosses the
boundary), and an extent that is symbolic and not an argument's. embedding_dense_backward (and
_embedding_bag_backward) is not checked: eager drops such an id there too (its forward,
embedding or _embedding_bag, raised first). A bool or uint8 index tensor is a mask, not ids
(`MASKS`).

The index ops the backend does not lower stay in eager PyTorch, which checks their ids itself:
aten.index / index_put with several index tensors, index_put without accumulate, nll_loss2d,
scatter (src and value), scatter_reduce other than a sum, index_copy, index_fill, take and
EmbeddingBag's forward (ids and offsets); tests/test_torch_index_bounds_eager.py shows each.

>>> import torch
>>> b = IndexBound(arg=0, tensor="ids", op="aten.embedding", extent=4)
>>> b.check((torch.tensor([0, 3]),))
>>> b.check((torch.tensor([0, 4, 1]),))
Traceback (most recent call last):
...
panamera.errors.IndexRangeError: aten.embedding: index 'ids' holds 4 at position 1, outside [0, 4) (dimension 0 of size 4), as eager PyTorch refuses it
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import IndexRangeError

aten = torch.ops.aten

# ops whose result holds every value of their input (a view, an expansion; a cast, `_keeps_values`):
# ids that reach an index op through them cross the boundary as the view's input
SAME_VALUES = frozenset(
    (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
     aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.permute.default, aten.t.default,
     aten.transpose.int, aten.clone.default, aten.alias.default, aten._to_copy.default, aten.contiguous.default)
)  # fmt: skip


# an index tensor of these dtypes is a mask (x[mask], index_put by a mask): eager checks its shape, not ids
MASKS = frozenset((torch.bool, torch.uint8))


def _keeps_values(node) -> bool:
    """Whether FX `node` (a SAME_VALUES op) holds every value of its input: a cast only between
    integer dtypes where the result's range covers the input's (int32 -> int64, not int64 -> int32,
    whose wrapped id eager checks, nor a float's truncation); every other SAME_VALUES op."""
    if node.target is not aten._to_copy.default:
        return True
    src, dst = _meta(node.args[0]), _meta(node)
    if src is None or dst is None or src.dtype.is_floating_point or dst.dtype.is_floating_point:
        return src is not None and dst is not None and src.dtype == dst.dtype
    if src.dtype == torch.bool or dst.dtype == torch.bool or src.dtype.is_complex or dst.dtype.is_complex:
        return src.dtype == dst.dtype
    a, b = torch.iinfo(src.dtype), torch.iinfo(dst.dtype)
    return b.min <= a.min and a.max <= b.max


@dataclass(frozen=True)
class IndexBound:
    """One index argument of a compiled partition: `arg` its position among the partition's
    arguments, `tensor` its name, `op` the index op, `extent` the indexed axis' size (None: read at
    call time from argument `data`'s axis `axis`), `wraps`: negative ids count from the end,
    `ignore`: an id outside the range that is allowed (nll_loss's ignore_index)."""

    arg: int
    tensor: str
    op: str
    extent: int | None
    data: int | None = None
    axis: int = 0
    wraps: bool = False
    ignore: int | None = None

    def check(self, args) -> None:
        """Raise an IndexRangeError when an id of `args[self.arg]` is outside the range."""
        ids = args[self.arg]
        n = self.extent if self.extent is not None else int(args[self.data].shape[self.axis])
        if not isinstance(ids, torch.Tensor) or ids.numel() == 0:
            return
        lo = -n if self.wraps else 0
        ignore = _ignored(ids, self.ignore, lo, n)
        key = ignore is not None and ignore < lo == 0  # the ignored id below a range from 0: `_only_ignored`
        low_high = torch.aminmax(ids)  # one pass, no copy of the ids
        if ids.device.type == "cpu":
            (least, most), keyed = (int(low_high.min), int(low_high.max)), None
        else:  # every number in one copy back: one synchronisation, not one per number
            extra = (torch.aminmax(ids ^ ~ignore).min,) if key else ()
            least, most, *rest = torch.stack((*low_high, *extra)).tolist()
            keyed = rest[0] if rest else None
        if least >= lo and most < n:
            return
        if key and keyed is None and least < lo:  # on the CPU, only once an id is below: the ignored one?
            keyed = int(torch.aminmax(ids ^ ~ignore).min)
        if ignore is not None and _only_ignored(ids, ignore, least, most, keyed, lo, n):
            return
        flat = ids.reshape(-1)
        bad = (flat < lo) | (flat >= n)
        pos = int((bad if ignore is None else bad & (flat != ignore)).nonzero()[0, 0])
        raise IndexRangeError(
            f"{self.op}: index {self.tensor!r} holds {int(flat[pos])} at position {pos}, outside [{lo}, {n}) "
            f"(dimension {self.axis} of size {n}), as eager PyTorch refuses it"
        )


def _ignored(ids: torch.Tensor, ignore: int | None, lo: int, n: int) -> int | None:
    """The ignored id when it matters: outside [lo, n) and a value `ids`' integer dtype holds."""
    if (
        ignore is None
        or lo <= ignore < n
        or ids.dtype.is_floating_point
        or ids.dtype.is_complex
        or ids.dtype == torch.bool
    ):
        return None
    info = torch.iinfo(ids.dtype)
    return ignore if info.min <= ignore <= info.max else None


def _only_ignored(ids, ignore: int, least: int, most: int, keyed, lo: int, n: int) -> bool:
    """Whether every id of `ids` outside [lo, n) is `ignore` (least, most: the ids' extremes).

    Below a range that starts at 0 (nll_loss's -100 and [0, C)), without a copy: `keyed` is the
    least of ids ^ ~ignore, one same-dtype pass that keeps each id's sign (~ignore >= 0): -1 for
    `ignore` itself; for another negative id y, y ^ ignore is positive (the signs cancel, some other
    bit differs), so y ^ ~ignore = ~(y ^ ignore) <= -2; >= 0 for an id >= 0. Every negative id is
    `ignore` iff keyed >= -1. Above the range (an ignore_index >= n, rare) the ignored ids are masked (a copy)."""
    if keyed is not None:
        return keyed >= -1 and most < n
    if least < lo <= ignore or most >= n > ignore:
        return False  # an id outside, on the side the ignored one is not
    low_high = torch.aminmax(torch.where(ids == ignore, lo, ids))
    return int(low_high.min) >= lo and int(low_high.max) < n


@dataclass(frozen=True)
class _Rule:
    """Where an index op's ids, indexed tensor and axis are (`place(node)` -> (ids, data, axis) or
    None), whether it wraps negative ids, and the id it ignores (`ignore(node)`, or None)."""

    place: object
    wraps: bool
    ignore: object = None


def _single(node):
    given = [(k, i) for k, i in enumerate(node.args[1]) if i is not None]
    return (given[0][1], node.args[0], given[0][0]) if len(given) == 1 else None


def _dim(k_dim: int, k_ids: int):
    return lambda node: (node.args[k_ids], node.args[0], node.args[k_dim])


RULES = {
    aten.embedding.default: _Rule(lambda node: (node.args[1], node.args[0], 0), False),
    aten.index.Tensor: _Rule(_single, True),
    aten.index_put.default: _Rule(_single, True),
    aten.index_put_.default: _Rule(_single, True),
    aten.index_select.default: _Rule(_dim(1, 2), False),
    aten.gather.default: _Rule(_dim(1, 2), False),
    aten.index_add.default: _Rule(_dim(1, 2), False),
    aten.scatter_add.default: _Rule(_dim(1, 2), False),
    aten.scatter_reduce.two: _Rule(_dim(1, 2), False),
    aten.nll_loss_forward.default: _Rule(
        lambda node: (node.args[1], node.args[0], 1 if _meta(node.args[0]).ndim > 1 else 0),
        False,
        lambda node: node.args[4] if len(node.args) > 4 else node.kwargs.get("ignore_index", -100),
    ),
}


@dataclass(frozen=True)
class NodeBound:
    """An index op's range on an FX node of the whole graph (`index_bounds`): the node's values are
    its ids; `data` the indexed tensor's node name, `axis` its indexed axis, `extent` that axis'
    size when it is concrete."""

    op: str
    data: str
    axis: int
    extent: int | None
    wraps: bool
    ignore: int | None = None


def _meta(node):
    return node.meta.get("val", node.meta.get("example_value")) if isinstance(node, torch.fx.Node) else None


def index_bounds(gm: torch.fx.GraphModule) -> dict:
    """{FX node name: [NodeBound, ...]} for every id tensor of an index op in `gm` (RULES), recorded
    on the ids' node and on each node they come from through ops that keep every value (SAME_VALUES);
    by name, which the partitioner's fused graph keeps (its nodes are new objects).
    Read before any rewrite of the graph (isolate.py's canonical scatters turn index_put into an
    embedding gradient, which eager does not check)."""
    out: dict = {}
    for node in gm.graph.nodes:
        rule = RULES.get(node.target) if node.op == "call_function" else None
        placed = rule.place(node) if rule is not None else None
        if placed is None or not isinstance(placed[0], torch.fx.Node):
            continue
        ids, data, axis = placed
        x, given = _meta(data), _meta(ids)
        if x is None or not x.ndim or given is None or given.dtype in MASKS:
            continue
        axis %= x.ndim
        size = x.shape[axis]
        ignore = rule.ignore(node) if rule.ignore is not None else None
        bound = NodeBound(str(node.target.overloadpacket.__name__), data.name, axis, size if isinstance(size, int) else None,
                          rule.wraps, ignore)  # fmt: skip
        while True:
            out.setdefault(ids.name, []).append(bound)
            keeps = ids.op == "call_function" and ids.target in SAME_VALUES and ids.args and _keeps_values(ids)
            src = ids.args[0] if keeps else None
            if not isinstance(src, torch.fx.Node):
                break
            ids = src
    return out


def partition_bounds(call: torch.fx.Node, recorded: dict) -> tuple[IndexBound, ...]:
    """The IndexBounds of the partition that `call` (a call_module node of the fused graph) runs:
    one per argument that `index_bounds` recorded, whose extent is concrete or an argument's."""
    out = []
    for k, a in enumerate(call.args):
        for b in recorded.get(a.name, ()) if isinstance(a, torch.fx.Node) else ():
            data = next((j for j, d in enumerate(call.args) if isinstance(d, torch.fx.Node) and d.name == b.data), None)
            if b.extent is None and data is None:
                continue  # a symbolic extent computed inside the partition: not checked (module docstring)
            out.append(IndexBound(k, a.name, f"aten.{b.op}", b.extent, data, b.axis, b.wraps, b.ignore))
    return tuple(dict.fromkeys(out))


class IndexChecked(torch.nn.Module):
    """A compiled partition whose index arguments are range-checked before it runs (`bounds`)."""

    def __init__(self, inner: torch.nn.Module, bounds: tuple[IndexBound, ...]):
        super().__init__()
        self.inner, self.bounds = inner, bounds

    def forward(self, *args):
        for b in self.bounds:
            b.check(args)
        return self.inner(*args)


def checked(module: torch.nn.Module, call: torch.fx.Node, recorded: dict) -> torch.nn.Module:
    """`module` wrapped in IndexChecked when the partition `call` runs reads index arguments."""
    bounds = partition_bounds(call, recorded)
    return IndexChecked(module, bounds) if bounds else module
