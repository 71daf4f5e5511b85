"""``bench_scale.py``'s results as compact Markdown tables (the JSON has every figure)."""

from __future__ import annotations

from typing import Any

MiB = 1 << 20


def _table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _mib(n: float) -> str:
    return f"{n / MiB:,.1f}"


def report(results: list[dict[str, Any]]) -> str:
    out = ["## Prometheus at N ranks (peak RSS: after the dashboard queries too)", ""]
    out.append(
        _table(
            [
                "N",
                "mode",
                "scenario",
                "series/rank exported",
                "head series",
                "head/rank",
                "RSS MiB",
                "peak RSS MiB",
                "CPU cores",
                "alerts active",
                "history series",
                "run s",
            ],
            [
                [
                    r["ranks"],
                    r["mode"],
                    r["scenario"],
                    f"{r['exported']['average']} ({', '.join(f'{k} {v}' for k, v in r['exported']['per_kind'].items())})",
                    f"{r['head_series']:,}",
                    r["head_series_per_rank"],
                    _mib(r["rss_bytes"]),
                    _mib(r.get("peak_rss_end_bytes", r["peak_rss_bytes"])),
                    r["cpu_cores"],
                    _alerts(r),
                    f"{r['history']['series']:,}",
                    r["wall_s"],
                ]
                for r in results
            ],
        )
    )
    out += ["", "## Rule groups: evaluation time (s), p50 / max over the window (last_duration at the end)", ""]
    groups = sorted({g for r in results for g in r["rule_groups"]})
    out.append(
        _table(
            ["N", "scenario", *groups],
            [[r["ranks"], r["scenario"], *(_group(r["rule_groups"].get(g)) for g in groups)] for r in results],
        )
    )
    for r in results:
        if "queries" not in r:
            continue
        dash = r["queries"]["dashboards"]
        out += [
            "",
            f"## Dashboards at N={r['ranks']} ({r['mode']}): a refresh over {r['queries']['range_s'] / 3600:g} h",
            "",
        ]
        out.append(
            _table(
                [
                    "dashboard",
                    "queries",
                    "refresh p50 s",
                    "refresh p99 s",
                    "collapsed rows opened: + p50 / p99 s",
                    "refresh MiB",
                    "largest panel MiB",
                    "errors",
                ],
                [
                    [
                        name,
                        d["queries"],
                        d["refresh_p50_s"],
                        d["refresh_p99_s"],
                        f"{d.get('opened_p50_s', 0)} / {d.get('opened_p99_s', 0)}",
                        _mib(d["refresh_bytes"]),
                        f"{_mib(d['largest_panel_bytes'])} ({d['largest_panel']})",
                        d["errors"],
                    ]
                    for name, d in sorted(dash.items())
                ],
            )
        )
        slow = sorted(r["queries"]["rows"], key=lambda q: -q["p99_s"])[:8]
        out += ["", "Slowest queries:", ""]
        out.append(
            _table(
                ["dashboard", "panel", "kind", "p50 s", "p99 s", "KiB", "series", "query bytes", "error"],
                [
                    [
                        q["dashboard"].removeprefix("memexporter-").removesuffix(".json"),
                        q["panel"],
                        q["kind"],
                        q["p50_s"],
                        q["p99_s"],
                        f"{q['bytes'] / 1024:,.0f}",
                        q["series"],
                        q["expr_bytes"],
                        q["error"][:60],
                    ]
                    for q in slow
                ],
            )
        )
    return "\n".join(out)


def _alerts(r: dict[str, Any]) -> str:
    firing = sum(n for key, n in r["alerts"].items() if key.endswith(" firing"))
    return f"{r['alerts_active']} ({firing} firing)" if r["alerts_active"] else "0"


def _group(g: dict[str, Any] | None) -> str:
    return "-" if g is None else f"{g['p50_s']} / {g['max_s']} ({g['last_duration_s']})"
