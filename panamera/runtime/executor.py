"""Running a launch plan: binding the caller's arrays, buffers, resident workspaces, launches.

An `Executor` is made once per compiled computation from its `LaunchPlan` and source. Per call it
checks and binds the inputs, allocates the outputs, keeps the resident buffers (workspaces,
partials and counters: initialised by the first call's `init_once` launches, left at the identity
/ zero by the last block of every call) and launches the plan on a backend: the emulator (the
CUDA source compiled by g++, runs on the CPU) or CUDA (CuPy). Each backend's kernel functions are
looked up once. Calls are serialized by a lock.

Resident buffers are kept per (device, stream) on a GPU (`cuda_resident_key`): calls on one
stream are ordered by the stream, and two streams never share a counter or a workspace, so they
may call one computation concurrently (each stream's first call pays the initialisation, and
holds its own copy of the residents). The emulator has one resident set.

Inputs are passed as they are when they are C-contiguous and aligned for the widest vector load
any kernel makes of them (`InputSpec.align`: vector width x item size); otherwise they are copied
into a fresh, aligned buffer. An offset view (x[1:], a split chunk, a storage offset) would else
fault on a GPU (cudaErrorMisalignedAddress), and fails the launch on the emulator.

The caller's arrays (numpy, CuPy, torch, DLPack or `__array__` objects) cross into numpy and
CuPy, and the results back into the caller's kind, through runtime/arrays.py.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ..errors import DTypeError, IndexRangeError, InputError, OptionError, OutOfMemoryError
from . import arrays as arrays_mod
from . import cuda as cuda_backend
from . import emulator
from .plan import BufferSpec, LaunchPlan, LaunchRole


def aligned_empty(n: int, dt) -> np.ndarray:
    """An uninitialised array of n elements whose data starts on a 64-byte boundary."""
    dt = np.dtype(dt)
    raw = np.empty(n * dt.itemsize + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off : off + n * dt.itemsize].view(dt)


def aligned_copy(a: np.ndarray) -> np.ndarray:
    out = aligned_empty(a.size, a.dtype).reshape(a.shape)
    out[...] = a
    return out


def needs_copy(address: int, contiguous: bool, align: int) -> bool:
    """Whether an input at `address` must be copied before kernels read it with vector loads of
    `align` bytes (or as a flat array).

    >>> needs_copy(0x1000, True, 16), needs_copy(0x1004, True, 16), needs_copy(0x1004, True, 4)
    (False, True, False)
    """
    return not contiguous or address % max(align, 1) != 0


EMULATOR = "emulator"  # the emulator's resident set: one per computation


def cuda_resident_key(device: int, stream: int) -> str:
    """The resident set of a call on a GPU: one per (device, stream handle), so that calls on two
    streams never mix their arrivals at a counter.

    >>> cuda_resident_key(0, 0), cuda_resident_key(1, 0x5a0)
    ('cuda:0:stream:0x0', 'cuda:1:stream:0x5a0')
    """
    return f"cuda:{device}:stream:{stream:#x}"


def current_cuda_key(cupy) -> str:
    """The resident key of the current device and CuPy's current stream."""
    return cuda_resident_key(cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr)


def _alloc(alloc, spec: BufferSpec):
    dt = spec.dtype.np if spec.dtype is not None else np.dtype(np.uint32)
    try:
        if dt.names:  # a struct workspace: raw bytes (CuPy has no structured dtypes)
            return alloc(max(spec.size, 1) * dt.itemsize, np.uint8)
        return alloc(max(spec.size, 1), dt)
    except MemoryError as e:  # numpy's and CuPy's out-of-memory errors are MemoryErrors
        raise OutOfMemoryError(
            f"cannot allocate buffer {spec.key!r} ({spec.role}, {spec.size} x {dt}, "
            f"{max(spec.size, 1) * dt.itemsize} bytes): {e}"
        ) from None


class Executor:
    """Runs one launch plan. `target` is "emulator" or "cuda"."""

    def __init__(self, plan: LaunchPlan, source: str, signatures: tuple, target: str):
        self.plan, self.source, self.signatures, self.target = plan, source, signatures, target
        # Resident buffers per backend (EMULATOR, or cuda_resident_key(device, stream)), by buffer key.
        self.resident: dict[str, dict] = {}
        self._functions: dict[str, dict] = {}  # per backend: kernel name -> launchable
        self._lock = threading.Lock()

    # -- binding -------------------------------------------------------------------------------
    def bind(self, arrays, named, bound: dict | None = None) -> list[arrays_mod.Arg]:
        """The caller's arrays in placeholder order, classified (runtime/arrays.py) and checked
        against each input's shape and dtype; `bound` holds the arrays of the inputs the
        program supplies itself (constant masks, by input position), which the caller omits."""
        inputs, bound = self.plan.inputs, bound or {}
        free = [t for k, t in enumerate(inputs) if k not in bound]
        if named:
            by_name = {t.name: t for t in free}
            unknown = set(named) - set(by_name)
            if unknown:
                raise InputError(f"unknown input name(s) {sorted(unknown)}; inputs are {[t.name for t in free]}")
            if arrays:
                raise InputError("pass inputs either positionally or by name, not both")
            missing = [t.name for t in free if t.name not in named]
            if missing:
                raise InputError(f"missing input(s) {missing}")
            arrays = [named[t.name] for t in free]
        if len(arrays) != len(free):
            raise InputError(f"expected {len(free)} input(s) {[t.name for t in free]}, got {len(arrays)}")
        given = iter(arrays)
        arrays = [bound[k] if k in bound else next(given) for k in range(len(inputs))]
        args = [arrays_mod.adopt(a, t.name) for t, a in zip(inputs, arrays)]
        for t, a in zip(inputs, args):
            arrays_mod.refuse_grad(a, t.name)
            if tuple(a.shape) != t.shape:
                raise InputError(f"input {t.name!r}: expected shape {t.shape}, got {tuple(a.shape)}")
            if a.dtype != t.dtype.np:
                raise DTypeError(f"input {t.name!r}: expected dtype {t.dtype}, got {a.dtype}")
        return args

    def __call__(self, args: list, order: str = "forward", seed: int = 0) -> list:
        """Run on bound inputs (`bind`); the results come back as the caller's kind."""
        if order not in emulator.ORDERS:
            raise OptionError(f"unknown thread order {order!r}; use one of {sorted(emulator.ORDERS)}")
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed < 2**32:
            raise OptionError(f"seed must be an int in [0, 2**32), got {seed!r}")
        args = [
            a if isinstance(a, arrays_mod.Arg) else arrays_mod.adopt(a, t.name) for a, t in zip(args, self.plan.inputs)
        ]
        caller = arrays_mod.caller_of(args)
        if self.target == "emulator":
            aligns = [t.align for t in self.plan.inputs]
            hosted = [_host_input(arrays_mod.to_host(a), n) for a, n in zip(args, aligns)]
            return arrays_mod.deliver(self._run_emulator(hosted, order, seed), caller)
        cuda_backend.module(self.source)  # a clear BackendError without CuPy or a GPU
        import cupy

        with arrays_mod.cuda_context(caller, cupy):  # the caller's device and current stream
            return arrays_mod.deliver(self._run_cuda(args), caller)

    # -- buffers and launches -------------------------------------------------------------------
    def _buffers(self, alloc, inputs, backend: str) -> tuple[dict, bool]:
        """Buffers of one call, and whether the resident ones are new (their init must run)."""
        bufs = {t.key: a for t, a in zip(self.plan.inputs, inputs)}
        fresh = backend not in self.resident
        resident = self.resident.setdefault(backend, {})
        for key, spec in self.plan.buffers.items():
            if spec.role.resident:
                if key not in resident:
                    resident[key] = _alloc(alloc, spec)
                bufs[key] = resident[key]
            elif key not in bufs:
                bufs[key] = _alloc(alloc, spec)
        return bufs, fresh

    def _launches(self, backend: str, fresh: bool, launch) -> None:
        try:
            for ln in self.plan.launches:
                if ln.role != LaunchRole.INIT_ONCE or fresh:
                    launch(ln)
        except BaseException:  # a failed call may leave workspaces dirty: start over next time
            self.resident.pop(backend, None)
            raise

    def _results(self, bufs, inputs) -> list:
        for c in self.plan.checks:  # an index input out of range: an error, never a wrong answer
            pos = int(bufs[c.key][0])
            if pos != c.sentinel:
                got = int(inputs[c.input_index].reshape(-1)[pos])
                raise IndexRangeError(
                    f"{c.op}: index {c.tensor!r} holds {got} at position {pos}, outside [0, {c.extent}) "
                    f"(the table's rows)"
                )
        out, used = [], set()
        for r in self.plan.results:
            if r.input_index >= 0:
                out.append(inputs[r.input_index].copy().reshape(r.shape))
                continue
            a = bufs[r.key][: r.size].reshape(r.shape)
            out.append(a.copy() if r.key in used else a)  # two outputs never share memory
            used.add(r.key)
        return out

    def _run_emulator(self, inputs, order, seed):
        fns = self._functions.get(EMULATOR)
        if fns is None:
            lib = emulator.build(self.source, self.signatures)
            fns = self._functions[EMULATOR] = {name: emulator.function(lib, name) for name, _ in self.signatures}
        with self._lock:
            bufs, fresh = self._buffers(aligned_empty, inputs, EMULATOR)

            def launch(ln):
                args = [ctypes.c_void_p(bufs[key].ctypes.data) for _, key in ln.args]
                emulator.run(
                    fns[ln.kernel],
                    ln.kernel,
                    ln.grid,
                    ln.block,
                    args,
                    order,
                    seed,
                    ln.cooperative,
                    ln.cluster,
                    ln.dynamic_smem_bytes,
                )

            self._launches(EMULATOR, fresh, launch)
            return self._results(bufs, inputs)

    def _run_cuda(self, args):
        mod = cuda_backend.module(self.source)  # a clear BackendError without CuPy or a GPU
        import cupy

        inputs = [_device_input(cupy, arrays_mod.to_device(a, cupy), t.align) for a, t in zip(args, self.plan.inputs)]
        backend = current_cuda_key(cupy)
        device = f"cuda:{cupy.cuda.Device().id}"  # functions are per device, residents per stream
        fns = self._functions.get(device)
        if fns is None:
            fns = self._functions[device] = {name: mod.get_function(name) for name, _ in self.signatures}
        with self._lock:
            bufs, fresh = self._buffers(lambda n, dt: cupy.empty(n, dt), inputs, backend)

            def launch(ln):
                args = tuple(bufs[key] for _, key in ln.args)
                if ln.cluster > 8:  # __cluster_dims__ past the portable 8: the function must allow it
                    cupy.cuda.driver.funcSetAttribute(fns[ln.kernel].kernel.ptr, NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
                shared = ln.dynamic_smem_bytes  # schedule/dynsmem.py: past 48 KiB the function must opt in
                if shared and shared > fns[ln.kernel].max_dynamic_shared_size_bytes:
                    fns[ln.kernel].max_dynamic_shared_size_bytes = shared  # cudaFuncAttributeMaxDynamicSharedMemorySize
                if ln.cooperative:  # cuLaunchCooperativeKernel: all blocks resident, or a launch error
                    fns[ln.kernel].kernel(ln.grid, ln.block, args, shared_mem=shared, enable_cooperative_groups=True)
                else:
                    fns[ln.kernel](ln.grid, ln.block, args, shared_mem=shared)

            self._launches(backend, fresh, launch)
            return self._results(bufs, inputs)


NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # CUfunction_attribute (cuda.h)


def _host_input(a, align: int) -> np.ndarray:
    if type(a).__module__.startswith("cupy"):
        a = a.get()
    a = np.asarray(a)
    if needs_copy(a.ctypes.data, a.flags.c_contiguous, align):
        a = aligned_copy(a)
    return a


def _device_input(cupy, a, align: int):
    a = cupy.asarray(a)
    # cupy.ascontiguousarray keeps a contiguous view's offset pointer: copy instead (a fresh
    # allocation from CuPy's pool is 256-byte aligned).
    if needs_copy(a.data.ptr, a.flags.c_contiguous, align):
        a = a.copy(order="C")
    return a
