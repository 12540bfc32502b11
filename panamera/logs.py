"""Logging, progress and optional dependencies: what long work says while it runs.

Every module logs to a child of the `panamera` logger (`get("compiler")` is
`logging.getLogger("panamera.compiler")`): DEBUG for each stage and its time, INFO for progress
(one subgraph, one workload, one timed run). A library never configures logging, so by default
nothing is printed (the `panamera` logger has a NullHandler); `logging.basicConfig(level="INFO")`
shows the progress lines, and the `panamera` command calls `configure` for its `-v`/`-q`.

`steps(...)` is the one progress mechanism: on a terminal (after `configure`) it draws a bar on
stderr; anywhere else it logs a plain line when a step starts `INTERVAL` seconds or more after
the last line (or after the work began), so a piped run is never silent for long and a quick
one says nothing.

>>> import logging
>>> with steps("compiling", 3, get("doc")) as s:
...     for name in ("a", "b", "c"):
...         s.step(name)
>>> s.done, s.total
(3, 3)
>>> require("math", "", "a doctest")  # present: nothing happens
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from .enums import StrEnum
from .errors import MissingDependency

ROOT = "panamera"
INTERVAL = 2.0  # seconds: the least time between two plain progress lines (and before the first)
logging.getLogger(ROOT).addHandler(logging.NullHandler())


def get(name: str) -> logging.Logger:
    """The logger of one part of Panamera: `get("onnx")` is `logging.getLogger("panamera.onnx")`."""
    return logging.getLogger(f"{ROOT}.{name}")


class Verbosity(StrEnum):
    """How much the `panamera` command says on stderr besides its results."""

    QUIET = "quiet"  # warnings and errors only
    NORMAL = "normal"  # progress and info lines
    DEBUG = "debug"  # every stage and its time

    @property
    def level(self) -> int:
        return {Verbosity.QUIET: logging.WARNING, Verbosity.NORMAL: logging.INFO, Verbosity.DEBUG: logging.DEBUG}[self]


@dataclass
class _State:
    console: object | None = None  # rich Console on stderr, set by configure
    bar: bool = False  # draw progress bars (a terminal, not quiet)
    live: object | None = None  # the rich Progress being drawn
    depth: int = 0


_state = _State()


class _ConsoleHandler(logging.Handler):
    """Log records as one line each on the stderr console (so they print above a live bar)."""

    def __init__(self, console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.levelno == logging.INFO:
                line = f"panamera: {msg}"
            else:
                part = record.name.removeprefix(ROOT).lstrip(".")
                line = f"panamera: {record.levelname.lower()}: {part + ': ' if part else ''}{msg}"
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        except Exception:  # logging must never break the work it reports on
            self.handleError(record)


def configure(verbosity: Verbosity = Verbosity.NORMAL, console=None, bar: bool | None = None) -> None:
    """Send the `panamera` logger to stderr at `verbosity` (the CLI's -q / -v); `bar` (default:
    stderr is a terminal and not quiet) draws progress bars instead of progress lines. Calling it
    again replaces the previous configuration."""
    from rich.console import Console

    logger = logging.getLogger(ROOT)
    for h in [h for h in logger.handlers if isinstance(h, _ConsoleHandler)]:
        logger.removeHandler(h)
    console = console if console is not None else Console(stderr=True, highlight=False, soft_wrap=True)
    logger.addHandler(_ConsoleHandler(console))
    logger.setLevel(verbosity.level)
    _state.console = console
    _state.bar = (console.is_terminal if bar is None else bar) and verbosity != Verbosity.QUIET


def reset() -> None:
    """Undo `configure`: no handler of ours, the level inherited, no bar (the end of a command)."""
    logger = logging.getLogger(ROOT)
    for h in [h for h in logger.handlers if isinstance(h, _ConsoleHandler)]:
        logger.removeHandler(h)
    logger.setLevel(logging.NOTSET)
    _state.console, _state.bar = None, False


def console():
    """The stderr console `configure` set (None before): warnings print through it, above a bar."""
    return _state.console


@dataclass
class Steps:
    """Progress through `total` steps (None: unknown); `step(label)` says the next one starts."""

    what: str
    total: int | None
    logger: logging.Logger
    interval: float = INTERVAL  # seconds between two plain lines
    done: int = 0
    _task: object | None = None
    _level: int = logging.INFO
    _t0: float = field(default_factory=lambda: time.perf_counter())
    _last: float | None = None  # when the last plain line was said (None: the start)
    _lines: int = 0

    def step(self, label: str = "") -> None:
        """Step `done + 1` starts (the previous one, if any, is done)."""
        k = self.done
        if self._task is not None:
            desc = f"{self.what}: {label}"[:60]
            _state.live.update(self._task, completed=k, total=self.total, description=desc)
        else:
            now = time.perf_counter()
            if now - (self._t0 if self._last is None else self._last) >= self.interval:
                of = f"/{self.total}" if self.total is not None else ""
                self.logger.log(self._level, "%s %d%s%s", self.what, k + 1, of, f": {label}" if label else "")
                self._last, self._lines = now, self._lines + 1
        self.done = k + 1

    def _close(self) -> None:
        dt = time.perf_counter() - self._t0
        if self._task is not None:
            _state.live.remove_task(self._task)
        level = self._level if self._lines else logging.DEBUG  # a closing line after progress lines
        self.logger.log(level, "%s: %d step(s) in %.1f s", self.what, self.done, dt)


@contextlib.contextmanager
def steps(
    what: str, total: int | None, logger: logging.Logger | None = None, interval: float | None = None
) -> Iterator[Steps]:
    """Report progress through `total` steps of `what` (see the module docstring; `interval`
    defaults to INTERVAL). Nested steps get a second bar on a terminal, and log at DEBUG when
    plain (the outer lines are enough)."""
    s = Steps(what, total, logger or logging.getLogger(ROOT), INTERVAL if interval is None else interval)
    if _state.depth:
        s._level = logging.DEBUG
    if _state.bar and s.logger.isEnabledFor(logging.INFO):
        if _state.live is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            _state.live = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=_state.console,
                transient=True,
            )
            _state.live.start()
        s._task = _state.live.add_task(what, total=total)
    _state.depth += 1
    try:
        yield s
    finally:
        _state.depth -= 1
        s._close()
        if _state.depth == 0 and _state.live is not None:
            _state.live.stop()
            _state.live = None


def each(items, what: str, logger: logging.Logger | None = None, label=str, interval: float | None = None) -> Iterator:
    """`items` one by one, with `steps` progress (the loop need not be indented under a `with`).

    >>> [x * 2 for x in each([1, 2], "doubling", get("doc"))]
    [2, 4]
    """
    items = list(items)
    with steps(what, len(items), logger, interval) as s:
        for x in items:
            s.step(label(x))
            yield x


class Extra(StrEnum):
    """The optional dependencies and how to install each (pyproject.toml's extras)."""

    MATPLOTLIB = "matplotlib"
    ONNXRUNTIME = "onnxruntime"
    TORCH = "torch"
    CUPY = "cupy"

    @property
    def install(self) -> str:
        return {
            Extra.MATPLOTLIB: "pip install 'panamera[plot]'",
            Extra.ONNXRUNTIME: "pip install onnxruntime",
            Extra.TORCH: "pip install torch",
            Extra.CUPY: "pip install 'panamera[cuda12]' (or [cuda13])",
        }[self]


def require(module: str, install: str, purpose: str) -> None:
    """Raise MissingDependency naming `purpose` and how to install `module` unless it can be
    imported; checked before long work starts (the module is found, not imported: fast).

    >>> require("no_such_module_xyz", Extra.ONNXRUNTIME.install, "--verify=onnxruntime")
    Traceback (most recent call last):
    panamera.errors.MissingDependency: --verify=onnxruntime needs no_such_module_xyz, which is not installed: pip install onnxruntime
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingDependency(f"{purpose} needs {module}, which is not installed: {install}")


def require_extra(extra: Extra, purpose: str) -> None:
    """`require` for one of the known optional dependencies."""
    require(extra.value, extra.install, purpose)
