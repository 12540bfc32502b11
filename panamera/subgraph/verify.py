"""Verification: a model's values against a float64 reference, within tolerances derived from
each value's dtype, reduction lengths and magnitudes, on inputs drawn the way a model reads them.

**The reference.** The model is *promoted*: its float inputs, initializers, outputs and Cast /
ConstantOfShape targets become float64 (`promote`), and onnx's reference evaluator (with
numpy_ops' corrections) runs it on the same inputs, cast up. A correct float32 result is then
compared with the exact-to-float32 value, not with another float32 result that has rounding
errors of its own. Where promotion is impossible (an op with no float64 form in the reference),
the native-dtype reference is used, the tolerance doubles (both sides round) and the Check says
so. Integer and boolean values are compared exactly with the native-dtype reference (a float64
ArgMax may break a tie that float32 cannot see).

**The tolerance** of a float value v is `|got - ref| <= atol(v) + rtol(v) * |ref|` with

    atol(v) = atol0(dtype) + a(v),   rtol(v) = rtol0(dtype) + r(v)

(`tolerance(dtype)` gives the floors atol0, rtol0), and a(v), r(v) the error budget that one
pass over the graph accumulates from the float64 reference's values, with eps = eps(dtype) =
2u (u the unit roundoff) and L a node's reduction length:
- a sum of L mixed-sign terms (ReduceSum, ReduceL1, ReduceLogSum, MatMul, Gemm, Conv) adds
  `eps * L * T` to a, T the largest |term| (max|x|; max|A| * max|B| for a product). In the
  worst summation order (serial, one running sum) each addition rounds by up to u|S_k|, and for
  terms of random sign the partial sums S_k grow like sqrt(k) * rms, so the errors add up to
  about u * rms * L / sqrt(3) (rounding errors modeled as independent, Higham and Mary 2019).
  eps * L * T is above that by 2 * sqrt(3) * T/rms (more than 10x for normal inputs) and covers
  tree and blocked orders too. It is the *typical* error, not a worst-case bound: the worst
  case (gamma_L * sum|x_i|, about u * L^2 * T) would accept nearly anything. The bound is in
  the terms' magnitude, not the result's: a column sum of 65536 normals whose value is near
  zero has an error of ~1e-3 that a bound relative to |result| fails.
- ReduceMean adds eps * T (the sum's error divided by L).
- a sum of same-sign terms (ReduceSumSquare, ReduceL2, ReduceLogSumExp, ReduceProd, Softmax,
  LogSoftmax, and the variance of the normalizations) adds eps * L to r: the deterministic
  bound gamma_{L-1} ~ (L-1)u on its relative error. The normalizations also add eps * max|y|.
- Exp, Softmax, LogSoftmax and ReduceLogSumExp turn their input's absolute error into a
  relative one: r += a(input).
- every other op rounds once: r += eps; views add nothing. Budgets of the inputs add up
  (first order: errors of a sum, product or quotient's operands add, absolutely or relatively).

`--rtol`/`--atol` (and compare's rtol/atol) widen the result; they never tighten it.

**Inputs** (`random_inputs`): floats standard normal; an integer input that indexes (Gather,
GatherElements, GatherND, OneHot, Scatter*, through Cast / Reshape / Unsqueeze ... views) is
drawn in [0, extent) of what it indexes; one that is a mask (it only reaches Cast, Where, Equal,
Not ...) in {0, 1}; booleans are masks: 3/4 true, the first position of the last axis always
true (a mask never hides every position); other integers in [-10, 10).

>>> import numpy as np
>>> compare("y", np.float32([1.0, 2.0]), np.float32([1.0, 2.00001])).ok
True
>>> compare("y", np.int64([1, 2]), np.int64([1, 3])).detail
'max |error| 1 (rtol 0, atol 0)'
>>> tolerance(np.float32)
(0.0002, 1e-05)
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ..enums import StrEnum
from ..errors import OptionError
from ..frontend.walk import evaluate
from .library import to_host
from .model import OnnxModel
from .numpy_ops import REFERENCE_FIXES
from .weights import resolved as _resolved


class Reference(StrEnum):
    """What a model's values are compared with."""

    REFERENCE = "reference"  # onnx's reference evaluator, on the float64-promoted model
    ONNXRUNTIME = "onnxruntime"  # the float64 reference and onnxruntime too


@dataclass(frozen=True)
class Check:
    """The comparison of one value with the reference: whether it matches, and by how much not."""

    value: str
    ok: bool
    max_abs_err: float
    detail: str = ""
    reference: str = "reference"  # what it was compared with


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol) floors of one element-wise result of `dtype` (integers and booleans: exact)."""
    name = np.dtype(dtype).name
    return {"float64": (1e-9, 1e-12), "float32": (2e-4, 1e-5), "float16": (1e-2, 1e-3), "bfloat16": (5e-2, 1e-2)}.get(
        name, (0.0, 0.0)
    )


def compare(name: str, got, want, rtol: float | None = None, atol: float | None = None, reference: str = "") -> Check:
    """Compare `got` (numpy or CuPy) with the reference `want`: floats within the dtype's tolerance
    (widened to `rtol`/`atol` if given), NaN matching NaN; integers and booleans exactly. The
    comparison is made in float64, so `want` may be the float64 reference of a float32 `got`."""
    got = to_host(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return Check(name, False, float("inf"), f"shape {got.shape} != reference {want.shape}", reference)
    r, a = tolerance(got.dtype if got.dtype.kind == "f" or got.dtype.name == "bfloat16" else want.dtype)
    r, a = max(r, rtol or 0.0), max(a, atol or 0.0)
    if want.dtype.kind not in "biu":  # floats, including ml_dtypes' bfloat16 and float8 types
        g64, w64 = got.astype(np.float64), want.astype(np.float64)
        ok = bool(np.allclose(g64, w64, rtol=r, atol=a, equal_nan=True))
        fin = np.isfinite(g64) & np.isfinite(w64)
        err = float(np.max(np.abs(g64[fin] - w64[fin]), initial=0.0))
    else:
        ok = bool(np.array_equal(got, want))
        err = 0.0 if ok else float(np.max(np.abs(got.astype(np.int64) - want.astype(np.int64)), initial=0))
    return Check(name, ok, err, "" if ok else f"max |error| {err:.3g} (rtol {r:.3g}, atol {a:.3g})", reference)


# -- the float64 reference ----------------------------------------------------------------------
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def promote(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `proto` computing in float64: float inputs, outputs, initializers and Cast /
    ConstantOfShape targets made DOUBLE, inferred value types dropped; a deployed model's weights
    (weights.py stubs, read in by `resolved`) promoted as any initializer."""
    p = onnx.ModelProto.FromString(_resolved(proto).SerializeToString())
    g = p.graph
    for k, init in enumerate(g.initializer):
        if init.data_type in _FLOATS:
            g.initializer[k].CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float64), init.name)
            )
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type in _FLOATS:
            vi.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    del g.value_info[:]
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i in _FLOATS:
                a.i = onnx.TensorProto.DOUBLE
            elif n.op_type == "ConstantOfShape" and a.name == "value" and a.t.data_type in _FLOATS:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
    return p


def _run(proto: onnx.ModelProto, names: list[str], feeds: dict) -> dict:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        ref = ReferenceEvaluator(_resolved(proto), new_ops=REFERENCE_FIXES)  # mapped weights read in
        return dict(zip(names, ref.run(names, feeds)))


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


def reference_values(model: OnnxModel, feeds: dict, names: list[str]) -> tuple[dict, dict, str]:
    """(float64 values of every node output, native-dtype values of `names`, what the float
    values are). The float64 run falls back to the native one where promotion is impossible."""
    every = [o for n in model.proto.graph.node for o in n.output if o]
    feeds64 = {k: (np.asarray(v, np.float64) if _is_float(np.asarray(v)) else v) for k, v in feeds.items()}
    try:
        wide, label = _run(promote(model.proto), every, feeds64), "float64 reference"
    except Exception as e:
        wide, label = None, f"native-dtype reference (float64 promotion failed: {type(e).__name__}: {str(e)[:80]})"
    native = None
    if wide is None or any(not _is_float(np.asarray(wide[n])) for n in names if n in wide):
        native = _run(model.proto, every, feeds)
    if wide is None:
        wide = native
    given = feeds64 if label.startswith("float64") else feeds
    return {**model.constants, **given, **wide}, native or {}, label


# -- the error budget ---------------------------------------------------------------------------
_SUM_LIKE = {"ReduceSum", "ReduceL1", "ReduceLogSum", "MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"}
_PRODUCTS = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"}
_SAME_SIGN = {"ReduceSumSquare", "ReduceL2", "ReduceLogSumExp", "ReduceProd", "Softmax", "LogSoftmax"}
_NORMS = {"LayerNormalization", "GroupNormalization", "InstanceNormalization", "BatchNormalization"}
_EXP_LIKE = {"Exp", "Softmax", "LogSoftmax", "ReduceLogSumExp"}
_EXACT = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Identity", "Transpose", "Slice", "Concat",
          "Split", "Gather", "GatherElements", "GatherND", "Tile", "Pad", "Where", "ReduceMax", "ReduceMin",
          "Max", "Min", "Relu", "Neg", "Abs", "MaxPool", "GlobalMaxPool", "Shape", "Size", "Cast"}  # fmt: skip


def _eps(dtype: np.dtype) -> float:
    """Machine epsilon (2u) of a float dtype; bfloat16's is 2^-7."""
    return float(np.finfo(dtype).eps) if np.dtype(dtype).kind == "f" else 2.0**-7


def _maxabs(a) -> float:
    a = np.asarray(a)
    if a.size == 0 or not _is_float(a) and a.dtype.kind not in "iu":
        return 0.0
    f = np.abs(a.astype(np.float64))
    f = f[np.isfinite(f)]
    return float(f.max(initial=0.0))


def _length(op: str, attrs: dict, ins: list, out: np.ndarray) -> int:
    x = ins[0] if ins and ins[0] is not None else None
    if x is None:
        return 1
    if op.startswith("Reduce"):
        return max(x.size // max(out.size, 1), 1)
    if op in ("Softmax", "LogSoftmax"):
        axis = attrs.get("axis", -1)
        return x.shape[axis] if x.ndim else 1
    if op == "LayerNormalization":
        return int(np.prod(x.shape[attrs.get("axis", -1) % x.ndim :])) if x.ndim else 1
    if op == "GroupNormalization":
        return max(x.size // max(x.shape[0] * attrs.get("num_groups", 1), 1), 1)
    if op == "InstanceNormalization":
        return int(np.prod(x.shape[2:]))
    if op == "BatchNormalization":
        return max(x.size // max(x.shape[1], 1), 1) if attrs.get("training_mode", 0) else 1
    if op == "MatMul":
        return x.shape[-1]
    if op == "Gemm":
        return x.shape[0] if attrs.get("transA", 0) else x.shape[-1]
    if op in ("Conv", "ConvTranspose") and len(ins) > 1 and ins[1] is not None:
        return int(np.prod(ins[1].shape[1:]))
    return 1


def error_budget(model: OnnxModel, values: dict, floats: dict | None = None) -> dict[str, tuple[float, float]]:
    """name -> (r, a): the relative and absolute error a correct computation in the model's own
    dtypes may have on each node output (see the module docstring), from the reference `values`
    (float64 where promoted); `floats` gives each value's own dtype where `values` are promoted.
    Added to the dtype's floors by `tolerance_for`.

    >>> import numpy as np
    >>> from onnx import helper, TensorProto
    >>> v = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
    >>> g = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)], "g", [v("x", [4096])], [v("y", [])])
    >>> from panamera.subgraph.model import load_model
    >>> m = load_model(helper.make_model(g))
    >>> r, a = error_budget(m, {"x": np.full(4096, 0.5), "y": np.float64(2048.0)})["y"]
    >>> round(a / float(np.finfo(np.float32).eps))  # eps * L * max|term|
    2048
    """
    budget: dict[str, tuple[float, float]] = {}
    for n in model.nodes:
        ins = [values.get(i) if i else None for i in n.inputs]
        ins = [None if a is None else np.asarray(a) for a in ins]
        r_in = sum(budget.get(i, (0.0, 0.0))[0] for i in n.inputs if i)
        a_in = sum(budget.get(i, (0.0, 0.0))[1] for i in n.inputs if i)
        for o in n.outputs:
            if not o or o not in values:
                continue
            y = np.asarray(values[o])
            v = model.values.get(o)
            own = helper.tensor_dtype_to_np_dtype(v.elem) if v is not None and v.elem else y.dtype
            if not (np.dtype(own).kind == "f" or np.dtype(own).name == "bfloat16"):
                continue
            eps = _eps(own)
            L = _length(n.op_type, n.attrs, ins, y)
            r, a = r_in, a_in
            if n.op_type in _SUM_LIKE:
                terms = _maxabs(ins[0])
                if n.op_type in _PRODUCTS and len(ins) > 1:
                    terms *= _maxabs(ins[1])
                a += eps * L * terms
                r += eps
            elif n.op_type == "ReduceMean":
                a += eps * _maxabs(ins[0])
                r += eps
            elif n.op_type in _SAME_SIGN:
                r += eps * L
            elif n.op_type in _NORMS:
                r += eps * L
                a += eps * L**0.5 * _maxabs(y)
            elif n.op_type not in _EXACT:
                r += eps
            if n.op_type in _EXP_LIKE and ins and ins[0] is not None:
                r += budget.get(n.inputs[0], (0.0, 0.0))[1]
            budget[o] = (r, a)
    return budget


def tolerance_for(dtype: np.dtype, budget: tuple[float, float], native: bool = False) -> tuple[float, float]:
    """(rtol, atol) for a value of `dtype` with error budget (r, a); doubled when the reference
    is computed in the native dtype too (`native`: both sides round)."""
    r0, a0 = tolerance(dtype)
    r, a = r0 + budget[0], a0 + budget[1]
    return (2 * r, 2 * a) if native else (r, a)


# -- inputs -------------------------------------------------------------------------------------
_PASS = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Slice", "Transpose",
         "Concat", "Tile"}  # fmt: skip
_INTS = {onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
         onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}  # fmt: skip
_MASK_USES = {"Cast", "Where", "Equal", "Not", "And", "Or", "Xor"}


def _index_extent(model: OnnxModel, name: str) -> tuple[int | None, bool]:
    """(the smallest extent that `name` indexes, or None; whether it is only used as a mask).
    Through pass-through ops (Cast, Reshape, ...) the value's uses are those of their outputs,
    followed without recursion (walk.evaluate: chains of any length), each value once."""
    uses: dict[str, list] = {}
    for n in model.nodes:
        for pos, i in enumerate(n.inputs):
            uses.setdefault(i, []).append((n, pos))

    def shape(i: int, n) -> tuple | None:
        v = model.values.get(n.inputs[i]) if len(n.inputs) > i and n.inputs[i] else None
        return v.shape if v is not None else None

    def passed(v: str) -> list[str]:
        return [o for n, pos in uses.get(v, ()) if n.op_type in _PASS and pos == 0 for o in n.outputs if o]

    def combine(v: str, found_all: list) -> tuple[int | None, bool]:
        extent, mask, used, later = None, True, False, iter(found_all)
        for n, pos in uses.get(v, ()):
            used = True
            e = None
            if n.op_type in ("Gather", "GatherElements", "ScatterElements") and pos == 1 and shape(0, n):
                s = shape(0, n)
                e = s[n.attrs.get("axis", 0) % len(s)] if s else None
            elif n.op_type in ("GatherND", "ScatterND") and pos == 1 and shape(0, n):
                b = n.attrs.get("batch_dims", 0)
                e = min(shape(0, n)[b:], default=None)
            elif n.op_type == "OneHot" and pos == 0 and n.inputs[1] in model.constants:
                e = int(np.asarray(model.constants[n.inputs[1]]).reshape(-1)[0])
            elif n.op_type in _PASS and pos == 0:
                found = [next(later) for o in n.outputs if o]
                es = [x for x, _ in found if x is not None]
                e = min(es) if es else None
                to_float = n.op_type == "Cast" and n.attrs.get("to") not in _INTS
                mask = mask and (to_float or all(m for _, m in found))
            if e is not None:
                extent = e if extent is None else min(extent, e)
                mask = False
            elif n.op_type not in _MASK_USES and n.op_type not in _PASS:
                mask = False
        return extent, (mask and used)

    return evaluate(name, str, passed, combine)


def random_inputs(model: OnnxModel, seed: int = 0) -> dict[str, np.ndarray]:
    """One random array per model input, drawn as the module docstring says.

    >>> from onnx import helper, TensorProto, numpy_helper
    >>> import numpy as np
    >>> emb = numpy_helper.from_array(np.ones((2, 4), np.float32), "emb")
    >>> g = helper.make_graph([helper.make_node("Gather", ["emb", "ids"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("ids", TensorProto.INT64, [64])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 4])], [emb])
    >>> from panamera.subgraph.model import load_model
    >>> ids = random_inputs(load_model(helper.make_model(g)))["ids"]
    >>> sorted(set(ids.tolist()))
    [0, 1]
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in model.inputs:
        v = model.values[name]
        dt = helper.tensor_dtype_to_np_dtype(v.elem)
        if dt == np.bool_ or np.issubdtype(dt, np.integer):
            extent, mask = _index_extent(model, name)
            if extent is not None:
                feeds[name] = rng.integers(0, max(extent, 1), v.shape).astype(dt)
                continue
            if dt == np.bool_ or mask:
                m = rng.random(v.shape) < 0.75
                if m.ndim:
                    m[..., 0] = True
                feeds[name] = m.astype(dt)
                continue
            feeds[name] = rng.integers(-10, 10, v.shape).astype(dt)
        else:
            feeds[name] = rng.standard_normal(v.shape).astype(dt)
    return feeds


# -- the whole check ----------------------------------------------------------------------------
def verify_values(
    model: OnnxModel,
    feeds: dict,
    ours: dict,
    rtol: float | None = None,
    atol: float | None = None,
    against: Reference | str = Reference.REFERENCE,
) -> list[Check]:
    """Compare `ours` (value name -> array, from Panamera's run on `feeds`) with the float64
    reference (and onnxruntime, `against="onnxruntime"`)."""
    against = Reference(against) if against in tuple(Reference) else _bad_reference(against)
    names = list(ours)
    wide, native, label = reference_values(model, feeds, names)
    promoted = label.startswith("float64")
    budget = error_budget(model, wide)
    checks = []
    for n in names:
        got = to_host(ours[n])
        if _is_float(got) and n in wide:
            r, a = tolerance_for(got.dtype, budget.get(n, (0.0, 0.0)), native=not promoted)
            checks.append(compare(n, got, wide[n], max(r, rtol or 0), max(a, atol or 0), label))
        else:
            ref = native.get(n, wide.get(n))
            checks.append(compare(n, got, ref, rtol, atol, "native-dtype reference"))
    if against == Reference.ONNXRUNTIME:
        checks += _onnxruntime_checks(model, feeds, ours, budget, rtol, atol)
    return checks


def _bad_reference(against) -> Reference:
    raise OptionError(f"--verify={against}: expected one of {[r.value for r in Reference]}")


def _onnxruntime_checks(model: OnnxModel, feeds: dict, ours: dict, budget: dict, rtol, atol) -> list[Check]:
    try:
        import onnxruntime as ort
    except ImportError:
        raise OptionError("--verify=onnxruntime: onnxruntime is not installed (pip install onnxruntime)") from None
    proto = onnx.ModelProto.FromString(_resolved(model.proto).SerializeToString())
    known = {o.name for o in proto.graph.output}
    for n in ours:  # inner values become outputs too
        if n not in known and n in model.values and model.values[n].elem:
            v = model.values[n]
            proto.graph.output.append(helper.make_tensor_value_info(n, v.elem, v.shape))
    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs() if o.name in ours]
        outs = dict(zip(names, sess.run(names, {k: np.asarray(v) for k, v in feeds.items()})))
    except Exception as e:
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return [Check("<model>", False, math.inf, f"onnxruntime could not run the model: {msg}", "onnxruntime")]
    checks = []
    for n in names:
        got = to_host(ours[n])
        r, a = tolerance_for(got.dtype, budget.get(n, (0.0, 0.0)), native=True) if _is_float(got) else (rtol, atol)
        checks.append(compare(n, got, outs[n], max(r or 0, rtol or 0), max(a or 0, atol or 0), "onnxruntime"))
    return checks
