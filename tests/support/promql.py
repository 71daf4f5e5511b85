"""PromQL helpers for tests: metric names in an expression, Grafana variable substitution, and a
real ``promtool check rules`` run over a set of expressions."""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support.binaries import require

# Keywords and modifiers that look like identifiers but are not metric names.
KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "inf",
        "nan",
        "atan2",
    }
)
BUILTINS = frozenset({"ALERTS", "ALERTS_FOR_STATE", "up", "scrape_duration_seconds", "scrape_samples_scraped"})

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.$:])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")

# What Grafana would put in place of its variables when the dashboard runs, for parsing and for
# queries against a test Prometheus (job and instance "All" is ".+", rates use 1m windows).
GRAFANA_DEFAULTS: Mapping[str, str] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "__range_s": "3600",
    "topk": "10",
}


def metric_names(expr: str) -> set[str]:
    """Metric and recording-rule names referenced by ``expr``: every identifier that is not a
    function, keyword, label name, string, duration or template variable."""
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    return {m for m in _IDENT.findall(text) if m.lower() not in KEYWORDS}


def substitute(expr: str, values: Mapping[str, str] | None = None) -> str:
    """Replace ``$var``, ``${var}`` and ``[[var]]`` with ``values`` (falling back to
    ``GRAFANA_DEFAULTS``, then ``.+``: the "All" value of every memexporter query variable).
    ``$1`` (a ``label_replace`` group reference) is left alone, as Grafana leaves it."""
    table = {**GRAFANA_DEFAULTS, **(values or {})}

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return table.get(name, ".+")

    return re.sub(r"\$\{([A-Za-z_]\w*)(?::\w+)?\}|\$([A-Za-z_]\w*)|\[\[([A-Za-z_]\w*)\]\]", repl, expr)


def rules_document(exprs: Mapping[str, str]) -> dict[str, Any]:
    """A rules file with one recording rule per expression; rule names are ``test:<key>``, cleaned."""
    rules = [{"record": "test:" + re.sub(r"[^A-Za-z0-9_]", "_", key), "expr": expr} for key, expr in exprs.items()]
    return {"groups": [{"name": "expressions-under-test", "rules": rules}]}


def promtool_check_exprs(exprs: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the real ``promtool check rules`` over ``exprs`` written as recording rules. The
    result's ``returncode`` is 0 when every expression parses; stdout/stderr name the bad one."""
    promtool = require("promtool")
    with tempfile.TemporaryDirectory(prefix="memexporter-promql-") as tmp:
        path = Path(tmp) / "exprs.rules.yml"
        path.write_text(yaml.safe_dump(rules_document(exprs), sort_keys=False), encoding="utf-8")
        return subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
        )


def promtool_expr_test(
    expr: str, series: list[dict[str, str]], samples: list[dict[str, Any]], at: str = "2m"
) -> subprocess.CompletedProcess[str]:
    """Run the real ``promtool test rules``: ``expr`` over ``series`` (its ``input_series``, one
    sample a minute) must answer ``samples`` (its ``exp_samples``) at ``at``. The result's
    ``returncode`` is 0 when it does; when not, stdout says what it got."""
    promtool = require("promtool")
    with tempfile.TemporaryDirectory(prefix="memexporter-promql-") as tmp:
        rules, tests = Path(tmp) / "none.rules.yml", Path(tmp) / "expr.test.yml"
        rules.write_text("groups: []\n", encoding="utf-8")
        test = {"interval": "1m", "input_series": series}
        test["promql_expr_test"] = [{"expr": expr, "eval_time": at, "exp_samples": samples}]
        doc = {"rule_files": [rules.name], "evaluation_interval": "1m", "tests": [test]}
        tests.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        return subprocess.run(
            [promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=60, check=False, cwd=tmp
        )


def rule_exprs(paths: Iterable[Path]) -> dict[str, str]:
    """``{"file:group:name": expr}`` for every recording and alerting rule in ``paths``."""
    out: dict[str, str] = {}
    for path in paths:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for group in doc.get("groups", []):
            for i, rule in enumerate(group.get("rules", [])):
                name = rule.get("record") or rule.get("alert") or str(i)
                out[f"{path.name}:{group['name']}:{name}:{i}"] = str(rule["expr"])
    return out


def recording_rules(paths: Iterable[Path]) -> set[str]:
    """Names of the recording rules defined in ``paths``."""
    names: set[str] = set()
    for path in paths:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for group in doc.get("groups", []):
            names.update(r["record"] for r in group.get("rules", []) if "record" in r)
    return names
