"""A thousand ranks (issue 25): what one Prometheus pays for N ranks of memexporter, with 6 h of history.

For each N (``--ranks 64,256,1024``) and scenario (``quiet``: no rank leaks; ``leak-all``: every rank
leaks, so the shipped leak and OOM-forecast alerts fire on every rank; ``leak-one``: rank 1 only),
the rank simulator (``tests/support/ranksim.py``) serves memexporter's real exposition on N loopback
ports. 6 h of that history is written as a TSDB block (``scale_history.py``), the recording rules'
history is backfilled by promtool, and in the leak scenarios the alerts' ``ALERTS_FOR_STATE`` so that
they fire from the first evaluation (``scale_alerts.py``). Then Debian's Prometheus scrapes every
rank every 15 s with the shipped ``alerts/*.yml``. After ``--warmup`` s it measures for ``--measure``
s (``scale_measure.py``): series per rank, head series, Prometheus' RSS and CPU, each rule group's
evaluation time (``/api/v1/rules`` evaluationTime, ``prometheus_rule_group_last_duration_seconds``)
and the alerts. In the ``quiet`` scenario it then times every dashboard query (``scale_queries.py``)
over the past 6 h, ``--repeats`` times after a warm-up pass: p50/p99 latency, bytes, series, and each
dashboard's refresh (the sum of its queries).

    python benchmarks/bench_scale.py --ranks 64 --json scale-64.json            # today's exporter
    python benchmarks/bench_scale.py --ranks 64,256,1024 --before --json b.json # as of de4f325
    make bench-scale                                                            # both, into build/

``--before``: the exposition (made by the exporter of that revision), rules and dashboards as
committed at ``de4f325``, before issue 25: every rank exports everything. On a 2-core machine one
scenario takes about 3 minutes at N=64 and 11 at N=1,024 before (most of it the queries); Prometheus
then holds about 2 GiB, and 5 GiB while the 6 h dashboard queries run. The cuda:0 figures are
SYNTHETIC (the A100-SXM4-80GB fixture's answers); the module rows and host figures come from a real
CPU run of the demo's 12-layer model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scale_alerts import restore_as_firing
from benchmarks.scale_history import raw_history, rule_history, settle
from benchmarks.scale_measure import measure, time_queries
from benchmarks.scale_prometheus import Prom
from benchmarks.scale_queries import from_helper, from_json
from benchmarks.scale_report import report
from tests.support import REPO_ROOT
from tests.support.rank_exposition import BEFORE, DETAIL_WORLD, adapt, expositions
from tests.support.ranksim import RankSim, Template
from tests.support.ranksim_server import RankServers

RUN_ID = "scale-bench"


def git_files(rev: str, folder: str, suffix: str, into: Path) -> list[Path]:
    """``folder/*suffix`` as committed at ``rev``, written under ``into``."""
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{rev}:{folder}"], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    out = []
    for name in sorted(n for n in names if n.endswith(suffix)):
        path = into / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(
            subprocess.run(
                ["git", "show", f"{rev}:{folder}/{name}"], cwd=REPO_ROOT, check=True, capture_output=True
            ).stdout
        )
        out.append(path)
    return out


def setup(
    before: bool, ranks: list[int], tmp: Path, cache: Path | None
) -> tuple[dict[str, Template], list[Path], dict[str, str]]:
    """Templates, rule files and dashboards (name -> JSON text) of the mode."""
    if before:
        rules, dashboards = (
            git_files(BEFORE, "alerts", ".yml", tmp),
            git_files(BEFORE, "grafana/dashboards", ".json", tmp),
        )
    else:
        rules = sorted((REPO_ROOT / "alerts").glob("*.yml"))
        dashboards = sorted((REPO_ROOT / "grafana" / "dashboards").glob("*.json"))
    made: dict[str, Any] = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    key = "before" if before else "after"
    if key not in made:
        t0 = time.monotonic()
        made[key] = expositions(before, max(ranks), RUN_ID)
        if not before and min(ranks) < DETAIL_WORLD <= max(ranks):  # small and large runs in one go
            made[key] |= expositions(False, 1, RUN_ID)
        print(f"[scale] {key} expositions made by the exporter in {time.monotonic() - t0:.0f} s", flush=True)
        if cache is not None:
            cache.write_text(json.dumps(made))
    templates = {kind: Template.parse(kind, adapt(m, kind, RUN_ID)) for kind, m in made[key].items()}
    return templates, rules, {p.name: p.read_text() for p in dashboards}


def scenario(
    args: argparse.Namespace,
    n: int,
    name: str,
    templates: dict[str, Template],
    rules: list[Path],
    dashboards: dict[str, str],
    tmp: Path,
) -> dict[str, Any]:
    """One (N, scenario) run from an empty TSDB; the measurements as a dict."""
    t_start = time.monotonic()
    sim = RankSim(templates, n, "before" if args.before else "after", RUN_ID, refresh_seconds=args.scrape_interval)
    end = time.time()
    if name != "quiet":  # the leak began 2 h ago: a full trend window for the Prometheus-side checks
        sim.set_leak("all" if name == "leak-all" else 1, start=end - 2 * 3600)
    out: dict[str, Any] = {"ranks": n, "mode": "before" if args.before else "after", "scenario": name}
    with RankServers(sim) as servers:
        out["exported"] = exported(sim)
        data = tmp / "data"
        data.mkdir()
        print(f"[scale] N={n} {name}: writing {args.history_hours:g} h of history", flush=True)
        out["history"] = raw_history(sim, servers.targets, data, end, args.history_hours, args.scrape_interval)
        blocks = 1
        if name != "quiet" and args.firing:
            print(f"[scale] N={n} {name}: probing the active alerts, writing their ALERTS_FOR_STATE", flush=True)
            out["firing_restore"] = restore_as_firing(tmp / "alerts", data, rules, end, args.scrape_interval)
            blocks += out["firing_restore"]["alerts"] > 0
        if args.rule_history:
            print(f"[scale] N={n} {name}: backfilling the recording rules", flush=True)
            out["rule_history"] = rule_history(
                tmp / "rules", data, rules, end - args.history_hours * 3600, end, args.scrape_interval
            )
            blocks += out["rule_history"]["levels"]
        if blocks > 1:
            print(f"[scale] N={n} {name}: letting Prometheus compact the {blocks} overlapping blocks", flush=True)
            out["compaction"] = settle(tmp / "settle", data)
            if out["compaction"]["blocks"] > 1:
                print(f"[scale] warning: {out['compaction']['blocks']} blocks left after compaction", flush=True)
        # All that took minutes: bring the history up to now, so that Prometheus starts within its 5-minute
        # lookback of the last sample (the alerts it restores must be active at its second evaluation).
        caught = end + (time.time() - end) // args.scrape_interval * args.scrape_interval
        if caught > end:
            out["catch_up"] = raw_history(
                sim, servers.targets, data, caught, (caught - end) / 3600, args.scrape_interval
            )
            if args.rule_history:
                out["catch_up"]["rules"] = rule_history(
                    tmp / "rules-catch-up", data, rules, end, caught, args.scrape_interval
                )
            end = caught
        t0 = time.monotonic()
        with Prom(tmp / "prom", data, servers.targets, rules, args.scrape_interval) as prom:
            out["prometheus_ready_s"] = round(time.monotonic() - t0, 1)
            out["targets_up_s"] = round(prom.wait_up(n, timeout=max(120.0, 4 * args.scrape_interval)), 1)
            out["history_gap_s"] = round(time.time() - end, 1)
            print(
                f"[scale] N={n} {name}: {n} targets up; warm-up {args.warmup:g} s, measuring {args.measure:g} s",
                flush=True,
            )
            # The catch-up's blocks overlap: Prometheus compacts them a minute after it starts (a few seconds'
            # work), within the default warm-up.
            time.sleep(args.warmup)
            out |= measure(prom, args.measure, n)
            if name == "quiet" and args.repeats > 0:
                range_s = args.range_hours * 3600
                queries = None if args.before else from_helper(dashboards, RUN_ID, range_s, args.scrape_interval)
                out["query_source"] = (
                    "memexporter.dashboards.panel_queries" if queries is not None else "dashboard JSON"
                )
                if queries is None:
                    queries = from_json(
                        dashboards,
                        RUN_ID,
                        lambda sel, label: label_values(prom, sel, label),
                        range_s,
                        args.scrape_interval,
                    )
                print(f"[scale] N={n}: timing {len(queries)} dashboard queries x {args.repeats}", flush=True)
                out["queries"] = time_queries(prom, queries, args.repeats, args.range_hours * 3600)
            out["peak_rss_end_bytes"] = prom.peak_rss()  # after the queries too
            if args.hold > 0:  # for trying queries by hand against the same history
                print(f"[scale] N={n} {name}: Prometheus at {prom.url} for {args.hold:g} s more", flush=True)
                time.sleep(args.hold)
            out["scrapes_served"] = sum(servers.requests)
    out["wall_s"] = round(time.monotonic() - t_start, 1)
    return out


def label_values(prom: Prom, selector: str, label: str) -> list[str]:
    params = {"match[]": selector} if selector else {}
    return sorted(str(v) for v in prom.api(f"label/{label}/values", **params))


def exported(sim: RankSim) -> dict[str, Any]:
    """Series per rank as the simulator serves them (no Prometheus): by kind, and the average."""
    kinds = [sim.kind(r) for r in range(sim.ranks)]
    per_kind = {k: sum(1 for _ in sim.series(kinds.index(k))) for k in sorted(set(kinds))}
    total = sum(per_kind[k] for k in kinds)
    return {
        "per_kind": per_kind,
        "ranks_per_kind": {k: kinds.count(k) for k in per_kind},
        "average": round(total / sim.ranks, 1),
        "total": total,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--ranks", default="64,256,1024", help="comma-separated rank counts (default 64,256,1024)")
    p.add_argument("--scenarios", default="quiet,leak-all", help="quiet, leak-all, leak-one (default quiet,leak-all)")
    p.add_argument("--before", action="store_true", help=f"the exposition, rules and dashboards of {BEFORE}")
    p.add_argument("--scrape-interval", type=float, default=15.0, help="seconds (default 15)")
    p.add_argument("--history-hours", type=float, default=6.0, help="history written before the start (default 6)")
    p.add_argument("--range-hours", type=float, default=6.0, help="dashboard time range (default 6)")
    p.add_argument(
        "--warmup", type=float, default=120.0, help="seconds of live scraping before measuring (default 120)"
    )
    p.add_argument("--measure", type=float, default=120.0, help="seconds of steady state measured (default 120)")
    p.add_argument(
        "--repeats", type=int, default=7, help="timed passes over the dashboard queries (default 7; 0: none)"
    )
    p.add_argument(
        "--no-rule-history",
        dest="rule_history",
        action="store_false",
        help="skip the recording rules' backfill (their series then start with the live run)",
    )
    p.add_argument(
        "--no-firing",
        dest="firing",
        action="store_false",
        help="leave the leak scenarios' alerts pending (their for: has not elapsed) instead of restoring "
        "them as firing from ALERTS_FOR_STATE",
    )
    p.add_argument(
        "--hold",
        type=float,
        default=0.0,
        help="after measuring, keep Prometheus and the ranks up this many seconds (to try queries by hand)",
    )
    p.add_argument(
        "--templates",
        type=Path,
        help="cache of the exporter's expositions (JSON; made if missing: delete it when the exporter changes)",
    )
    p.add_argument("--json", type=Path, help="write the results here (after each scenario)")
    p.add_argument("--markdown", type=Path, help="write the report's tables here too")
    args = p.parse_args()
    ranks = [int(x) for x in args.ranks.split(",")]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp_name:
        tmp = Path(tmp_name)
        templates, rules, dashboards = setup(args.before, ranks, tmp, args.templates)
        for n in ranks:
            for name in args.scenarios.split(","):
                with contextlib.ExitStack() as stack:
                    run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"n{n}-{name}-", dir=tmp)))
                    results.append(scenario(args, n, name, templates, rules, dashboards, run_dir))
                print(f"[scale] N={n} {name}: done in {results[-1]['wall_s']:.0f} s", flush=True)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=1))
    text = report(results)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
