"""Render the Prometheus recording and alerting rules in ``alerts/`` from one template.

Like a monitoring mixin's ``_config``: the selector, windows, horizons, thresholds and ``for:``
durations live in ``RulesConfig``; the expressions below read them through ``%(name)s`` and never
hard-code them. ``memexporter rules`` prints the rendering; ``alerts/memexporter.rules.yml`` is the
``default`` preset and a test keeps it equal to ``render()``. Durations are seconds.

Why the rules look the way they do: training memory is a sawtooth within every step, so the rules
read the exporter's per-step peak and baseline, never raw ``used`` samples. Forecasts follow the
node-mixin "filling up" pattern: a level gate AND a forecast AND a ``for:`` long enough to ride out
warm-up and evaluation spikes. Two estimators feed the forecast: the exporter's own ETA (Theil-Sen
slope of the baseline) and a Prometheus-side one from the medians of the step peak over the two
halves of the trend window (robust to spikes, and it sees a peak that grows while the baseline
stays flat). The Prometheus side only counts after a full trend window of uninterrupted steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from memexporter import kube

SEVERITIES = ("critical", "warning", "info")
_PEAK = "rank_device:memexporter_memory_peak_bytes"
_UTIL = "rank_device:memexporter_memory_peak_utilisation:ratio"
_EXCESS = "rank_device:memexporter_memory_peak_excess_over_job_median:ratio"
_ETA = "rank_device:memexporter_oom_eta_seconds"
# The labels that name one training run: the ranks that share them are peers (RankImbalance).
# A label a series lacks groups as empty, so a setup with one run per Prometheus job, no
# `namespace` and no `run_id` compares exactly the ranks of that job. The example scrape configs
# set `run_id` (static and file_sd target labels; the PodMonitor from the pod's job-name label).
PEER_LABELS: tuple[str, ...] = ("job", "namespace", "run_id")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Per-rank labels (every rank its own peer group: the alert could never fire) and the rule's own.
_NOT_PEER_LABELS = frozenset({"instance", "pod", "rank", "local_rank", "device", "device_kind"})


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
    predicted_min_utilisation: float = 0.6  # node-mixin warns below 40% free
    predicted_for: int = 1800
    imminent_horizon: int = 1800
    imminent_min_utilisation: float = 0.8  # node-mixin's critical gate: below 20% free
    imminent_full_utilisation: float = 0.97  # headroom nearly gone, whatever the trend
    imminent_for: int = 600
    leak_min_growth_per_hour: float = 0.01  # baseline growth, as a fraction of the limit per hour
    leak_for: int = 1800
    thrashing_window: int = 300
    thrashing_for: int = 600
    oom_window: int = 600
    fragmentation_window: int = 900
    fragmentation_min_ratio: float = 0.3
    fragmentation_min_waste: float = 0.05  # inactive split bytes as a fraction of the limit
    fragmentation_for: int = 900
    imbalance_min_excess: float = 0.1  # peak above the job's median rank, fraction of the limit
    imbalance_for: int = 1800
    collector_window: int = 600
    collector_min_success: float = 0.9
    collector_for: int = 600

    @classmethod
    def default(cls) -> RulesConfig:
        """Production: 15 s to 1 m scrapes, hour-long trends; quiet on a healthy job near capacity."""
        return cls()

    @classmethod
    def demo(cls) -> RulesConfig:
        """Windows in seconds so ``memexporter demo`` and the end-to-end test fire in minutes.
        Assumes scrape and evaluation intervals of 5 s or less; thresholds are the defaults'."""
        return cls(level_window=30, trend_window=120, predicted_horizon=600, predicted_for=60,
                   imminent_horizon=120, imminent_for=30, leak_for=60, thrashing_window=60,
                   thrashing_for=30, oom_window=60, fragmentation_window=60, fragmentation_for=60,
                   imbalance_for=60, collector_window=60, collector_for=60)


PRESETS: Mapping[str, RulesConfig] = {"default": RulesConfig.default(), "demo": RulesConfig.demo()}


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
            raise ValueError(f"memexporter: peer label {name!r} (in {text!r}) is not a label name "
                             "([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)")
        if name in _NOT_PEER_LABELS:
            raise ValueError(f"memexporter: peer label {name!r} (in {text!r}) differs between the ranks of one "
                             f"run; peer labels name the run, e.g. {', '.join(PEER_LABELS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"memexporter: peer labels {text!r} repeat a label")
    return names


def _query(metric: str, fmt: str) -> str:
    """Template text printing ``metric`` for the alert's job/instance/rank/device through ``fmt``."""
    labels = "$labels.job $labels.instance $labels.rank $labels.device"
    return (f'{{{{ with printf "{metric}{{job=%q,instance=%q,rank=%q,device=%q}}" {labels} | query }}}}'
            f"{{{{ $v := . | first | value }}}}{fmt}{{{{ end }}}}")


def _params(c: RulesConfig) -> dict[str, str]:
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
        util=_query(_UTIL, "{{ $v | humanizePercentage }}"),
        eta=_query(f"{_ETA}:min",
                   "{{ if lt $v 1e+300 }}{{ humanizeDuration $v }}{{ else }}none, not growing{{ end }}"),
        # A full trend window of steps without a restart: warm-up never counts as a trend.
        uninterrupted="and on(job, instance, rank) (resets(memexporter_steps_total{%(sel)s}[%(trend_window)s]) == 0)\n"
                      "and on(job, instance, rank) (memexporter_steps_total{%(sel)s} offset %(trend_window)s)",
    )
    p["uninterrupted"] %= p
    return p


def _median_deriv(metric: str) -> str:
    q = f"quantile_over_time(0.5, {metric}{{%(sel)s}}[%(half)s]"
    return f"(\n    {q})\n  - {q} offset %(half)s)\n) / %(half_s)s\n%(uninterrupted)s"


def _recording() -> list[Rule]:
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
    ]


def _alerts(c: RulesConfig) -> list[Rule]:
    util, eta = _UTIL + "{%(sel)s}", _ETA + ":min{%(sel)s}"
    return [
        Rule("MemexporterOOMPredicted",
             f"{eta} < %(predicted_horizon_s)s\nand\n{util} > %(predicted_min_utilisation)s\n%(uninterrupted)s",
             "Level AND forecast AND a long for: (node-mixin filling up). Only after a full trend window\n"
             "of steps: the tail of a warm-up reads as a slope in the exporter's window for a while.\n"
             "OOMImminent has no such wait, so a fast leak right after a restart still pages.",
             c.predicted_for, "warning",
             "Training memory is predicted to run out within %(predicted_horizon)s.",
             "%(who)s is predicted to run out of memory in {{ $value | humanizeDuration }}: "
             "its per-step peak is at %(util)s of the limit and growing."),
        Rule("MemexporterOOMImminent",
             f"{util} > %(imminent_full_utilisation)s\nor\n(\n  {util} > %(imminent_min_utilisation)s\n"
             f"  and\n  {eta} < %(imminent_horizon_s)s\n)",
             "Headroom nearly gone, or a short ETA with little headroom.", c.imminent_for, c.critical_severity,
             "Training memory is about to run out.",
             "%(who)s has its per-step peak at {{ $value | humanizePercentage }} of the limit; "
             "time to OOM at the current trend: %(eta)s."),
        Rule("MemexporterMemoryLeak",
             "memexporter_leak_rate_bytes_per_second{%(sel)s} * 3600 / memexporter_memory_limit_bytes{%(sel)s}\n"
             "  > %(leak_min_growth_per_hour)s\nand\nrank_device:memexporter_memory_baseline_bytes:deriv{%(sel)s} > 0",
             "The exporter's slope AND Prometheus' median trend agree that the baseline grows.",
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
    ]


def _scalar(value: str, indent: str) -> str:
    if "\n" in value:  # block literal: PromQL stays readable, nothing to escape
        return "|-\n" + "".join(f"{indent}  {line}\n" for line in value.splitlines()).rstrip("\n")
    return str(yaml.safe_dump(value, width=1 << 16)).removesuffix("\n...\n").rstrip("\n")


def _emit(rule: Rule, p: Mapping[str, str]) -> str:
    head = "".join(f"  # {line}\n" for line in rule.why.splitlines())
    kind = "alert" if rule.severity else "record"
    out = [f"{head}  - {kind}: {rule.name}", f"    expr: {_scalar(rule.expr % p, '    ')}"]
    if rule.for_:
        out.append(f"    for: {duration(rule.for_)}")
    if rule.severity:
        url = f"{p['runbook_base_url']}#{rule.name.lower()}"
        out += ["    labels:", f"      severity: {_scalar(rule.severity, '')}", "    annotations:"]
        out += [f"      {k}: {_scalar(v % p if k != 'runbook_url' else v, '      ')}"
                for k, v in (("summary", rule.summary), ("description", rule.description), ("runbook_url", url))]
    return "\n".join(out) + "\n"


def render_config(c: RulesConfig, preset: str = "custom") -> str:
    """The rules file for ``c``: YAML for Prometheus, stable byte for byte."""
    if any(ch in c.selector for ch in "{}"):
        raise ValueError(f"memexporter: selector must be label matchers without braces, got {c.selector!r}")
    if c.critical_severity not in SEVERITIES:
        raise ValueError(f"memexporter: critical_severity must be one of {SEVERITIES}, got {c.critical_severity!r}")
    p = _params(c)
    p.update(leak=_query("memexporter_leak_bytes_per_step", "{{ $v | humanize1024 }}B"),
             split=_query("memexporter_allocator_inactive_split_bytes", "{{ $v | humanize1024 }}B"))
    knobs = "\n".join(f"#   {f.name}: {p[f.name]}" for f in dataclasses.fields(c))
    lines = [f"# Generated by `memexporter rules --preset {preset}` (memexporter/rules.py). Do not edit by hand:",
             "# change the template or its parameters and render again. Parameters:", knobs,
             "groups:", "- name: memexporter.rules", "  rules:"]
    lines += [_emit(r, p) for r in _recording()]
    lines += ["- name: memexporter.alerts", "  rules:"]
    lines += [_emit(r, p) for r in _alerts(c)]
    return "\n".join(lines).rstrip("\n") + "\n"


def render(preset: str = "default", selector: str | None = None, critical_severity: str | None = None,
           runbook_base_url: str | None = None, peer_labels: str | None = None) -> str:
    """Render ``preset`` with optional overrides (``None`` keeps the preset's value)."""
    if preset not in PRESETS:
        raise ValueError(f"memexporter: unknown rules preset {preset!r}; known: {sorted(PRESETS)}")
    c = PRESETS[preset]
    c = dataclasses.replace(
        c, selector=c.selector if selector is None else selector,
        critical_severity=c.critical_severity if critical_severity is None else critical_severity,
        runbook_base_url=c.runbook_base_url if runbook_base_url is None else runbook_base_url,
        peer_labels=c.peer_labels if peer_labels is None else peer_labels)
    return render_config(c, preset)


def main(argv: list[str] | None = None) -> int:
    """``memexporter rules``: print (or write) the rendered rules."""
    parser = argparse.ArgumentParser(
        prog="memexporter rules", description="Print the memexporter Prometheus recording and alerting rules.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default",
                        help="parameter set (default: %(default)s)")
    default_selector = RulesConfig.selector.replace("%", "%%")  # argparse %-formats help texts
    parser.add_argument("--selector", help=f"label matchers for every series, e.g. 'job=\"trainer\"' "
                        f"(default: {default_selector})")
    parser.add_argument("--critical-severity", choices=SEVERITIES, help="severity of MemexporterOOMImminent "
                        "(warning: never page)")
    parser.add_argument("--peer-labels", metavar="LABELS",
                        help="comma-separated labels that name one training run; MemexporterRankImbalance "
                        "compares the ranks that share them, and a label a series lacks counts as empty "
                        f"(default: {RulesConfig.peer_labels.replace(' ', '')})")
    parser.add_argument("--runbook-url", help="base URL of runbook.md; the anchor #<alertname lowercased> is appended")
    parser.add_argument("--output", metavar="FILE", help="write to FILE instead of stdout")
    kube.add_rules_arguments(parser)
    args = parser.parse_args(argv)
    try:
        text = render(args.preset, args.selector, args.critical_severity, args.runbook_url, args.peer_labels)
        text = kube.rules_output(text, args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
