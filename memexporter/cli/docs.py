"""Render the documentation's generated blocks from their sources of truth.

Each block lives in one page of ``docs/`` between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``
markers. ``python -m memexporter.cli.docs`` rewrites them in place; ``--check`` exits 1 when a page is
stale (the tests run it too).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

from memexporter import config, metrics
from memexporter.otel import names as otel_names

#: block name -> (the page under the docs folder that holds it, its renderer)
BLOCKS: dict[str, tuple[str, Callable[[], str]]] = {
    "metrics": ("metrics.md", metrics.reference_table),
    "config": ("configuration.md", config.reference_table),
    "otel": ("otel.md", otel_names.reference_table),
}
DOCS = Path(__file__).resolve().parents[2] / "docs"


def render(text: str, names: list[str]) -> str:
    """``text`` with each named block replaced by its fresh rendering."""
    for name in names:
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise ValueError(
                f"no <!-- {name}:start --> ... <!-- {name}:end --> block where {BLOCKS[name][0]} should have it"
            )
        body = BLOCKS[name][1]()

        def fill(m: re.Match[str], body: str = body) -> str:  # a function: body may hold backslashes
            return f"{m.group(1)}{body}\n{m.group(2)}"

        text = pattern.sub(fill, text)
    return text


def pages(docs: Path) -> dict[Path, list[str]]:
    """Each page that holds generated blocks, with the names of its blocks."""
    found: dict[Path, list[str]] = {}
    for name, (page, _) in BLOCKS.items():
        found.setdefault(docs / page, []).append(name)
    return found


def main(argv: list[str] | None = None) -> int:
    """``python -m memexporter.cli.docs``: rewrite the stale generated blocks of the pages under ``--docs``,
    printing each page rendered; with ``--check``, write nothing and print the stale pages. Exit 0, or 1
    when ``--check`` finds a stale page."""
    parser = argparse.ArgumentParser(prog="python -m memexporter.cli.docs", description=__doc__)
    parser.add_argument("--docs", type=Path, default=DOCS, help="the docs folder (default: the checkout's)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, names in pages(args.docs).items():
        old = path.read_text(encoding="utf-8")
        new = render(old, names)
        if new == old:
            continue
        if args.check:
            stale.append(path)
        else:
            path.write_text(new, encoding="utf-8")
            print(f"rendered {path}")
    for path in stale:
        print(f"{path} is stale: run python -m memexporter.cli.docs")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
