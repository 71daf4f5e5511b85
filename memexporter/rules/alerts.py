"""The alerting rules: each alert per rank (``scope="rank"``), and its run-wide twin (``scope="run"``).

A rank alert's expression is its condition, per rank (and device), with the rank's ``run_id``
(``runs.with_run``, or records that carry it), so that Alertmanager can tell the runs apart. Its
annotations read only ``$value`` and ``$labels``: an alert that fires on 1,024 ranks runs no
template query. Where a figure used to come from a query, the value carries it (OOMImminent's
phase arm), or the run alert names it once per run, or the runbook says how to look it up.

Every alert but RankImbalance (one rank against its peers: a cause of its own by definition) has a
run twin (``runs.run_alert``): a leak in code that every rank runs, an OOM forecast on ranks that
hold the same model, a failing collector (a driver mismatch on a whole fleet), a hung collective.
"""

from __future__ import annotations

import dataclasses

from memexporter.rules.conditions import CONDITIONS
from memexporter.rules.inputs import input_alerts
from memexporter.rules.params import RulesConfig
from memexporter.rules.phases import stalled_alert
from memexporter.rules.rule import Rule
from memexporter.rules.runs import Twin, run_alert
from memexporter.rules.template import params

_EXCESS = "rank_device:memexporter_memory_peak_excess_over_job_median:ratio{%(sel)s}"
_PCT = "{{ value . | humanizePercentage }}"
_COUNT = '{{ value . | printf "%%.0f" }}'


def _rank_alerts(c: RulesConfig) -> list[tuple[Rule, Twin | None]]:
    """Each alert per rank (its expression reads its condition: ``conditions.py``) and its run twin."""
    r = {name: cond.reader for name, cond in CONDITIONS.items()}
    return [
        (
            Rule(
                "MemexporterOOMPredicted",
                expr=r["MemexporterOOMPredicted"],
                why="Level AND forecast AND for: (node-mixin filling up). The forecast is the sooner of two ETAs:\n"
                "the exporter's from its first steps (its warm-up, noise and pace gates keep start-up creep\n"
                "out), and Prometheus' only once it has a full trend window of steps without a restart.",
                for_=c.predicted_for,
                severity="warning",
                summary="Training memory is predicted to run out within %(predicted_horizon)s.",
                description="%(who)s is predicted to run out of memory in {{ $value | humanizeDuration }}: its per-step peak, "
                "over %(predicted_min_pct)s of the limit, keeps growing.",
            ),
            Twin(
                summary="Training memory of several ranks of a run is predicted to run out within %(predicted_horizon)s.",
                description="%(run_who)s: %(n_of_m)s are predicted to run out of memory within %(predicted_horizon)s; the "
                "soonest: %(worst)s. A cause that every rank shares (the code, the model, the data): fix it once.",
                pick="min",
                shows="in {{ value . | humanizeDuration }}",
            ),
        ),
        (
            Rule(
                "MemexporterOOMImminent",
                expr=r["MemexporterOOMImminent"],
                why="Headroom nearly gone, or a short ETA with little headroom: on the step peak, training alone.\n"
                "Or the last occurrence of an out-of-step phase (an evaluation, a checkpoint) nearly filled the\n"
                "limit: the exporter keeps those phases out of the step peak (so an evaluation spike no longer\n"
                "feeds the forecast), so they get their own headroom gate; the next occurrence can OOM. The\n"
                "forecast arm stays on training peaks. The value is the step peak's utilisation, or on the\n"
                "phase arm the phase's (with the step peak's labels, so this arm waits for a completed step).",
                for_=c.imminent_for,
                severity=c.critical_severity,
                summary="Training memory is about to run out.",
                description="%(who)s peaks at {{ $value | humanizePercentage }} of its limit (in its training steps or, when "
                "that is higher, in its last evaluation or checkpoint), or is growing towards it within "
                "%(imminent_horizon)s: it is about to run out of memory.",
            ),
            Twin(
                summary="Training memory of several ranks of a run is about to run out.",
                description="%(run_who)s: %(n_of_m)s are about to run out of memory; the fullest: %(worst)s. A cause "
                "that every rank shares (the batch, the model, an evaluation, a leak): fix it once.",
                pick="max",
                shows=f"at {_PCT} of its limit",
            ),
        ),
        (
            Rule(
                "MemexporterMemoryLeak",
                expr=r["MemexporterMemoryLeak"],
                why="The exporter's slope, from its first steps; once Prometheus' median trend of the baseline\n"
                "has a full window (no restart in it), it must agree that the baseline grows.",
                for_=c.leak_for,
                severity="warning",
                summary="Memory held between training steps keeps growing.",
                description="%(who)s holds more memory between steps every hour: its baseline grows by "
                "{{ $value | humanizePercentage }} of the limit per hour.",
            ),
            Twin(
                summary="Memory held between training steps keeps growing on several ranks of a run.",
                description="%(run_who)s: %(n_of_m)s hold more memory between steps every hour; the fastest: %(worst)s. "
                "A leak in code that every rank runs: find it on one rank.",
                pick="max",
                shows=f"{_PCT} of its limit per hour",
            ),
        ),
        (
            Rule(
                "MemexporterAllocatorThrashing",
                expr=r["MemexporterAllocatorThrashing"],
                why="Retries in every window for the whole for: a sustained pattern, not one burst.",
                for_=c.thrashing_for,
                severity="warning",
                summary="The CUDA caching allocator keeps retrying allocations.",
                description='%(who)s retried cudaMalloc about {{ $value | printf "%%.0f" }} times in the last %(thrashing_window)s '
                "after freeing its cache: steps slow down and an OOM is close.",
            ),
            Twin(
                summary="The CUDA caching allocator keeps retrying allocations on several ranks of a run.",
                description="%(run_who)s: %(n_of_m)s keep retrying cudaMalloc after freeing their cache; the most: %(worst)s. "
                "Steps slow down and an OOM is close.",
                pick="max",
                shows=f"{_COUNT} retries in the last %(thrashing_window)s",
            ),
        ),
        (
            Rule(
                "MemexporterOOMOccurred",
                expr=r["MemexporterOOMOccurred"],
                why="increase() counts across a restart (a reset adds the new value) as long as the restart\n"
                "gap is shorter than the window.",
                for_=0,
                severity="warning",
                summary="A training process ran out of memory.",
                description='%(who)s raised about {{ $value | printf "%%.0f" }} CUDA out-of-memory error(s) '
                "in the last %(oom_window)s.",
            ),
            Twin(
                summary="Several ranks of a run ran out of memory.",
                description="%(run_who)s: %(n_of_m)s raised CUDA out-of-memory errors in the last %(oom_window)s; the most: "
                "%(worst)s.",
                pick="max",
                shows=f"about {_COUNT}",
            ),
        ),
        (
            Rule(
                "MemexporterFatalOOMSuspected",
                expr=r["MemexporterFatalOOMSuspected"],
                why="A fatal OOM (an uncaught CUDA OOM, the kernel's OOM killer) ends the process before the next\n"
                "scrape, so OOMOccurred never sees it. Observed: the exporter's helper outlives the job for a\n"
                "grace period and says how it ended (memexporter_job_end_info, cause cuda_oom or oom_kill); the\n"
                "alert then carries cause, exit_code and signal. An end observed otherwise, but not a clean\n"
                "exit (a status other than 0, a signal, no trace: an OOM the job could not name), near the\n"
                "limit: the same, with the end's labels. Inferred, where no end was observed (an exporter\n"
                "without a helper, a helper gone with its node or container): the series stop (the target is\n"
                "down or gone) while the last step peak was near the limit. A clean exit (status 0) near the\n"
                "limit never fires. A target that is up but lacks the\n"
                "series has a failing collector (CollectorFailing), not a dead process. The run of a rank that\n"
                "is gone: its last run_info within the window.",
                for_=c.lost_for,
                severity="warning",
                summary="A training process died near its memory limit: probably an OOM.",
                description='{{ if or (eq $labels.cause "oom_kill") (eq $labels.cause "cuda_oom") }}%(who)s ended by '
                '{{ if eq $labels.cause "oom_kill" }}the memory cgroup\'s OOM killer{{ else }}a CUDA out-of-memory '
                "error{{ end }}{{ with $labels.signal }} ({{ . }}){{ end }}{{ with $labels.exit_code }} (exit status "
                "{{ . }}){{ end }}, as its exporter's helper observed; its per-step peak was at "
                "{{ $value | humanizePercentage }} of its limit.{{ else }}%(who)s {{ if $labels.cause }}ended "
                "({{ $labels.cause }}{{ with $labels.signal }} {{ . }}{{ end }}{{ with $labels.exit_code }} {{ . }}"
                "{{ end }}, as its exporter's helper observed){{ else }}stopped answering scrapes{{ end }} right after "
                "its per-step peak reached {{ $value | humanizePercentage }} of its limit: it probably died of an "
                "out-of-memory error, an uncaught CUDA OOM or the kernel's OOM killer. Check its exit status and log."
                "{{ end }}",
            ),
            Twin(
                summary="Several ranks of a run died near their memory limit: probably an OOM.",
                description="%(run_who)s: {{ $value }} ranks stopped answering scrapes right after their per-step peaks came "
                "near their limits (%(answering)s ranks of the run still answer); the fullest: %(worst)s. The run "
                "probably died of an out-of-memory error: check the exit status and log of that rank first.",
                pick="max",
                shows=f"at {_PCT} of its limit",
            ),
        ),
        (
            Rule(
                "MemexporterFragmentationHigh",
                expr=r["MemexporterFragmentationHigh"],
                why="A high ratio that also wastes a real share of the limit.",
                for_=c.fragmentation_for,
                severity="warning",
                summary="CUDA memory is highly fragmented.",
                description="%(who)s: {{ $value | humanizePercentage }} of the memory reserved by the caching allocator sits in "
                "inactive split blocks (average over %(fragmentation_window)s).",
            ),
            Twin(
                summary="CUDA memory is highly fragmented on several ranks of a run.",
                description="%(run_who)s: %(n_of_m)s keep much of the memory their caching allocator reserved in inactive "
                "split blocks; the most: %(worst)s.",
                pick="max",
                shows=f"{_PCT} (average over %(fragmentation_window)s)",
            ),
        ),
        (
            Rule(
                "MemexporterRankImbalance",
                expr=_EXCESS + " > %(imbalance_min_excess)s",
                why="Medians over half the trend window, so an evaluation spike on rank 0 does not count.",
                for_=c.imbalance_for,
                severity="warning",
                summary="One rank uses far more memory than its peers.",
                description="%(who)s has a typical per-step peak {{ $value | humanizePercentage }} of its limit above the "
                "median rank of its training run (peers share %(peer_labels)s). The whole run stops when this rank "
                "runs out of memory.",
            ),
            None,
        ),
        (
            Rule(
                "MemexporterCollectorFailing",
                expr=r["MemexporterCollectorFailing"],
                why="A collector that fails loses only its own series, so nothing else shows it.",
                for_=c.collector_for,
                severity="warning",
                summary="A memexporter collector is failing.",
                description="Collector {{ $labels.collector }} of rank {{ $labels.rank }} of job {{ $labels.job }} on "
                "{{ $labels.instance }} succeeded in only {{ $value | humanizePercentage }} of scrapes over the "
                "last %(collector_window)s: its series are missing. The exporter's log names the error.",
            ),
            Twin(
                summary="A memexporter collector is failing on several ranks of a run.",
                description="%(run_who)s: collector {{ $labels.collector }} is failing on %(n_of_m)s; the worst: %(worst)s. "
                "Its series are missing; the exporter's log names the error (one cause for the whole run: a "
                "driver, a library, the container's permissions).",
                pick="min",
                shows=f"{_PCT} of scrapes over the last %(collector_window)s",
                by=("collector",),
            ),
        ),
        (
            stalled_alert(c, r["MemexporterTrainingStalled"]),
            Twin(
                summary="A training run has stopped making progress on several ranks.",
                description="%(run_who)s: %(n_of_m)s have not finished a training step for longer than their rhythm allows, "
                "while their processes still answer scrapes; the longest: %(worst)s. It is probably hung: dump "
                "the stacks of every rank with py-spy; the rank waiting somewhere else than its peers is the one.",
                pick="max",
                shows="for {{ value . | humanizeDuration }}",
            ),
        ),
    ]


# The OOM forecasts and the leak fire together on every rank of a leaking run: groups of their own,
# so that each alert group stays short (an active alert costs its templates at every evaluation,
# about 0.25 ms). The three in one group took 1.03 s an evaluation with 1,024 ranks leaking.
FORECASTS = ("MemexporterOOMPredicted", "MemexporterOOMImminent")
LEAKS = ("MemexporterMemoryLeak",)


def alerts(c: RulesConfig) -> list[Rule]:
    """Every alert: the record of its condition where it has one, the alert per rank, its run twin."""
    p = params(c)
    out: list[Rule] = []
    for alert, twin in [*_rank_alerts(c), *((rule, None) for rule in input_alerts(c))]:
        out += [CONDITIONS[alert.name].record] if alert.name in CONDITIONS else []
        rank = dataclasses.replace(alert, scope="rank")
        out.append(rank)
        if twin is not None:
            out.append(run_alert(rank, twin, c, p))
    return out


def alert_groups(c: RulesConfig) -> list[tuple[str, list[Rule]]]:
    """``alerts(c)`` as rule groups: the forecasts, the leak, and the others (each condition with its alerts)."""
    rules = alerts(c)

    def of(names: tuple[str, ...]) -> list[Rule]:
        return [r for r in rules if r.name in names or r.name in {CONDITIONS[n].record.name for n in names}]

    forecast, leak = of(FORECASTS), of(LEAKS)
    return [
        ("memexporter.forecast", forecast),
        ("memexporter.leak", leak),
        ("memexporter.alerts", [r for r in rules if r not in forecast and r not in leak]),
    ]
