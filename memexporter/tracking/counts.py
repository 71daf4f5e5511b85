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

__all__ = ["Absent", "ModelCounts", "Placement"]

Placement = tuple[tuple[str, str, tuple[int, ...]], ...]
"""``(family, device, bytes per row)``: where a DeepSpeed ZeRO model's bytes live."""
Absent = tuple[tuple[str, str], ...]
"""``(family, reason)``: families left out because a framework's structures were not as expected."""


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
        self._step_placement: Placement = ()  # (family, device, bytes per row) of the last step count
        self._step_absent: Absent = ()
        self.snapshot = Snapshot(
            layout,
            max_modules,
            self.params.bytes,
            zeros,
            zeros,
            zeros,
            self.params.unsharded,
            *self._where(),
            parameter_fp32=self.params.fp32,
        )
        self._write = threading.Lock()  # writers only (training threads); scrapes never take it

    def _where(self) -> tuple[Placement, Absent]:
        """The snapshot's ``placement`` and ``absent``: the parameters' (ZeRO-3) and the last step count's."""
        params = tuple(("parameter", device, values) for device, values in self.params.placement or ())
        absent = (("parameter", self.params.absent),) if self.params.absent else ()
        return params + self._step_placement, absent + self._step_absent

    def publish_activation(self, activation: tuple[int, ...], inputs: tuple[int, ...] = ()) -> None:
        """Bytes saved for backward per row, over the last recorded forward, and the repeated
        blocks' input bytes in it (``Snapshot.inputs``)."""
        with self._write:
            self.snapshot = replace(self.snapshot, activation=activation, inputs=inputs)

    def publish_step(
        self,
        gradient: tuple[int, ...],
        optimizer_state: tuple[int, ...],
        placement: Placement = (),
        absent: Absent = (),
    ) -> None:
        """Gradient and optimizer-state bytes per row, as counted at an optimizer step; for a
        DeepSpeed ZeRO model also where they live (``placement``) or why they are left out (``absent``)."""
        with self._write:
            self._step_placement, self._step_absent = placement, absent
            where, missing = self._where()
            self.snapshot = replace(
                self.snapshot, gradient=gradient, optimizer_state=optimizer_state, placement=where, absent=missing
            )

    def refresh_params(self, force: bool = False) -> None:
        """Recount parameter bytes if any parameter or buffer moved (``.to()``, ``.half()``) or was
        replaced (``fully_shard`` after ``track()``, ZeRO-3's partitioning), or when ``force``d
        (DeepSpeed rebuilt its partitions). Cheap when nothing changed: one fingerprint."""
        fingerprint = self.plan.fingerprint()
        if fingerprint == self._fingerprint and not force:
            return
        self.params = ledger.count_params(self.plan)
        self._fingerprint = fingerprint
        with self._write:
            where, missing = self._where()
            self.snapshot = replace(
                self.snapshot,
                parameter=self.params.bytes,
                parameter_fp32=self.params.fp32,
                unsharded=self.params.unsharded,
                placement=where,
                absent=missing,
            )
