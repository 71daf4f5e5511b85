"""The rules template: every recording and alerting rule, written against ``RulesConfig``.

Why the rules look the way they do: training memory is a sawtooth within every step, so the rules
read the exporter's per-step peak and baseline, never raw ``used`` samples. Forecasts follow the
node-mixin "filling up" pattern: a level gate AND a forecast AND a ``for:`` long enough to ride out
warm-up and evaluation spikes. Two estimators feed the forecast: the exporter's own ETA (Theil-Sen
slope of the baseline) and a Prometheus-side one from the medians of the step peak over the two
halves of the trend window (robust to spikes, and it sees a peak that grows while the baseline
stays flat). The Prometheus side only counts after a full trend window of uninterrupted steps.

Phases (``memexporter.phase()``, and forward/backward/optimizer of a tracked model): the exporter
keeps out-of-step phases (``OUT_OF_STEP_PHASES``: evaluation, checkpoint...) out of the step peak,
so the forecast reads training alone and those phases get their own headroom gate. The
stalled-run alert judges a run by its own step rhythm, and an open out-of-step phase by its own last
duration. Their rules are in ``phases.py``.

Expressions and annotations are ``%``-format strings over ``params()``: every knob (durations as
``5m``, and as seconds under ``<name>_s``) plus the shared snippets defined there.
"""

from __future__ import annotations

import dataclasses

from memexporter.rules.params import RulesConfig, duration, parse_peer_labels
from memexporter.rules.phases import PHASE_UTIL, phase_params, phase_recording, stalled_alert
from memexporter.rules.rule import Rule, query

__all__ = ["Rule", "alerts", "params", "query", "recording"]

_PEAK = "rank_device:memexporter_memory_peak_bytes"
_UTIL = "rank_device:memexporter_memory_peak_utilisation:ratio"
_EXCESS = "rank_device:memexporter_memory_peak_excess_over_job_median:ratio"
_ETA = "rank_device:memexporter_oom_eta_seconds"


def params(c: RulesConfig) -> dict[str, str]:
    """Template values: every knob (durations as ``5m``, and as seconds under ``<name>_s``) and snippets."""
    p = {f.name: str(getattr(c, f.name)) for f in dataclasses.fields(c)}
    for f in dataclasses.fields(c):
        if f.type == "int":
            p[f.name + "_s"], p[f.name] = p[f.name], duration(getattr(c, f.name))
    half = c.trend_window // 2
    p.update(
        sel=c.selector, half=duration(half), half_s=str(half),
        peer_labels=", ".join(parse_peer_labels(c.peer_labels)),
        who="Rank {{ $labels.rank }} of job {{ $labels.job }} on {{ $labels.instance }} ({{ $labels.device }})",
        util=query(_UTIL, "{{ $v | humanizePercentage }}"),
        leak=query("memexporter_leak_bytes_per_step", "{{ $v | humanize1024 }}B"),
        split=query("memexporter_allocator_inactive_split_bytes", "{{ $v | humanize1024 }}B"),
        eta=query(f"{_ETA}:min",
                  "{{ if lt $v 1e+300 }}{{ humanizeDuration $v }}{{ else }}none, not growing{{ end }}"),
        # A full trend window of steps without a restart: warm-up never counts as a trend.
        uninterrupted="and on(job, instance, rank) (resets(memexporter_steps_total{%(sel)s}[%(trend_window)s]) == 0)\n"
                      "and on(job, instance, rank) (memexporter_steps_total{%(sel)s} offset %(trend_window)s)",
    )
    p["uninterrupted"] %= p
    p.update(
        last_peak=query("memexporter_memory_peak_bytes", "{{ $v | humanize1024 }}B", p["lost_window"]),
        last_limit=query("memexporter_memory_limit_bytes", "{{ $v | humanize1024 }}B", p["lost_window"]),
        last_steps=query("memexporter_steps_total", '{{ $v | printf "%.0f" }}', p["lost_window"], rank_only=True),
    )
    p.update(phase_params())
    return p


def _median_deriv(metric: str) -> str:
    q = f"quantile_over_time(0.5, {metric}{{%(sel)s}}[%(half)s]"
    return f"(\n    {q})\n  - {q} offset %(half)s)\n) / %(half_s)s\n%(uninterrupted)s"


def recording() -> list[Rule]:
    kind = f'label_replace({_PEAK}:median_over_time{{%(sel)s}}, "device_kind", "$1", "device", "([a-z]+).*")'
    return [
        Rule(f"{_PEAK}:max_over_time", "max_over_time(memexporter_memory_peak_bytes{%(sel)s}[%(level_window)s])",
             "Highest step peak over the level window: the level that the OOM gates compare to the limit."),
        Rule(_UTIL,
             f"{_PEAK}:max_over_time{{%(sel)s}}\n/\nmemexporter_memory_limit_bytes{{%(sel)s}}",
             "Peak utilisation of the limit (0..1)."),
        Rule(f"{_PEAK}:median_over_time", "quantile_over_time(0.5, memexporter_memory_peak_bytes{%(sel)s}[%(half)s])",
             "Typical step peak: evaluation spikes of a few minutes do not move the median."),
        Rule(f"{_PEAK}:deriv", _median_deriv("memexporter_memory_peak_bytes"),
             "Robust growth of the step peak (bytes/s): the difference of the medians of the two halves of\n"
             "the trend window, over their distance. Needs a full window of steps without a restart."),
        Rule("rank_device:memexporter_memory_baseline_bytes:deriv", _median_deriv("memexporter_memory_baseline_bytes"),
             "The same for the baseline (memory held between steps): the Prometheus-side leak cross-check."),
        Rule(f"{_ETA}:peak_trend",
             f"(memexporter_memory_limit_bytes{{%(sel)s}} - {_PEAK}:max_over_time{{%(sel)s}})\n"
             f"/\n({_PEAK}:deriv{{%(sel)s}} > 0)",
             "Prometheus-side seconds until the step peak reaches the limit at the peak's median trend."),
        Rule(f"{_ETA}:min",
             "min without (estimator) (\n"
             '    label_replace(memexporter_oom_eta_seconds{%(sel)s}, "estimator", "exporter", "", "")\n'
             "  or\n"
             f'    label_replace({_ETA}:peak_trend{{%(sel)s}}, "estimator", "prometheus", "", "")\n'
             ")",
             "The sooner of the two ETAs: the exporter's (baseline slope, +Inf when flat) and Prometheus'."),
        Rule(_EXCESS,
             f"(\n    {kind}\n  - on(%(peer_labels)s, device_kind) group_left()\n"
             f"    quantile by (%(peer_labels)s, device_kind) (0.5, {kind})\n"
             ")\n/ ignoring(device_kind)\nmemexporter_memory_limit_bytes{%(sel)s}",
             "How far each rank's typical peak sits above the median rank of its peers (the series that\n"
             "share the peer labels: one training run) on the same kind of device (cuda or cpu), as a\n"
             "fraction of its own limit. A peer label a series lacks counts as empty."),
        *phase_recording(),
    ]


def alerts(c: RulesConfig) -> list[Rule]:
    util, eta = _UTIL + "{%(sel)s}", _ETA + ":min{%(sel)s}"
    return [
        Rule("MemexporterOOMPredicted",
             f"{eta} < %(predicted_horizon_s)s\nand\n{util} > %(predicted_min_utilisation)s",
             "Level AND forecast AND for: (node-mixin filling up). The forecast is the sooner of two ETAs:\n"
             "the exporter's from its first steps (its warm-up, noise and pace gates keep start-up creep\n"
             "out), and Prometheus' only once it has a full trend window of steps without a restart.",
             c.predicted_for, "warning",
             "Training memory is predicted to run out within %(predicted_horizon)s.",
             "%(who)s is predicted to run out of memory in {{ $value | humanizeDuration }}: "
             "its per-step peak is at %(util)s of the limit and growing."),
        Rule("MemexporterOOMImminent",
             f"{util} > %(imminent_full_utilisation)s\nor\n(\n  {util} > %(imminent_min_utilisation)s\n"
             f"  and\n  {eta} < %(imminent_horizon_s)s\n)\nor\n(\n  {util}\n"
             "  and on(job, instance, rank, device)\n"
             f"  max without (phase) ({PHASE_UTIL}{{%(sel)s}}) > %(imminent_full_utilisation)s\n)",
             "Headroom nearly gone, or a short ETA with little headroom: on the step peak, training alone.\n"
             "Or the last occurrence of an out-of-step phase (an evaluation, a checkpoint) nearly filled the\n"
             "limit: the exporter keeps those phases out of the step peak (so an evaluation spike no longer\n"
             "feeds the forecast), so they get their own headroom gate; the next occurrence can OOM. The\n"
             "forecast arm stays on training peaks. The value is the step peak's utilisation (the\n"
             "description names the phase), so this arm waits for a completed step.",
             c.imminent_for, c.critical_severity,
             "Training memory is about to run out.",
             "%(who)s has its per-step peak at {{ $value | humanizePercentage }} of the limit%(phase_note)s; "
             "time to OOM at the current trend: %(eta)s."),
        Rule("MemexporterMemoryLeak",
             "memexporter_leak_rate_bytes_per_second{%(sel)s} * 3600 / memexporter_memory_limit_bytes{%(sel)s}\n"
             "  > %(leak_min_growth_per_hour)s\nunless on(job, instance, rank, device)\n"
             "rank_device:memexporter_memory_baseline_bytes:deriv{%(sel)s} <= 0",
             "The exporter's slope, from its first steps; once Prometheus' median trend of the baseline\n"
             "has a full window (no restart in it), it must agree that the baseline grows.",
             c.leak_for, "warning", "Memory held between training steps keeps growing.",
             "%(who)s holds more memory between steps every hour: its baseline grows by "
             "{{ $value | humanizePercentage }} of the limit per hour (%(leak)s per step); "
             "time to OOM at this rate: %(eta)s."),
        Rule("MemexporterAllocatorThrashing",
             "increase(memexporter_allocator_alloc_retries_total{%(sel)s}[%(thrashing_window)s]) > 0",
             "Retries in every window for the whole for: a sustained pattern, not one burst.",
             c.thrashing_for, "warning", "The CUDA caching allocator keeps retrying allocations.",
             '%(who)s retried cudaMalloc about {{ $value | printf "%%.0f" }} times in the last %(thrashing_window)s '
             "after freeing its cache: steps slow down and an OOM is close."),
        Rule("MemexporterOOMOccurred",
             "increase(memexporter_allocator_ooms_total{%(sel)s}[%(oom_window)s]) > 0",
             "increase() counts across a restart (a reset adds the new value) as long as the restart\n"
             "gap is shorter than the window.", 0, "warning", "A training process ran out of memory.",
             '%(who)s raised about {{ $value | printf "%%.0f" }} CUDA out-of-memory error(s) '
             "in the last %(oom_window)s."),
        Rule("MemexporterFatalOOMSuspected",
             "last_over_time(memexporter_memory_peak_bytes{%(sel)s}[%(lost_window)s])\n"
             "  / last_over_time(memexporter_memory_limit_bytes{%(sel)s}[%(lost_window)s])\n"
             "  > %(lost_min_utilisation)s\n"
             "unless on(job, instance, rank, device) memexporter_memory_peak_bytes{%(sel)s}\n"
             "unless on(job, instance) up{%(sel)s} == 1",
             "A fatal OOM (an uncaught CUDA OOM, the kernel's OOM killer) ends the process before the next\n"
             "scrape, so OOMOccurred never sees it: the series just stop. This fires when they stop (the\n"
             "target is down or gone) while the last step peak was near the limit. A target that is up\n"
             "but lacks the series has a failing collector (CollectorFailing), not a dead process.",
             c.lost_for, "warning", "A training process died near its memory limit: probably an OOM.",
             "%(who)s stopped answering scrapes right after its per-step peak reached "
             "{{ $value | humanizePercentage }} of its limit (last seen: peak %(last_peak)s of %(last_limit)s, "
             "%(last_steps)s steps): it probably died of an out-of-memory error, an uncaught CUDA OOM or "
             "the kernel's OOM killer. Check its exit status and log."),
        Rule("MemexporterFragmentationHigh",
             "avg_over_time(memexporter_allocator_fragmentation_ratio{%(sel)s}[%(fragmentation_window)s])\n"
             "  > %(fragmentation_min_ratio)s\nand\n"
             "avg_over_time(memexporter_allocator_inactive_split_bytes{%(sel)s}[%(fragmentation_window)s])\n"
             "  / memexporter_memory_limit_bytes{%(sel)s} > %(fragmentation_min_waste)s",
             "A high ratio that also wastes a real share of the limit.", c.fragmentation_for, "warning",
             "CUDA memory is highly fragmented.",
             "%(who)s: {{ $value | humanizePercentage }} of the memory reserved by the caching allocator sits in "
             "inactive split blocks (average over %(fragmentation_window)s), now %(split)s."),
        Rule("MemexporterRankImbalance",
             _EXCESS + "{%(sel)s} > %(imbalance_min_excess)s",
             "Medians over half the trend window, so an evaluation spike on rank 0 does not count.",
             c.imbalance_for, "warning", "One rank uses far more memory than its peers.",
             "%(who)s has a typical per-step peak {{ $value | humanizePercentage }} of its limit above the "
             "median rank of its training run (peers share %(peer_labels)s). The whole run stops when this rank "
             "runs out of memory."),
        Rule("MemexporterCollectorFailing",
             "avg_over_time(memexporter_collector_success{%(sel)s}[%(collector_window)s])"
             " < %(collector_min_success)s",
             "A collector that fails loses only its own series, so nothing else shows it.",
             c.collector_for, "warning", "A memexporter collector is failing.",
             "Collector {{ $labels.collector }} of rank {{ $labels.rank }} of job {{ $labels.job }} on "
             "{{ $labels.instance }} succeeded in only {{ $value | humanizePercentage }} of scrapes over the "
             "last %(collector_window)s: its series are missing. The exporter's log names the error."),
        stalled_alert(c),
    ]
