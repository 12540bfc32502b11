"""The emulator backend: the exact CUDA source, compiled by g++ against cuda_emulation.h.

Compiled libraries are cached by the hash of what is compiled (source, header, flags) under
$PANAMERA_CACHE (default ~/.cache/panamera; `off`: a temporary directory per process), a
private directory whose entries are verified against their recorded SHA-256 before they are
loaded (runtime/diskcache.py).
Launches run block by block; `order` picks the thread and block order (forward, reverse,
shuffled), so that a missing barrier is caught. A cooperative launch runs every block at once
(one fiber per thread of the grid, blocks switched at grid-wide waits; cuda_emulation.h); a
launch of thread-block clusters runs each cluster's blocks at once, one cluster after another.

A loaded library keeps its scheduler state (fibers, the current block) in statics, and ctypes
releases the GIL during a launch: every launch holds its library's lock, so that two threads
(or two Compiled objects with the same source, which share the library) never interleave.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..errors import BackendError, CompileError
from . import diskcache

HERE = Path(__file__).parent
HEADER = HERE / "cuda_emulation.h"
# -fwrapv: signed integer overflow wraps, as on the GPU's two's complement adders and in numpy.
FLAGS = ("-std=c++20", "-O1", "-fwrapv", "-shared", "-fPIC", "-DPANAMERA_EMULATOR", "-w")


LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def headers(root: Path | None = None) -> tuple[Path, ...]:
    """The emulator's headers a build reads: `root` (cuda_emulation.h) and, in order, every header
    it includes by a quoted `#include`, recursively. The headers' own include lines are the one
    list: a cached library's key hashes them all (`headers_text`).

    >>> [h.name for h in headers()]
    ['cuda_emulation.h', 'wmma_emulation.h', 'wgmma_emulation.h']
    """
    seen: dict[Path, None] = {}

    def visit(h: Path) -> None:
        if h not in seen:
            seen[h] = None
            for name in LOCAL_INCLUDE.findall(h.read_text()):
                visit(h.parent / name)

    visit(root or HEADER)
    return tuple(seen)


def headers_text(root: Path | None = None) -> str:
    """The text of every header `headers` lists, concatenated: what a library's cache key hashes."""
    return "".join(h.read_text() for h in headers(root))


def library_key(text: str) -> str:
    """The disk-cache key of the emulator library built from `text`: its text, every header it
    reads, the flags and the compiler's identity (`compiler_identity`)."""
    return hashlib.sha256((text + headers_text() + " ".join(FLAGS) + compiler_identity()).encode()).hexdigest()[:24]


ORDERS = {"forward": 0, "reverse": 1, "shuffled": 2}
_loaded: dict[str, ctypes.CDLL] = {}  # by content hash
_by_source: dict[str, ctypes.CDLL] = {}  # by source text: the per-call fast path
_locks: dict[int, threading.Lock] = {}  # by library handle: one launch at a time per library
_locks_guard = threading.Lock()


CACHE_ENV = diskcache.ENV  # a directory for the built libraries, or "off"
cache_location = diskcache.location


def cache_dir() -> Path:
    """The directory libraries are built into: the cache when it is private and writable, else
    this process's temporary directory (runtime/diskcache.py)."""
    return diskcache.directory()


def glue(signatures) -> str:
    """Entry points that unpack an argument array and launch each kernel on the fibers.
    signatures: (kernel name, C parameter types) pairs, or a dict of them."""
    out = []
    for name, types in dict(signatures).items():
        args = ", ".join(f"*({t}*)a[{k}]" for k, t in enumerate(types))
        out.append(f"static void pn_call_{name}(void** a) {{ {name}({args}); }}")
        out.append(
            f'extern "C" const char* pn_emu_launch_{name}(void** a, unsigned gx, unsigned gy, unsigned gz, '
            f"unsigned bx, unsigned by, unsigned bz, int order, unsigned seed, int cooperative, int cluster, "
            f"unsigned smem) {{ if (const char* e = pn_emu::set_dynamic(smem)) return e; "
            f"return cluster > 1 ? pn_emu::launch_clusters(&pn_call_{name}, a, dim3{{gx, gy, gz}}, "
            f"dim3{{bx, by, bz}}, order, seed, cluster) : "
            f"(cooperative ? pn_emu::launch_cooperative : pn_emu::launch)("
            f"&pn_call_{name}, a, dim3{{gx, gy, gz}}, dim3{{bx, by, bz}}, order, seed); }}"
        )
    return "\n".join(out) + "\n"


def build(source: str, signatures) -> ctypes.CDLL:
    """The shared library of `source` (its kernels' parameter types in `signatures`); a source
    seen before in this process costs one dict lookup, a source built before one file check."""
    if source in _by_source:  # the kernels, hence the signatures, are a function of the source
        return _by_source[source]
    text = source + "\n" + glue(signatures)
    key = library_key(text)
    if key in _loaded:
        _by_source[source] = _loaded[key]
        return _loaded[key]
    handle = diskcache.load(cache_dir() / f"emu_{key}.so", lambda: _compile(text), "emulator")
    _loaded[key] = _by_source[source] = handle
    return handle


def compiler(who: str = "emulator") -> str:
    """The C++ compiler: $CXX, else g++, else c++; BackendError naming `who` without one."""
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        raise BackendError(f"{who}: no C++ compiler (g++) found; install g++ or set CXX")
    return cxx


def compiler_identity(who: str = "emulator") -> str:
    """What a built library depends on besides its source, headers and flags: the compiler's
    resolved path and its `--version` banner (an upgraded g++ in place, or another $CXX, keys its
    libraries apart). Asked once per compiler path per process.

    >>> "g++" in compiler_identity() or "clang" in compiler_identity() or "c++" in compiler_identity()
    True
    """
    return _identity(os.path.realpath(compiler(who)))


@cache
def _identity(path: str) -> str:
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        banner = r.stdout.strip() or r.stderr.strip()
    except (OSError, subprocess.SubprocessError) as e:
        banner = f"unknown ({e})"
    return f"{path}|{banner}"


def _compile(text: str, flags: tuple[str, ...] = FLAGS, who: str = "emulator", libs: tuple[str, ...] = ()) -> bytes:
    """The shared library g++ builds from `text` with `flags` (in a temporary directory), as
    bytes; `libs` follow the source on the command line (where the linker needs them). A
    rejected source is a CompileError naming `who` and the offending line."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(text)
        out = Path(tmp) / "k.so"
        cmd = [compiler(who), *flags, "-I", str(HERE), str(src), "-o", str(out), *libs]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise CompileError(_explain(r.stderr, text, f"g++ ({who})"))
        return out.read_bytes()


def _explain(stderr: str, text: str, who: str) -> str:
    m = re.search(r":(\d+):\d+: error: (.*)", stderr) or re.search(r"\((\d+)\): error: (.*)", stderr)
    if not m:
        return f"{who} failed:\n{stderr[-2000:]}"
    line = int(m.group(1))
    lines = text.splitlines()
    ctx = "\n".join(f"{k + 1:5d}| {lines[k]}" for k in range(max(0, line - 4), min(len(lines), line + 2)))
    return f"{who} rejected generated code at line {line}: {m.group(2)}\n{ctx}"


def library_lock(lib: ctypes.CDLL) -> threading.Lock:
    """The lock every launch of `lib` holds (its scheduler state is static)."""
    with _locks_guard:
        return _locks.setdefault(lib._handle, threading.Lock())


@dataclass(frozen=True)
class Entry:
    """One kernel's launch entry point in a built library, and that library's lock."""

    fn: object  # the ctypes function pn_emu_launch_<kernel>
    lock: threading.Lock


def function(lib: ctypes.CDLL, kernel: str) -> Entry:
    """The launch entry point of one kernel of a built library (look it up once, run it often)."""
    fn = getattr(lib, f"pn_emu_launch_{kernel}")
    fn.restype = ctypes.c_char_p
    return Entry(fn, library_lock(lib))


def run(
    entry: Entry,
    kernel: str,
    grid,
    block,
    args: list,
    order: str = "forward",
    seed: int = 0,
    cooperative: bool = False,
    cluster: int = 1,
    shared: int = 0,
) -> None:
    """Launch `entry` (from `function`) under its library's lock; args: ctypes objects, one per
    kernel parameter (c_void_p for pointers); `cooperative`: every block resident at once;
    `cluster` > 1: thread-block clusters of that many blocks along y, each cluster's blocks run
    at once; `shared`: each block's bytes of dynamic shared memory (`extern __shared__`). A fault the emulator detects (a deadlock, a misaligned vector load, distributed
    shared memory of an exited block) is a BackendError."""
    arr = (ctypes.c_void_p * max(1, len(args)))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    with entry.lock:
        err = entry.fn(
            arr,
            *map(ctypes.c_uint, grid),
            *map(ctypes.c_uint, block),
            ctypes.c_int(ORDERS[order]),
            ctypes.c_uint(seed),
            ctypes.c_int(int(cooperative)),
            ctypes.c_int(cluster),
            ctypes.c_uint(shared),
        )
        err = err.decode() if err else None  # the message lives in the library's static buffer
    if err:
        raise BackendError(f"emulator: kernel {kernel}: {err}")


def launch(
    lib: ctypes.CDLL,
    kernel: str,
    grid,
    block,
    args: list,
    order: str = "forward",
    seed: int = 0,
    cooperative=False,
    cluster: int = 1,
    shared: int = 0,
) -> None:
    """Look up and launch one kernel (tests and one-off launches)."""
    run(function(lib, kernel), kernel, grid, block, args, order, seed, cooperative, cluster, shared)
