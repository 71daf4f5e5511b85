"""``python -m memexporter.dashboards [--check]``: write (or check) ``grafana/dashboards/*.json``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memexporter.dashboards.grafana import render
from memexporter.dashboards.panels import build

OUT_DIR = Path(__file__).resolve().parents[2] / "grafana" / "dashboards"


def main(argv: list[str] | None = None) -> int:
    """``python -m memexporter.dashboards``: write each dashboard's JSON into ``--out`` (default: the checkout's
    ``grafana/dashboards/``); with ``--check``, write nothing and list the stale files. Exit 0, or 1 when
    a file is stale or cannot be written (one line on stderr)."""
    parser = argparse.ArgumentParser(
        prog="python -m memexporter.dashboards", description="Generate grafana/dashboards/*.json."
    )
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
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as exc:  # one line, not a traceback
            print(f"cannot write {str(exc.filename or path)!r}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    if stale:
        print(f"stale dashboards (run python -m memexporter.dashboards): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0
