"""``python -m memexporter.cli.generate [--check] [NAME ...]``: every committed file that is
generated from a source of truth, in one table, written or checked by one command.

``GENERATED`` names each family of files with its source and a function that renders them
(``{path relative to the checkout: text}``). Without ``--check`` the stale files are written;
with ``--check`` nothing is written, the stale files are listed and the exit status is 1. The
test command runs ``--check`` (``make check-generated``); ``make generate`` writes them all, and
``make rules``, ``dashboards``, ``kubernetes`` and ``docs`` one family each.

Not in the table: what only the test harness can produce (``tests/golden/``, the exposition of
a seeded scrape; ``tests/fixtures/synthetic/``; the screenshots in ``docs/``). Their tests check
them and say how to regenerate them (docs/development.md lists every generated file).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memexporter.cli import docs, kube, os_error
from memexporter.cli.export import rendered as dashboards_rendered
from memexporter.rules.rendering import render as render_rules

CHECKOUT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Generated:
    """One family of generated files: what it is rendered from, and the renderer."""

    source: str
    render: Callable[[Path], dict[str, str]]  # (the checkout) -> {relative path: text}


def _rules(root: Path) -> dict[str, str]:
    return {"alerts/memexporter.rules.yml": render_rules("default")}


def _dashboards(root: Path) -> dict[str, str]:
    return {f"grafana/dashboards/{name}": text for name, text in dashboards_rendered().items()}


def _kubernetes(root: Path) -> dict[str, str]:
    # What `make kubernetes` wrote before this table: the defaults of `memexporter rules
    # --format prometheusrule` and of `memexporter dashboards --format configmap`.
    return {
        "deploy/kubernetes/prometheusrule.yaml": kube.prometheus_rule(render_rules("default")),
        "deploy/kubernetes/dashboards.yaml": kube.dashboard_configmaps(dashboards_rendered()),
    }


def _docs(root: Path) -> dict[str, str]:
    out = {}
    for page, names in docs.pages(root / "docs").items():
        out[str(page.relative_to(root))] = docs.render(page.read_text(encoding="utf-8"), names)
    return out


GENERATED: dict[str, Generated] = {
    "rules": Generated("memexporter/rules/ (the default preset)", _rules),
    "dashboards": Generated("memexporter/dashboards/", _dashboards),
    "kubernetes": Generated("the rules and the dashboards, as Kubernetes objects", _kubernetes),
    "docs": Generated("memexporter/metrics/, memexporter/config/, memexporter/otel/names.py", _docs),
}


def stale(root: Path, names: list[str]) -> dict[str, str]:
    """``{relative path: fresh text}`` of the files of ``names`` that differ from ``root``'s."""
    out = {}
    for name in names:
        for rel, text in GENERATED[name].render(root).items():
            path = root / rel
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                out[rel] = text
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the stale generated files under ``--root`` (default: this checkout), printing each;
    with ``--check``, write nothing and list them. Exit 0; 1 when ``--check`` finds a stale file
    or a file cannot be written (one line on stderr); 2 for a name not in the table."""
    parser = argparse.ArgumentParser(
        prog="python -m memexporter.cli.generate",
        description="Write (or --check) the files generated from memexporter's sources of truth.",
        epilog="families: " + "; ".join(f"{name} (from {g.source})" for name, g in GENERATED.items()),
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"families: {', '.join(GENERATED)} (default: all)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    parser.add_argument("--root", type=Path, default=CHECKOUT, help="the checkout (default: %(default)s)")
    args = parser.parse_args(argv)
    for name in args.names:
        if name not in GENERATED:
            close = difflib.get_close_matches(name, GENERATED, 1)
            hint = f" (did you mean {close[0]}?)" if close else f"; choose from {', '.join(GENERATED)}"
            parser.error(f"no generated files named {name!r}{hint}")
    names: list[str] = args.names or list(GENERATED)
    found = stale(args.root, names)
    if args.check:
        for rel in found:
            print(f"{rel} is stale: run python -m memexporter.cli.generate", file=sys.stderr)
        return 1 if found else 0
    for rel, text in found.items():
        path = args.root / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as exc:  # one line, not a traceback
            print(f"python -m memexporter.cli.generate: {os_error(exc)}", file=sys.stderr)
            return 1
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
