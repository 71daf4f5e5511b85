"""The parameters of the alert rules: ``RulesConfig``, its presets, and the checks on its values.

Like a monitoring mixin's ``_config``: the selector, windows, horizons, thresholds and ``for:``
durations live here; the template (``template.py``) reads them through ``%(name)s`` and never
hard-codes them. Durations are seconds, utilisations fractions of the limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from memexporter.rules.selector import parse_selector

SEVERITIES = ("critical", "warning", "info")
# The labels that name one training run: the ranks that share them are peers (RankImbalance, the
# run-wide alerts and records). `run_id` comes from the exporter's `memexporter_run_info`, joined by
# the rules (runs.py), unless the target sets its own. A label a series lacks groups as empty, so
# ranks of an old exporter (no run_info) with one run per Prometheus job compare the ranks of that job.
PEER_LABELS: tuple[str, ...] = ("job", "namespace", "run_id")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Per-rank labels (every rank its own peer group: the alert could never fire) and the rule's own.
NOT_PEER_LABELS = frozenset({"instance", "pod", "rank", "local_rank", "device", "device_kind"})


@dataclass(frozen=True)
class RulesConfig:
    """Every knob of the rules. Durations in seconds, utilisations as fractions of the limit."""

    selector: str = 'job="memexporter"'
    runbook_base_url: str = "https://github.com/memexporter/memexporter/blob/main/alerts/runbook.md"
    critical_severity: str = "critical"  # node-mixin's nodeCriticalSeverity: "warning" never pages
    peer_labels: str = ", ".join(PEER_LABELS)  # labels naming one training run: its ranks are peers
    level_window: int = 300  # max_over_time of the step peak: the level every gate reads
    trend_window: int = 3600  # Prometheus-side trend: medians of its two halves, one half apart
    predicted_horizon: int = 7200
    predicted_min_utilisation: float = 0.5  # warn from half full: the ETA itself is gated on noise
    predicted_for: int = 900  # > the exporter's read of a warm-up tail (minutes), < a young job's life
    imminent_horizon: int = 1800
    imminent_min_utilisation: float = 0.8  # node-mixin's critical gate: below 20% free
    imminent_full_utilisation: float = 0.97  # headroom nearly gone, whatever the trend
    imminent_for: int = 600
    leak_min_growth_per_hour: float = 0.01  # baseline growth, as a fraction of the limit per hour
    leak_for: int = 900
    thrashing_window: int = 300
    thrashing_for: int = 600
    oom_window: int = 600
    lost_window: int = 900  # how long after a target is lost its last figures still count
    lost_min_utilisation: float = 0.9  # the last step peak, as a fraction of the limit
    lost_for: int = 120  # a target gone this long is not one failed scrape
    fragmentation_window: int = 900
    fragmentation_min_ratio: float = 0.3
    fragmentation_min_waste: float = 0.05  # inactive split bytes as a fraction of the limit
    fragmentation_for: int = 900
    imbalance_min_excess: float = 0.1  # peak above the job's median rank, fraction of the limit
    imbalance_for: int = 1800
    input_near: float = 0.9  # the largest input seen over the capacity that warns (oom/capacity.py: NEAR)
    input_for: int = 300  # the capacity is refitted at every scrape: a few minutes ride out a noisy one
    collector_window: int = 600
    collector_min_success: float = 0.9
    collector_for: int = 600
    # A stalled run: no step for longer than its own rhythm allows, while its process is scraped.
    stalled_factor: float = 10.0  # times the median step interval (or an open out-of-step phase's last duration)
    stalled_floor: int = 900  # never less: a GC pause, a slow batch or an unmarked save is not a stall
    stalled_phase_floor: int = 3600  # an out-of-step phase with no completed occurrence yet (a first evaluation)
    stalled_for: int = 300
    # Run-wide alerts (one per run, scope="run") for a cause that every rank shares.
    run_min_ranks: int = 2  # ranks of one run that must meet a rank alert's condition: one rank is its own page
    # A run alert's for: ends this much sooner than its rank alerts' (at most half of it): the ranks of
    # a run cross a threshold minutes apart (noise, a rank a little fuller), and Alertmanager mutes a
    # rank alert only if its run alert already fires when the rank's group is first sent.
    run_lead_for: int = 300

    @classmethod
    def default(cls) -> RulesConfig:
        """Production: 15 s to 1 m scrapes, hour-long trends; quiet on a healthy job near capacity."""
        return cls()

    @classmethod
    def demo(cls) -> RulesConfig:
        """Windows in seconds so ``memexporter demo`` and the end-to-end test fire in minutes.
        Assumes scrape and evaluation intervals of 5 s or less; thresholds are the defaults'."""
        return cls(
            level_window=30,
            trend_window=120,
            predicted_horizon=600,
            predicted_for=30,
            imminent_horizon=120,
            imminent_for=30,
            leak_for=30,
            thrashing_window=60,
            thrashing_for=30,
            oom_window=60,
            lost_window=60,
            lost_for=10,
            fragmentation_window=60,
            fragmentation_for=60,
            imbalance_for=60,
            input_for=30,
            collector_window=60,
            collector_for=60,
            stalled_floor=60,
            stalled_phase_floor=120,
            stalled_for=30,
            run_lead_for=10,
        )


PRESETS: Mapping[str, RulesConfig] = {"default": RulesConfig.default(), "demo": RulesConfig.demo()}


def duration(seconds: int) -> str:
    """Prometheus duration: 5400 -> ``1h30m``, 30 -> ``30s``."""
    out = "".join(f"{v}{u}" for v, u in ((seconds // 3600, "h"), (seconds % 3600 // 60, "m"), (seconds % 60, "s")) if v)
    return out or "0s"


def parse_peer_labels(text: str) -> tuple[str, ...]:
    """``"job, namespace,run_id"`` -> ``("job", "namespace", "run_id")``; ValueError names a bad value."""
    names = tuple(n.strip() for n in text.split(","))
    if not text.strip():
        raise ValueError("memexporter: peer labels must name at least one label, e.g. 'job,run_id'")
    for name in names:
        if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise ValueError(
                f"memexporter: peer label {name!r} (in {text!r}) is not a label name "
                "([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)"
            )
        if name in NOT_PEER_LABELS:
            raise ValueError(
                f"memexporter: peer label {name!r} (in {text!r}) differs between the ranks of one "
                f"run; peer labels name the run, e.g. {', '.join(PEER_LABELS)}"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"memexporter: peer labels {text!r} repeat a label")
    return names


def run_for(c: RulesConfig, rank_for: int) -> int:
    """The ``for:`` of a run alert whose rank alerts wait ``rank_for`` seconds: ``run_lead_for``
    sooner, but never less than half of it (a shared warm-up transient must still be ridden out)."""
    return max(rank_for - c.run_lead_for, rank_for // 2)


def check(c: RulesConfig) -> None:
    """Raise ValueError naming the first value of ``c`` that would render rules Prometheus refuses."""
    parse_selector(c.selector)
    if c.critical_severity not in SEVERITIES:
        raise ValueError(f"memexporter: critical_severity must be one of {SEVERITIES}, got {c.critical_severity!r}")
    parse_peer_labels(c.peer_labels)
    if c.run_min_ranks < 2:
        raise ValueError(
            f"memexporter: run_min_ranks must be 2 or more (one rank is its own page), got {c.run_min_ranks!r}"
        )
    if not c.stalled_factor > 0:
        raise ValueError(f"memexporter: stalled_factor must be a positive number, got {c.stalled_factor!r}")
