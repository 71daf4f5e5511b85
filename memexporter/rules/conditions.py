"""The condition of each alert, per rank, recorded once where the alerts group begins (issue 25).

A rank alert, its run twin (``runs.run_alert``, which counts the ranks that meet it) and the twin's
description (which names the worst of them) all read the same condition. Evaluated three times, a
range function over every rank (the collector flags of 1,024 ranks over 10 minutes) was the costly
part of the alerts group; recorded once, each reader only looks it up. A record holds the ranks that
meet the condition (none on a healthy run), with the alert's value; ``reader`` is the expression of
the rank alert: the record with the rank's ``run_id`` (joined here where the record lacks it).

Prometheus evaluates the rules of a group in order, so the alerts read this evaluation's records.
"""

from __future__ import annotations

from dataclasses import dataclass

from memexporter.rules.phases import PHASE_UTIL, STALLED
from memexporter.rules.rule import Rule
from memexporter.rules.runs import INFO, with_run

_UTIL = "rank_device:memexporter_memory_peak_utilisation:ratio{%(sel)s}"
_ETA = "rank_device:memexporter_oom_eta_seconds:min{%(sel)s}"
# The run of a rank that is gone (FatalOOMSuspected): its last info within the window.
_LOST_INFO = f"topk by (job, instance, rank) (1, last_over_time({INFO}{{%(sel)s}}[%(lost_window)s]))"
# How a rank ended, as its exporter's helper observed it (issue 35): served for a grace period after the end.
_ENDED = "last_over_time(memexporter_job_end_info{%s%%(sel)s}[%%(lost_window)s])"
# The last committed peak (what met the limit; the step peak of an exporter older than issue 34) over
# the limit.
_LAST_UTIL = (
    "(\n"
    "    last_over_time(memexporter_memory_committed_peak_bytes{%(sel)s}[%(lost_window)s])\n"
    "  or\n"
    "    last_over_time(memexporter_memory_peak_bytes{%(sel)s}[%(lost_window)s])\n"
    "  )\n"
    "  / last_over_time(memexporter_memory_limit_bytes{%(sel)s}[%(lost_window)s])"
)
_WHY = (
    "The condition of the alerts below, per rank: present while it holds, with their value. Recorded\n"
    "once, so that the rank alert, its run twin and the twin's description do not each evaluate it."
)


@dataclass(frozen=True)
class Condition:
    """``record``: the rule that records the condition; ``reader``: the rank alert's expression."""

    record: Rule
    reader: str


def _condition(name: str, expr: str, info: str = "", joined: bool = False) -> Condition:
    """``joined``: ``expr`` reads records that carry the run_id already."""
    selected = name + "{%(sel)s}"
    return Condition(
        Rule(name, expr=expr, why=_WHY), selected if joined else with_run(selected, *([info] if info else []))
    )


CONDITIONS = {
    "MemexporterOOMPredicted": _condition(
        "rank_device:memexporter_oom_predicted:condition",
        f"{_ETA} < %(predicted_horizon_s)s\nand\n{_UTIL} > %(predicted_min_utilisation)s",
        joined=True,
    ),
    # The phase arm's value is the phase's peak (with the step peak's labels: it waits for a step).
    "MemexporterOOMImminent": _condition(
        "rank_device:memexporter_oom_imminent:condition",
        f"{_UTIL} > %(imminent_full_utilisation)s\nor\n(\n  {_UTIL} > %(imminent_min_utilisation)s\n"
        f"  and\n  {_ETA} < %(imminent_horizon_s)s\n)\nor\n(\n  0 * {_UTIL}\n"
        "  + on(job, instance, rank, device) group_left()\n"
        f"  max without (phase) ({PHASE_UTIL}{{%(sel)s}})\n) > %(imminent_full_utilisation)s",
        joined=True,
    ),
    "MemexporterMemoryLeak": _condition(
        "rank_device:memexporter_memory_leak:condition",
        "memexporter_leak_rate_bytes_per_second{%(sel)s} * 3600 / memexporter_memory_limit_bytes{%(sel)s}\n"
        "  > %(leak_min_growth_per_hour)s\nunless on(job, instance, rank, device)\n"
        "rank_device:memexporter_memory_baseline_bytes:deriv{%(sel)s} <= 0",
    ),
    "MemexporterAllocatorThrashing": _condition(
        "rank_device:memexporter_allocator_thrashing:condition",
        "increase(memexporter_allocator_alloc_retries_total{%(sel)s}[%(thrashing_window)s]) > 0",
    ),
    "MemexporterOOMOccurred": _condition(
        "rank_device:memexporter_oom_occurred:condition",
        "increase(memexporter_allocator_ooms_total{%(sel)s}[%(oom_window)s]) > 0",
    ),
    # Observed: the helper saw the job end by a CUDA OOM or the cgroup's OOM killer (the fullest device of
    # the rank, with the end's labels), whatever the peak. Observed otherwise, but not as a clean exit (a
    # status that is not 0, a signal, no trace): near the limit, as inferred, with the end's labels.
    # Inferred, where no end was observed (no helper, or one gone with its node): the series stopped right
    # after a peak near the limit. A clean exit (status 0) never infers.
    "MemexporterFatalOOMSuspected": _condition(
        "rank_device:memexporter_fatal_oom_suspected:condition",
        f"topk by (job, instance, rank) (1,\n  {_LAST_UTIL}\n)\n"
        "* on(job, instance, rank) group_left(cause, exit_code, signal)\n"
        + _ENDED
        % 'cause=~"cuda_oom|oom_kill", '
        + f"\nor\n(\n  {_LAST_UTIL}\n    > %(lost_min_utilisation)s\n)\n"
        "* on(job, instance, rank) group_left(cause, exit_code, signal)\n"
        + _ENDED
        % 'cause!~"cuda_oom|oom_kill", exit_code!="0", '
        + "\nor\n(\n"
        f"  {_LAST_UTIL}\n"
        "    > %(lost_min_utilisation)s\n"
        "  unless on(job, instance, rank, device) memexporter_memory_peak_bytes{%(sel)s}\n"
        "  unless on(job, instance) up{%(sel)s} == 1\n"
        "  unless on(job, instance, rank) " + _ENDED % "" + "\n)",
        _LOST_INFO,
    ),
    "MemexporterFragmentationHigh": _condition(
        "rank_device:memexporter_fragmentation_high:condition",
        "avg_over_time(memexporter_allocator_fragmentation_ratio{%(sel)s}[%(fragmentation_window)s])\n"
        "  > %(fragmentation_min_ratio)s\nand\n"
        "avg_over_time(memexporter_allocator_inactive_split_bytes{%(sel)s}[%(fragmentation_window)s])\n"
        "  / memexporter_memory_limit_bytes{%(sel)s} > %(fragmentation_min_waste)s",
    ),
    "MemexporterCollectorFailing": _condition(
        "rank_collector:memexporter_collector_failing:condition",
        "avg_over_time(memexporter_collector_success{%(sel)s}[%(collector_window)s]) < %(collector_min_success)s",
    ),
    "MemexporterTrainingStalled": _condition("rank:memexporter_training_stalled:condition", STALLED, joined=True),
}
