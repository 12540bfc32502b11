"""Control flow and sequences that constant folding turns into plain nodes (model.py's `_fold`).

Exporters write data-independent loops as ONNX control flow: torch's EmbeddingBag becomes a
`Loop` over the bags whose body reads the enclosing graph's values (the ids, the offsets, the
table), and the dynamo exporter collects the bags' rows in a sequence (`SequenceEmpty`,
`SequenceInsert` in the body, `ConcatFromSequence` after). Once the shapes are known, the trip
count and the condition of such a loop are constants: `loop_step` unrolls it, one iteration at a
time, into the body's nodes with the iteration number a constant, so that the folder folds what
each iteration computes from constants (offsets, bounds, `If` conditions) and the rest are plain
nodes Panamera converts (a Gather of the table, a ReduceSum over the bag, a Concat of the rows).
`Sequences` tracks sequence values by the names of their tensors, so a sequence op becomes an
alias or a Concat.

Preconditions for unrolling a Loop (else it stays a live node, or the message says why):
1. its trip count M is absent or a constant, and its initial condition is absent or a constant;
2. the condition each iteration computes folds to a constant (a loop that stops on data does not
   unroll: `Unsupported` names the node);
3. it runs at most `MAX_UNROLL` iterations (unrolling trades a loop for that many copies of its body);
4. a scan output needs at least one iteration (an empty scan's element shape is unknown).

>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> body = helper.make_graph([helper.make_node("Add", ["acc", "x"], ["acc2"]),
...     helper.make_node("Identity", ["c"], ["c2"])], "body",
...     [helper.make_tensor_value_info("i", TensorProto.INT64, []),
...      helper.make_tensor_value_info("c", TensorProto.BOOL, []),
...      helper.make_tensor_value_info("acc", TensorProto.FLOAT, [2])],
...     [helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
...      helper.make_tensor_value_info("acc2", TensorProto.FLOAT, [2])])
>>> loop = helper.make_node("Loop", ["m", "", "a0"], ["y"], body=body)
>>> st = Unrolling()
>>> nodes = loop_step(loop, {"m": np.array(2)}, st, "model")
>>> [(n.op_type, list(n.input), list(n.output)) for n in nodes[:3]]
[('Constant', [], ['y/iter0/i']), ('Constant', [], ['y/iter0/c']), ('Add', ['a0', 'x'], ['y/iter0/acc2'])]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ModelError, Unsupported

# The most iterations a Loop is unrolled into (precondition 3).
MAX_UNROLL = 1024


def rename_inputs(n: onnx.NodeProto, rename: dict) -> None:
    """Rename the inputs of `n` and of the nodes of its subgraphs (their reads of outer values)."""
    n.input[:] = [rename.get(i, i) for i in n.input]
    for a in n.attribute:
        for g in [a.g] if a.HasField("g") else list(a.graphs):
            for m in g.node:
                rename_inputs(m, rename)


def inline(g: onnx.GraphProto, rename: dict, prefix: str) -> list[onnx.NodeProto]:
    """The nodes of graph `g` with every value it makes renamed `prefix + name` (unique in the
    enclosing graph), its initializers as Constant nodes, and its other reads renamed by `rename`
    (a branch's or body's formal inputs; names of the enclosing graph stay as they are)."""
    local = {i.name for i in g.initializer} | {o for m in g.node for o in m.output if o}
    rename = {**rename, **{v: prefix + v for v in local}}
    out = [helper.make_node("Constant", [], [rename[i.name]], name=prefix + i.name, value=i) for i in g.initializer]
    for m in g.node:
        m2 = onnx.NodeProto()
        m2.CopyFrom(m)
        m2.name = prefix + (m.name or m.op_type)
        rename_inputs(m2, rename)
        m2.output[:] = [rename.get(o, o) for o in m.output]
        out.append(m2)
    return out


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(np.asarray(value), name))


@dataclass
class _Loop:
    """Where the unrolling of one Loop stands: the next iteration and the current values."""

    i: int
    cond: str  # "" for an absent condition (true)
    carried: list[str]
    scans: list[list[str]]  # per scan output, the name of each iteration's value


@dataclass
class Unrolling:
    """The unrolling state of one folding pass: the loops under way (by their first output) and
    the sequences known by the names of their tensors."""

    loops: dict[str, _Loop] = field(default_factory=dict)
    sequences: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _label(n: onnx.NodeProto) -> str:
    return repr(n.name or n.output[0])


def loop_step(n: onnx.NodeProto, consts: dict, st: Unrolling, path: str) -> list[onnx.NodeProto] | None:
    """The nodes that stand for the next iteration of Loop `n` followed by `n` again (the folder
    folds the iteration, then comes back to decide on the next), or the nodes that give `n`'s
    outputs once it is done; None when `n` does not unroll (precondition 1: it stays live)."""
    body = next(a.g for a in n.attribute if a.name == "body")
    key = n.output[0]
    m_name = n.input[0] if n.input else ""
    cond_name = n.input[1] if len(n.input) > 1 else ""
    if key not in st.loops:
        if (m_name and m_name not in consts) or (cond_name and cond_name not in consts):
            return None
        n_carried = len(n.input) - 2
        st.loops[key] = _Loop(0, cond_name, list(n.input[2:]), [[] for _ in body.output[1 + n_carried :]])
    lp = st.loops[key]
    if lp.cond and lp.cond not in consts:
        raise Unsupported(
            f"{path}: Loop {_label(n)}: iteration {lp.i - 1}'s condition depends on the inputs; Panamera "
            "unrolls loops whose trip count and condition are constants"
        )
    trips = int(np.asarray(consts[m_name]).reshape(-1)[0]) if m_name else None
    going = (trips is None or lp.i < trips) and (not lp.cond or bool(np.asarray(consts[lp.cond]).reshape(-1)[0]))
    if going and (lp.i >= MAX_UNROLL or (trips or 0) > MAX_UNROLL and not lp.cond):
        raise Unsupported(
            f"{path}: Loop {_label(n)} runs more than {MAX_UNROLL} iterations; Panamera unrolls loops up to that"
        )
    if not going:
        return _finish(n, lp, st, path)
    prefix = f"{key}/iter{lp.i}/"
    formal = [i.name for i in body.input]
    if len(formal) != 2 + len(lp.carried):
        raise ModelError(f"{path}: Loop {_label(n)}: the body has {len(formal)} inputs, not {2 + len(lp.carried)}")
    out = [_const(prefix + formal[0], np.int64(lp.i))]
    cond_in = lp.cond
    if not cond_in:
        cond_in = prefix + formal[1]
        out.append(_const(cond_in, np.bool_(True)))
    rename = {formal[0]: prefix + formal[0], formal[1]: cond_in, **dict(zip(formal[2:], lp.carried))}
    out += inline(body, rename, prefix)
    local = {o for m in out for o in m.output}
    made = [prefix + o.name if prefix + o.name in local else rename.get(o.name, o.name) for o in body.output]
    lp.i, lp.cond, lp.carried = lp.i + 1, made[0], made[1 : 1 + len(lp.carried)]
    for s, name in zip(lp.scans, made[1 + len(lp.carried) :]):
        s.append(name)
    return [*out, n]


def _finish(n: onnx.NodeProto, lp: _Loop, st: Unrolling, path: str) -> list[onnx.NodeProto]:
    """Identity nodes from the final carried values to the Loop's outputs, and each scan output
    as the Concat of its iterations' values, each with a new leading axis."""
    out = []
    for name, y in zip(lp.carried, n.output):
        if not y:
            continue
        if name in st.sequences:
            st.sequences[y] = st.sequences[name]
        else:
            out.append(helper.make_node("Identity", [name], [y], name=f"{y}/final"))
    for names, y in zip(lp.scans, n.output[len(lp.carried) :]):
        if not y:
            continue
        if not names:  # precondition 4
            raise Unsupported(f"{path}: Loop {_label(n)} runs no iteration: its scan output {y!r} has no known shape")
        out += _stack(names, y, 0, new_axis=True)
    return out


def _stack(names: list[str] | tuple[str, ...], y: str, axis: int, new_axis: bool) -> list[onnx.NodeProto]:
    """Concat of `names` along `axis` into `y`, each first given a new axis there when `new_axis`."""
    out = []
    if new_axis:
        ax = f"{y}/axes"
        out.append(_const(ax, np.array([axis], np.int64)))
        parts = [f"{y}/part{k}" for k in range(len(names))]
        out += [helper.make_node("Unsqueeze", [s, ax], [p], name=p) for s, p in zip(names, parts)]
        names = parts
    out.append(helper.make_node("Concat", list(names), [y], name=f"{y}/concat", axis=axis))
    return out


# The sequence ops `sequence_step` turns into aliases and Concats.
SEQUENCE_OPS = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceAt", "SequenceLength",
                          "ConcatFromSequence"})  # fmt: skip


def sequence_step(n: onnx.NodeProto, consts: dict, st: Unrolling, path: str) -> list[onnx.NodeProto] | None:
    """The nodes that stand for sequence op `n` (none when it only names a sequence), or None where
    its sequence is not known by name or a position is not constant (it stays a live node).

    >>> st = Unrolling()
    >>> sequence_step(helper.make_node("SequenceConstruct", ["a", "b"], ["s"]), {}, st, "m")
    []
    >>> [m.op_type for m in sequence_step(helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=1), {}, st, "m")]
    ['Concat']
    """
    op, ins = n.op_type, list(n.input)
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    if op == "SequenceEmpty":
        st.sequences[n.output[0]] = ()
        return []
    if op == "SequenceConstruct":
        st.sequences[n.output[0]] = tuple(ins)
        return []
    seq = st.sequences.get(ins[0])
    pos_name = ins[2 if op == "SequenceInsert" else 1] if len(ins) > (2 if op == "SequenceInsert" else 1) else ""
    if seq is None or (pos_name and pos_name not in consts):
        return None
    pos = int(np.asarray(consts[pos_name]).reshape(-1)[0]) if pos_name else None
    if op == "SequenceInsert":
        at = len(seq) if pos is None else pos % (len(seq) + 1) if pos < 0 else pos
        st.sequences[n.output[0]] = (*seq[:at], ins[1], *seq[at:])
        return []
    if op == "SequenceLength":
        return [_const(n.output[0], np.int64(len(seq)))]
    if op == "SequenceAt":
        if not -len(seq) <= pos < len(seq):
            raise ModelError(f"{path}: SequenceAt {_label(n)}: position {pos} is outside a sequence of {len(seq)}")
        return [helper.make_node("Identity", [seq[pos]], [n.output[0]], name=n.output[0] + "/at")]
    if not seq:  # ConcatFromSequence of an empty sequence
        raise Unsupported(f"{path}: ConcatFromSequence {_label(n)} of an empty sequence has no known shape")
    return _stack(seq, n.output[0], int(attrs.get("axis", 0)), bool(attrs.get("new_axis", 0)))
