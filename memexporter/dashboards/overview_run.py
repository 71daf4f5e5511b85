"""The Overview's top: the run at a glance, from the per-run recording rules.

Each panel reads the rules' per-run aggregates (``run_device_kind:...``, ``run:...``): one series per
run and device kind however many ranks the run has, so a refresh of the top costs the same at 8 ranks
as at 1,024. The ranks themselves sit below, in a row collapsed by default (``overview_memory.py``
and ``overview_process.py``); ``overview.py`` puts the two together.
"""

from __future__ import annotations

from memexporter.dashboards.grafana import Panel
from memexporter.dashboards.scope import run_rule

_UTIL = "run_device_kind:memexporter_memory_peak_utilisation"
_RUN = "{{run_id}} {{device_kind}}"
# Thresholds shared with the ranks row: a fraction of the limit, and seconds to an OOM.
FULL = (("green", None), ("orange", 0.8), ("red", 0.9))
ETA = (("red", None), ("orange", 3600.0), ("green", 86400.0))


def run_panels() -> list[Panel]:
    """The run, from the per-run recording rules (one series per run and device kind)."""
    return [
        Panel(
            "Ranks answering",
            "stat",
            "short",
            "How many ranks of the run answer their scrape? One memexporter_run_info per rank "
            "(run:memexporter_ranks:count); fewer than the world size means ranks down or not scraped.",
            ((run_rule("run:memexporter_ranks:count"), "{{run_id}}"),),
            w=4,
            h=5,
            instant=True,
            run_wide=True,
        ),
        Panel(
            "Fullest rank",
            "stat",
            "percentunit",
            "Which rank of the run is closest to an OOM, and how close? Its step peak over the level window "
            "as a fraction of its limit, with the rank and device that hold it.",
            ((run_rule(f"{_UTIL}:worst_rank"), "{{run_id}} {{device_kind}}: rank {{rank}} {{device}}"),),
            w=6,
            h=5,
            instant=True,
            thresholds=FULL,
            run_wide=True,
        ),
        Panel(
            "Lowest time to OOM",
            "stat",
            "s",
            "How long until the first rank of the run reaches its limit at its current leak rate? The lowest "
            "OOM ETA among the run's ranks; Infinity when none grows beyond its own noise.",
            ((run_rule("run_device_kind:memexporter_oom_eta_seconds:min"), _RUN),),
            w=5,
            h=5,
            instant=True,
            thresholds=ETA,
            run_wide=True,
        ),
        Panel(
            "Fastest leak",
            "stat",
            "binBps",
            "Is memory that persists between steps growing on any rank? The fastest baseline growth among "
            "the run's ranks; 0 while every rank is within its noise.",
            ((run_rule("run_device_kind:memexporter_leak_rate_bytes_per_second:max"), _RUN),),
            w=4,
            h=5,
            instant=True,
            run_wide=True,
        ),
        Panel(
            "Spread between ranks",
            "stat",
            "percentunit",
            "Do the run's ranks peak alike? The highest minus the lowest peak utilisation among its ranks; "
            "in data parallel it stays near 0, and a rank far above the others is what "
            "MemexporterRankImbalance watches.",
            ((run_rule(f"{_UTIL}:spread"), _RUN),),
            w=5,
            h=5,
            instant=True,
            thresholds=(("green", None), ("orange", 0.1), ("red", 0.25)),
            run_wide=True,
        ),
        Panel(
            "Run memory used and limit",
            "timeseries",
            "bytes",
            "How much memory does the whole run use, against what its ranks could hold? The sum of used "
            "and of limit over the run's ranks, per device kind.",
            (
                (run_rule("run_device_kind:memexporter_memory_used_bytes:sum"), f"used {_RUN}"),
                (run_rule("run_device_kind:memexporter_memory_limit_bytes:sum"), f"limit {_RUN}"),
            ),
            run_wide=True,
        ),
        Panel(
            "Peak utilisation: fullest rank and spread",
            "timeseries",
            "percentunit",
            "Is the run getting closer to an OOM, and are its ranks drifting apart? The highest peak "
            "utilisation among the run's ranks, and the spread between the highest and the lowest.",
            ((run_rule(f"{_UTIL}:max"), f"fullest {_RUN}"), (run_rule(f"{_UTIL}:spread"), f"spread {_RUN}")),
            thresholds=FULL,
            run_wide=True,
        ),
    ]
