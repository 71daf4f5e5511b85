"""The Grafana dashboards, generated: ``python -m memexporter.dashboards [--check]``.

- ``scope``: what every query selects (the run and the ranks, through ``memexporter_run_info``, once);
- ``variables``: the data source, job, run, instance, rank and Top K variables;
- ``overview`` and ``panels``: the panel tables of each dashboard (title, type, unit, description, queries);
  the Overview's in three parts: ``overview_run`` (its top), ``overview_memory`` and ``overview_process``
  (its ranks row);
- ``annotations``: the Overview's annotation queries (firing alerts, a probable fatal OOM, out-of-step phases);
- ``grafana``: their rendering into Grafana's classic JSON model (layout, rows, variables, annotations);
- ``queries``: ``panel_queries()``, every query with the variables filled in as Grafana would (benchmarks);

The commands are in ``memexporter.cli``: ``dashboards`` writes ``grafana/dashboards/*.json`` (``--check``
exits 1 when the committed files drift), ``export`` is ``memexporter dashboards`` (the same JSON
from an installed package, or as ConfigMaps).
"""

from memexporter.dashboards.grafana import (
    GPU_ONLY,
    RUN_WIDE,
    SCHEMA_VERSION,
    SHARDED_ONLY,
    Panel,
    Row,
    dashboard,
    gpu_only,
    metrics_of,
    render,
    sharded_only,
)
from memexporter.dashboards.panels import build
from memexporter.dashboards.queries import Query, formatted, interpolate, panel_queries
from memexporter.dashboards.scope import by_kind, m

__all__ = [
    "GPU_ONLY",
    "RUN_WIDE",
    "SCHEMA_VERSION",
    "SHARDED_ONLY",
    "Panel",
    "Query",
    "Row",
    "build",
    "by_kind",
    "dashboard",
    "formatted",
    "gpu_only",
    "interpolate",
    "m",
    "metrics_of",
    "panel_queries",
    "render",
    "sharded_only",
]
