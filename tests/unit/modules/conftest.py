"""Every per-module tracking test leaves no model tracked and the process-wide hook-error counter
as it found it (some tests inject failures), so tests stay independent of order and of each other."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memexporter.tracking import hooks
from memexporter.tracking.modules import TrackHandle, active_handles


@pytest.fixture(autouse=True)
def _untrack_all() -> Iterator[None]:
    errors = hooks._errors  # not monkeypatch: tests call monkeypatch.undo() part-way
    yield
    for h in list(active_handles()):
        assert isinstance(h, TrackHandle)
        h.remove()
    hooks._errors = errors
