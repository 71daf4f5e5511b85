"""Every per-module tracking test leaves no model tracked, so tests stay independent of order."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memexporter.tracking.modules import TrackHandle, active_handles


@pytest.fixture(autouse=True)
def _untrack_all() -> Iterator[None]:
    yield
    for h in list(active_handles()):
        assert isinstance(h, TrackHandle)
        h.remove()
