"""What every dashboard query selects: one run, the ranks picked, and at scale only a few of them.

The exporter's series carry no run identity; ``memexporter_run_info{run_id, detail}`` does, one per
rank. So a query selects the run and the ranks through one ``memexporter_run_info`` selector joined
on ``job, instance, rank`` (``scoped``), as the rules do: no relabelling needed, and a target that
sets its own ``run_id`` label keeps working (it lands on ``run_info`` too).

Query length: Grafana writes a multi-value variable into a query as a regex of every value ticked
(1,024 ranks: about 4 KiB; 1,024 ``host:port`` instances: over 20 KiB), and VictoriaMetrics refuses
a query over 16 KiB (``-search.maxQueryLen``). So ``$rank`` and ``$instance`` appear once per query,
in that one selector, and "All" is ``.+`` (``allValue``), never the list. The other selectors name
``$job`` only (a handful of values), which keeps the index lookup narrow.

Series count: at 1,024 ranks a per-rank panel must not return a series per rank. ``worst`` picks
the ``$topk`` (rank, device) pairs closest to their limit among those selected; panels show those,
or aggregate.
"""

from __future__ import annotations

import re

INFO = "memexporter_run_info"
KEY = "job, instance, rank"  # one rank: what run_info and every exporter series share
JOB = 'job=~"$job"'
RUN = f'{JOB}, run_id=~"$run_id"'
RANKS = f'{RUN}, instance=~"$instance", rank=~"$rank"'
# Ranks that export module rows: every rank below 64 ranks (per_rank), the detail ranks above
# (representative: by default the first node's). The others export the core set only.
DETAIL = 'detail=~"per_rank|representative"'
# What m() and info() write, with its range if it has one: `@` follows `[5m]`.
_SELECTOR = re.compile(r"\b(memexporter_\w+\{[^}]*\}(?:\[[^\]]*\])?)")


def m(name: str) -> str:
    """``memexporter_<name>{job=~"$job"}``: the ranks are selected by ``scoped``, once per query."""
    return f"memexporter_{name}{{{JOB}}}"


COMMITTED_PEAK = f"({m('memory_committed_peak_bytes')} or {m('memory_peak_bytes')})"
"""The level every OOM gate reads: the committed step peak, or the step peak of an exporter from
before it (as the rules' level record)."""


def info(detail: bool = False) -> str:
    """The ``memexporter_run_info`` series of the selected run and ranks (only the detail ranks)."""
    return f"{INFO}{{{RANKS}{', ' + DETAIL if detail else ''}}}"


def scoped(expr: str, detail: bool = False) -> str:
    """``expr`` (an instant vector of per-rank series) kept to the selected run and ranks."""
    return f"({expr} and on ({KEY}) {info(detail)})"


def with_run(expr: str, ranks: bool = True) -> str:
    """``expr`` with the ``run_id`` label of its rank, kept to the selected run (and ranks, unless
    ``ranks=False``: every rank of the run, e.g. the median a rank is compared with)."""
    sel = RANKS if ranks else RUN
    return f"({expr} * on ({KEY}) group_left (run_id) max by ({KEY}, run_id) ({INFO}{{{sel}}}))"


def run_rule(record: str) -> str:
    """A per-run recording rule (``run_device_kind:...``, ``run:...``) of the selected runs."""
    return f"{record}{{{RUN}}}"


def at_end(expr: str) -> str:
    """``expr`` with every series selector read at the end of the time range (``@ end()``). A range
    query evaluates such an expression once, not at each of its 720 steps (6 h at 30 s): it picks
    the ranks that a panel then shows over the whole range. VictoriaMetrics takes ``@`` on a
    selector too (not after a parenthesised expression: hence on each selector)."""
    return _SELECTOR.sub(r"\1 @ end()", expr)


def worst(k: str = "$topk", pinned: bool = False) -> str:
    """The ``k`` (rank, device) pairs of the selection whose step peak is closest to their limit
    (at each step; ``pinned``: at the end of the range, the same ``k`` over the whole range)."""
    expr = f"topk({k}, {scoped(COMMITTED_PEAK)} / {m('memory_limit_bytes')})"
    return at_end(expr) if pinned else expr


def picked(expr: str, pick: str = "topk") -> str:
    """The ``$topk`` selected ranks with the highest ``expr`` (``pick`` ``bottomk``: the lowest) at
    the end of the time range: one evaluation, where a ``topk`` at each step would pick whichever
    ranks led at each, and cost a join a step. Draw series of them with ``among``."""
    return at_end(f"{pick}($topk, {scoped(expr)})")


def top(expr: str, pick: str = "topk", on: str = f"{KEY}, device") -> str:
    """``expr`` (per-rank series) of the ranks ``picked`` by ``expr`` itself: the same K series over
    the whole range."""
    return among(expr, picked(expr, pick), on)


def among(expr: str, within: str, on: str = f"{KEY}, device") -> str:
    """``expr`` only for the series of ``within`` (matched on ``on``): ``worst``'s ranks, say."""
    return f"{expr} and on ({on}) {within}"


def by_kind(expr: str) -> str:
    """Add a ``device_kind`` label (``cuda`` or ``cpu``): ranks compare like with like, and
    rank 0 on ``cuda:0`` must be compared with rank 1 on ``cuda:1``."""
    return f'label_replace({expr}, "device_kind", "$1", "device", "([a-z]+).*")'
