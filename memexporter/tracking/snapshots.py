"""Published per-module snapshots and the registry of tracked models: what the scrape side reads.

A tracked model's handle (``tracking/modules.py``) publishes an immutable ``Snapshot`` by
swapping one attribute on the training thread; the modules collector reads only published
snapshots and ``fold()`` from the scrape thread, never a live tensor (DESIGN.md §2 rule 4). The
counting that fills a snapshot is in ``tracking/ledger.py``. This module imports no torch.

A snapshot holds one row per *candidate* module: the root and every module at most ``depth``
levels down (deeper modules were already folded into their ancestor at track time). ``fold()``
then bounds the rows to ``max_modules`` (+ the root) by folding the smallest leaves into their
parents, bottom-up, so every byte stays in some row and the family sums never change.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# Family names, in the order of the value columns of a Snapshot and of a folded row.
FAMILIES = (
    "memexporter_module_parameter_bytes",
    "memexporter_module_gradient_bytes",
    "memexporter_module_optimizer_state_bytes",
    "memexporter_module_activation_bytes",
    # Only for models with sharded (DTensor, ZeRO-3) parameters: the unsharded size of the same parameters.
    "memexporter_module_parameter_unsharded_bytes",
)
DEVICE_BYTES = "memexporter_module_device_bytes"
"""Only for DeepSpeed ZeRO models: each family's row split by the device that holds it (``placement``)."""

Row = tuple[str, tuple[int, ...]]

ROOT_LABEL = "(root)"
"""``module`` label of the root's own row (its direct parameters) when the prefix is empty."""


@dataclass(frozen=True)
class Layout:
    """The candidate rows of one tracked model, in pre-order (a parent precedes its children).

    ``names`` are the ``module`` label values; ``parents[i]`` is the row index of row i's parent,
    ``-1`` for the root (row 0). ``classes[i]``: the class name of row i's module (empty when not
    known); ``repeated``: the rows of repeated blocks (``plan.Plan.repeated``), which the levers
    (``oom/levers.py``) group by parent and class.
    """

    names: tuple[str, ...]
    parents: tuple[int, ...]
    classes: tuple[str, ...] = ()
    repeated: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Snapshot:
    """Bytes per candidate row, as of the last update of each family (all values in bytes).

    ``parameter``: at track time and whenever the parameters' storage changed (``.to()``);
    ``gradient``/``optimizer_state``: at the last optimizer step; ``activation``: during the last
    grad-enabled forward (at most one a second); ``unsharded``: the global bytes of the parameters,
    ``None`` unless some parameter is sharded (a DTensor: FSDP2, tensor parallel; a ZeRO-3 partition).
    ``placement``: for DeepSpeed ZeRO models, ``(family, device, bytes per row)``: where each
    family's bytes live (CPU offload puts them on the host). ``absent``: ``(family, reason)`` for
    the families left out because a framework's structures were not as expected.
    ``parameter_fp32``: the part of ``parameter`` held in float32 (for the bf16 lever).
    ``inputs``: for the repeated blocks (``plan.Plan.repeated``), the bytes of each block's tensor
    inputs in the last recorded forward, 0 elsewhere: what activation checkpointing keeps. Not exported.
    """

    layout: Layout
    max_modules: int
    parameter: tuple[int, ...]
    gradient: tuple[int, ...]
    optimizer_state: tuple[int, ...]
    activation: tuple[int, ...]
    unsharded: tuple[int, ...] | None = None
    placement: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    absent: tuple[tuple[str, str], ...] = ()
    parameter_fp32: tuple[int, ...] = ()
    inputs: tuple[int, ...] = ()


class SnapshotSource(Protocol):
    """What the collector needs from a tracking handle."""

    def snapshot(self) -> Snapshot: ...


def fold(snap: Snapshot) -> list[Row]:
    """Rows to export: at most ``max_modules`` non-root rows, the folded bytes added to ancestors.

    Repeatedly merges the leaf with the fewest bytes (all four families together) into its parent
    until the cap holds. Ties fold the later module first, so the result is deterministic. Rows
    that end with zero bytes in every family are left out, except the root, which is always
    there (so the four families exist as soon as a model is tracked). A row's values are the four
    families, then ``unsharded`` when the snapshot has it, then one per ``placement`` entry (folded
    alike, not used for the choice).
    """
    names, parents = snap.layout.names, snap.layout.parents
    n = len(names)
    cols = [list(snap.parameter), list(snap.gradient), list(snap.optimizer_state), list(snap.activation)]
    total = [cols[0][i] + cols[1][i] + cols[2][i] + cols[3][i] for i in range(n)]
    if snap.unsharded is not None:
        cols.append(list(snap.unsharded))
    cols.extend(list(values) for _, _, values in snap.placement)
    children = [0] * n
    for i in range(1, n):
        children[parents[i]] += 1
    alive = [True] * n
    kept = n - 1
    heap = [(total[i], -i) for i in range(1, n) if children[i] == 0]
    heapq.heapify(heap)
    while kept > snap.max_modules and heap:
        _, neg = heapq.heappop(heap)
        i = -neg
        p = parents[i]
        for col in cols:
            col[p] += col[i]
        total[p] += total[i]
        alive[i] = False
        kept -= 1
        children[p] -= 1
        # A leaf's value never changes while it is a leaf, so heap entries never go stale.
        if children[p] == 0 and p != 0:
            heapq.heappush(heap, (total[p], -p))
    return [(names[i], tuple(col[i] for col in cols)) for i in range(n) if alive[i] and (i == 0 or total[i] > 0)]


# --- The active handles. Written by track()/remove() under a lock, read lock-free by scrapes:
# the tuple is replaced whole, so a reader sees either the old or the new one.

_active: tuple[SnapshotSource, ...] = ()
_lock = threading.Lock()


def register(source: SnapshotSource) -> None:
    """Export ``source``'s snapshots from now on (``TrackHandle`` registers itself)."""
    global _active
    with _lock:
        _active = (*_active, source)


def unregister(source: SnapshotSource) -> None:
    """Stop exporting ``source``'s rows. Idempotent."""
    global _active
    with _lock:
        _active = tuple(s for s in _active if s is not source)


def active_handles() -> Sequence[SnapshotSource]:
    """The tracking handles whose snapshots the modules collector exports (a point-in-time copy)."""
    return _active
