"""Every benchmark imports: they run by hand, not in CI, so a broken one would otherwise be found by
the next person to measure (a helper once landed between ``@dataclass`` and its class)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

BENCHMARKS = sorted(p.stem for p in (REPO_ROOT / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_imports(name: str) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    assert Path(module.__file__ or "").stem == name
