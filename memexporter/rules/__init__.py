"""The Prometheus recording and alerting rules in ``alerts/``, rendered from one template.

- ``params``: ``RulesConfig`` (selector, windows, horizons, thresholds, ``for:``), the presets, and
  the checks on their values;
- ``template``: every rule, as ``%``-format text over those parameters (``rule``: one rule, and
  the annotation text that queries a series; ``phases``: the out-of-step phases' level and the
  stalled-run alert);
- ``rendering``: the YAML that Prometheus loads (``alerts/memexporter.rules.yml`` is ``render()``);
- ``cli``: ``memexporter rules`` (also ``python -m memexporter.rules``).
"""

from memexporter.rules.cli import main
from memexporter.rules.params import PEER_LABELS, PRESETS, SEVERITIES, RulesConfig, duration, parse_peer_labels
from memexporter.rules.rendering import render, render_config

__all__ = ["PEER_LABELS", "PRESETS", "SEVERITIES", "RulesConfig", "duration", "main", "parse_peer_labels",
           "render", "render_config"]
