"""Tests that start the in-process exporter: none runs before or after each test.

Use with ``pytestmark = pytest.mark.usefixtures("no_exporter_around")`` after importing it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import memexporter


@pytest.fixture
def no_exporter_around() -> Iterator[None]:
    memexporter.stop()
    yield
    memexporter.stop()
