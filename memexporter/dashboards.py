"""The Grafana dashboards, generated: ``python -m memexporter.dashboards [--check]``.

Each dashboard is a data table of panels (title, type, unit, description, queries) rendered into
Grafana's classic JSON model (schemaVersion 39, loads in Grafana 10 and 11). The committed files
under ``grafana/dashboards/`` are this module's output; ``--check`` exits 1 when they drift.

Every query filters ``job``, ``instance`` and ``rank`` through the dashboard variables. A panel
whose every query needs a CUDA-only metric (``cuda_only`` in the spec table) gets the suffix
``(GPU only)`` in its description, so readers and tests know it stays empty on a CPU job.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memexporter.metrics import BY_NAME
from memexporter.rules import PEER_LABELS

JSON = dict[str, Any]
DS: JSON = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", instance=~"$instance", rank=~"$rank"'
GPU_ONLY = " (GPU only)"
SCHEMA_VERSION = 39
OUT_DIR = Path(__file__).resolve().parent.parent / "grafana" / "dashboards"
_METRIC = re.compile(r"\bmemexporter_[a-z0-9_]+\b")
_FAMILIES = ("parameter", "gradient", "optimizer_state", "activation")


def m(name: str) -> str:
    """``memexporter_<name>{job=~"$job", instance=~"$instance", rank=~"$rank"}``."""
    return f"memexporter_{name}{{{SEL}}}"


def by_kind(expr: str) -> str:
    """Add a ``device_kind`` label (``cuda`` or ``cpu``): ranks compare like with like, and
    rank 0 on ``cuda:0`` must be compared with rank 1 on ``cuda:1``."""
    return f'label_replace({expr}, "device_kind", "$1", "device", "([a-z]+).*")'


@dataclass(frozen=True)
class Panel:
    """One panel: ``targets`` are ``(expr, legend)``; ``w``/``h`` in grid units (24 columns)."""

    title: str
    kind: str  # timeseries | stat | bargauge | table
    unit: str
    description: str
    targets: tuple[tuple[str, str], ...]
    w: int = 12
    h: int = 8
    stack: bool = False
    instant: bool = False
    thresholds: tuple[tuple[str, float | None], ...] = (("green", None),)


def metrics_of(expr: str) -> set[str]:
    """The memexporter metrics a query reads (the dashboards use no recording rules)."""
    return set(_METRIC.findall(expr))


def gpu_only(exprs: list[str]) -> bool:
    """True when every query needs at least one CUDA-only metric: the panel is empty on a CPU job."""
    return bool(exprs) and all(any(BY_NAME[n].cuda_only for n in metrics_of(e)) for e in exprs)


def _overview() -> list[Panel]:
    ri = "[$__rate_interval]"
    alloc = "allocator_"
    return [
        Panel("Memory used, limit and step peak", "timeseries", "bytes",
              "How close is each rank to its OOM limit? used is live memory (cuda: allocated bytes, cpu: RSS), "
              "limit is what used can reach before an OOM, peak the highest used in the last step, baseline "
              "what persists between steps.",
              ((m("memory_used_bytes"), "used r{{rank}} {{device}}"),
               (m("memory_limit_bytes"), "limit r{{rank}} {{device}}"),
               (m("memory_peak_bytes"), "step peak r{{rank}} {{device}}"),
               (m("memory_baseline_bytes"), "baseline r{{rank}} {{device}}")), w=16, h=9),
        Panel("Time to OOM", "stat", "s",
              "How long until the step peak reaches the limit at the current leak rate? Infinity means memory "
              "is not growing beyond its own noise.",
              ((f"min by (rank, device) ({m('oom_eta_seconds')})", "r{{rank}} {{device}}"),),
              w=8, h=9, instant=True, thresholds=(("red", None), ("orange", 3600.0), ("green", 86400.0))),
        Panel("Headroom at step peak", "bargauge", "percentunit",
              "What fraction of the limit is still free at the step peak? 1 - peak / limit, per rank and device.",
              ((f"1 - {m('memory_peak_bytes')} / {m('memory_limit_bytes')}", "r{{rank}} {{device}}"),),
              w=8, instant=True, thresholds=(("red", None), ("orange", 0.1), ("green", 0.25))),
        Panel("Leak rate", "timeseries", "binBps",
              "Is the memory that persists between steps growing? Robust slope of the baseline over the leak "
              "window; 0 until enough steps and while within noise.",
              ((m("leak_rate_bytes_per_second"), "r{{rank}} {{device}}"),), w=8),
        Panel("Leak per step", "timeseries", "bytes",
              "How many bytes does the baseline grow per training step? The same slope against the step count.",
              ((m("leak_bytes_per_step"), "r{{rank}} {{device}}"),), w=8),
        Panel("Allocator reserved vs allocated", "timeseries", "bytes",
              "How much memory does the CUDA caching allocator hold beyond live tensors? reserved - allocated is "
              "cache; active includes blocks waiting on streams.",
              ((m(alloc + "reserved_bytes"), "reserved r{{rank}} {{device}}"),
               (m(alloc + "allocated_bytes"), "allocated r{{rank}} {{device}}"),
               (m(alloc + "active_bytes"), "active r{{rank}} {{device}}")), w=12),
        Panel("Allocator fragmentation", "timeseries", "percentunit",
              "How much of the reserved memory is stranded in inactive split blocks? inactive_split / reserved; "
              "high values mean large allocations may fail although memory is free.",
              ((m(alloc + "fragmentation_ratio"), "r{{rank}} {{device}}"),), w=12,
              thresholds=(("green", None), ("orange", 0.3), ("red", 0.5))),
        Panel("Allocator retries and OOMs", "timeseries", "short",
              "Is the allocator thrashing? Retries are cudaMalloc calls retried after flushing the cache (the "
              "classic pre-OOM signal); OOMs are errors raised. Counted per rate interval.",
              ((f"increase({m(alloc + 'alloc_retries_total')}{ri})", "retries r{{rank}} {{device}}"),
               (f"increase({m(alloc + 'ooms_total')}{ri})", "OOMs r{{rank}} {{device}}")), w=12),
        Panel("Host RSS and DataLoader workers", "timeseries", "bytes",
              "How much host memory do the training process and its children (DataLoader workers) hold, "
              "against the host or cgroup limit?",
              ((m("host_rss_bytes"), "rss r{{rank}}"), (m("host_children_rss_bytes"), "children r{{rank}}"),
               (m("host_limit_bytes"), "limit r{{rank}}")), w=12),
        Panel("Training steps per second", "timeseries", "ops",
              "Is the job making progress? Rate of steps seen (optimizer steps or memexporter.step()).",
              ((f"rate({m('steps_total')}{ri})", "r{{rank}}"),), w=8),
        Panel("GPU memory, all processes (NVML)", "timeseries", "bytes",
              "Does anything else use this GPU? Device memory used by every process, as NVML reports it, "
              "against the device total.",
              ((m("device_used_bytes"), "used r{{rank}} {{device}}"),
               (m("device_total_bytes"), "total r{{rank}} {{device}}")), w=8),
        Panel("Collector success", "timeseries", "bool_yes_no",
              "Is every collector working? 0 means the collector raised and its series were dropped.",
              ((f"min by (collector) ({m('collector_success')})", "{{collector}}"),), w=8),
    ]


def _modules() -> list[Panel]:
    panels = [
        Panel(f"Top modules by {fam.replace('_', ' ')} bytes", "timeseries", "bytes",
              f"Which modules hold the most {fam.replace('_', ' ')} memory? The $topk largest modules (the "
              "highest value across the selected ranks), stacked; rows partition the model, so the stack is the "
              "model's total when all modules fit.",
              ((f"topk($topk, max by (module) ({m(f'module_{fam}_bytes')}))", "{{module}}"),), stack=True)
        for fam in _FAMILIES
    ]
    panels.append(Panel(
        "Model memory by family", "timeseries", "bytes",
        "How is the model's memory split between parameters, gradients, optimizer state and saved activations? "
        "Sum over modules, per rank.",
        tuple((f"sum by (rank) ({m(f'module_{fam}_bytes')})", f"{fam.replace('_', ' ')} r{{{{rank}}}}")
              for fam in _FAMILIES), w=24, stack=True))
    panels.append(Panel(
        "Module breakdown", "table", "bytes",
        "Current bytes per module and family (the highest value across the selected ranks). Sort by a column "
        "to find the module to shrink, checkpoint or shard.",
        tuple((f"max by (module) ({m(f'module_{fam}_bytes')})", fam.replace("_", " ")) for fam in _FAMILIES),
        w=24, h=12, instant=True))
    return panels


def _ranks() -> list[Panel]:
    peak, limit = m("memory_peak_bytes"), m("memory_limit_bytes")
    # Peers are the ranks of one training run on one kind of device, as in the alert rules.
    peers = ", ".join((*PEER_LABELS, "device_kind"))
    spread = f"max by ({peers}) ({by_kind(peak)}) - min by ({peers}) ({by_kind(peak)})"
    # What MemexporterRankImbalance measures (on the step peak, without its median smoothing).
    excess = (f"({by_kind(peak)} - on ({peers}) group_left () "
              f"quantile by ({peers}) (0.5, {by_kind(peak)})) / ignoring (device_kind) {limit}")
    return [
        Panel("Step peak per rank", "bargauge", "bytes",
              "Do the ranks peak at the same level? The last step's peak per rank, side by side.",
              ((f"max by (rank, device) ({peak})", "r{{rank}} {{device}}"),), instant=True),
        Panel("Excess over the median rank", "bargauge", "percentunit",
              "How far above the median rank of its training run (same job, namespace and run_id) does each "
              "rank peak, as a share of its own limit? This is what the MemexporterRankImbalance alert watches "
              "(it smooths with a median over time).",
              ((excess, "r{{rank}} {{device}}"),), instant=True,
              thresholds=(("green", None), ("orange", 0.1), ("red", 0.25))),
        Panel("Rank closest to its limit", "stat", "percentunit",
              "Which rank runs out of memory first? The largest step peak / limit across ranks and devices.",
              ((f"topk(1, {peak} / {limit})", "rank {{rank}} {{device}}"),), w=8, instant=True,
              thresholds=(("green", None), ("orange", 0.8), ("red", 0.9))),
        Panel("Peak / limit per rank", "bargauge", "percentunit",
              "How full is each rank at its step peak? step peak / limit per rank and device.",
              ((f"{peak} / {limit}", "r{{rank}} {{device}}"),), w=16, instant=True,
              thresholds=(("green", None), ("orange", 0.8), ("red", 0.9))),
        Panel("Step peak per rank over time", "timeseries", "bytes",
              "When did the ranks diverge? The step peak of each rank over time.",
              ((peak, "r{{rank}} {{device}}"),)),
        Panel("Peak spread across ranks (max - min)", "timeseries", "bytes",
              "How far apart are the highest and lowest rank's step peaks, per training run (job, namespace, "
              "run_id) and device kind (cpu, cuda)?",
              ((spread, "{{job}} {{namespace}} {{run_id}} {{device_kind}}"),)),
        Panel("Steps per second per rank", "timeseries", "ops",
              "Is a rank lagging behind? Step rate per rank; in data-parallel jobs they should match.",
              ((f"rate({m('steps_total')}[$__rate_interval])", "r{{rank}}"),), w=24),
    ]


def _target(ref: str, expr: str, legend: str, p: Panel) -> JSON:
    return {"datasource": DS, "editorMode": "code", "expr": expr, "legendFormat": legend, "refId": ref,
            "range": not p.instant, "instant": p.instant, **({"format": "table"} if p.kind == "table" else {})}


def _options(p: Panel) -> JSON:
    reduce = {"calcs": ["lastNotNull"], "fields": "", "values": False}
    if p.kind == "timeseries":
        return {"legend": {"calcs": ["lastNotNull", "max"], "displayMode": "table", "placement": "bottom",
                           "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"}}
    if p.kind == "stat":
        return {"colorMode": "value", "graphMode": "none", "justifyMode": "auto", "orientation": "auto",
                "reduceOptions": reduce, "textMode": "value_and_name"}
    if p.kind == "bargauge":
        return {"displayMode": "gradient", "orientation": "horizontal", "reduceOptions": reduce,
                "showUnfilled": True, "valueMode": "color"}
    return {"cellHeight": "sm", "showHeader": True, "sortBy": [{"desc": True, "displayName": "activation"}]}


def _panel(pid: int, p: Panel, pos: JSON) -> JSON:
    exprs = [e for e, _ in p.targets]
    defaults: JSON = {"unit": p.unit, "thresholds": {"mode": "absolute", "steps": [
        {"color": c, "value": v} for c, v in p.thresholds]}}
    if p.kind == "timeseries":
        defaults["custom"] = {"fillOpacity": 30 if p.stack else 10, "lineWidth": 1, "showPoints": "never",
                              "stacking": {"group": "A", "mode": "normal" if p.stack else "none"}}
    out: JSON = {
        "datasource": DS, "description": p.description + (GPU_ONLY if gpu_only(exprs) else ""),
        "fieldConfig": {"defaults": defaults, "overrides": []}, "gridPos": pos, "id": pid,
        "options": _options(p), "targets": [_target(chr(65 + i), e, lg, p) for i, (e, lg) in enumerate(p.targets)],
        "title": p.title, "type": p.kind,
    }
    if p.kind == "table":  # merge the instant queries on their labels: one column per query, named by its legend
        rename = {f"Value #{t['refId']}": t["legendFormat"] for t in out["targets"]}
        out["transformations"] = [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": rename}}]
    return out


def _layout(panels: list[Panel]) -> list[JSON]:
    """Flow the panels left to right into the 24-column grid, wrapping to a new row when full."""
    out, x, y, row_h = [], 0, 0, 0
    for i, p in enumerate(panels, start=1):
        if x + p.w > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(_panel(i, p, {"h": p.h, "w": p.w, "x": x, "y": y}))
        x, row_h = x + p.w, max(row_h, p.h)
    return out


def _query_var(name: str, query: str, sort: int) -> JSON:
    return {"name": name, "label": name, "type": "query", "datasource": DS, "definition": query, "query": query,
            "refresh": 2, "multi": True, "includeAll": True, "allValue": ".+", "sort": sort, "regex": "",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "hide": 0, "options": []}


def _variables(extra: list[JSON]) -> list[JSON]:
    info = "memexporter_build_info"
    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "options": [], "refresh": 1, "regex": ""},
        _query_var("job", f"label_values({info}, job)", 1),
        _query_var("instance", f'label_values({info}{{job=~"$job"}}, instance)', 1),
        _query_var("rank", f'label_values({info}{{job=~"$job", instance=~"$instance"}}, rank)', 3),
        *extra,
    ]


def _alert_annotation() -> JSON:
    return {"datasource": DS, "enable": True, "iconColor": "red", "name": "memexporter alerts", "step": "30s",
            "expr": 'ALERTS{alertname=~"Memexporter.*", alertstate="firing", job=~"$job"}',
            "titleFormat": "{{alertname}}", "textFormat": "{{severity}}: rank {{rank}} on {{instance}}",
            "tagKeys": "severity,rank", "useValueForTime": False}


def dashboard(uid: str, title: str, panels: list[Panel], extra_vars: list[JSON] | None = None,
              annotations: list[JSON] | None = None) -> JSON:
    builtin = {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
               "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}
    return {
        "annotations": {"list": [builtin, *(annotations or [])]}, "description": f"memexporter: {title}",
        "editable": True, "graphTooltip": 1, "id": None, "links": [{"asDropdown": True, "includeVars": True,
        "keepTime": True, "tags": ["memexporter"], "title": "memexporter", "type": "dashboards"}],
        "panels": _layout(panels), "refresh": "30s", "schemaVersion": SCHEMA_VERSION, "tags": ["memexporter"],
        "templating": {"list": _variables(extra_vars or [])}, "time": {"from": "now-1h", "to": "now"},
        "timepicker": {}, "timezone": "browser", "title": f"memexporter / {title}", "uid": uid, "version": 1,
    }


def build() -> dict[str, JSON]:
    """``{filename: dashboard JSON}`` for every dashboard."""
    topk = {"name": "topk", "label": "Top K", "type": "custom", "query": "5,10,20", "hide": 0, "multi": False,
            "includeAll": False, "current": {"selected": True, "text": "10", "value": "10"},
            "options": [{"selected": v == "10", "text": v, "value": v} for v in ("5", "10", "20")]}
    return {
        "memexporter-overview.json": dashboard("memexporter-overview", "Overview", _overview(),
                                               annotations=[_alert_annotation()]),
        "memexporter-modules.json": dashboard("memexporter-modules", "Modules", _modules(), [topk]),
        "memexporter-ranks.json": dashboard("memexporter-ranks", "Ranks", _ranks()),
    }


def render(dash: JSON) -> str:
    """The committed form: sorted keys, two-space indent, trailing newline."""
    return json.dumps(dash, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memexporter.dashboards",
                                     description="Generate grafana/dashboards/*.json.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"output folder (default {OUT_DIR})")
    args = parser.parse_args(argv)
    stale = []
    for name, dash in sorted(build().items()):
        path, text = args.out / name, render(dash)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if stale:
        print(f"stale dashboards (run python -m memexporter.dashboards): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
