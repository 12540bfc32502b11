"""The plan of a sorted-segment scatter-add (frontend/scatter.py `scatter_add_sorted`): the
deterministic `out[ids[t]] += src[t]` for any table size, as PyTorch's deterministic embedding
backward computes it (sort the ids with their positions, cut the sorted positions into segments
of one row, sum each segment's rows in order, in pieces, then the pieces in order), rendered by
codegen/segment_kernel.py.

The plan holds every launch and the model's cost of each (sort passes, reads, writes, through
model/kernel_cost.py's `kernel_time`, the model every plan uses): sort tiles of keys in shared memory
(each valid id marks its row), `ceil(log2(n / tile))` merge passes over 8-byte keys, the pieces'
partial sums (every source row read once, whole segments' rows written), the owners' sums of
the segments cut at a chunk boundary. The rows no id marked are zeroed by blocks beside the
merges and the pieces (a share of the rows per launch), so every row of the table is written
once: the table's write is the limit's, and zeroing a row that a segment then writes again
(22 MB more at the bench shape) is gone. The ids are
data: the model takes them uniform (as the atomic plan does, schedule/cost.py), so a table of
`rows` rows hit by `n` ids has `rows (1 - (1 - 1/rows)^n)` segments.

The mapping choices (sort tile, chunks per block, threads across a row) change no sum's order:
SEGMENT_ROWS, the cut of a segment into pieces, is fixed, so every choice gives the same bits.

>>> from panamera.dtypes import as_dtype
>>> p = plan_segments(ScatterProblem(8192, 50257, 768, as_dtype("int64"), as_dtype("float32")))
>>> [name for name, *_ in p.launches], p.passes
(['tile', 'merge256', 'merge512', 'merge1024', 'merge2048', 'merge4096', 'part', 'own'], 5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..dtypes import DType
from ..errors import ShapeError
from ..model.gpu import H100, GPUSpec
from ..model.kernel_cost import KernelCost, chain_s, kernel_time
from .scatter_problem import OfProblem, ScatterProblem

SEGMENT_ROWS = 32  # positions per chunk: the fixed cut of a segment into pieces (never a mapping choice)
SORT_THREADS = 256  # threads of the tile and merge kernels' sort blocks


def sort_blocks(n: int, tile: int) -> int:
    """Blocks of the tile kernel that sort (the others zero the table)."""
    return -(-n // tile)


def merge_blocks(n: int) -> int:
    """Blocks of a merge kernel that merge, one key per thread (the others zero the table)."""
    return -(-n // SORT_THREADS)


UNROLL = 4  # source rows a thread loads before adding them (in order)


def vector_width(src: DType, width: int) -> int:
    """Elements per vector load of a source row (and of a partial): 16 bytes of a 4- or 8-byte
    type, 8 bytes of a 16-bit one (its partials are float), 1 where the row does not divide.

    >>> from panamera.dtypes import as_dtype
    >>> vector_width(as_dtype("float32"), 768), vector_width(as_dtype("float64"), 3)
    (4, 1)
    """
    v = 2 if src.itemsize == 8 else 4
    while v > 1 and width % v:
        v //= 2
    return v if src.itemsize in (2, 4, 8) and src.name != "bool" else 1


def merge_runs(n: int, tile: int) -> tuple[int, ...]:
    """The run length each merge pass starts from: tile, 2 tile, ... below n.

    >>> merge_runs(9, 2)
    (2, 4, 8)
    """
    runs, r = [], tile
    while r < n:
        runs.append(r)
        r *= 2
    return tuple(runs)


MAX_TILE = 1024  # keys per sort block: 8 KB of shared memory
TILES = (256, 512, MAX_TILE)  # the sort tiles the model chooses from (fewer merge passes, or more blocks)
GROUPS = (1, 2, 4, 8)  # chunks of SEGMENT_ROWS positions per block of the piece and owner kernels
KEY_BYTES = 8


@dataclass(frozen=True)
class SegmentPlan(OfProblem):
    """Every decision of one sorted-segment scatter-add of `problem` (n ids into `rows` rows of
    `width` elements; its fields read on the plan: `p.n`, `p.rows`, ...): the sort tile, chunks
    per block, threads, and each launch with its grid, block and modeled cost."""

    problem: ScatterProblem
    tile: int
    groups_per_block: int
    threads: int
    vec: int
    gpu: GPUSpec
    # (kernel suffix, (grid, block), cost, (bytes read, bytes written)) per launch
    launches: tuple[tuple[str, tuple[int, int], KernelCost, tuple[int, int]], ...]

    @property
    def passes(self) -> int:
        """Merge passes after the tile sort."""
        return len(merge_runs(self.n, self.tile))

    @property
    def modeled_us(self) -> float:
        """The launches in sequence, each after the first queued (model/kernel_cost.py `chain_s`)."""
        return chain_s([c.total_s for _, _, c, _ in self.launches], self.gpu) * 1e6

    def describe(self) -> str:
        return (
            f"SORTED_SEGMENTS ids={self.n} rows={self.rows} width={self.width} tile={self.tile} "
            f"merge_passes={self.passes} piece={SEGMENT_ROWS} chunks_per_block={self.groups_per_block} "
            f"threads={self.threads} vec={self.vec}"
        )


def expected_segments(n: int, rows: int) -> float:
    """Distinct rows among n uniform ids into `rows` rows (the model's segments).

    >>> round(expected_segments(8192, 50257))
    7559
    """
    return rows * -math.expm1(n * math.log1p(-1.0 / rows)) if rows > 1 else 1.0


def share_rows(rows: int, shares: int) -> int:
    """Rows of each zeroing share but the last (which takes the rest).

    >>> share_rows(10, 3)
    4
    """
    return -(-rows // shares)


def zero_blocks(rows: int, width: int, shares: int, threads: int, gpu: GPUSpec) -> int:
    """Zeroing blocks of one launch: four elements a thread, at most 8 blocks per SM."""
    return max(1, min(math.ceil(rows * width / shares / (threads * 4)), gpu.sms * 8))


def _costs(n, rows, width, ids: DType, src: DType, tile, gpb, threads, vec, gpu: GPUSpec):
    e, acc = src.itemsize, 4 if src.is_16bit_float else src.itemsize
    segs = expected_segments(n, rows)
    pieces = min(n, segs + math.ceil(n / SEGMENT_ROWS))
    out = []

    def add(name: str, shape: tuple[int, int], cost: KernelCost, *parts: KernelCost) -> None:
        """One launch: its cost, and its traffic (read, written) summed over the parts it runs."""
        f = [dict(c.features) for c in parts or (cost,)]
        written = sum(x.get("write_bytes", 0.0) for x in f)
        out.append((name, shape, cost, (int(sum(x["dram_bytes"] for x in f) - written), int(written))))

    runs = merge_runs(n, tile)
    shares = 1 + len(runs)  # the merge launches and `part` each zero a share of the rows no id names
    untouched = (rows - segs) * width * e / shares

    def zeroing(shares_rows: int) -> KernelCost:
        """The zeroing blocks of one share: they stream the writes of its rows no id names (the
        rows the tile launch did not mark), reading the marks (a byte per row, left in L2 by the
        tile launch just before: L2 traffic, no DRAM round trip)."""
        zb = zero_blocks(rows, width, shares, SORT_THREADS, gpu)
        return kernel_time(gpu, dram_bytes=untouched, write_bytes=untouched, blocks=zb, threads=SORT_THREADS,
                           bytes_in_flight_per_thread=e, l2_bytes=32.0 * shares_rows)  # fmt: skip

    def beside(name: str, blocks: int, sort: KernelCost) -> None:
        """A merge launch with zeroing blocks: its merge blocks and zeroing blocks run side by side,
        so it lasts as long as the longer of the two alone (the merge's few blocks wait on
        latencies, the zeroing blocks stream the table's writes)."""
        z = zeroing(share_rows(rows, shares))
        zb = dict(z.features)["blocks"]
        add(name, (blocks + zb, SORT_THREADS), max(sort, z, key=lambda c: c.total_s), sort, z)

    tiles = sort_blocks(n, tile)
    # each key counts the smaller keys of its tile: a shared-memory load (a quarter of the FP32 rate), a
    # compare and an add per key of the tile, on the sort blocks' SMs only; each valid id marks its row
    add("tile", (tiles, SORT_THREADS),
        kernel_time(gpu, dram_bytes=n * (ids.itemsize + KEY_BYTES) + segs, write_bytes=n * KEY_BYTES + segs,
                    blocks=tiles, threads=SORT_THREADS, bytes_in_flight_per_thread=ids.itemsize,
                    fp32_ops=4.0 * n * min(n, tile), shared_bytes=tile * KEY_BYTES))  # fmt: skip
    for L in runs:
        probes = math.ceil(math.log2(L)) + 1  # the binary search's dependent L2 round trips, per thread
        blocks = merge_blocks(n)
        merge = kernel_time(gpu, dram_bytes=2 * n * KEY_BYTES, write_bytes=n * KEY_BYTES, blocks=blocks,
                            threads=SORT_THREADS, bytes_in_flight_per_thread=KEY_BYTES, l2_bytes=n * probes * 32.0,
                            epilogue_cycles=probes * gpu.l2_latency_cycles)  # fmt: skip
        beside(f"merge{L}", blocks, merge)
    blocks = math.ceil(n / (gpb * SEGMENT_ROWS))
    spans = (math.ceil(n / SEGMENT_ROWS) - 1) * (n - segs) / max(1, n - 1)  # segments cut at a chunk boundary
    partials = min(pieces, 2 * spans)  # the pieces of those: written by `part`, read by `own`
    whole = (segs - spans) * width * e  # rows `part` writes itself
    # `part` carries the last share's zeroing blocks (its rows stream beside the pieces' sums)
    zb, last = zero_blocks(rows, width, shares, threads, gpu), rows - (shares - 1) * share_rows(rows, shares)
    zero_w = (rows - segs) * width * e * last / rows
    add("part", (blocks + zb, threads),
        kernel_time(gpu, dram_bytes=n * KEY_BYTES + n * width * e + whole + partials * width * acc + zero_w,
                    write_bytes=whole + partials * width * acc + zero_w, blocks=blocks + zb, threads=threads,
                    bytes_in_flight_per_thread=UNROLL * vec * e, fp32_ops=float(n * width),
                    l2_bytes=32.0 * last))  # fmt: skip
    add("own", (blocks, threads),
        kernel_time(gpu, dram_bytes=n * KEY_BYTES + partials * width * acc + spans * width * e,
                    write_bytes=spans * width * e, blocks=blocks, threads=threads,
                    bytes_in_flight_per_thread=vec * acc, fp32_ops=float(partials * width)))  # fmt: skip
    return tuple(out)


def plan_segments(
    problem: ScatterProblem,
    gpu: GPUSpec = H100,
    tile: int | None = None,
    groups_per_block: int | None = None,
    threads: int | None = None,
) -> SegmentPlan:
    """The model's plan of scattering n rows of `width` elements into a table of `rows` rows by
    sorted segments; `tile`, `groups_per_block` and `threads` pin a choice (tests pin two to show
    the bits do not move). Preconditions (each a ShapeError): (1) n < 2^31 positions and
    rows < 2^31 (a key holds the row and the position in 32 bits each); (2) `tile` a power of two
    of at most MAX_TILE; (3) n, rows and width positive.

    >>> from panamera.dtypes import as_dtype
    >>> plan_segments(ScatterProblem(5, 4, 3, as_dtype("int64"), as_dtype("float32")), tile=2).passes
    2
    """
    n, rows, width, ids, src = problem.n, problem.rows, problem.width, problem.ids, problem.src
    if n <= 0 or rows <= 0 or width <= 0:
        raise ShapeError(f"sorted scatter-add: {n} ids, {rows} rows, {width} elements per row: each must be positive")
    if n >= 2**31 or rows >= 2**31:
        raise ShapeError(f"sorted scatter-add: {n} ids into {rows} rows; a sort key holds each in 31 bits")
    if tile is not None and (tile < 1 or tile > MAX_TILE or tile & (tile - 1)):
        raise ShapeError(f"sorted scatter-add: tile {tile} is not a power of two up to {MAX_TILE}")
    whole = min(MAX_TILE, 1 << max(0, (n - 1).bit_length()))  # one tile holds every key
    tiles = (tile,) if tile is not None else tuple(sorted({min(t, whole) for t in TILES}))
    vec = vector_width(src, width)
    if threads is None:
        threads = min(256, 32 * math.ceil(width / vec / 32))
    candidates = (groups_per_block,) if groups_per_block is not None else GROUPS
    options = [(t, g, _costs(n, rows, width, ids, src, t, g, threads, vec, gpu)) for t in tiles for g in candidates]
    t, g, costs = min(options, key=lambda o: (chain_s([c.total_s for _, _, c, _ in o[2]], gpu), -o[0], o[1]))
    return SegmentPlan(problem, t, g, threads, vec, gpu, costs)
