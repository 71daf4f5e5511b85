"""Fixtures shared by the integration tests (those of the whole suite, ``no_exporter`` among them, are
in tests/support/fixtures.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import memexporter
from tests.support.tls import self_signed


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    """A throwaway self-signed certificate and key for 127.0.0.1."""
    return self_signed(tmp_path)


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The debug token files in this test's own folder (``$XDG_RUNTIME_DIR/memexporter``), with no
    token from the environment; the exporter stops before the folder goes. Yields that folder."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MEMEXPORTER_DEBUG_TOKEN", raising=False)
    yield tmp_path / "memexporter"
    memexporter.stop()
