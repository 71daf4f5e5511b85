"""Render the README's generated blocks from their sources of truth.

``python -m memexporter.docs`` rewrites the blocks between ``<!-- NAME:start -->`` and
``<!-- NAME:end -->`` markers; ``--check`` exits 1 when the README is stale (tests run it too).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

from memexporter import config, metrics
from memexporter.otel import names as otel_names

BLOCKS: dict[str, Callable[[], str]] = {
    "metrics": metrics.reference_table,
    "config": config.reference_table,
    "otel": otel_names.reference_table,
}


def render(text: str) -> str:
    """``text`` with every known block replaced by its fresh rendering."""
    for name, make in BLOCKS.items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"README has no <!-- {name}:start --> ... <!-- {name}:end --> block")
        body = make()

        def fill(m: re.Match[str], body: str = body) -> str:  # a function: body may hold backslashes
            return f"{m.group(1)}{body}\n{m.group(2)}"

        text = pattern.sub(fill, text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memexporter.docs", description=__doc__)
    parser.add_argument("--readme", type=Path, default=Path(__file__).resolve().parents[1] / "README.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if the README is stale")
    args = parser.parse_args(argv)
    old = args.readme.read_text()
    new = render(old)
    if args.check:
        if new != old:
            print(f"{args.readme} is stale: run python -m memexporter.docs")
            return 1
        return 0
    args.readme.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
