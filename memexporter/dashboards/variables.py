"""The dashboards' variables: data source, job, run, instance, rank and Top K.

job, run (``run_id``), instance and rank are read from ``memexporter_run_info`` (one series per
rank, ``run_id`` from the launcher), each scoped by the ones before it: picking a run lists its
instances and ranks only. They offer "All", and "All" is ``.+`` (``allValue``): Grafana then
writes two characters into a query, not a regex of every value (``scope.py``). job, run and rank
are multi-select; instance is one or All, so that no selection makes a query longer than 16 KiB.
"""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]
DS: JSON = {"type": "prometheus", "uid": "${datasource}"}
ALL = ".+"
TOPK = ("5", "10", "20")
TOPK_DEFAULT = "10"
_INFO = "memexporter_run_info"


def query_var(name: str, label: str, query: str, sort: int, multi: bool = True) -> JSON:
    """A query variable with "All", "All" by default, refreshed when the time range changes
    (``label_values`` then lists only what the range holds: today's runs, not last month's)."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": query,
        "refresh": 2,
        "multi": multi,
        "includeAll": True,
        "allValue": ALL,
        "sort": sort,
        "regex": "",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "hide": 0,
        "options": [],
    }


def topk_var() -> JSON:
    """How many series a per-rank or per-module panel shows: the K fullest ranks, the K largest modules."""
    return {
        "name": "topk",
        "label": "Top K",
        "type": "custom",
        "query": ",".join(TOPK),
        "hide": 0,
        "multi": False,
        "includeAll": False,
        "current": {"selected": True, "text": TOPK_DEFAULT, "value": TOPK_DEFAULT},
        "options": [{"selected": v == TOPK_DEFAULT, "text": v, "value": v} for v in TOPK],
    }


def variables(detail_ranks: bool = False) -> list[JSON]:
    """Every dashboard's variables; ``detail_ranks``: the rank list holds only the ranks that export
    module rows (all of them below 64 ranks, the detail ranks above: the Modules dashboard)."""
    detail = ', detail=~"per_rank|representative"' if detail_ranks else ""
    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "options": [],
            "refresh": 1,
            "regex": "",
        },
        query_var("job", "job", f"label_values({_INFO}, job)", 1),
        query_var("run_id", "run", f'label_values({_INFO}{{job=~"$job"}}, run_id)', 1),
        # One instance or All: 1,024 host:port values ticked would be about 31 KiB in every query.
        # Several ranks are picked with $rank (1,024 ranks: 4 KiB).
        query_var(
            "instance", "instance", f'label_values({_INFO}{{job=~"$job", run_id=~"$run_id"}}, instance)', 1, multi=False
        ),
        query_var(
            "rank",
            "rank",
            f'label_values({_INFO}{{job=~"$job", run_id=~"$run_id", instance=~"$instance"{detail}}}, rank)',
            3,
        ),
        topk_var(),
    ]
