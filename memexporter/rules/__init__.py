"""The Prometheus recording and alerting rules in ``alerts/``, rendered from one template.

- ``params``: ``RulesConfig`` (selector, windows, horizons, thresholds, ``for:``), the presets, and
  the checks on their values;
- ``template``: the recording rules, as ``%``-format text over those parameters, and ``alerts``:
  the alerting rules, each per rank (``scope="rank"``) and, for a cause that every rank shares, per
  run (``scope="run"``) (``rule``: one rule; ``phases``: the out-of-step phases' level and the
  stalled-run alert; ``runs``: the run each rank belongs to, the per-run records, the run alerts;
  ``conditions``: each alert's condition per rank, recorded once before its alerts);
- ``rendering``: the YAML that Prometheus loads (``alerts/memexporter.rules.yml`` is ``render()``), in
  four groups: per-rank records, per-run records, the OOM forecasts, the other alerts;

``memexporter rules`` (also ``python -m memexporter.rules``) is ``memexporter.cli.rules``.
"""

from memexporter.rules.params import PEER_LABELS, PRESETS, SEVERITIES, RulesConfig, duration, parse_peer_labels
from memexporter.rules.rendering import render, render_config

__all__ = [
    "PEER_LABELS",
    "PRESETS",
    "SEVERITIES",
    "RulesConfig",
    "duration",
    "parse_peer_labels",
    "render",
    "render_config",
]
