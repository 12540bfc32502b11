"""Errors Panamera raises. Every message names the tensor, axis, op or kernel at fault."""


class PanameraError(Exception):
    """Base class of every error Panamera raises on purpose."""


class ShapeError(PanameraError, ValueError):
    """Shapes that do not broadcast, reshape or match the placeholder."""


class SymbolicShapeError(ShapeError):
    """An op on symbolic extents (frontend/symbolic.py) that cannot be proven for every value of
    the symbols at build time: a sum or comparison of extents, a slice bound, two symbols
    broadcast together."""


class SymbolBindingError(ShapeError):
    """At call time: a symbol bound to two sizes, or an array whose static extent does not fit its
    placeholder (runtime/dynamic.py); the message names the symbol, tensor, axis and sizes."""


class EmptyAxisError(ShapeError, IndexError):
    """A gather (`take`, `x[ids]`, `take_along_axis`, `gather_nd`, ONNX Gather) from an axis of
    extent 0 with a non-empty index: no id is in range and there is no element to clamp to (numpy
    and eager PyTorch raise an IndexError). Raised when the gather is built where the extents are
    static, at call time where they are symbolic; the message names the op, tensor, axis and index."""


class AxisError(PanameraError, ValueError):
    """An axis out of range or repeated."""


class DTypeError(PanameraError, TypeError):
    """A dtype Panamera does not support, or an array of the wrong dtype."""


class EmptyReductionError(PanameraError, ValueError):
    """A reduction over a zero-size extent whose combiner has no identity (max, min)."""


class InputError(PanameraError, ValueError):
    """An array passed to a compiled kernel that does not fit its placeholder."""


class IndexRangeError(InputError, IndexError):
    """An index input holding an id outside the range its op accepts (an IndexError, as numpy's
    and eager PyTorch's); the message names the op, the index tensor, the id and its position."""


class CompileError(PanameraError, RuntimeError):
    """A host or device compiler rejected generated code; the message shows the source line."""


class BackendError(PanameraError, RuntimeError):
    """A backend that cannot run here (no GPU for `cuda`, no g++ for `emulator`) or failed."""


class OutOfMemoryError(BackendError, MemoryError):
    """A buffer the backend could not allocate: host memory for the emulator, device memory for
    cuda (a `MemoryError` too, so `except MemoryError` still catches it)."""


class LegalityError(PanameraError, ValueError):
    """A transformation whose preconditions do not hold."""


class ModelError(PanameraError, ValueError):
    """A model file that is not ONNX, is truncated, fails onnx's checker or has symbolic shapes."""


class Unsupported(PanameraError):
    """An ONNX node Panamera leaves to the array library (the message says why)."""


class TargetRefused(Unsupported):
    """A target does not cover this program (the message names the kind and the statements);
    another target may: `target="auto"` then runs it on the emulator."""


class ScheduleError(PanameraError, ValueError):
    """A saved schedule that does not fit the subgraph or GPU it is loaded for."""


class OptionError(PanameraError, ValueError):
    """An option value the API does not know: a target, method, stage, split or order."""


class MissingDependency(PanameraError, ImportError):
    """An optional dependency (matplotlib, onnxruntime, torch, CuPy) the request needs is not installed."""


class PanameraWarning(UserWarning):
    """Base class of every warning Panamera issues. `shell` is the same advice as the `panamera`
    command spells it (`--target emulator` where Python says `target="emulator"`).

    >>> w = PanameraWarning('pass target="emulator"', shell="pass --target emulator")
    >>> str(w), w.shell
    ('pass target="emulator"', 'pass --target emulator')
    """

    def __init__(self, message: str = "", shell: str | None = None):
        super().__init__(message)
        self.shell = shell if shell is not None else message


class StaleScheduleWarning(PanameraWarning):
    """A schedule database entry that was skipped: the model plans instead."""


class EagerFallbackWarning(PanameraWarning):
    """`torch.compile(backend="panamera")` runs a graph or a subgraph in eager PyTorch; the message
    gives the reason (a graph that needs autograd, an op Panamera cannot express)."""


class CacheWarning(PanameraWarning):
    """The kernel cache directory cannot be used safely (not private, not writable, not a
    directory): this process builds into a private temporary directory instead."""


class EmulatorWarning(PanameraWarning):
    """`target="auto"` ran a program on the CPU emulator (the CPU target refused it; the message
    says why): a correctness tool, not a fast CPU path."""


__all__ = [
    "OutOfMemoryError", "SymbolicShapeError", "SymbolBindingError",
    "PanameraError", "ShapeError", "EmptyAxisError", "AxisError", "DTypeError", "EmptyReductionError", "InputError", "IndexRangeError", "CompileError",
    "BackendError", "LegalityError", "ModelError", "Unsupported", "TargetRefused", "ScheduleError", "OptionError", "MissingDependency",
    "PanameraWarning", "EagerFallbackWarning", "EmulatorWarning", "StaleScheduleWarning", "CacheWarning",
]  # fmt: skip
