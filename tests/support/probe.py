"""When each alert fires in a promtool scenario: the real promtool, asked at every evaluation.

``firing(scenario_file, test_name, rules_file)`` copies one test of a scenario file, replaces its
expectations with "nothing fires" at every evaluation for every alert of the rules file, runs
``promtool test rules`` and reads back, from its report of each mismatch, which alerts fired when.
The lead-time benchmark and the scenario tests use it, so lead times are measured, not assumed.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

import yaml

from tests.support.binaries import require

_HEADER = re.compile(r"alertname: (\w+), time: ([\dhms.]+),")
_LABELS = re.compile(r"Labels:\{([^}]*)\}")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def seconds(duration: str) -> float:
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)([hms])", duration))


def duration(s: float) -> str:
    s = round(s)
    return f"{s // 3600}h{s % 3600 // 60}m{s % 60}s"


def firing(
    scenario: Path, test_name: str, rules: Path, end: float | None = None, every: float | None = None
) -> dict[tuple[str, str], list[float]]:
    """``{(alertname, "instance rank device"): [seconds at which it was firing]}``."""
    doc = yaml.safe_load(scenario.read_text(encoding="utf-8"))
    (test,) = [t for t in doc["tests"] if t.get("name") == test_name]
    step = every or seconds(doc.get("evaluation_interval", "1m"))
    interval = seconds(test.get("interval", doc.get("evaluation_interval", "1m")))
    if end is None:
        end = max(len(_expand(s["values"])) for s in test["input_series"]) * interval
    names = list(  # once each: an alert of two severities (MemexporterInputOverCapacity) is one name
        dict.fromkeys(
            r["alert"]
            for g in yaml.safe_load(rules.read_text(encoding="utf-8"))["groups"]
            for r in g["rules"]
            if "alert" in r
        )
    )
    probe = {k: v for k, v in test.items() if k not in ("alert_rule_test", "promql_expr_test")}
    probe["alert_rule_test"] = [
        {"eval_time": duration(k * step), "alertname": n, "exp_alerts": []}
        for k in range(int(end // step) + 1)
        for n in names
    ]
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="memexporter-probe-") as tmp:
        path = Path(tmp) / "probe.yml"
        path.write_text(
            yaml.safe_dump(
                {
                    "rule_files": [str(rules.resolve())],
                    "evaluation_interval": duration(step),
                    "group_eval_order": doc.get("group_eval_order", []),
                    "tests": [probe],
                },
                sort_keys=False,
                width=1 << 20,
            ),
            encoding="utf-8",
        )
        result = subprocess.run(
            [require("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=600, check=False
        )
    current: tuple[str, float] | None = None
    for line in (result.stdout + result.stderr).splitlines():
        if (head := _HEADER.search(line)) is not None:
            current = (head.group(1), seconds(head.group(2)))
        elif current is not None and (labels := _LABELS.search(line)) is not None:
            lab = dict(_LABEL.findall(labels.group(1)))
            out[
                (current[0], f"{lab.get('instance', '')} {lab.get('rank', '')} {lab.get('device', '')}".strip())
            ].append(current[1])
    return dict(out)


def _expand(values: str) -> list[str]:
    out: list[str] = []
    for tok in values.split():
        if "x" in tok and not tok.startswith("0x"):
            out.extend([tok] * (int(tok.rsplit("x", 1)[1]) + (0 if tok.startswith("_") else 1)))
        else:
            out.append(tok)
    return out


# The lead times issue 9 asks for: (what, scenario file, test name, preset, alert, event seconds,
# "before" (the alert must fire this long before the event) or "after" (within this long after)).
LEAD_TIMES: list[tuple[str, str, str, str, str, float, str]] = [
    (
        "young job: warning before the OOM",
        "alerts/tests/young_job.yml",
        "young job leaking from its warm-up, and a healthy young job",
        "default",
        "MemexporterOOMPredicted",
        3615,
        "before",
    ),
    (
        "young job: page before the OOM",
        "alerts/tests/young_job.yml",
        "young job leaking from its warm-up, and a healthy young job",
        "default",
        "MemexporterOOMImminent",
        3615,
        "before",
    ),
    (
        "young job: MemoryLeak after the leak's start",
        "alerts/tests/young_job.yml",
        "young job leaking from its warm-up, and a healthy young job",
        "default",
        "MemexporterMemoryLeak",
        300,
        "after",
    ),
    (
        "3-hour leak: warning before the OOM",
        "alerts/tests/oom_forecast.yml",
        "linear leak reaching the limit after 3 h",
        "default",
        "MemexporterOOMPredicted",
        10800,
        "before",
    ),
    (
        "3-hour leak: page before the OOM",
        "alerts/tests/oom_forecast.yml",
        "linear leak reaching the limit after 3 h",
        "default",
        "MemexporterOOMImminent",
        10800,
        "before",
    ),
    (
        "3-hour leak: MemoryLeak after the leak's start",
        "alerts/tests/oom_forecast.yml",
        "linear leak reaching the limit after 3 h",
        "default",
        "MemexporterMemoryLeak",
        300,
        "after",
    ),
    (
        "demo (promtool): warning before the stop",
        "tests/promtool/demo_young.yml",
        "the demo leaking from its first step",
        "demo",
        "MemexporterOOMPredicted",
        169.6,
        "before",
    ),
]


def lead_times(repo: Path, rules: dict[str, Path]) -> list[tuple[str, float]]:
    """``[(what, seconds)]`` for ``LEAD_TIMES``, measured with promtool; ``rules`` maps preset to file."""
    out = []
    for what, scenario, test, preset, alert, event, direction in LEAD_TIMES:
        fired = firing(repo / scenario, test, rules[preset])
        first = min(t for (name, _), times in fired.items() if name == alert for t in times)
        out.append((what, event - first if direction == "before" else first - event))
    return out
