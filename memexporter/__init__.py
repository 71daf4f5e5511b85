"""memexporter: PyTorch training memory on a Prometheus ``/metrics`` endpoint, in one line.

    import memexporter
    memexporter.start(port=9400)

See the README and docs/ for the metrics, the alert rules and the dashboards.
"""

from __future__ import annotations

from memexporter._version import __version__
from memexporter.api import Exporter, Phase, on_oom_risk, phase, start, step, stop, track

__all__ = ["Exporter", "Phase", "__version__", "on_oom_risk", "phase", "start", "step", "stop", "track"]
