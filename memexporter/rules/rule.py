"""One rule of the template, and the template text that reads a series inside an annotation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """One recording rule (``severity`` empty) or alerting rule; ``why`` becomes a YAML comment."""

    name: str
    expr: str
    why: str
    for_: int = 0
    severity: str = ""
    summary: str = ""
    description: str = ""


def query(metric: str, fmt: str, over: str = "", rank_only: bool = False, none: str = "") -> str:
    """Template text printing ``metric`` for the alert's job/instance/rank/device through ``fmt``;
    ``over`` (a duration) reads its last value within that range, for a series that is gone;
    ``rank_only`` for a series without ``device`` (``steps_total``); ``none`` is printed when
    there is no such series."""
    names = ("job", "instance", "rank") if rank_only else ("job", "instance", "rank", "device")
    selector = metric + "{" + ",".join(f"{n}=%q" for n in names) + "}"
    if over:
        selector = f"last_over_time({selector}[{over}])"
    labels = " ".join(f"$labels.{n}" for n in names)
    otherwise = f"{{{{ else }}}}{none}" if none else ""
    return (f'{{{{ with printf "{selector}" {labels} | query }}}}'
            f"{{{{ $v := . | first | value }}}}{fmt}{otherwise}{{{{ end }}}}")
