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
from memexporter.rules.rule import Rule, query
from memexporter.tracking.phases import OUT_OF_STEP_PHASES

PHASE_UTIL = "rank_device_phase:memexporter_phase_peak_utilisation:ratio"
_ALLOWANCE = "rank:memexporter_stall_allowance_seconds:max"
# The phases the exporter keeps out of the step peak, as a matcher: the rules and the dashboards
# read the same set as the exporter. First in the braces, so that a selector with a trailing comma
# still parses.
OUT_OF_STEP = 'phase=~"' + "|".join(sorted(OUT_OF_STEP_PHASES)) + '"'


def phase_params() -> dict[str, str]:
    """The snippets of the phase rules' expressions and annotations (``%(name)s``)."""
    return dict(
        out_of_step=OUT_OF_STEP,
        who_rank="Rank {{ $labels.rank }} of job {{ $labels.job }} on {{ $labels.instance }}",
        interval=query("memexporter_step_interval_seconds", "its median step takes {{ humanizeDuration $v }}",
                       rank_only=True, none="it has finished one step only"),
        allowance=query(_ALLOWANCE, "{{ humanizeDuration $v }}", rank_only=True),
        # The phases open now, sorted (nested ones each): where it hangs, e.g. "backward" or "eval".
        open_phases='{{ with printf "memexporter_phase_active{job=%q,instance=%q,rank=%q} == 1" '
                    '$labels.job $labels.instance $labels.rank | query | sortByLabel "phase" }}'
                    '{{ range $i, $s := . }}{{ if $i }}, {{ end }}{{ label "phase" $s }}{{ end }}'
                    "{{ else }}none{{ end }}",
        # The out-of-step phase with the highest peak, if any: " (its last eval phase: 98%)".
        phase_note=f'{{{{ with printf "topk(1, {PHASE_UTIL}{{job=%q,instance=%q,rank=%q,device=%q}})" '
                   "$labels.job $labels.instance $labels.rank $labels.device | query }}"
                   '{{ with first . }} (its last {{ label "phase" . }} phase: {{ value . | humanizePercentage }})'
                   "{{ end }}{{ end }}",
    )


def phase_recording() -> list[Rule]:
    """The phase records, after the template's own."""
    return [
        Rule(PHASE_UTIL,
             "max_over_time(memexporter_phase_peak_bytes{%(out_of_step)s,%(sel)s}[%(level_window)s])\n"
             "/ ignoring(phase) group_left()\nmemexporter_memory_limit_bytes{%(sel)s}",
             "Peak of the last occurrence of each out-of-step phase (evaluation, checkpoint...) over the\n"
             "level window, as a fraction of the limit. The exporter keeps these phases out of the step\n"
             "peak, so this is the only level that sees them."),
        Rule(_ALLOWANCE,
             "max without (allowance) (\n"
             "    label_replace(\n"
             "      clamp_min(\n"
             "          %(stalled_factor)s * memexporter_step_interval_seconds{%(sel)s}\n"
             "        or\n"
             "          0 * memexporter_last_step_timestamp_seconds{%(sel)s},\n"
             "        %(stalled_floor_s)s\n"
             "      ),\n"
             '      "allowance", "step", "", ""\n'
             "    )\n"
             "  or\n"
             "    label_replace(\n"
             "      0 * memexporter_last_step_timestamp_seconds{%(sel)s}\n"
             "      + on(%(peer_labels)s) group_left()\n"
             "      max by (%(peer_labels)s) (\n"
             "          clamp_min(\n"
             "              %(stalled_factor)s * memexporter_phase_duration_seconds{%(out_of_step)s,%(sel)s}\n"
             "            or\n"
             "              0 * memexporter_phase_active{%(out_of_step)s,%(sel)s},\n"
             "            %(stalled_phase_floor_s)s\n"
             "          )\n"
             "        and\n"
             "          memexporter_phase_active{%(out_of_step)s,%(sel)s} == 1\n"
             "      ),\n"
             '      "allowance", "phase", "", ""\n'
             "    )\n"
             ")",
             "Seconds without a step that still count as progress: the rank's own rhythm (factor x its\n"
             "median step interval, at least the floor; the floor alone after one step), or, while an\n"
             "out-of-step phase is open on any rank of its run (the ranks that share the peer labels: rank 0\n"
             "evaluating or saving while the others wait in a barrier), factor x that phase's last duration\n"
             "(at least the phase floor; the phase floor alone at its first occurrence), whichever is longer."),
    ]


def stalled_alert(c: RulesConfig) -> Rule:
    """``MemexporterTrainingStalled``: pages (the critical severity), like ``MemexporterOOMImminent``."""
    return Rule("MemexporterTrainingStalled",
                "time() - memexporter_last_step_timestamp_seconds{%(sel)s}\n  > " + _ALLOWANCE + "{%(sel)s}",
                "Steps stopped while the process is still scraped (a dead one has no series: FatalOOMSuspected,\n"
                "up), judged against the run's own rhythm, so a slow job is not a stalled one, and an open\n"
                "evaluation or checkpoint against its own last duration. Never before the first step (no\n"
                "timestamp yet), so start-up, data loading and compilation do not count. time() is Prometheus'\n"
                "clock and the timestamp the trainer's: their skew must stay well under the floor.",
                c.stalled_for, c.critical_severity, "A training run has stopped making progress.",
                "%(who_rank)s has not finished a training step for {{ $value | humanizeDuration }} while its "
                "process still answers scrapes: more than it is allowed (%(allowance)s); %(interval)s. Open phases: "
                "%(open_phases)s. It is probably hung (a collective waiting for a peer, the data loader, I/O): "
                "dump its stacks with py-spy.")
