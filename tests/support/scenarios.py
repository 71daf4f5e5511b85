"""The promtool scenarios whose exporter series come from the real trend estimator.

Two kinds of file:
- generated here whole (input series from ``traces.Process`` definitions, expectations written
  below by hand): ``alerts/tests/young_job.yml``, ``alerts/tests/fatal_oom.yml`` and
  ``tests/promtool/demo_young.yml`` (``scenario_defs.py``), ``alerts/tests/runs.yml``
  (``run_scenarios.py``), ``alerts/tests/observed_end.yml`` (``end_scenarios.py``);
- written by hand, one step per scrape (``oom_forecast.yml``, ``healthy.yml``): their leak rate and
  ETA series are re-derived from their own peak and baseline series (``rederive``).

So what the alert rules see in promtool is what the exporter would report for those traces.
``python -m tests.support.scenarios`` writes the files; ``--check`` exits 1 when one is stale
(tests/unit/oom/test_trend_scenarios.py runs the check).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import yaml

from memexporter.oom.trend import TrendWindow, estimate
from tests.support import REPO_ROOT
from tests.support.end_scenarios import GENERATED as ENDS
from tests.support.run_scenarios import GENERATED as RUNS
from tests.support.scenario_defs import GENERATED
from tests.support.trace_scenarios import GENERATED as FROM_TRACES
from tests.support.traces import Value, decode, encode

ALERTS_TESTS = REPO_ROOT / "alerts" / "tests"
HAND_WRITTEN = [ALERTS_TESTS / "oom_forecast.yml", ALERTS_TESTS / "healthy.yml"]
DERIVED = ("memexporter_leak_rate_bytes_per_second", "memexporter_leak_bytes_per_step", "memexporter_oom_eta_seconds")
_SERIES = re.compile(r"^(\s*- series: ')([a-z_:]+)\{([^}]*)\}'\s*$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _absent(v: Value) -> bool:
    return v is None or math.isnan(v)


def derive(
    peaks: list[Value], baselines: list[Value], steps_total: list[Value], limit: list[Value], interval: float
) -> dict[str, list[Value]]:
    """The exporter's leak rate, leak per step and ETA at each scrape of a one-step-per-scrape
    trace: each scrape with a peak is a step; ``steps_total`` going down, or a stale gap, is a
    restart (a new process, a new window)."""
    out: dict[str, list[Value]] = {name: [] for name in DERIVED}
    window, count, last_total = TrendWindow(200, 20), 0, -1.0
    for k, (peak, base, total, lim) in enumerate(zip(peaks, baselines, steps_total, limit, strict=True)):
        if _absent(peak) or _absent(base):
            for name in DERIVED:
                out[name].append(peak)  # the same blank or stale marker
            window, count, last_total = TrendWindow(200, 20), 0, -1.0
            continue
        assert peak is not None and base is not None
        if total is not None and not math.isnan(total):
            if total < last_total:
                window, count = TrendWindow(200, 20), 0
            last_total = total
        count += 1
        window.add(count, k * interval, base, peak)
        est = estimate(window.snapshot(), lim if not _absent(lim) else None)
        out["memexporter_leak_rate_bytes_per_second"].append(est.leak_bytes_per_second)
        out["memexporter_leak_bytes_per_step"].append(est.leak_bytes_per_step)
        out["memexporter_oom_eta_seconds"].append(est.oom_eta_seconds)
    return out


def rederive(text: str) -> str:
    """``text`` (a hand-written scenario file) with every derived series' values re-computed."""
    doc = yaml.safe_load(text)
    lines = text.splitlines(keepends=True)
    replacements: dict[tuple[int, str], str] = {}
    for number, test in enumerate(doc["tests"]):
        interval = _seconds(test.get("interval", doc.get("evaluation_interval", "1m")))
        values = {s["series"]: decode(s["values"]) for s in test["input_series"]}
        for key in values:
            name, labels = key.split("{", 1)
            if name != "memexporter_oom_eta_seconds":
                continue
            rank = re.sub(r',device="[^"]*"', "", labels)
            needed = (
                "memexporter_memory_peak_bytes",
                "memexporter_memory_baseline_bytes",
                "memexporter_memory_limit_bytes",
            )
            if not all(f"{m}{{{labels}" in values for m in needed) or f"memexporter_steps_total{{{rank}" not in values:
                continue  # no per-step trace to derive from (a level-only scenario)

            def get(metric: str, lab: str = labels, v: dict[str, list[Value]] = values) -> list[Value]:
                return v[f"{metric}{{{lab}"]

            derived = derive(
                get("memexporter_memory_peak_bytes"),
                get("memexporter_memory_baseline_bytes"),
                get("memexporter_steps_total", rank),
                get("memexporter_memory_limit_bytes"),
                interval,
            )
            for metric, series in derived.items():
                if f"{metric}{{{labels}" in values:
                    replacements[(number, f"{metric}{{{labels}")] = encode(series)
    test_number, out = -1, []
    pending: str | None = None
    for line in lines:
        if line.startswith("  - name:"):
            test_number += 1
        if pending is not None and line.lstrip().startswith("values:"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}values: '{pending}'\n")
            pending = None
            continue
        m = _SERIES.match(line.rstrip("\n"))
        if m and (test_number, f"{m.group(2)}{{{m.group(3)}}}") in replacements:
            pending = replacements[(test_number, f"{m.group(2)}{{{m.group(3)}}}")]
        out.append(line)
    return "".join(out)


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", duration)))


def renderings() -> dict[Path, str]:
    """Every scenario file this module owns, as it should be on disk."""
    out = {path: rederive(path.read_text(encoding="utf-8")) for path in HAND_WRITTEN}
    for path, render in {**GENERATED, **RUNS, **ENDS, **FROM_TRACES}.items():
        out[path] = render()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.scenarios", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed scenario file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in renderings().items():
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(REPO_ROOT)))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO_ROOT)}")
    if stale:
        print(f"stale promtool scenarios (run python -m tests.support.scenarios): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
