"""A whole CPU model run as one C call: its units' C stages in one table (`OptimizedModel.run`).

On a small convnet (the exported MobileNetV3: 14 units of a few µs of arithmetic each) a run spent
most of its time in Python between the C calls: each unit looked up its inputs, checked them,
wrote its pointers, allocated its outputs and made one or more ctypes calls (12-20 µs a unit
against onnxruntime's ~3 µs a node). A `Chain` is built once, from a completed run (every value's
shape and dtype known), when every unit has a C form:

1. a CPU subgraph with one C entry (its constants bound: cpu_run.bind_constants) -> its
   `pn_program(table, threads)`, the table's live inputs and outputs pointing at resident arrays;
2. a library Conv the host step's C kernels take (conv_step.HostConvStep `fast`) -> its stages
   (columns, one gemm through the BLAS numpy links, epilogue; or the direct depthwise kernel),
   planned again for the chain alone (its own tables and scratch: conv_step.c_stages).

Every value between units is a resident array, written in place by each run. A run points the
tables at the caller's feeds (C-contiguous and aligned ones; others are copied into their resident
arrays) and at fresh output arrays it returns (a run's results are never overwritten by a later run),
in the same ctypes call as the steps (`pn_chain_objects`, then `pn_chain`: the steps in order, a
switch on their kind); where the object layout is unknown it copies feeds in and outputs out. Any
other unit (a numpy library node, a subgraph with a numpy BLAS step, a torch feed) leaves the
model on the unit-by-unit path. `pn_chain` also times each step when given an array
(`Chain.profile`: the per-step table `panamera profile` prints).

>>> CHAIN_SOURCE.count('extern "C" void pn_chain(')
1
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from enum import Enum
from functools import cache

import numpy as np

from ..runtime import cpu, cpu_gemm
from ..runtime.blas_threads import blas_threads, native_count
from ..runtime.cpu_call import address, object_layout
from . import conv_kernels as ck
from .conv_kernels import NO_EPILOGUE
from .conv_step import HostConvStep, c_stages
from .library import LibraryNode
from .model import DEFAULT_DOMAINS

CHAIN_SOURCE = (
    cpu_gemm.GEMM_SOURCE
    + r"""
#include <time.h>
typedef long L;
struct PnChainStep { L kind; void* fn; void** p; const void* d; L nt_slot; };  // nt_slot >= 0: d[nt_slot] = nt
typedef void (*PnProgram)(void**, int);
typedef void (*PnStage)(void**, const L*);
static inline double pn_now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
// c (m x n) = beta c + a (m x k) b (k x n), row-major: a product too small for a BLAS call's fixed cost
// (a squeeze-excite 1x1 conv: 4 x 1 x 16), plain loops, SIMD over n (or over k for one contiguous column)
#define PN_SMALL_GEMM 2048
#define PN_SMALL_GEMV 65536
static void pn_small_gemm(L m, L n, L k, const float* a, L lda, const float* b, L ldb, float* c, L ldc, float beta) {
  for (L i = 0; i < m; i++) {
    const float* __restrict ai = a + i * lda;
    float* __restrict ci = c + i * ldc;
    if (n == 1 && ldb == 1) {
      float s = 0.0f;
      _Pragma("omp simd reduction(+ : s)") for (L q = 0; q < k; q++) s += ai[q] * b[q];
      ci[0] = (beta != 0.0f ? beta * ci[0] : 0.0f) + s;
      continue;
    }
    if (beta == 0.0f) { _Pragma("omp simd") for (L j = 0; j < n; j++) ci[j] = 0.0f; }
    else if (beta != 1.0f) { _Pragma("omp simd") for (L j = 0; j < n; j++) ci[j] *= beta; }
    for (L q = 0; q < k; q++) {
      float v = ai[q];
      const float* __restrict bq = b + q * ldb;
      _Pragma("omp simd") for (L j = 0; j < n; j++) ci[j] += v * bq[j];
    }
  }
}
// kind 0: a program entry fn(table, threads); 1: a conv stage fn(p, d); 2: gemm calls (conv_step.c_stages).
// bget/bset (or null): the BLAS's thread count, held at nt for the call and restored after it
typedef int (*PnBlasGet)();
typedef void (*PnBlasSet)(int);
extern "C" void pn_chain(const PnChainStep* s, L n, int nt, double* ns, void* bget, void* bset) {
  const int before = bget ? ((PnBlasGet)bget)() : nt;
  if (before != nt) ((PnBlasSet)bset)(nt);
  for (L i = 0; i < n; i++) {
    double t0 = ns ? pn_now() : 0.0;
    switch (s[i].kind) {
    case 0: ((PnProgram)s[i].fn)(s[i].p, nt); break;
    case 1:
      if (s[i].nt_slot >= 0) ((L*)s[i].d)[s[i].nt_slot] = nt;  // a stage that splits over threads
      ((PnStage)s[i].fn)(s[i].p, (const L*)s[i].d);
      break;
    default: {
      const long long* d = (const long long*)s[i].d;
      const float *a = (const float*)s[i].p[0], *b = (const float*)s[i].p[1];
      float* c = (float*)s[i].p[2];
      if ((d[1] == 1 && d[4] == 1 && d[0] * d[2] <= PN_SMALL_GEMV) || d[0] * d[1] * d[2] <= PN_SMALL_GEMM)
        for (long long j = 0; j < d[6]; j++) {
          const long long* t = d + 7 + 4 * j;
          pn_small_gemm(d[0], d[1], d[2], a + t[0], d[3], b + t[1], d[4], c + t[2], d[5], (float)t[3]);
        }
      else
        pn_gemm<float>(0, 0, d[0], d[1], d[2], a, d[3], b, d[4], c, d[5], (int)d[6], d + 7);
    }
    }
    if (ns) ns[i] += pn_now() - t0;
  }
  if (before != nt) ((PnBlasSet)bset)(before);
}
// pn_chain after pointing the tables at this run's arrays: slot i (an address inside a step's pointer
// table) gets the data pointer of item which[i] of the tuple `objs` (the feeds read in place, the fresh
// outputs), read from the objects as runtime/cpu_call.py's OBJECT_CALL does (`object_layout`). The
// fixed arguments in one struct: each ctypes argument costs ~0.1-0.2 us a call
struct PnChainRun { const PnChainStep* s; L n; void* bget; void* bset; void* const* slots; const int* which; L m;
                    L data_at, item_at; };
extern "C" void pn_chain_objects(const PnChainRun* r, int nt, double* ns, const char* objs) {
  const char* const* item = (const char* const*)(objs + r->item_at);
  for (L i = 0; i < r->m; i++) *(void**)r->slots[i] = *(void* const*)(item[r->which[i]] + r->data_at);
  pn_chain(r->s, r->n, nt, ns, r->bget, r->bset);
}
"""
)


_UNSEEN = object()  # Chain.run: a names tuple not seen before


class StepKind(Enum):
    """What one step of the chain runs (`pn_chain`'s switch)."""

    PROGRAM = 0  # a CPU subgraph's C entry
    STAGE = 1  # a host conv's C stage (columns, depthwise, epilogue)
    GEMM = 2  # a host conv's product, through the BLAS numpy links


class _Step(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_long),
        ("fn", ctypes.c_void_p),
        ("p", ctypes.c_void_p),
        ("d", ctypes.c_void_p),
        ("nt_slot", ctypes.c_long),
    ]


@cache
def _lib() -> ctypes.CDLL:
    lib = cpu.build(CHAIN_SOURCE)
    lib.pn_chain.argtypes = (ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p)  # fmt: skip
    lib.pn_chain.restype = None
    lib.pn_chain_objects.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.py_object)
    lib.pn_chain_objects.restype = None
    return lib


class _Run(ctypes.Structure):
    """pn_chain_objects's `PnChainRun`: pn_chain's fixed arguments and the slots a run points."""

    _fields_ = [
        ("s", ctypes.c_void_p),
        ("n", ctypes.c_long),
        ("bget", ctypes.c_void_p),
        ("bset", ctypes.c_void_p),
        ("slots", ctypes.c_void_p),
        ("which", ctypes.c_void_p),
        ("m", ctypes.c_long),
        ("data_at", ctypes.c_long),
        ("item_at", ctypes.c_long),
    ]


@dataclass(frozen=True)
class StepInfo:
    """One chain step: its kind, what it is (`label`, the profile's row) and its unit's index."""

    kind: StepKind
    label: str
    unit: int


class Chain:
    """A model's units as one C call over resident arrays (`build` makes it from a completed run).

    Where the interpreter's object layout allows (cpu_call.object_layout), a run reads a feed in
    place (C-contiguous, aligned; the caller checked its shape and dtype) and writes each model output
    into a fresh array it returns: `in_place` names the values whose pointer-table slots it points at
    them per run (`slots_of`). Any other feed is copied into its resident array, any other output
    copied out of its own."""

    def __init__(
        self,
        table,
        infos: tuple[StepInfo, ...],
        resident: dict,
        feeds: tuple,
        keep: list,
        nt: int,
        blas: bool,
        tables: tuple = (),
        outputs: tuple[str, ...] = (),
    ):
        self.table, self.infos, self.resident, self.feeds = table, infos, resident, feeds
        self.keep, self.nt, self.blas, self.lock = keep, nt, blas, threading.Lock()
        self.fn = _lib().pn_chain
        # the call's arguments as ctypes objects, made once (converting them cost ~1 us a run)
        self._head = (ctypes.c_void_p(ctypes.addressof(table)), ctypes.c_long(len(infos)))
        self._nts: dict = {}
        # a chain with gemm steps holds the BLAS at the run's thread count from C where it can (one
        # OpenBLAS on its own threads: blas_threads.native_count), else around the call from Python
        native = native_count() if blas else None
        self._blas = (ctypes.c_void_p(native[0]), ctypes.c_void_p(native[1])) if native else (None, None)
        self._names: dict = {}  # names tuple -> None (a name not resident), True (the fresh outputs), False
        self._py_blas = blas and native is None
        layout = object_layout()
        fed = self._fed = frozenset(n for n, _ in feeds)
        wanted = [n for n, _ in feeds] + [o for o in dict.fromkeys(outputs) if o in resident and o not in fed]
        slots = slots_of(tables, {n: resident[n] for n in wanted}) if layout else {}
        self.in_place = tuple(n for n in wanted if n in slots)
        self._feeds = tuple((n, a, n in slots) for n, a in feeds)
        self._outs = tuple((n, resident[n].shape, resident[n].dtype) for n in self.in_place if n not in fed)
        self._out_names = tuple(n for n, _, _ in self._outs)
        at = [s for n in self.in_place for s in slots[n]]
        which = [k for k, n in enumerate(self.in_place) for _ in slots[n]]
        self._slots = ((ctypes.c_void_p * max(1, len(at)))(*at), (ctypes.c_int * max(1, len(which)))(*which))
        if self.in_place:
            head = (ctypes.addressof(table), len(infos), *(b.value if b is not None else None for b in self._blas))
            self._run = _Run(*head, *map(ctypes.addressof, self._slots), len(at), *layout)
            self._objects = (_lib().pn_chain_objects, ctypes.c_void_p(ctypes.addressof(self._run)))

    def run(self, feeds: dict, names: tuple[str, ...], threads: int | None, ns=None) -> dict | None:
        """`names` after one run on `feeds` (checked by the caller: shapes and dtypes), or None where
        the chain cannot take them (a name it does not hold, a feed that is not a numpy array). Every
        result is a fresh array (an output written in place there, another value copied out); a feed
        read in place is only read during the call."""
        how = self._names.get(names, _UNSEEN)
        if how is _UNSEEN:  # first seen: whether every name is resident, and whether `names` are the fresh outputs
            how = self._names[names] = (names == self._out_names) if all(n in self.resident for n in names) else None
        c_nt = self._nts.get(threads)
        if c_nt is None:
            c_nt = self._nts[threads] = ctypes.c_int(threads or self.nt)
        if how is None:
            return None
        with self.lock:
            if not self.in_place:
                if not all(type(feeds[n]) is np.ndarray for n, _ in self.feeds):
                    return None
                for name, arr in self.feeds:
                    np.copyto(arr, feeds[name])
                if self._py_blas:
                    with blas_threads(c_nt.value):
                        self.fn(*self._head, c_nt, ns, *self._blas)
                else:
                    self.fn(*self._head, c_nt, ns, *self._blas)
                return {n: self._copy(n, feeds) for n in names}
            objs = []
            for name, arr, in_place in self._feeds:
                a = feeds[name]
                if type(a) is not np.ndarray:
                    return None
                if in_place:
                    f = a.flags
                    if f.c_contiguous and f.aligned:  # read in place (shape and dtype checked by the caller)
                        objs.append(a)
                        continue
                    objs.append(arr)
                np.copyto(arr, a)
            fresh = [np.empty(shape, dt) for _, shape, dt in self._outs]
            fn, run = self._objects
            if self._py_blas:
                with blas_threads(c_nt.value):
                    fn(run, c_nt, ns, (*objs, *fresh))
            else:
                fn(run, c_nt, ns, (*objs, *fresh))
            if how:
                return dict(zip(names, fresh))
            out = dict(zip(self._out_names, fresh))
            return {n: out[n] if n in out else self._copy(n, feeds) for n in names}

    def _copy(self, name: str, feeds: dict) -> np.ndarray:
        """A copy of value `name` after a run (a feed's from the caller's array: one read in place
        never reached its resident array)."""
        return np.array(feeds[name], order="C") if name in self._fed else self.resident[name].copy()

    def profile(self, feeds: dict, names: tuple[str, ...], rounds: int, threads: int | None = None) -> list[tuple]:
        """Rows (label, steps, µs per run), the largest first, then ("whole run (wall)", 1, µs): each
        step's median C time over `rounds` runs (after one warm-up; medians: a shared machine's
        preemptions land in a few rounds), summed per kind of step; the wall time's median."""
        self.run(feeds, names, threads)
        per, walls = np.empty((rounds, len(self.infos))), []
        for r in range(rounds):
            ns = (ctypes.c_double * len(self.infos))()
            t0 = time.perf_counter()
            self.run(feeds, names, threads, ns)
            walls.append(time.perf_counter() - t0)
            per[r] = np.frombuffer(ns)
        med = np.median(per, axis=0) / 1e3
        tot: dict = defaultdict(float)
        cnt: dict = defaultdict(int)
        for info, t in zip(self.infos, med):
            tot[info.label] += float(t)
            cnt[info.label] += 1
        rows = sorted(((k, cnt[k], tot[k]) for k in tot), key=lambda r: -r[2])
        return rows + [("whole run (wall)", 1, float(np.median(walls)) * 1e6)]


def slots_of(tables, arrays: dict) -> dict[str, tuple[int, ...]]:
    """The addresses of the entries of the pointer `tables` (ctypes arrays of void*) that hold the
    data pointer of each of `arrays` (name -> array), for the names whose arrays every table refers
    to only by that pointer (none inside them: a view at an offset would not follow a new pointer)
    and that own a distinct, non-empty buffer.

    >>> a, b = np.zeros(4, np.float32), np.zeros(2, np.float32)
    >>> t = (ctypes.c_void_p * 3)(address(a), address(b), address(b) + 4)
    >>> got = slots_of([t], {"a": a, "b": b})
    >>> list(got), got["a"] == (ctypes.addressof(t),)
    (['a'], True)
    """
    spans = {n: (address(a), address(a) + a.nbytes) for n, a in arrays.items() if a.nbytes}
    starts = [lo for lo, _ in spans.values()]
    found: dict = {n: [] for n in spans if starts.count(spans[n][0]) == 1}
    width = ctypes.sizeof(ctypes.c_void_p)
    for t in tables:
        base = ctypes.addressof(t)
        for i, v in enumerate(t):
            if v is None:
                continue
            for n, (lo, hi) in spans.items():
                if v == lo and n in found:
                    found[n].append(base + i * width)
                elif lo < v < hi:
                    found.pop(n, None)
    return {n: tuple(s) for n, s in found.items() if s}


def _conv_label(step: HostConvStep, kind: str) -> str:
    return "conv depthwise" if kind == "depthwise" else f"conv {step.form.value} {kind}"


def build(opt, env: dict) -> Chain | None:
    """The chain of `opt` (an OptimizedModel) from `env`, the values of one completed run (the
    feeds, the constants and every unit's outputs), or None where some unit has no C form."""
    if cpu_gemm.blas() is None:
        return None
    constants, inputs = opt.model.constants, set(opt.model.inputs) - set(opt.model.specialized)
    resident: dict[str, np.ndarray] = {}
    feeds: list = []
    keep: list = []
    steps: list[tuple] = []
    infos: list[StepInfo] = []
    blas, nt = False, 1

    def value(name: str) -> np.ndarray | None:
        if name in resident:
            return resident[name]
        a = env.get(name)
        if type(a) is not np.ndarray:
            return None
        if name in inputs:
            resident[name] = np.empty(a.shape, a.dtype)
            feeds.append((name, resident[name]))
            return resident[name]
        if name in constants and a.flags.c_contiguous:
            keep.append(a)
            return a
        return None

    from .cpu_run import bind_constants
    from .optimizer import Subgraph

    for k, (u, _, ins, outs_of, _bound) in enumerate(opt._steps):
        if isinstance(u, Subgraph):
            bound = bind_constants(u, constants)
            if bound is None or bound.fast.hosts or len(bound.fast.steps) != 1:
                return None
            fast = bound.fast
            for slot, name, (shape, dt) in zip(fast.free, bound.live, fast.specs):
                a = value(name)
                if a is None or a.shape != shape or a.dtype != dt:
                    return None
                fast.ptrs[slot] = address(a)
            for (slot, shape, dt), name in zip(fast.outs, outs_of):
                resident[name] = np.empty(shape, dt)
                fast.ptrs[slot] = address(resident[name])
            keep.append(fast)
            steps.append((StepKind.PROGRAM, ctypes.cast(fast.steps[0], ctypes.c_void_p).value, fast.ptrs, None, -1))
            infos.append(StepInfo(StepKind.PROGRAM, "subgraph program", k))
            blas, nt = blas or fast.blas, max(nt, fast.threads)
            continue
        if not (isinstance(u, LibraryNode) and u.node.op_type == "Conv" and u.node.domain in DEFAULT_DOMAINS):
            return None
        args = [value(i) for i in ins]
        if any(a is None or a.dtype != np.float32 for a in args):
            return None
        nres = len(u.fused.residuals) if u.fused else 0
        nin = len(args) - nres
        epi = u.fused.epilogue if u.fused else NO_EPILOGUE
        pool = u.fused.pool if u.fused else ()  # a MaxPool fused into the step (conv_fuse.py precondition 5)
        step = HostConvStep.plan(args[0].shape, args[1].shape, u.node.attrs, nin == 3, epi, pool)
        out = env.get(outs_of[0])
        if type(out) is not np.ndarray or out.shape != step.out_shape or out.dtype != np.float32:
            return None
        resident[outs_of[0]] = y = np.empty(step.out_shape, np.float32)
        b = args[2] if nin == 3 else None
        stages = c_stages(step, args[0], args[1], b, tuple(args[nin:]), y, w_constant=ins[1] in constants)
        if stages is None:
            return None
        keep.append(step)
        for kind, fn, p, d in stages:
            sk = StepKind.GEMM if kind == "gemm" else StepKind.STAGE
            steps.append((sk, fn, p, d, len(d) - 1 if kind == "direct" else -1))
            infos.append(StepInfo(sk, _conv_label(step, kind), k))
            blas = blas or sk is StepKind.GEMM
    table = (_Step * max(1, len(steps)))()
    for i, (kind, fn, p, d, nt_slot) in enumerate(steps):
        table[i].kind, table[i].fn, table[i].nt_slot = kind.value, fn, nt_slot
        table[i].p, table[i].d = ctypes.addressof(p), (ctypes.addressof(d) if d is not None else None)
        keep += [p, d]
    tables = tuple({id(p): p for _, _, p, _, _ in steps}.values())
    return Chain(table, tuple(infos), resident, tuple(feeds), keep, nt, blas, tables, tuple(opt.model.outputs))


def _epi_fn() -> int:
    return ctypes.cast(ck._lib().pn_step_epilogue, ctypes.c_void_p).value


def profile(opt, feeds: dict, rounds: int = 20, threads: int | None = None) -> list[tuple[str, int, float]]:
    """Where a run of `opt` (an OptimizedModel) on `feeds` goes: rows (kind of step, how many, µs
    per run: medians over `rounds`), the largest first, then ("whole run (wall)", 1, µs). A model
    run as one C call is timed inside it (`pn_chain`'s clock per step); any other unit by unit from
    Python (each unit's call, its Python included): "subgraph program" / "subgraph (general call)"
    / "library <op>".

    >>> from onnx import helper, TensorProto
    >>> from panamera.subgraph.optimizer import optimize
    >>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
    >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [v("x", [4])], [v("y", [4])])
    >>> rows = profile(optimize(helper.make_model(g).SerializeToString(), target="cpu"), {"x": np.ones(4, np.float32)}, 2)
    >>> [(label, n) for label, n, _ in rows]
    [('subgraph program', 1), ('whole run (wall)', 1)]
    """
    for _ in range(2):  # the second run builds the chain (optimizer.OptimizedModel.run)
        opt.run(feeds, threads=threads)
    checked = opt._check_feeds(feeds)
    chain = opt._chain[1] if len(opt._chain) == 2 else None
    if chain is not None:
        return chain.profile(checked, tuple(opt.model.outputs), rounds, threads)
    times: dict = defaultdict(list)
    labels = []
    for st in opt._steps:
        u, bound = st[0], st[4]
        if isinstance(u, LibraryNode):
            labels.append(f"library {'+'.join(n.op_type for n in u.nodes)}")
        else:
            labels.append("subgraph program" if bound is not None else "subgraph (general call)")
    walls = []
    for _ in range(rounds):
        env = dict(opt.model.constants)
        env.update(checked)
        for k, st in enumerate(opt._steps):
            t0 = time.perf_counter()
            opt._unit(st, env, threads)
            times[k].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        opt.run(feeds, threads=threads)
        walls.append(time.perf_counter() - t0)
    tot: dict = defaultdict(float)
    cnt: dict = defaultdict(int)
    for k, label in enumerate(labels):
        tot[label] += float(np.median(times[k])) * 1e6
        cnt[label] += 1
    rows = sorted(((k, cnt[k], tot[k]) for k in tot), key=lambda r: -r[2])
    return rows + [("whole run (wall)", 1, float(np.median(walls)) * 1e6)]


def describe(rows: list[tuple[str, int, float]]) -> str:
    """`profile`'s rows as a text table.

    >>> print(describe([("conv depthwise", 4, 17.25), ("whole run (wall)", 1, 54.0)]))
    step                              count    us/run
    conv depthwise                        4      17.2
    whole run (wall)                      1      54.0
    """
    lines = [f"{'step':<32} {'count':>6} {'us/run':>9}"]
    lines += [f"{label:<32} {n:>6} {us:>9.1f}" for label, n, us in rows]
    return "\n".join(lines)
