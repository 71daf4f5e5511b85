"""Per-module breakdown: parameter, gradient, optimizer-state and activation bytes per ``module``
(and the unsharded parameter bytes of a sharded model).

Reads only the immutable snapshots that tracked models publish from the training thread
(``memexporter.tracking.snapshots``), never a live tensor, and folds each to ``max_modules`` rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import Metric

from memexporter.collectors.scrape import Scrape
from memexporter.metrics import families
from memexporter.tracking.snapshots import FAMILIES, SnapshotSource, active_handles, fold

DELTA = "memexporter_module_forward_delta_bytes"


class ModulesCollector:
    """One row per reported module of every tracked model; nothing when no model is tracked."""

    name = "modules"

    def __init__(self, handles: Callable[[], Sequence[SnapshotSource]] = active_handles) -> None:
        self._handles = handles

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        rank = scrape.sources.rank
        rows: dict[str, list[tuple[tuple[str, ...], float]]] = {name: [] for name in (*FAMILIES, DELTA)}
        for handle in self._handles():
            for module, values in fold(handle.snapshot()):
                # The unsharded column exists only for sharded models: zip stops at the values.
                for name, value in zip(FAMILIES, values, strict=False):
                    rows[name].append(((rank, module), float(value)))
            # Opt-in CUDA forward deltas: a copy made on the training thread, not folded (they nest).
            deltas: dict[str, int] = getattr(handle, "forward_deltas", dict)()
            rows[DELTA].extend(((rank, module), float(v)) for module, v in sorted(deltas.items()))
        return families(rows)
