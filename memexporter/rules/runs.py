"""Run identity, and the rules about a whole run (issue 25).

**Identity.** ``memexporter_run_info{rank, run_id, run_id_source, detail}`` (value 1, one per rank)
names each rank's training run. ``rank:memexporter_run:info`` keeps one series per rank (its ``job,
instance, rank``, its target labels and ``run_id``), and ``with_run()`` copies that ``run_id`` onto
a per-rank expression by a join on ``job, instance, rank``: no relabelling needed.

- A target that sets its own ``run_id`` label keeps it: Prometheus renames the exporter's label to
  ``exported_run_id``, which the record drops, so the operator's value wins everywhere.
- A rank of an exporter without ``run_info`` takes the target labels of its ``memexporter_build_info``
  (a relabelled ``run_id`` included): every exporter, old or new, serves it, so the join costs no
  rank its alerts (a rank with neither, its build_info dropped by relabelling, is not evaluated).
- ``topk by (job, instance, rank) (1, ...)`` keeps one series per rank whatever happens (a rank
  restarted under a new run_id, seen twice within one lookback): a duplicate would fail every join.

**Per-run records** aggregate the ranks that share the peer labels (``run_by``) per kind of device
(``device_kind``: ``cuda``, ``cpu``, the device label's prefix). The dashboards read them. They form
a group of their own (``memexporter.runs``): Prometheus evaluates groups side by side, so each
group's evaluation stays short at 1,024 ranks, and nothing in the other groups waits for them.

**Run alerts.** ``run_alert()`` gives a rank alert its run-wide twin: the same name, label
``scope="run"``, one alert per run, firing while ``run_min_ranks`` ranks of the run meet the rank
alert's own condition, with a ``for:`` that ends sooner (``params.run_for``), so that Alertmanager
can mute the rank alerts of a run while its run alert fires. Its description names how many ranks
of how many, and the worst one: two template queries per run alert, however many ranks fire.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from memexporter.rules.params import RulesConfig, run_for
from memexporter.rules.rule import Rule

INFO = "rank:memexporter_run:info"
RANKS = "run:memexporter_ranks:count"
KEY = "job, instance, rank"  # what run_info and every exporter series of one rank share
_SELECTOR = re.compile(r"[\w:]+\{[^{}]*\}")  # a bare series selector needs no parentheses
_UTIL = "rank_device:memexporter_memory_peak_utilisation:ratio"
_ETA = "rank_device:memexporter_oom_eta_seconds:min"


def indent(text: str, spaces: int) -> str:
    """``text`` with each line indented by ``spaces`` spaces, to nest one PromQL expression in another."""
    return "\n".join(" " * spaces + line for line in text.splitlines())


def kind(expr: str) -> str:
    """``expr`` with ``device_kind`` (``cuda``, ``cpu``...): ranks compare like with like."""
    return f'label_replace({expr}, "device_kind", "$1", "device", "([a-z]+).*")'


def with_run(expr: str, info: str = INFO + "{%(sel)s}") -> str:
    """``expr`` (per-rank series) with the ``run_id`` of its rank from ``info`` (a join: its cost is a
    label set built per series of ``expr``, so the rules join once and read the joined records)."""
    inner = expr if _SELECTOR.fullmatch(expr) else f"(\n{indent(expr, 4)}\n  )"
    return f"(\n  {inner}\n  * on({KEY}) group_left(run_id)\n    {info}\n)"


def info_record() -> Rule:
    """The ``rank:memexporter_run:info`` record: one series per rank with its ``run_id``, from ``run_info``,
    else from ``build_info``."""
    return Rule(
        INFO,
        expr=f"topk by ({KEY}) (1,\n"
        "    group without (run_id_source, detail, exported_run_id) (memexporter_run_info{%(sel)s})\n"
        f"  or on({KEY})\n"
        "    group without (version, torch_version, cuda_version) (memexporter_build_info{%(sel)s})\n"
        ")",
        why="One series per rank (value 1) carrying its run: run_id from the exporter's run_info (a run_id\n"
        "target label wins: the exporter's is then exported_run_id, dropped here), or, from an exporter\n"
        "without run_info, the target labels of its build_info. The rules join it on job, instance, rank.",
    )


def run_records() -> list[Rule]:
    """The per-run aggregates, after the per-rank records they read."""
    by = "%(run_by)s, device_kind"
    util = kind(_UTIL + "{%(sel)s}")
    return [
        Rule(
            RANKS,
            expr=f"count by (%(run_by)s) ({INFO}{{%(sel)s}})",
            why="Ranks of each run that answer scrapes (from run_info, or build_info for an older exporter).",
        ),
        Rule(
            "run_device_kind:memexporter_memory_peak_utilisation:max",
            expr=f"max by ({by}) ({util})",
            why="The highest peak utilisation (0..1) among the ranks of each run, per kind of device.",
        ),
        Rule(
            "run_device_kind:memexporter_memory_peak_utilisation:worst_rank",
            expr=f"topk by ({by}) (1, {util})",
            why="The same value, with the labels of the rank that holds it (instance, rank, device): one\n"
            "series per run and kind of device.",
        ),
        Rule(
            "run_device_kind:memexporter_memory_peak_utilisation:spread",
            expr=f"max by ({by}) ({util})\n-\nmin by ({by}) ({util})",
            why="Highest minus lowest peak utilisation among the ranks of each run: 0 when balanced.",
        ),
        Rule(
            "run_device_kind:memexporter_oom_eta_seconds:min",
            expr=f"min by ({by}) ({kind(_ETA + '{%(sel)s}')})",
            why="The soonest OOM ETA among the ranks of each run (+Inf when no rank grows).",
        ),
        *[
            Rule(
                f"run_device_kind:memexporter_{name}:{op}",
                expr=f"{op} by ({by}) (\n{indent(kind(with_run(f'memexporter_{name}{{%(sel)s}}')), 2)}\n)",
                why=why,
            )
            for name, op, why in (
                ("memory_used_bytes", "sum", "Memory in use now, summed over the ranks of each run."),
                ("memory_limit_bytes", "sum", "The limits, summed over the ranks of each run."),
                (
                    "leak_rate_bytes_per_second",
                    "max",
                    "The fastest leak (baseline growth, bytes/s) among the ranks of each run.",
                ),
            )
        ],
    ]


@dataclass(frozen=True, kw_only=True)
class Twin:
    """The run-wide twin of a rank alert. ``description``: ``%``-template over the parameters plus
    ``n_of_m`` ("3 of 4 ranks": ``$value`` of the ranks that answer), ``answering`` (how many answer)
    and ``worst`` (the worst rank, picked by ``pick`` among those that meet
    the condition, then ``shows``: its value, ``.`` the sample; a ``%``-template too)."""

    summary: str
    description: str
    pick: str  # "max": the highest value is the worst; "min": the lowest (an ETA, a success ratio)
    shows: str
    by: tuple[str, ...] = ()  # labels of the rank alert kept per run (CollectorFailing: collector)


def _vector(names: list[str]) -> str:
    """A one-sample vector with ``names`` set from ``%q`` arguments: ``and on(names)`` it keeps one run."""
    out = "vector(1)"
    for name in names:
        out = f'label_replace({out}, "{name}", %q, "", "")'
    return out


def _go(text: str) -> str:
    """``text`` as a Go template string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def run_alert(rank: Rule, twin: Twin, c: RulesConfig, p: Mapping[str, str]) -> Rule:
    """``rank``'s run-wide twin (``rank.expr`` is its per-rank condition, with ``run_id``)."""
    names = [n.strip() for n in p["run_by"].split(",")] + list(twin.by)
    by = ", ".join(names)
    # (index $labels "x"), not $labels.x: a label the alert lacks (namespace) is "" under both
    # Prometheus and vmalert; vmalert prints $labels.x as <no value>, and printf %q then breaks the query.
    args = " ".join(f'(index $labels "{n}")' for n in names)
    cond = " ".join((rank.expr % p).split()).replace("%", "%%")
    # Every rank at the run's worst value, sorted by rank (as text): the same rank at every evaluation
    # when they tie (ranks that run the same code often leak exactly alike).
    fmt = f"({cond}) == on({by}) group_left() {twin.pick} by ({by}) ({cond}) and on({by}) {_vector(names)}"
    worst = (
        f'{{{{ with printf {_go(fmt)} {args} | query | sortByLabel "rank" }}}}{{{{ with first . }}}}'
        'rank {{ label "rank" . }} on '
        '{{ label "instance" . }}{{ with label "device" . }} ({{ . }}){{ end }}, '
        f"{twin.shows % p}{{{{ end }}}}{{{{ end }}}}"
    )
    own = [n for n in names if n not in twin.by]
    own_args = " ".join(f'(index $labels "{n}")' for n in own)
    count = f'printf "{RANKS}{{{",".join(f"{n}=%q" for n in own)}}}" {own_args} | query'
    extra = {
        **p,
        "worst": worst,
        "n_of_m": f"{{{{ $value }}}}{{{{ with {count} }}}} of {{{{ . | first | value }}}}{{{{ end }}}} ranks",
        "answering": f"{{{{ with {count} }}}}{{{{ . | first | value }}}}{{{{ else }}}}no{{{{ end }}}}",
    }
    expr = (
        f"count by ({by}) (\n  count by ({by}, instance, rank) (\n{indent(rank.expr, 4)}\n  )\n) >= %(run_min_ranks)s"
    )
    why = (
        f"One alert per run while {c.run_min_ranks} or more of its ranks meet the condition above: a cause\n"
        "that every rank shares is one notification, and Alertmanager mutes the rank alerts of the run.\n"
        "Its for: ends sooner than theirs, so that it fires no later than the first of them."
    )
    return Rule(
        rank.name,
        expr=expr,
        why=why,
        for_=run_for(c, rank.for_),
        severity=rank.severity,
        summary=twin.summary % p,
        description=twin.description % extra,
        scope="run",
        rendered=True,
    )
