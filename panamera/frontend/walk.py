"""Iterative walks over DAGs (the tensor graph, expression trees, ONNX nodes): a chain of
thousands of ops must not hit Python's recursion limit (issue 18: a chain of 400 element-wise
ops raised RecursionError), so no pass over a graph recurses; each uses these two.

Both visit exactly as the plain recursive walk would (children left to right, each node once,
a node after its children), so orders, numbering and hashes built from them do not change.

>>> children = {"a": ["b", "c"], "b": ["c"], "c": []}
>>> postorder(["a"], children.__getitem__, key=str)
['c', 'b', 'a']
>>> evaluate("a", str, children.__getitem__, lambda n, vals: n + "".join(vals))
'abcc'
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

N = TypeVar("N")
V = TypeVar("V")


def postorder(roots: Iterable[N], children: Callable[[N], Iterable[N]], key: Callable[[N], Hashable] = id) -> list[N]:
    """Every node reachable from `roots`, each once (by `key`), children before their parent;
    `children(n)` is asked once per node, when the walk first reaches it."""
    seen: set = set()
    order: list[N] = []
    for root in roots:
        if key(root) in seen:
            continue
        seen.add(key(root))
        stack = [(root, iter(children(root)))]
        while stack:
            node, rest = stack[-1]
            for c in rest:
                k = key(c)
                if k not in seen:
                    seen.add(k)
                    stack.append((c, iter(children(c))))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def evaluate(
    root: N,
    key: Callable[[N], Hashable],
    children: Callable[[N], Sequence[N]],
    combine: Callable[[N, list[V]], V],
    memo: dict | None = None,
) -> V:
    """`combine(n, [values of children(n)])` bottom-up from `root`, once per key (`memo`, which
    a caller may keep across calls), in the order of the recursive evaluation: a node's
    children in order, each finished before the next starts."""
    memo = {} if memo is None else memo
    k0 = key(root)
    if k0 in memo:
        return memo[k0]

    def frame(n: N, k: Hashable) -> list:
        kids = list(children(n))
        return [n, k, kids, [key(c) for c in kids], 0]

    stack = [frame(root, k0)]
    while stack:
        top = stack[-1]
        node, k, kids, keys, at = top
        while at < len(kids) and keys[at] in memo:
            at += 1
        top[4] = at
        if at < len(kids):
            stack.append(frame(kids[at], keys[at]))
            continue
        stack.pop()
        memo[k] = combine(node, [memo[c] for c in keys])
    return memo[k0]
