"""The counts the job keeps of its helpers (serving/conn.py ``ConnectionStats``): the dropped connections never go
down when a new helper, counting from 0, takes over, and the restarts are counted."""

from __future__ import annotations

from memexporter.serving.conn import ConnectionStats


def test_dropped_counts_carry_over_a_restart_and_restarts_are_counted() -> None:
    stats = ConnectionStats()
    stats.set({"timeout": 3, "reset": 1})
    assert stats.restarts() == 0
    stats.restarted()
    assert stats.dropped()["timeout"] == 3  # nothing lost between the helpers
    stats.set({"timeout": 1})  # the new helper's own count
    assert stats.dropped()["timeout"] == 4 and stats.dropped()["reset"] == 1
    stats.restarted()
    stats.set({"reset": 2})
    assert stats.dropped()["timeout"] == 4 and stats.dropped()["reset"] == 3
    assert stats.restarts() == 2
