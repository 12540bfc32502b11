"""The CPU target's call path: one C entry per program, its pointers bound once.

A program whose kernels are all compiled (no numpy BLAS call between them) gets one more C
function, `pn_program(void** buffers, int threads)`, that calls its kernels in order, each with
its own parameters picked from one table of buffer pointers (`buffer_order`: the inputs, then
every other buffer of the plan). `FastCall` holds that table as a ctypes array: the buffers
between kernels (a program's intermediates) are allocated once and their pointers written once;
per call it writes the inputs' and outputs' pointers and makes one ctypes call.

`FastCall.call` is the whole call for plain numpy inputs: an exact type, shape and dtype compare
and a contiguity flag per input, `threads` an int, outputs from `np.empty` (or the caller's
`out=` arrays, written in place when they are contiguous and do not overlap an input). Contiguous
torch CPU tensors are read in place likewise, and give torch outputs (`torch.empty`). Anything
else (views that need a copy, names, a wrong shape, a tensor requiring grad) returns None and
takes the general path (`Compiled._bind`), which raises the specific error. A numpy call passes
its arrays as one tuple to OBJECT_CALL, which reads their data pointers in C (no ctypes object per
array) into a copy of the table on its stack: such calls take the lock only when the program has
intermediates (shared between calls). Torch calls write the shared table under the lock.

>>> import numpy as np, panamera as pn
>>> k = pn.compile(pn.sum(pn.placeholder((3, 4), "float32"), axis=1), target="cpu")
>>> k.executor.fast().call((np.ones((3, 4), np.float32),), 1, None)[0].tolist()
[4.0, 4.0, 4.0]
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading
from dataclasses import dataclass
from functools import cache

import numpy as np

from .arrays import numpy_to_torch_dtype
from .blas_threads import blas_threads
from .cpu_team import TEAM_CALL, TEAM_SOURCE
from .executor import _alloc
from .plan import LaunchPlan

PROGRAM_ENTRY = "pn_program"


def buffer_order(plan: LaunchPlan) -> tuple[str, ...]:
    """The buffers' keys in the order of `pn_program`'s table: the inputs, then the others."""
    ins = tuple(t.key for t in plan.inputs)
    return ins + tuple(k for k in plan.buffers if k not in ins)


def segments(kernels: tuple) -> list[tuple[int, ...]]:
    """The program's steps: runs of consecutive compiled kernels (one C entry each) and each numpy
    BLAS kernel alone, as kernel indices in order.

    >>> segments((("a", (), None), ("b", (), None), ("mm", (), "blas"), ("c", (), None)))
    [(0, 1), (2,), (3,)]
    """
    out: list[list[int]] = []
    for n, (_, _, host) in enumerate(kernels):
        if host is None and out and kernels[out[-1][-1]][2] is None:
            out[-1].append(n)
        else:
            out.append([n])
    return [tuple(x) for x in out]


def entry_name(kernels: tuple, segment: tuple[int, ...]) -> str:
    """`pn_program` for a program of compiled kernels only, else `pn_program_s{first kernel}`."""
    return PROGRAM_ENTRY if all(h is None for _, _, h in kernels) else f"{PROGRAM_ENTRY}_s{segment[0]}"


def program_entry(plan: LaunchPlan, kernels: tuple) -> str:
    """The C source of `pn_program`: each kernel of `kernels` ((name, parameter keys, host), in
    order) called with its parameters taken from the table; with numpy BLAS kernels among them,
    one entry per run of compiled kernels (`segments`, `entry_name`), called between the BLAS calls.
    Each entry first places its OpenMP team off the caller's core (runtime/cpu_team.py, whose C
    source leads the text).

    >>> import panamera as pn
    >>> x = pn.placeholder((4, 8), "float32")
    >>> k = pn.compile([pn.sum(x, axis=1), pn.sum(x, axis=0)], target="cpu")
    >>> print(program_entry(k.plan, k.executor.kernels).removeprefix(TEAM_SOURCE))
    extern "C" void pn_program(void** pn_b, int pn_nt) {
      pn_team_place(pn_nt);
      { void* a[] = {pn_b[0], pn_b[1]}; pn_k0_reduce(a, pn_nt); }
      { void* a[] = {pn_b[0], pn_b[2]}; pn_k1_reduce(a, pn_nt); }
    }
    """
    slot = {k: n for n, k in enumerate(buffer_order(plan))}
    lines = []
    for seg in segments(kernels):
        if kernels[seg[0]][2] is not None:
            continue
        lines.append(f'extern "C" void {entry_name(kernels, seg)}(void** pn_b, int pn_nt) {{')
        lines.append(TEAM_CALL.rstrip("\n"))
        for name, keys, _ in (kernels[n] for n in seg):
            args = ", ".join(f"pn_b[{slot[k]}]" for k in keys)
            lines.append(f"  {{ void* a[] = {{{args}}}; {name}(a, pn_nt); }}" if keys else f"  {name}(nullptr, pn_nt);")
        lines.append("}")
    return TEAM_SOURCE + "\n".join(lines)


def address(a: np.ndarray) -> int:
    """The address of a numpy array's data (a writable array's through ctypes' buffer export,
    three times faster than `a.ctypes.data`)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):  # read-only, or no byte to export
        return a.ctypes.data


# The numpy call's C side: the caller's arrays and the results passed as one Python tuple, their
# data pointers read from the objects in C (numpy's `PyArrayObject.data`, the first field after
# the object header), so a call builds no ctypes or buffer object per array; the table is copied
# to the stack (no shared state written: no lock unless the program has intermediates). With
# `check` (the caller's out= arrays) it first refuses, returning 1, an output overlapping any
# other buffer of the table (np.may_share_memory's bounds test).
OBJECT_CALL = r"""#include <cstring>
#include <alloca.h>
struct pn_objects {
  void (*entry)(void**, int); void* const* base; const long* bytes; const int* slots;
  int n, m, outs; long data_at, item_at;
};
extern "C" int pn_call_objects(const pn_objects* d, const char* objs, int check, int nt) {
  void** b = (void**)alloca(sizeof(void*) * d->n);
  memcpy(b, d->base, sizeof(void*) * d->n);
  const char* const* item = (const char* const*)(objs + d->item_at);
  for (int i = 0; i < d->m; ++i) b[d->slots[i]] = *(void* const*)(item[i] + d->data_at);
  for (int i = d->m - d->outs; check && i < d->m; ++i) {
    const int o = d->slots[i];
    const char* lo = (const char*)b[o];
    for (int s = 0; s < d->n; ++s) {
      const char* x = (const char*)b[s];
      if (s != o && x && d->bytes[s] > 0 && d->bytes[o] > 0 && x < lo + d->bytes[o] && lo < x + d->bytes[s]) return 1;
    }
  }
  d->entry(b, nt);
  return 0;
}
"""


class _Objects(ctypes.Structure):
    """OBJECT_CALL's `pn_objects`: the entry, the table of resident pointers, each slot's bytes,
    the slots of the tuple's arrays (free inputs, then results) and the two layout offsets."""

    _fields_ = [
        ("entry", ctypes.c_void_p),
        ("base", ctypes.c_void_p),
        ("bytes", ctypes.c_void_p),
        ("slots", ctypes.c_void_p),
        ("n", ctypes.c_int),
        ("m", ctypes.c_int),
        ("outs", ctypes.c_int),
        ("data_at", ctypes.c_long),
        ("item_at", ctypes.c_long),
    ]


@cache
def object_layout() -> tuple[int, int] | None:
    """Where a numpy array's data pointer and a tuple's first item lie in their objects (bytes from
    the object's address: `object.__basicsize__`, `tuple.__basicsize__`), checked once on probe
    objects; None where either does not hold (another interpreter build): calls then write the
    pointers from Python (`FastCall.launch`)."""
    a, data_at, item_at = np.ones(3, np.float32), object.__basicsize__, tuple.__basicsize__
    t = (a,)
    if ctypes.c_void_p.from_address(id(a) + data_at).value != a.ctypes.data:
        return None
    if ctypes.c_void_p.from_address(id(t) + item_at).value != id(a):
        return None
    return data_at, item_at


@cache
def object_entry():
    """OBJECT_CALL's C function (one small library, built once and kept on disk), or None where
    `object_layout` does not hold."""
    if object_layout() is None:
        return None
    from .cpu import build  # runtime/cpu.py imports this module

    fn = build(OBJECT_CALL).pn_call_objects
    fn.argtypes = (ctypes.POINTER(_Objects), ctypes.py_object, ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def _torch_of(a):
    """torch, when `a` is exactly a torch.Tensor (not a subclass: FakeTensor, Parameter), else None."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and type(a) is torch.Tensor else None


def _plain_tensor(torch, t, shape: tuple, dtype) -> bool:
    """Whether torch tensor `t` can be read in place as an input of `shape` and `dtype`: on the
    CPU, contiguous, no lazy negation, not requiring grad under grad mode (refused by the general
    path)."""
    if t.dtype != dtype or t.shape != shape or not t.is_cpu or not t.is_contiguous() or t.is_neg():
        return False
    return not (t.requires_grad and torch.is_grad_enabled())


def simple(plan: LaunchPlan) -> bool:
    """Whether every result is a whole buffer of its own (not an input, not shared, not a prefix
    of a larger buffer), so that it can be allocated as the result itself."""
    keys = [r.key for r in plan.results]
    return all(
        r.input_index < 0 and r.key in plan.buffers and r.size == plan.buffers[r.key].size for r in plan.results
    ) and len(set(keys)) == len(keys)


@dataclass(frozen=True)
class HostStep:
    """A numpy BLAS kernel between the C entries: its operands' and output's slots in the table."""

    host: object  # schedule/cpu_blas.py's BlasCall
    ins: tuple[int, ...]
    out: int


class FastCall:
    """A program's C entries with their pointer table, its intermediates allocated once; `steps`
    the entries (ctypes functions of the table and the thread count) and the HostSteps between
    them, in order; `bound` the arrays of the inputs the program supplies itself (constant masks,
    by input position); `threads` the default thread count of a call; `blas`: some kernel is a
    gemm on numpy's BLAS, which then runs on the call's thread count too (runtime/blas_threads.py)."""

    def __init__(self, plan: LaunchPlan, steps: tuple, bound: dict[int, np.ndarray], threads: int, blas: bool = False):
        order = buffer_order(plan)
        slot = {k: n for n, k in enumerate(order)}
        self.steps, self.threads, self.blas, self.lock = steps, threads, blas, threading.Lock()
        self.hosts = any(isinstance(st, HostStep) for st in steps)  # numpy arrays needed per call
        self.arrays: list = [None] * len(order)  # slot -> its resident array (HostSteps read them)
        self._torch_dtypes: dict = {}
        self.ptrs = (ctypes.c_void_p * max(1, len(order)))()
        self.keep: list[np.ndarray] = []  # arrays whose pointers the table holds between calls
        for k, arr in bound.items():
            arr = np.ascontiguousarray(arr)
            self.keep.append(arr)
            self.ptrs[k], self.arrays[k] = address(arr), arr
        free = [k for k in range(len(plan.inputs)) if k not in bound]
        self.free = tuple(free)  # slots of the caller's inputs (input k is slot k)
        self.specs = tuple((plan.inputs[k].shape, plan.inputs[k].dtype.np) for k in free)
        self.order = tuple(plan.inputs[k].name for k in free)  # a call by name passes them in this order
        self.names = frozenset(self.order)
        results = {r.key for r in plan.results}
        self.outs = tuple((slot[r.key], r.shape, plan.buffers[r.key].dtype.np) for r in plan.results)
        for key in order[len(plan.inputs) :]:
            if key not in results:  # an intermediate between kernels: resident
                arr = _alloc(np.empty, plan.buffers[key])
                self.keep.append(arr)
                self.ptrs[slot[key]], self.arrays[slot[key]] = address(arr), arr
        self.scratch = len(self.keep) > len(bound)  # intermediates shared between calls: the lock
        self.objects, self._desc = self._object_call(plan, order)

    def _object_call(self, plan: LaunchPlan, order: tuple[str, ...]) -> tuple:
        """OBJECT_CALL's function and this program's `pn_objects` (None, None: a program with numpy
        BLAS steps, or no object layout here)."""
        fn = object_entry() if self.steps and not self.hosts else None
        if fn is None:
            return None, None
        nbytes = [0] * len(order)
        for k, t in enumerate(plan.inputs):
            nbytes[k] = math.prod(t.shape) * t.dtype.np.itemsize
        for k, arr in enumerate(self.arrays):
            if arr is not None:
                nbytes[k] = arr.nbytes
        for k, shape, dt in self.outs:
            nbytes[k] = math.prod(shape) * dt.itemsize
        slots = (*self.free, *(k for k, _, _ in self.outs))
        self._bytes = (ctypes.c_long * len(order))(*nbytes)
        self._slots = (ctypes.c_int * max(1, len(slots)))(*slots)
        data_at, item_at = object_layout()
        desc = _Objects(
            ctypes.cast(self.steps[0], ctypes.c_void_p).value,
            ctypes.addressof(self.ptrs),
            ctypes.addressof(self._bytes),
            ctypes.addressof(self._slots),
            len(order),
            len(slots),
            len(self.outs),
            data_at,
            item_at,
        )
        return fn, desc

    def call(self, arrays: tuple, threads, out) -> list | None:
        """The results of one call on the caller's arrays (free inputs in order), or None when a
        check fails: that call takes the general path, which explains the failure."""
        if len(arrays) != len(self.specs) or not (threads is None or (type(threads) is int and threads > 0)):
            return None
        torch = None
        for a, (shape, dt) in zip(arrays, self.specs):
            if type(a) is np.ndarray:
                if a.shape != shape or (a.dtype is not dt and a.dtype != dt) or not a.flags.c_contiguous:
                    return None
            elif (torch := _torch_of(a)) is None or not _plain_tensor(torch, a, shape, self._torch_dtype(dt)):
                return None
        if torch is not None:  # torch in, torch out (runtime/arrays.py's rule); out= takes the general path
            if out is not None or self.hosts:  # numpy's BLAS reads numpy arrays
                return None
            results = [torch.empty(shape, dtype=self._torch_dtype(dt)) for _, shape, dt in self.outs]
        elif out is None:
            results = [np.empty(shape, dt) for _, shape, dt in self.outs]
        else:
            results = list(out) if isinstance(out, tuple | list) else [out]
            if not self._writable(results, arrays, self.objects is None):
                return None
        if torch is not None or self.objects is None:
            self.launch(arrays, results, threads)
        elif self._run_objects(arrays, results, threads, out is not None):
            return None  # an out= array overlaps another buffer: the general path copies
        return results

    def _run_objects(self, arrays: tuple, results: list, threads: int | None, check: bool) -> int:
        """One call of OBJECT_CALL on numpy `arrays` and `results` (contiguous, checked); nonzero
        when `check` found an output overlapping another buffer (nothing ran)."""
        objs, nt = (*arrays, *results), threads or self.threads
        if self.blas:  # a gemm on numpy's BLAS inside the entry: on the call's thread count too
            with self.lock, blas_threads(nt):
                return self.objects(self._desc, objs, check, nt)
        if self.scratch:
            with self.lock:
                return self.objects(self._desc, objs, check, nt)
        return self.objects(self._desc, objs, check, nt)

    def _torch_dtype(self, dt: np.dtype):
        """torch's dtype of numpy's `dt` (looked up once)."""
        t = self._torch_dtypes.get(dt)
        if t is None:
            t = self._torch_dtypes[dt] = numpy_to_torch_dtype(dt)
        return t

    def _writable(self, outs: list, arrays: tuple, overlap: bool = True) -> bool:
        """Whether the caller's `out=` arrays can be written in place: numpy, of the results'
        shapes and dtypes, contiguous, writable, and (with `overlap`; else OBJECT_CALL tests it)
        sharing no memory with an input or another."""
        if len(outs) != len(self.outs):
            return False
        for o, (_, shape, dt) in zip(outs, self.outs):
            if type(o) is not np.ndarray or o.shape != shape or (o.dtype is not dt and o.dtype != dt):
                return False
            if not ((f := o.flags).c_contiguous and f.writeable):
                return False
        return not overlap or not any(
            np.may_share_memory(o, b) for k, o in enumerate(outs) for b in (*arrays, *self.keep, *outs[k + 1 :])
        )

    def launch(self, inputs, results: list, threads: int | None) -> None:
        """Write the caller's inputs' and the results' pointers into the table and run (inputs:
        every free input, contiguous)."""
        with self.lock:
            p = self.ptrs
            for k, a in zip(self.free, inputs):
                p[k] = address(a) if type(a) is np.ndarray else a.data_ptr()
            for (k, _, _), r in zip(self.outs, results):
                p[k] = address(r) if type(r) is np.ndarray else r.data_ptr()
            nt = threads or self.threads
            if self.blas:
                with blas_threads(nt):
                    self._run(p, nt, inputs, results)
            else:
                self._run(p, nt, inputs, results)

    def _run(self, p, nt: int, inputs, results: list) -> None:
        """The steps in order on the table `p` (the caller holds the lock)."""
        if not self.hosts:
            if self.steps:  # none: every kernel's domain is empty (a result of no element), nothing runs
                self.steps[0](p, nt)
            return
        arrays = self.arrays.copy()
        for k, a in zip(self.free, inputs):
            arrays[k] = a
        for (k, _, _), r in zip(self.outs, results):
            arrays[k] = r
        for st in self.steps:
            if type(st) is HostStep:
                st.host.run([arrays[k] for k in st.ins], arrays[st.out])
            else:
                st(p, nt)
