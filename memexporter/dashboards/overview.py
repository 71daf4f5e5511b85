"""The Overview dashboard: the run at a glance from the per-run recording rules, then its ranks on request.

The top reads the rules' per-run aggregates (``run_device_kind:...``, ``run:...``, one series per run
and device kind however many ranks it has): ``overview_run.py``. The ranks sit in a row collapsed by
default, so a refresh queries none of them until it is opened, and each of its panels shows only the
``$topk`` ranks that matter (the fullest, the slowest...) among those selected, or aggregates them:
their device memory, leak and allocator in ``overview_memory.py``, then their host memory, progress,
the GPU's other processes, the collectors and the phases in ``overview_process.py``.
"""

from __future__ import annotations

from memexporter.dashboards.grafana import Panel, Row
from memexporter.dashboards.overview_memory import memory_panels
from memexporter.dashboards.overview_process import process_panels
from memexporter.dashboards.overview_run import run_panels


def overview() -> list[Panel | Row]:
    """The run's figures, then its ranks in a collapsed row."""
    ranks = (*memory_panels(), *process_panels())
    return [*run_panels(), Row("Ranks: the Top K ($topk) of the selected ranks, per panel", ranks)]
