"""The rules template: the recording rules, written against ``RulesConfig`` (the alerts: ``alerts.py``).

Why the rules look the way they do: training memory is a sawtooth within every step, so the rules
read the exporter's per-step peak and baseline, never raw ``used`` samples. Forecasts follow the
node-mixin "filling up" pattern: a level gate AND a forecast AND a ``for:`` long enough to ride out
warm-up and evaluation spikes. Two estimators feed the forecast: the exporter's own ETA (Theil-Sen
slope of the baseline) and a Prometheus-side one from the medians of the step peak over the two
halves of the trend window (robust to spikes, and it sees a peak that grows while the baseline
stays flat). The Prometheus side only counts after a full trend window of uninterrupted steps.

Phases (``memexporter.phase()``, and forward/backward/optimizer of a tracked model): the exporter
keeps out-of-step phases (``OUT_OF_STEP_PHASES``: evaluation, checkpoint...) out of the step peak,
so the forecast reads training alone and those phases get their own headroom gate. Their rules are
in ``phases.py``. The run each rank belongs to, and the per-run records: ``runs.py``.

Expressions and annotations are ``%``-format strings over ``params()``: every knob (durations as
``5m``, and as seconds under ``<name>_s``) plus the shared snippets defined there. Annotations of
the per-rank alerts read only ``$value`` and ``$labels``: no template query, whatever the number of
ranks that fire.
"""

from __future__ import annotations

import dataclasses

from memexporter.rules.params import NOT_PEER_LABELS, RulesConfig, duration, parse_peer_labels
from memexporter.rules.phases import phase_params, phase_recording
from memexporter.rules.rule import Rule
from memexporter.rules.runs import info_record, kind, with_run
from memexporter.rules.selector import parse_selector

__all__ = ["Rule", "params", "recording", "trends"]

_PEAK = "rank_device:memexporter_memory_peak_bytes"
_LEVEL = "rank_device:memexporter_memory_committed_peak_bytes:max_over_time"
_UTIL = "rank_device:memexporter_memory_peak_utilisation:ratio"
_EXCESS = "rank_device:memexporter_memory_peak_excess_over_job_median:ratio"
_ETA = "rank_device:memexporter_oom_eta_seconds"


def run_labels(c: RulesConfig) -> tuple[str, ...]:
    """The labels of a run: the peer labels, and those the selector names that every rank of a run
    shares (two rule files that select ``cluster="a"`` and ``cluster="b"`` record distinct runs)."""
    peers = parse_peer_labels(c.peer_labels)
    extra = [n for n, _, _ in parse_selector(c.selector) if n not in peers and n not in NOT_PEER_LABELS]
    return peers + tuple(dict.fromkeys(extra))


def _pct(x: float) -> str:
    return f"{x * 100:g}%"


def params(c: RulesConfig) -> dict[str, str]:
    """Template values: every knob (durations as ``5m``, and as seconds under ``<name>_s``) and snippets."""
    p = {f.name: str(getattr(c, f.name)) for f in dataclasses.fields(c)}
    for f in dataclasses.fields(c):
        if f.type == "int":
            p[f.name + "_s"], p[f.name] = p[f.name], duration(getattr(c, f.name))
    p["run_min_ranks"] = str(c.run_min_ranks)  # a count, not a duration
    half = c.trend_window // 2
    runs = run_labels(c)
    # "Run llm-7 of job trainer in namespace ml": a run alert's subject, from the run labels it has.
    run_in = "".join(
        "{{ with $labels.namespace }} in namespace {{ . }}{{ end }}"
        if n == "namespace"
        else f"{{{{ with $labels.{n} }}}} ({n} {{{{ . }}}}){{{{ end }}}}"
        for n in runs
        if n not in ("job", "run_id")
    )
    p.update(
        sel=c.selector,
        half=duration(half),
        half_s=str(half),
        peer_labels=", ".join(parse_peer_labels(c.peer_labels)),
        run_by=", ".join(runs),
        run_who=("{{ with $labels.run_id }}Run {{ . }} of job{{ else }}Job{{ end }}" if "run_id" in runs else "Job")
        + " {{ $labels.job }}"
        + run_in,
        # The rank alerts' subject, from their labels. Their run is in their labels (run_id): each
        # {{ }} costs a little on each of 1,024 alerts at every evaluation, so no more than needed.
        who="Rank {{ $labels.rank }} of job {{ $labels.job }} on {{ $labels.instance }} ({{ $labels.device }})",
        predicted_min_pct=_pct(c.predicted_min_utilisation),
        stalled_times=f"{c.stalled_factor:g}",
        # A full trend window of steps without a restart: warm-up never counts as a trend.
        uninterrupted="and on(job, instance, rank) (resets(memexporter_steps_total{%(sel)s}[%(trend_window)s]) == 0)\n"
        "and on(job, instance, rank) (memexporter_steps_total{%(sel)s} offset %(trend_window)s)",
    )
    p["uninterrupted"] %= p
    p.update(phase_params())
    return p


def _median_deriv(metric: str) -> str:
    q = f"quantile_over_time(0.5, {metric}{{%(sel)s}}[%(half)s]"
    return f"(\n    {q})\n  - {q} offset %(half)s)\n) / %(half_s)s\n%(uninterrupted)s"


def _excess() -> str:
    """(A rank's typical peak - the median rank's of its run and kind of device) / its limit."""
    median = kind(f"{_PEAK}:median_over_time{{%(sel)s}}")
    return (
        "label_replace(\n  (\n      "
        + median.replace("\n", "\n      ")
        + "\n    - on(%(peer_labels)s, device_kind) group_left()\n"
        "      quantile by (%(peer_labels)s, device_kind) (0.5,\n        "
        + median.replace("\n", "\n        ")
        + ")\n  )\n  / ignoring(device_kind, run_id) group_left()\n  memexporter_memory_limit_bytes{%(sel)s},\n"
        '  "device_kind", "", "", ""\n)'
    )


def recording() -> list[Rule]:
    """The per-rank levels (``memexporter.rules``): peak, utilisation, median, excess, phases, stalls."""
    return [
        info_record(),
        Rule(
            _LEVEL,
            expr="max_over_time(memexporter_memory_committed_peak_bytes{%(sel)s}[%(level_window)s])\nor\n"
            "max_over_time(memexporter_memory_peak_bytes{%(sel)s}[%(level_window)s])",
            why="Highest committed step peak over the level window: the level that the OOM gates compare to the\n"
            "limit. Committed, not allocated: under the native allocator the limit is met by segments (an\n"
            "H200 job died with 79 % of its limit allocated, 99.7 % committed). An exporter from before the\n"
            "committed series: its step peak.",
        ),
        Rule(
            _UTIL,
            expr=with_run(f"{_LEVEL}{{%(sel)s}}\n/\nmemexporter_memory_limit_bytes{{%(sel)s}}"),
            why="Peak utilisation of the limit (0..1).\nWith the rank's run_id, as every per-rank alert: the join is in runs.with_run.",
        ),
        Rule(
            f"{_PEAK}:median_over_time",
            expr=with_run("quantile_over_time(0.5, memexporter_memory_peak_bytes{%(sel)s}[%(half)s])"),
            why="Typical step peak: evaluation spikes of a few minutes do not move the median. With the\n"
            "rank's run_id: RankImbalance compares the ranks of a run.",
        ),
        Rule(
            _EXCESS,
            expr=_excess(),
            why="How far each rank's typical peak sits above the median rank of its peers (the series that\n"
            "share the peer labels: one training run, run_id joined from run_info) on the same kind of\n"
            "device (cuda or cpu), as a fraction of its own limit. A peer label a series lacks counts as empty.",
        ),
        *phase_recording(),
    ]


def trends() -> list[Rule]:
    """The per-rank trends and ETAs (``memexporter.trends``): a group of their own, because their four
    quantiles over the trend window are about half of the per-rank records' cost (0.4 s of 0.9 s
    an evaluation at 1,024 ranks); they read the levels as of the levels' last evaluation."""
    return [
        Rule(
            f"{_PEAK}:deriv",
            expr=_median_deriv("memexporter_memory_peak_bytes"),
            why="Robust growth of the step peak (bytes/s): the difference of the medians of the two halves of\n"
            "the trend window, over their distance. Needs a full window of steps without a restart.",
        ),
        Rule(
            "rank_device:memexporter_memory_baseline_bytes:deriv",
            expr=_median_deriv("memexporter_memory_baseline_bytes"),
            why="The same for the baseline (memory held between steps): the Prometheus-side leak cross-check.",
        ),
        Rule(
            f"{_ETA}:peak_trend",
            expr=f"(memexporter_memory_limit_bytes{{%(sel)s}} - {_LEVEL}{{%(sel)s}})\n"
            f"/\n({_PEAK}:deriv{{%(sel)s}} > 0)",
            why="Prometheus-side seconds until the step peak reaches the limit at the peak's median trend.",
        ),
        Rule(
            f"{_ETA}:min",
            expr=with_run(
                "min without (estimator) (\n"
                '    label_replace(memexporter_oom_eta_seconds{%(sel)s}, "estimator", "exporter", "", "")\n'
                "  or\n"
                f'    label_replace({_ETA}:peak_trend{{%(sel)s}}, "estimator", "prometheus", "", "")\n'
                ")"
            ),
            why="The sooner of the two ETAs, the exporter's (baseline slope, +Inf when flat) and Prometheus',\n"
            "with the rank's run_id.",
        ),
    ]
