"""Autograd graphs kept alive from step to step.

A tensor with a ``grad_fn`` keeps its whole graph alive, and the graph keeps the tensors saved
for backward, which have no Python object: the census cannot see them. In a healthy loop the
only such tensors at a step boundary are this step's (the loss, the logits), whose graph was
built during the step. A graph that still reaches a node from an earlier census spans steps:
a list of losses (``losses.append(loss)``), outputs kept from a forward under grad, or a running
total built without ``.item()`` (``total += loss`` chains every step's graph to the next).

How "earlier" is told without holding any node (which would keep graphs alive): every autograd
node has a sequence number, increasing per thread (``Node._sequence_nr()``). Each census
remembers ``(sequence number, name)`` of the graph roots it saw; a later census that reaches one
of them found a graph spanning censuses. ``AccumulateGrad`` nodes (the leaves, which live as long
as their parameter) carry the largest 64-bit number and are never marks.

Saved tensors are not unpacked to weigh them: unpacking runs the user's saved-tensor hooks
(CPU offload would copy to the GPU). So the report counts graph nodes, not bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memexporter.diagnose.census import device_label

MAX_NODES = 20_000
"""Graph nodes walked per census, at most (all roots together)."""
MAX_MARKS = 4096
LEAF_SEQUENCE_NR = (1 << 64) - 1

Mark = tuple[int, str]


@dataclass(frozen=True)
class Graph:
    """Tensors of one device, dtype, shape and ``grad_fn`` whose graphs span censuses.

    ``nodes``: distinct graph nodes they reach (at most ``MAX_NODES``; ``capped`` when the walk
    stopped there); ``since_step``: unknown here (0), filled in by the caller from the census that
    first saw them.
    """

    device: str
    dtype: str
    shape: tuple[int, ...]
    grad_fn: str
    count: int
    nodes: int
    capped: bool


def _mark(node: Any) -> Mark | None:
    try:
        seq = int(node._sequence_nr())
        return None if seq == LEAF_SEQUENCE_NR else (seq, str(node.name()))
    except Exception:  # an exotic node type: no mark, the walk goes on
        return None


def inspect_graphs(
    roots: Sequence[Any], previous: frozenset[Mark]
) -> tuple[list[Graph], dict[tuple[str, str, tuple[int, ...], str], list[Any]], frozenset[Mark]]:
    """Graphs among ``roots`` (tensors with a ``grad_fn``) that reach a mark of ``previous``.

    Returns the spanning groups (most nodes first), up to 4 sample tensors per group (for the
    holder walk: drop them promptly) and this census's marks. Training thread only.
    """
    seen: set[int] = set()
    keep: list[Any] = []  # node wrappers must outlive the walk, or their ids could be reused
    marks: set[Mark] = set()
    groups: dict[tuple[str, str, tuple[int, ...], str], list[int]] = {}
    samples: dict[tuple[str, str, tuple[int, ...], str], list[Any]] = {}
    budget = MAX_NODES
    for t in roots:
        root = t.grad_fn
        if root is None:
            continue
        mark = _mark(root)
        if mark is not None and len(marks) < MAX_MARKS:
            marks.add(mark)
        nodes, spans, stack = 0, mark is not None and mark in previous, [root]
        while stack and budget > 0:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            keep.append(node)
            nodes += 1
            budget -= 1
            m = _mark(node)
            spans = spans or (m is not None and m in previous)
            stack.extend(fn for fn, _ in node.next_functions)
        if spans:
            key = (device_label(t.device), str(t.dtype).removeprefix("torch."), tuple(t.shape), str(root.name()))
            row = groups.setdefault(key, [0, 0, 0])
            row[0] += 1
            row[1] += nodes
            row[2] |= budget <= 0
            picks = samples.setdefault(key, [])
            if len(picks) < 4:
                picks.append(t)
    found = [Graph(*key, count=c, nodes=n, capped=bool(capped)) for key, (c, n, capped) in groups.items()]
    found.sort(key=lambda g: (-g.nodes, -g.count))
    del keep
    return found, samples, frozenset(marks)
