"""DESIGN.md §2 rule 1, read from the source: memexporter never calls what changes the numbers the
user and their framework measure (peak resets, cache flushes) or stalls the device."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

FORBIDDEN = {
    "reset_peak_memory_stats": "resets the user's peak stats",
    "reset_max_memory_allocated": "resets the user's peak stats",
    "reset_max_memory_cached": "resets the user's peak stats",
    "reset_accumulated_memory_stats": "resets the user's allocator counters",
    "empty_cache": "flushes the caching allocator under the user's feet",
    "synchronize": "stalls the device",
}
PACKAGE = REPO_ROOT / "memexporter"
# The demo job and the sweep's child runs are the training job itself, not the exporter around it.
JOB_SIDE = {"demo.py", "sweep.py"}
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if str(p.relative_to(PACKAGE)) not in JOB_SIDE)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_call_that_changes_what_the_user_measures(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            assert name not in FORBIDDEN, f"line {node.lineno}: {name}() {FORBIDDEN.get(name)}"
