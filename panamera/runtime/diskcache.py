"""The on-disk cache of built libraries: a private directory whose entries are verified before
they are loaded.

A shared library that is loaded runs its code in this process, so the cache is trusted only
as far as it is private:

1. the directory ($PANAMERA_CACHE, default ~/.cache/panamera) is created mode 0700;
2. one that is not a directory, cannot be created or written, is owned by another user or is
   writable by group or others is refused with a `CacheWarning` (once per process), and this
   process builds into a private temporary directory instead;
3. every library is written with its SHA-256 in a sidecar (`emu_KEY.so.sha256`), both through
   a temporary file and an atomic rename, so that concurrent processes never see half a file;
4. a library is loaded only when its bytes hash to its sidecar's digest; a missing, corrupt or
   mismatched entry is rebuilt (one logged line), never an error that lasts until the cache is
   cleared.

The sidecar protects against corruption (a truncated write, a disk error, a stray edit), not
against someone who can write the directory: that is what rule 2 keeps out.

>>> import os, tempfile
>>> d = Path(tempfile.mkdtemp())
>>> lib = store(d, "emu_k.so", b"bytes")
>>> verified(lib), (lib.stat().st_mode & 0o777) == 0o600
(True, True)
>>> _ = lib.write_bytes(b"other"); verified(lib)
False
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import BackendError, CacheWarning

ENV = "PANAMERA_CACHE"  # a directory for the built libraries, or "off"
SIDECAR = ".sha256"
log = logging.getLogger("panamera.cache")
T = TypeVar("T")
_private: list[str] = []  # this process's own directory (cache off, or refused)
_refused: set[str] = set()  # directories already warned about


def location() -> Path | None:
    """Where built libraries are kept: $PANAMERA_CACHE, default ~/.cache/panamera; None if off."""
    env = os.environ.get(ENV, "")
    if env.lower() == "off":
        return None
    return Path(env).expanduser() if env else Path.home() / ".cache" / "panamera"


def private_dir() -> Path:
    """This process's own temporary directory (mode 0700), removed at exit."""
    if not _private:
        _private.append(tempfile.mkdtemp(prefix="panamera-"))
        atexit.register(shutil.rmtree, _private[0], True)
    return Path(_private[0])


def problem(d: Path) -> str | None:
    """Why `d` cannot hold libraries this process loads (None: it can). Creates it, mode 0700,
    when it does not exist."""
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        return "it exists and is not a directory"
    except OSError as e:
        return f"it cannot be created ({e.strerror or e})"
    try:
        st = d.stat()
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"it is owned by another user (uid {st.st_uid}); a library planted there would run in this process"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"it is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode "
            f"{stat.S_IMODE(st.st_mode):o}); a library planted there would run in this process; `chmod 700` it"
        )
    if not os.access(d, os.R_OK | os.W_OK | os.X_OK):
        return "it is not writable"
    return None


def directory() -> Path:
    """The directory libraries are built into and loaded from: the cache when it is usable,
    else (the cache off, or refused with a CacheWarning) this process's private directory."""
    d = location()
    if d is None:
        return private_dir()
    why = problem(d)
    if why is None:
        return d
    if str(d) not in _refused:
        _refused.add(str(d))
        msg = f"kernel cache {d} ({ENV}) is not used: {why}; building into a private temporary directory instead"
        warnings.warn(msg, CacheWarning, stacklevel=3)
    return private_dir()


def digest(path: Path | str) -> str:
    """The SHA-256 of a file, read in 1 MiB chunks (hashlib.file_digest is Python 3.11's; 3.10 is
    supported)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same directory and a rename:
    a reader sees the old file or the new one, never part of one. Mode 0600."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def store(d: Path, name: str, data: bytes) -> Path:
    """Put a built library into `d` under `name`, with its SHA-256 sidecar; returns its path."""
    lib = d / name
    _atomic_write(lib, data)
    _atomic_write(lib.with_name(name + SIDECAR), (hashlib.sha256(data).hexdigest() + "\n").encode())
    return lib


def put(lib: Path, data: bytes, who: str = "emulator") -> Path:
    """`store` the library at `lib`; where the cache cannot take it (a full disk, a directory
    made read-only meanwhile) it goes to this process's private directory, with a warning."""
    try:
        return store(lib.parent, lib.name, data)
    except OSError as e:
        if lib.parent == private_dir():
            raise BackendError(f"{who}: cannot write the built library {lib} ({e.strerror or e})") from None
        log.warning("kernel cache: cannot write %s (%s); using a private temporary directory", lib, e.strerror or e)
        return store(private_dir(), lib.name, data)


def verified(lib: Path) -> bool:
    """Whether `lib` exists and its bytes hash to the digest its sidecar recorded."""
    side = lib.with_name(lib.name + SIDECAR)
    try:
        want = side.read_text(encoding="ascii").strip()
        return lib.is_file() and not lib.is_symlink() and digest(lib) == want
    except (OSError, ValueError):
        return False


def discard(lib: Path, why: str) -> None:
    """Remove a library (and its sidecar) that failed verification or loading; it is rebuilt."""
    log.warning("kernel cache: %s %s; rebuilding it", lib, why)
    for p in (lib, lib.with_name(lib.name + SIDECAR)):
        try:
            p.unlink(missing_ok=True)
        except OSError:
            pass


def ensure(lib: Path, compile_bytes: Callable[[], bytes], who: str) -> Path:
    """The path of a verified file for `lib`: the cached one when its bytes match its sidecar,
    else built by `compile_bytes` and stored (a changed entry is discarded first). The cuda
    backend keeps its NVRTC cubins this way; `load` adds loading them as shared libraries."""
    if lib.exists() and not verified(lib):
        discard(lib, "does not match the SHA-256 recorded when it was built (corrupt or changed)")
    if not lib.exists():
        lib = put(lib, compile_bytes(), who)
    return lib


def load(
    lib: Path,
    compile_bytes: Callable[[], bytes],
    who: str,
    opener: Callable[[Path], T] = lambda p: ctypes.CDLL(str(p)),
    failures: tuple[type[BaseException], ...] = (OSError,),
) -> T:
    """`opener(path)` of the library at `lib`, opened only when its bytes match its sidecar; a
    missing, changed or unopenable one (`opener` raises one of `failures`) is built again by
    `compile_bytes` (once) and stored verified; a second failure is a BackendError naming `who`.
    Every backend that builds libraries loads them through here: the emulator and the CPU target
    (a ctypes.CDLL, the default), the cuda backend's cubins (CuPy's module load).

    >>> d = Path(tempfile.mkdtemp()); opened = []
    >>> def flaky(p):
    ...     opened.append(p.read_bytes())
    ...     if len(opened) == 1:
    ...         raise OSError("bad")
    ...     return "module"
    >>> _ = store(d, "cubin_k.cubin", b"old")
    >>> load(d / "cubin_k.cubin", lambda: b"new", "cuda backend", flaky), opened
    ('module', [b'old', b'new'])
    """
    for attempt in (0, 1):
        lib = ensure(lib, compile_bytes, who)
        try:
            return opener(lib)
        except failures as e:  # verified bytes that do not load: rebuilt once, then an error
            if attempt:
                raise BackendError(f"{who}: the library built for this kernel does not load: {e}") from None
            discard(lib, f"does not load ({e})")
    raise AssertionError("unreachable")


PREFIXES = ("emu_", "cpu_", "cubin_")  # the emulator's libraries, the CPU target's, the cuda backend's cubins
SUFFIXES = (".so", ".cubin")  # what counts as one built library (a sidecar does not)


def entries(d: Path) -> list[Path]:
    """The cache's files: libraries, their sidecars and temporary files left by a crash."""
    if not d.is_dir():
        return []
    pats = [f"{pre}*" for p in PREFIXES for pre in (p, "." + p)]
    return [p for pat in pats for p in d.glob(pat) if p.is_file() and not p.is_symlink()]
