"""The Grafana dashboards, generated: ``python -m memexporter.dashboards [--check]``.

- ``panels``: the panel tables of each dashboard (title, type, unit, description, queries);
- ``annotations``: the Overview's annotation queries (firing alerts, a probable fatal OOM, out-of-step phases);
- ``grafana``: their rendering into Grafana's classic JSON model (layout, variables, annotations);
- ``cli``: writes ``grafana/dashboards/*.json``; ``--check`` exits 1 when the committed files drift;
- ``export``: ``memexporter dashboards``, the same JSON from an installed package, or as ConfigMaps.
"""

from memexporter.dashboards.cli import OUT_DIR, main
from memexporter.dashboards.grafana import (
    GPU_ONLY,
    SCHEMA_VERSION,
    SHARDED_ONLY,
    Panel,
    dashboard,
    gpu_only,
    metrics_of,
    render,
    sharded_only,
)
from memexporter.dashboards.panels import SEL, build, by_kind, m

__all__ = ["GPU_ONLY", "OUT_DIR", "SCHEMA_VERSION", "SEL", "SHARDED_ONLY", "Panel", "build", "by_kind", "dashboard",
           "gpu_only", "m", "main", "metrics_of", "render", "sharded_only"]
