"""dynamo's symbolic shapes as Panamera's (issue 22): one Panamera program per graph, not per shape.

When dynamo hands over a dynamic graph (automatic dynamic after a second shape, or
`torch._dynamo.mark_dynamic`), AOTAutograd's ATen graph carries `SymInt` extents (s0, 5*s0, ...).
`extent` turns each into a Panamera extent: an int, or a `Dim` (a product of symbols times a
constant, named as torch names them). A subgraph over such extents is built with symbolic
placeholders and compiled ONCE by `pn.compile` into a `DynamicCompiled` (kernels per size class).
Where the symbolic path refuses a subgraph (an op it does not have: `pn.Unsupported`, or a shape
it cannot keep symbolic: `SymbolicShapeError`), `PerShapeSubgraph` compiles it per concrete shape
at call time (`panamera.dynamic.specialize`), each specialization counted with its reason.

>>> import torch  # doctest: +SKIP
>>> extent(5)
5
"""

from __future__ import annotations

import hashlib

import sympy
import torch

import panamera as pn

from ..dynamic import specialize
from ..errors import PanameraError
from ..frontend.symbolic import NAME, Dim, make
from .aten import TranslationError


def extent(s) -> int | Dim:
    """torch's extent (an int or a SymInt) as a Panamera extent: a product of factors times a
    positive constant (s0, 5*s0, s0*s1). A factor is one of torch's symbols, or a sum of them (a
    KV cache after `cat`: s0 + 1), which becomes a symbol of its own (`opaque`), bound at each
    call from the axis that has that extent; anything else raises TranslationError naming it.

    >>> extent(7)
    7
    """
    if isinstance(s, int):
        return s
    if not isinstance(s, torch.SymInt):
        raise TranslationError(f"extent {s!r} is neither an int nor a SymInt")
    expr = s.node.expr
    if expr.is_Integer:
        return int(expr)
    coef, syms = monomial(expr)
    return make(coef, tuple(sorted(syms)))


def monomial(expr) -> tuple[int, list[str]]:
    """A sympy extent as (constant, factor names): sums are factored first (4*s0 + 4 -> 4*(s0 + 1)),
    and each sum factor is named by `opaque`.

    >>> s0 = sympy.Symbol("s0")
    >>> monomial(4 * s0 + 4)
    (4, ['s0p1'])
    """
    coef, rest = sympy.factor(expr).as_coeff_Mul() if expr.is_Add else expr.as_coeff_Mul()
    syms: list[str] = []
    for f in sympy.Mul.make_args(rest):
        base, power = f.as_base_exp()
        if isinstance(base, sympy.Symbol):
            name = str(base)
        elif base.is_Add and base.free_symbols and all(a.is_Integer or a.is_Symbol or a.is_Mul for a in base.args):
            name = opaque(base)
        else:
            name = ""
        if not (name and power.is_Integer and power > 0):
            raise TranslationError(f"symbolic extent {expr} is not a product of symbols or their sums")
        syms += [name] * int(power)
    if not (coef.is_Integer and coef > 0):
        raise TranslationError(f"symbolic extent {expr} has coefficient {coef}")
    return int(coef), syms


def opaque(expr) -> str:
    """The symbol that stands for a sum of torch's symbols: one name per expression, the same in
    every partition (s0 + 1 -> s0p1, s0 - 1 -> s0m1, s0*s1 + s2 -> s0xs1ps2). Panamera treats it as
    independent of its terms (it never proves two such extents equal), which is safe: an op that
    needs them related is refused and runs per shape.

    >>> opaque(sympy.Symbol("s0") - 1)
    's0m1'
    """
    text = str(expr).replace(" ", "").replace("+", "p").replace("-", "m").replace("*", "x")
    return text if NAME.match(text) else "e" + hashlib.sha1(str(expr).encode()).hexdigest()[:10]


def shape_of(val) -> tuple:
    """A FakeTensor's (or tensor's) shape as Panamera extents."""
    return tuple(extent(s) for s in val.shape)


def why_not_symbolic(val) -> str | None:
    """Why a value's shape cannot be kept symbolic, or None."""
    try:
        shape_of(val) if isinstance(val, torch.Tensor) else extent(val)
    except TranslationError as e:
        return str(e)
    return None


def signature(vals: list) -> list:
    """The arguments' extents as Panamera sees them: a tensor's shape, an integer's extent."""
    return [shape_of(v) if isinstance(v, torch.Tensor) else extent(v) if isinstance(v, (int, torch.SymInt)) else None
            for v in vals]  # fmt: skip


def bind(shapes: list, args: tuple) -> dict[str, int]:
    """Each symbol's size at this call, from the arguments' shapes where `shapes` (`signature`)
    has an extent that is one symbol, and from integer arguments that are one symbol."""
    sizes: dict[str, int] = {}
    for h, a in zip(shapes, args):
        if isinstance(h, tuple) and isinstance(a, torch.Tensor):
            pairs = zip(h, a.shape)
        elif isinstance(h, Dim):
            pairs = ((h, a),)
        else:
            continue
        for e, n in pairs:
            if isinstance(e, Dim) and e.coef == 1 and len(e.syms) == 1:
                sizes.setdefault(e.syms[0], int(n))
    return sizes


def split(shape: tuple) -> tuple:
    """A placeholder's shape with each product extent split into its factors (5*s0 -> s0, 5):
    `DynamicCompiled` binds a symbol only from an axis that is that symbol, so an argument of
    extent 5*s0 (a view's input) is passed viewed as (s0, 5) and reshaped back in the program.

    >>> from panamera.frontend.symbolic import sym
    >>> split((sym("s0") * 5, 16))
    (s0, 5, 16)
    """
    out: list = []
    for e in shape:
        if isinstance(e, Dim) and (e.coef != 1 or len(e.syms) > 1):
            out += [make(1, (x,)) for x in e.syms] + ([e.coef] if e.coef != 1 else [])
        else:
            out.append(e)
    return tuple(out)


def number(args: tuple, k: int) -> torch.Tensor:
    """Argument `k` as a tensor: an integer (a size read as a number, partition.is_value) as a 0-d
    int64 tensor on the arguments' device."""
    a = args[k]
    if isinstance(a, torch.Tensor):
        return a
    return torch.tensor(int(a), device=next((x.device for x in args if isinstance(x, torch.Tensor)), None))


class DynamicSubgraph(torch.nn.Module):
    """A partition compiled once over symbolic shapes: torch tensors in, torch tensors out. Each
    argument the program reads (`used`) is viewed at its placeholder's shape (`split`), evaluated
    at the call's sizes (`bind` over the arguments' `shapes`)."""

    def __init__(self, compiled, used: tuple[int, ...], shapes: list, placeholders: tuple):
        super().__init__()
        self.compiled, self.used, self.shapes = compiled, used, shapes
        self.placeholders = placeholders  # the used arguments' placeholder shapes

    def forward(self, *args):
        sizes = bind(self.shapes, args)
        arrays = []
        for k, shape in zip(self.used, self.placeholders):
            a = number(args, k)
            if a.ndim != len(shape):
                a = a.reshape(tuple(e.evaluate(sizes) if isinstance(e, Dim) else e for e in shape))
            arrays.append(a)
        return self.compiled(*arrays)


class PerShapeSubgraph(torch.nn.Module):
    """A partition the symbolic path refused (`reason`), compiled per concrete shape at its first
    call with it and cached by the argument shapes: `build(args) -> (outputs, single, holders)`
    gives its graph at those shapes (`specialized` or `retraced`); `on_specialize(name, shapes,
    reason)` is told of each new one (the backend's stats count them). A shape Panamera cannot
    compile at all runs `eager` (the partition's own graph module) and is told with its reason."""

    def __init__(self, name: str, build, target: str, deterministic: bool, reason: str, on_specialize=None,
                 eager: torch.nn.Module | None = None):  # fmt: skip
        super().__init__()
        self.name, self.build, self.reason, self.eager = name, build, reason, eager
        self.target, self.deterministic, self.on_specialize = target, deterministic, on_specialize
        self.compiled: dict = {}

    def forward(self, *args):
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        entry = self.compiled.get(key)
        if entry is None:
            try:
                outputs, single, holders = self.build(args)
                k = pn.compile(outputs[0] if single else outputs, target=self.target, deterministic=self.deterministic)
            except Exception as e:  # noqa: BLE001 - never break the model: this shape runs in eager PyTorch
                if self.eager is None:
                    raise
                why = str(e) if isinstance(e, PanameraError) else f"{type(e).__name__}: {e}"
                entry = self.compiled[key] = (None, ())
                reason = f"{self.reason}; at this shape it runs in eager PyTorch: {why}"
            else:
                # a rebuilt graph has new uids (and its own order of placeholders): they match by name
                index = {h.name: i for i, h in enumerate(holders) if isinstance(h, pn.Tensor)}
                used = tuple(index[t.name] for t in k.inputs)
                entry = self.compiled[key] = (k, used)
                reason = self.reason
            if self.on_specialize is not None:
                self.on_specialize(self.name, key, reason)
        k, used = entry
        if k is None:
            return self.eager(*args)
        return k(*(number(args, i) for i in used))


def specialized(outputs: list, single: bool, holders: list):
    """A `PerShapeSubgraph` build: the symbolic graph at the call's sizes (`panamera.dynamic.specialize`)."""

    shapes = [h.shape if isinstance(h, pn.Tensor) else h for h in holders]

    def build(args):
        sizes = bind(shapes, args)
        outs = list(specialize(outputs, sizes))
        return outs, single, holders

    return build


def retraced(sub: torch.fx.GraphModule, translate):
    """A `PerShapeSubgraph` build for a partition that could not be translated symbolically: the
    partition re-traced at the call's concrete shapes (make_fx, fake tensors), then translated."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def build(args):
        concrete = make_fx(sub, tracing_mode="fake")(*args)
        return translate(concrete, list(args))

    return build
