"""One rule of the template."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass


@dataclass(frozen=True)
class Rule:
    """One recording rule (``severity`` empty) or alerting rule; ``why`` becomes a YAML comment.

    ``scope`` (alerts only): ``rank`` (one alert per rank, and device) or ``run`` (one per run),
    rendered as the label of that name. ``rendered``: ``summary`` and ``description`` are final text
    (the run alerts' build their query from the rendered expression), not ``%``-templates."""

    name: str
    _: KW_ONLY  # the rest by name: a template of rules reads like a table of named fields
    expr: str
    why: str
    for_: int = 0
    severity: str = ""
    summary: str = ""
    description: str = ""
    scope: str = ""
    rendered: bool = False
