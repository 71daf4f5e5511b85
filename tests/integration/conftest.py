"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import memexporter
from tests.support.tls import self_signed


@pytest.fixture
def no_exporter() -> Iterator[None]:
    """No exporter runs in this process before the test or after it (the exporter is a
    process-wide singleton; a test that fails half-way must not leave one to the next)."""
    memexporter.stop()
    yield
    memexporter.stop()


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    """A throwaway self-signed certificate and key for 127.0.0.1."""
    return self_signed(tmp_path)
