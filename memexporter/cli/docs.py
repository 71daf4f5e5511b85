"""Render the documentation's generated blocks from their sources of truth.

Each block lives in one page of ``docs/`` between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``
markers. ``python -m memexporter.cli.generate docs`` rewrites them in place, and ``--check`` exits 1
when a page is stale (the test command runs it), like every other generated file (``generate.py``).
"""

from __future__ import annotations

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
