"""``MemexporterInputOverCapacity``: the OOM that arrives with a batch, warned before the batch comes.

The exporter learns from the job's own steps the largest input whose predicted step peak fits the
limit (``memexporter_input_capacity_elements``, oom/capacity.py). No trend sees this OOM coming: the
peak does not grow, it jumps with a batch longer than any before. Two rules of one name, as the
kubernetes-mixin's volume alerts are (one severity each):

- critical: the declared largest input (``memexporter_input_declared_max_elements``, the knob
  ``max_input_elements``) exceeds the capacity: the data holds a batch that will not fit;
- warning: the largest input seen (``memexporter_step_input_elements_max``) is within
  ``input_near`` of the capacity: the next longer batch may not fit.

The value is the input over the capacity (the declared maximum, or the largest seen), so the
description needs no query. No run twin: each rank has its own capacity, and ranks that share a
model and data fire together (Alertmanager groups them by name). The capacity series is absent
without spread in the inputs: then nothing fires.
"""

from __future__ import annotations

from memexporter.rules.params import RulesConfig
from memexporter.rules.rule import Rule
from memexporter.rules.runs import with_run

NAME = "MemexporterInputOverCapacity"
_CAPACITY = "memexporter_input_capacity_elements{%(sel)s}"
_SUMMARY = "The longest batch the data can bring will not fit in memory."


def input_alerts(c: RulesConfig) -> list[Rule]:
    """The critical (declared) and warning (seen) rules, per rank and device."""
    declared = with_run(
        "memexporter_input_declared_max_elements{%(sel)s}\n"
        f"  / on(job, instance, rank) group_right()\n  {_CAPACITY}\n> 1"
    )
    seen = with_run(
        "memexporter_step_input_elements_max{%(sel)s}\n"
        f"  / on(job, instance, rank) group_right()\n  {_CAPACITY}\n>= %(input_near)s"
    )
    return [
        Rule(
            NAME,
            expr=declared,
            why="The declared largest input over the capacity learned from the job's steps: the data holds a\n"
            "batch whose predicted step peak exceeds the limit. Fires before that batch comes.",
            for_=c.input_for,
            severity=c.critical_severity,
            summary=_SUMMARY,
            description="%(who)s: the largest input its data can bring (max_input_elements) is "
            "{{ $value | humanizePercentage }} of the largest input that fits its memory, learned from its own "
            "steps (memexporter_input_capacity_elements): that batch will run out of memory. Cap the length "
            "or the batch at what fits (the runbook says how to read it).",
        ),
        Rule(
            NAME,
            expr=seen,
            why="The largest input seen within input_near of the capacity: a batch a little longer may not fit.",
            for_=c.input_for,
            severity="warning",
            summary="The longest batch so far nearly filled the memory: a longer one may not fit.",
            description="%(who)s: its largest input so far is {{ $value | humanizePercentage }} of the largest "
            "input that fits its memory, learned from its own steps (memexporter_input_capacity_elements): a "
            "batch a little longer may run out of memory. Cap the length or the batch at what fits, or declare "
            "the data's largest input (max_input_elements) to know.",
        ),
    ]
