"""Fixtures shared by the integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tls import self_signed


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    """A throwaway self-signed certificate and key for 127.0.0.1."""
    return self_signed(tmp_path)
