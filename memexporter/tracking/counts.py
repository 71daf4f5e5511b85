"""One tracked model's counts: its row plan, its parameter bytes and the snapshot it publishes.

A ``TrackHandle`` (``modules.py``) owns one ``ModelCounts`` and hands it to its two writers, the
forward recorder (``forward.py``: activation bytes) and the gradient counter (``gradients.py``:
gradient and optimizer-state bytes). They write on the training thread through ``publish()``,
which swaps in a new immutable ``snapshots.Snapshot``; the collector reads ``snapshot`` (one
attribute read) from the scrape thread and never takes a lock (DESIGN.md §2 rule 4).
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace

from memexporter.tracking import ledger
from memexporter.tracking.ledger import ParamCount
from memexporter.tracking.plan import Plan
from memexporter.tracking.snapshots import Layout, Snapshot

__all__ = ["ModelCounts"]


class ModelCounts:
    """The published byte counts of one tracked model (all in bytes, one value per candidate row).

    ``pid`` is the process that tracked the model: hooks run in a forked child do nothing there.
    """

    def __init__(self, plan: Plan, layout: Layout, max_modules: int) -> None:
        self.plan = plan
        self.pid = os.getpid()
        self.params: ParamCount = ledger.count_params(plan)
        self._fingerprint = plan.fingerprint()
        zeros = (0,) * len(layout.names)
        self.snapshot = Snapshot(layout, max_modules, self.params.bytes, zeros, zeros, zeros, self.params.unsharded)
        self._write = threading.Lock()  # writers only (training threads); scrapes never take it

    def publish_activation(self, activation: tuple[int, ...]) -> None:
        """Bytes saved for backward per row, over the last recorded forward."""
        with self._write:
            self.snapshot = replace(self.snapshot, activation=activation)

    def publish_step(self, gradient: tuple[int, ...], optimizer_state: tuple[int, ...]) -> None:
        """``.grad`` and optimizer-state bytes per row, as counted at an optimizer step."""
        with self._write:
            self.snapshot = replace(self.snapshot, gradient=gradient, optimizer_state=optimizer_state)

    def refresh_params(self) -> None:
        """Recount parameter bytes if any parameter or buffer moved (``.to()``, ``.half()``) or was
        replaced (``fully_shard`` after ``track()``). Cheap when nothing changed: one fingerprint."""
        fingerprint = self.plan.fingerprint()
        if fingerprint == self._fingerprint:
            return
        self.params = ledger.count_params(self.plan)
        self._fingerprint = fingerprint
        with self._write:
            self.snapshot = replace(self.snapshot, parameter=self.params.bytes, unsharded=self.params.unsharded)
