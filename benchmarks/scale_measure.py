"""What ``bench_scale.py`` measures on a running Prometheus: its steady cost, and the dashboards'.

``measure``: over a window of scraping and rule evaluation only (no queries), the CPU Prometheus
used (``process_cpu_seconds_total``, in cores), its resident memory now and at its peak, head
series, every rule group's evaluation times (each evaluation's ``evaluationTime`` polled from
``/api/v1/rules``; ``prometheus_rule_group_last_duration_seconds`` at the end) and the alerts.

``time_queries``: one warm-up pass over every query, then ``repeats`` passes, each query timed from
the client: p50 and p99 (nearest rank: the slowest of fewer than 100) of its seconds, its answer's
bytes and series, and per dashboard the refresh: the sum of its queries that run at every refresh
(panels outside collapsed rows, and annotations; not the variables' ``label_values``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from benchmarks.scale_prometheus import Answer, Prom
from benchmarks.scale_queries import Query


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)] if s else math.nan


def measure(prom: Prom, seconds: float, ranks: int) -> dict[str, Any]:
    m0, t0 = prom.own_metrics(), time.monotonic()
    evals: dict[str, dict[str, float]] = {}
    while time.monotonic() - t0 < seconds:
        for group, (at, took) in prom.rule_groups().items():
            evals.setdefault(group, {})[at] = took
        time.sleep(2.0)
    m1, t1 = prom.own_metrics(), time.monotonic()
    cpu = (prom.one(m1, "process_cpu_seconds_total") - prom.one(m0, "process_cpu_seconds_total")) / (t1 - t0)
    head = prom.one(m1, "prometheus_tsdb_head_series")
    last = {
        labels.get("rule_group", "").rsplit(";", 1)[-1]: v
        for labels, v in m1.get("prometheus_rule_group_last_duration_seconds", [])
    }
    groups = {
        g: {
            "evaluations": len(v),
            "p50_s": round(statistics.median(v.values()), 4),
            "max_s": round(max(v.values()), 4),
            "last_duration_s": round(last.get(g, math.nan), 4),
        }
        for g, v in sorted(evals.items())
        if v
    }
    alerts = prom.api("alerts")["alerts"]
    states = Counter(f"{a['labels'].get('alertname')} {a['state']}" for a in alerts)
    return {
        "cpu_cores": round(cpu, 3),
        "rss_bytes": int(prom.one(m1, "process_resident_memory_bytes")),
        "heap_inuse_bytes": int(prom.one(m1, "go_memstats_heap_inuse_bytes")),
        "peak_rss_bytes": prom.peak_rss(),
        "head_series": int(head),
        "head_series_per_rank": round(head / ranks, 1),
        "scraped_per_rank": round(prom.scalar('avg(scrape_samples_scraped{job="memexporter"})'), 1),
        "rule_groups": groups,
        "alerts": dict(sorted(states.items())),
        "alerts_active": len(alerts),
    }


def _ask(prom: Prom, q: Query, end: float, range_s: float) -> Answer:
    if q.kind == "variable":
        params = {"start": f"{end - range_s:.0f}", "end": f"{end:.0f}"} | ({"match[]": q.expr} if q.expr else {})
        return prom.timed(f"label/{q.label}/values", **params)
    if q.kind == "instant":
        return prom.timed("query", query=q.expr, time=f"{end:.3f}")
    # Grafana aligns a range query to its step, so that a refresh reuses the same points.
    stop = math.floor(end / q.step) * q.step
    return prom.timed("query_range", query=q.expr, start=f"{stop - range_s:.0f}", end=f"{stop:.0f}", step=f"{q.step:g}")


def time_queries(prom: Prom, queries: Sequence[Query], repeats: int, range_s: float) -> dict[str, Any]:
    runs: list[list[Answer]] = [[] for _ in queries]
    for rep in range(repeats + 1):
        for i, q in enumerate(queries):
            answer = _ask(prom, q, time.time(), range_s)
            if rep:  # the first pass warms the page cache, as the previous refresh would have
                runs[i].append(answer)
    rows: list[dict[str, Any]] = []
    for q, answers in zip(queries, runs, strict=True):
        secs = [a.seconds for a in answers]
        rows.append(
            {
                "dashboard": q.dashboard,
                "panel": q.panel,
                "kind": q.kind,
                "collapsed": q.collapsed,
                "expr_bytes": len(q.expr.encode()),
                "step_s": q.step,
                "p50_s": round(pct(secs, 0.5), 4),
                "p99_s": round(pct(secs, 0.99), 4),
                "bytes": max(a.nbytes for a in answers),
                "series": max(a.series for a in answers),
                "error": next((a.error for a in answers if a.error), ""),
                "expr": q.expr,
            }
        )
    dashboards: dict[str, dict[str, Any]] = {}
    for row in rows:
        d = dashboards.setdefault(
            row["dashboard"],
            {
                "refresh_p50_s": 0.0,
                "refresh_p99_s": 0.0,
                "refresh_bytes": 0,
                "queries": 0,
                "errors": 0,
                "panels": Counter(),
                "opened_p50_s": 0.0,
                "opened_p99_s": 0.0,
            },
        )
        if row["kind"] == "variable":
            continue
        if row["collapsed"]:  # what opening the collapsed rows adds to a refresh
            d["opened_p50_s"] += row["p50_s"]
            d["opened_p99_s"] += row["p99_s"]
            continue
        d["refresh_p50_s"] += row["p50_s"]
        d["refresh_p99_s"] += row["p99_s"]
        d["refresh_bytes"] += row["bytes"]
        d["queries"] += 1
        d["errors"] += bool(row["error"])
        d["panels"][row["panel"]] += row["bytes"]
    for d in dashboards.values():
        panel, size = d.pop("panels").most_common(1)[0] if d["queries"] else ("", 0)
        d |= {
            "largest_panel": panel,
            "largest_panel_bytes": size,
            "refresh_p50_s": round(d["refresh_p50_s"], 3),
            "refresh_p99_s": round(d["refresh_p99_s"], 3),
            "opened_p50_s": round(d["opened_p50_s"], 3),
            "opened_p99_s": round(d["opened_p99_s"], 3),
        }
    return {"range_s": range_s, "repeats": repeats, "rows": rows, "dashboards": dashboards}
