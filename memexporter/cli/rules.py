"""``memexporter rules``: print (or write) the rendered rules."""

from __future__ import annotations

import argparse
import re
import sys

from memexporter.cli import kube
from memexporter.rules.params import PRESETS, SEVERITIES, RulesConfig
from memexporter.rules.rendering import render


def main(argv: list[str] | None = None) -> int:
    """``memexporter rules``: print (or write) the rendered rules."""
    parser = argparse.ArgumentParser(
        prog="memexporter rules", description="Print the memexporter Prometheus recording and alerting rules."
    )
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), default="default", help="parameter set (default: %(default)s)"
    )
    default_selector = RulesConfig.selector.replace("%", "%%")  # argparse %-formats help texts
    parser.add_argument(
        "--selector",
        help="PromQL label matchers for every series, comma-separated, values "
        f'quoted: e.g. \'job="trainer"\' or \'namespace="ml",job=~"trainer-.*"\' '
        f"(default: {default_selector})",
    )
    parser.add_argument(
        "--critical-severity",
        choices=SEVERITIES,
        help="severity of the alerts that page, "
        "MemexporterOOMImminent and MemexporterTrainingStalled (warning: never page)",
    )
    parser.add_argument(
        "--peer-labels",
        metavar="LABELS",
        help="comma-separated labels that name one training run; MemexporterRankImbalance "
        "compares the ranks that share them, and a label a series lacks counts as empty "
        f"(default: {RulesConfig.peer_labels.replace(' ', '')})",
    )
    parser.add_argument("--runbook-url", help="base URL of runbook.md; the anchor #<alertname lowercased> is appended")
    parser.add_argument("--output", metavar="FILE", help="write to FILE instead of stdout")
    kube.add_rules_arguments(parser)
    args = parser.parse_args(argv)
    try:
        text = render(args.preset, args.selector, args.critical_severity, args.runbook_url, args.peer_labels)
        text = kube.rules_output(text, args)
    except ValueError as exc:
        parser.error(str(exc).removeprefix("memexporter: "))  # argparse names the command itself
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:  # one line, not a traceback
            print(f"memexporter rules: cannot write {args.output!r}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        # Said like `dashboards --output` says it: a write that succeeds is not silent.
        alerts, records = (len(re.findall(rf"^\s*- {kind}:", text, re.M)) for kind in ("alert", "record"))
        print(
            f"wrote {args.output}: {alerts} alerts and {records} recording rules (preset {args.preset})",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text)
    return 0
