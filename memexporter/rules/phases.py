"""The rules about phases (issue 23): the out-of-step phases' own level, and the stalled run.

The exporter keeps out-of-step phases (``OUT_OF_STEP_PHASES``: evaluation, checkpoint...) out of the
step peak, so the OOM forecast reads training alone. Their own peak gets a level of its own
(``PHASE_UTIL``), which ``MemexporterOOMImminent``'s headroom arm reads (``template.py``).

``MemexporterTrainingStalled`` judges a run by its own rhythm: no step for longer than ``factor`` x its
median step interval (at least a floor), or, while an out-of-step phase is open on any rank of the
run, ``factor`` x that phase's last duration (at least a phase floor: the floor alone at its first
occurrence).
"""

from __future__ import annotations

from memexporter.rules.params import RulesConfig
from memexporter.rules.rule import Rule
from memexporter.rules.runs import indent, with_run
from memexporter.tracking.phases import OUT_OF_STEP_PHASES

PHASE_UTIL = "rank_device_phase:memexporter_phase_peak_utilisation:ratio"
_ALLOWANCE = "rank:memexporter_stall_allowance_seconds:max"
# A stalled rank: seconds since its last step, while longer than its allowance (both with its run_id).
STALLED = with_run("time() - memexporter_last_step_timestamp_seconds{%(sel)s}") + "\n  > " + _ALLOWANCE + "{%(sel)s}"
# The phases the exporter keeps out of the step peak, as a matcher: the rules and the dashboards
# read the same set as the exporter. First in the braces, so that a selector with a trailing comma
# still parses.
OUT_OF_STEP = 'phase=~"' + "|".join(sorted(OUT_OF_STEP_PHASES)) + '"'


def phase_params() -> dict[str, str]:
    """The snippets of the phase rules' expressions and annotations (``%(name)s``)."""
    return dict(
        out_of_step=OUT_OF_STEP,
        who_rank="Rank {{ $labels.rank }} of job {{ $labels.job }} on {{ $labels.instance }}",
    )


def _allowance() -> str:
    step = with_run(
        "clamp_min(\n"
        "    %(stalled_factor)s * memexporter_step_interval_seconds{%(sel)s}\n"
        "  or\n"
        "    0 * memexporter_last_step_timestamp_seconds{%(sel)s},\n"
        "  %(stalled_floor_s)s\n"
        ")"
    )
    # The longest allowance of an out-of-step phase open on any rank of the run, given to every rank.
    phase = with_run(
        "clamp_min(\n"
        "    %(stalled_factor)s * memexporter_phase_duration_seconds{%(out_of_step)s,%(sel)s}\n"
        "  or\n"
        "    0 * memexporter_phase_active{%(out_of_step)s,%(sel)s},\n"
        "  %(stalled_phase_floor_s)s\n"
        ")\n"
        "and\n"
        "memexporter_phase_active{%(out_of_step)s,%(sel)s} == 1"
    )
    ranks = with_run("0 * memexporter_last_step_timestamp_seconds{%(sel)s}")
    return (
        "max without (allowance) (\n"
        f'    label_replace(\n{indent(step, 6)},\n      "allowance", "step", "", ""\n    )\n'
        "  or\n"
        f"    label_replace(\n{indent(ranks, 6)}\n"
        "      + on(%(peer_labels)s) group_left()\n"
        f"      max by (%(peer_labels)s) (\n{indent(phase, 8)}\n      ),\n"
        '      "allowance", "phase", "", ""\n    )\n)'
    )


def phase_recording() -> list[Rule]:
    """The phase records, after the template's own."""
    return [
        Rule(
            PHASE_UTIL,
            expr="(\n"
            "    max_over_time(memexporter_phase_peak_bytes{%(out_of_step)s,%(sel)s}[%(level_window)s])\n"
            "  + ignoring(phase) group_left()\n"
            "    (\n"
            "        memexporter_memory_committed_bytes{%(sel)s} - memexporter_memory_used_bytes{%(sel)s}\n"
            "      or\n"
            "        0 * memexporter_memory_limit_bytes{%(sel)s}\n"
            "    )\n"
            ")\n"
            "/ ignoring(phase) group_left()\nmemexporter_memory_limit_bytes{%(sel)s}",
            why="Peak of the last occurrence of each out-of-step phase (evaluation, checkpoint...) over the\n"
            "level window, plus what is committed beyond used now (stranded in partly used segments), as\n"
            "a fraction of the limit. The exporter keeps these phases out of the step peak, so this is the\n"
            "only level that sees them.",
        ),
        Rule(
            _ALLOWANCE,
            expr=_allowance(),
            why="Seconds without a step that still count as progress: the rank's own rhythm (factor x its\n"
            "median step interval, at least the floor; the floor alone after one step), or, while an\n"
            "out-of-step phase is open on any rank of its run (the ranks that share the peer labels: rank 0\n"
            "evaluating or saving while the others wait in a barrier), factor x that phase's last duration\n"
            "(at least the phase floor; the phase floor alone at its first occurrence), whichever is longer.",
        ),
    ]


def stalled_alert(c: RulesConfig, expr: str) -> Rule:
    """``MemexporterTrainingStalled`` (``expr`` reads ``STALLED``, recorded): pages (the critical
    severity), like ``MemexporterOOMImminent``."""
    return Rule(
        "MemexporterTrainingStalled",
        expr=expr,
        why="Steps stopped while the process is still scraped (a dead one has no series: FatalOOMSuspected,\n"
        "up), judged against the run's own rhythm, so a slow job is not a stalled one, and an open\n"
        "evaluation or checkpoint against its own last duration. Never before the first step (no\n"
        "timestamp yet), so start-up, data loading and compilation do not count. time() is Prometheus'\n"
        "clock and the timestamp the trainer's: their skew must stay well under the floor.",
        for_=c.stalled_for,
        severity=c.critical_severity,
        summary="A training run has stopped making progress.",
        description="%(who_rank)s has not finished a training step for {{ $value | humanizeDuration }} while its "
        "process still answers scrapes: longer than its own rhythm allows (%(stalled_times)s x its median step, "
        "at least %(stalled_floor)s, or an open evaluation's or checkpoint's own allowance). It is probably "
        "hung (a collective waiting for a peer, the data loader, I/O): dump its stacks with py-spy.",
        scope="rank",
    )
