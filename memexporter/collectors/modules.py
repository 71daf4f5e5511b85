"""Per-module breakdown: parameter, gradient, optimizer-state and activation bytes per ``module``
(and the unsharded parameter bytes of a sharded model; for a DeepSpeed ZeRO model, each family's
bytes per device that holds them).

Reads only the immutable snapshots that tracked models publish from the training thread
(``memexporter.tracking.snapshots``), never a live tensor, and folds each to ``max_modules`` rows.
A family whose rows a framework's structures kept from being read (``Snapshot.absent``) is left
out for that model, and the collector reports a partial failure naming the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import Metric

from memexporter.collectors.scrape import PartialFailure, Scrape
from memexporter.metrics import families
from memexporter.tracking.snapshots import DEVICE_BYTES, FAMILIES, SnapshotSource, active_handles, fold

DELTA = "memexporter_module_forward_delta_bytes"


class ModulesCollector:
    """One row per reported module of every tracked model; nothing when no model is tracked."""

    name = "modules"

    def __init__(self, handles: Callable[[], Sequence[SnapshotSource]] = active_handles) -> None:
        self._handles = handles

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        rank = scrape.sources.rank
        rows: dict[str, list[tuple[tuple[str, ...], float]]] = {name: [] for name in (*FAMILIES, DELTA, DEVICE_BYTES)}
        failed: list[str] = []
        for handle in self._handles():
            snap = handle.snapshot()
            absent = {f"memexporter_module_{family}_bytes" for family, _ in snap.absent}
            failed.extend(f"{family} rows of {snap.layout.names[0]}: {reason}" for family, reason in snap.absent)
            # The unsharded column exists only for sharded models; placement columns come after it.
            names = FAMILIES if snap.unsharded is not None else FAMILIES[:4]
            for module, values in fold(snap):
                for name, value in zip(names, values, strict=False):
                    if name not in absent:
                        rows[name].append(((rank, module), float(value)))
                for (family, device, _), value in zip(snap.placement, values[len(names) :], strict=True):
                    if f"memexporter_module_{family}_bytes" not in absent:
                        rows[DEVICE_BYTES].append(((rank, module, family, device), float(value)))
            # Opt-in CUDA forward deltas: a copy made on the training thread, not folded (they nest).
            deltas: dict[str, int] = getattr(handle, "forward_deltas", dict)()
            rows[DELTA].extend(((rank, module), float(v)) for module, v in sorted(deltas.items()))
        if failed:
            raise PartialFailure(families(rows), failed)
        return families(rows)
