"""``/metrics`` and ``/live.json`` in the helper (serving/exposition.py): formats, gzip, the ``name[]``
filter, from the snapshot a fake board holds, and the cache of variants that lasts one snapshot."""

from __future__ import annotations

import gzip
from typing import Any

import pytest

from memexporter.serving.board import Snapshot
from memexporter.serving.exposition import VARIANTS, Exposition

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
TEXT = (
    b"# HELP memexporter_steps_total Training steps seen.\n"
    b"# TYPE memexporter_steps_total counter\n"
    b'memexporter_steps_total{rank="0"} %d.0\n'
    b"# HELP memexporter_memory_used_bytes Memory in use.\n"
    b"# TYPE memexporter_memory_used_bytes gauge\n"
    b'memexporter_memory_used_bytes{device="cpu",rank="0"} 42.0\n'
)


class Board:
    """What the helper's view returns: the same snapshot object until the job publishes a new one."""

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.reads = 0

    def publish(self, steps: int) -> None:
        generation = self.snapshot.generation + 1 if self.snapshot else 1
        self.snapshot = Snapshot(generation, 0.0, {"text": TEXT % steps, "live": b'{"steps":%d}' % steps})

    def __call__(self) -> Snapshot | None:
        self.reads += 1
        return self.snapshot


def call(app: Exposition, query: str = "", **headers: str) -> tuple[str, dict[str, str], bytes]:
    seen: list[tuple[str, list[tuple[str, str]]]] = []
    environ: dict[str, Any] = {"QUERY_STRING": query, "REQUEST_METHOD": "GET", **headers}
    body = b"".join(app(environ, lambda status, hdrs: seen.append((status, hdrs))))
    return seen[0][0], dict(seen[0][1]), body


def test_before_the_first_snapshot_it_is_a_503_that_says_so() -> None:
    status, headers, body = call(Exposition(Board()))
    assert status.startswith("503") and headers["Retry-After"] == "1" and b"no snapshot" in body


def test_each_request_gets_the_latest_snapshot_and_each_variant_is_made_once_per_snapshot() -> None:
    board = Board()
    app = Exposition(board)
    board.publish(1)
    for _ in range(20):  # a flood between two publishes: the same bytes, made once
        status, headers, body = call(app)
        assert status == "200 OK" and b'memexporter_steps_total{rank="0"} 1.0' in body
        assert headers["Content-Type"].startswith("text/plain") and headers["Content-Length"] == str(len(body))
    assert app.renders == 1
    gz = call(app, HTTP_ACCEPT_ENCODING="gzip")  # another variant: its own render, gzipped once
    assert gz[1]["Content-Encoding"] == "gzip" and gzip.decompress(gz[2]) == TEXT % 1
    assert call(app, HTTP_ACCEPT_ENCODING="gzip")[2] == gz[2] and app.renders == 2
    board.publish(2)  # the next snapshot: fresh data at once
    assert b'memexporter_steps_total{rank="0"} 2.0' in call(app)[2] and app.renders == 3


def test_openmetrics_is_made_from_the_text_with_the_units_of_the_spec_table() -> None:
    board = Board()
    board.publish(3)
    status, headers, body = call(Exposition(board), HTTP_ACCEPT=OPENMETRICS)
    assert status == "200 OK"
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert b"# TYPE memexporter_steps counter\n" in body and b'memexporter_steps_total{rank="0"} 3.0' in body
    assert b"# UNIT memexporter_memory_used_bytes bytes\n" in body and body.endswith(b"# EOF\n")


def test_the_cache_keeps_a_bounded_number_of_variants() -> None:
    board = Board()
    board.publish(1)
    app = Exposition(board)
    for i in range(VARIANTS + 5):
        call(app, f"name[]=x{i}")
    call(app, "name[]=x0")  # evicted: made again
    assert app.renders == VARIANTS + 6
    assert len(app._renders) == VARIANTS


@pytest.mark.parametrize("accept", ["", OPENMETRICS])
def test_name_filter_keeps_only_the_samples_named(accept: str) -> None:
    board = Board()
    board.publish(1)
    app = Exposition(board)
    query = "name[]=memexporter_steps_total&name%5B%5D=memexporter_memory_used_bytes"
    status, headers, body = call(app, query, HTTP_ACCEPT=accept)
    assert status == "200 OK"
    assert b'memexporter_steps_total{rank="0"} 1.0' in body and b"memexporter_memory_used_bytes{" in body
    body = call(app, "name[]=memexporter_memory_used_bytes", HTTP_ACCEPT=accept)[2]
    assert b"memexporter_memory_used_bytes" in body and b"memexporter_steps" not in body
    if accept:
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert b"# UNIT memexporter_memory_used_bytes bytes" in body and body.endswith(b"# EOF\n")
    empty = call(app, "name[]=nothing_by_this_name", HTTP_ACCEPT=accept)[2]
    assert empty == (b"# EOF\n" if accept else b"")


def test_the_live_pages_json_is_its_own_section_whatever_the_accept_header() -> None:
    board = Board()
    board.publish(7)
    app = Exposition(board, "live")
    for _ in range(5):
        status, headers, body = call(app, HTTP_ACCEPT=OPENMETRICS)
    assert (status, headers["Content-Type"], body) == ("200 OK", "application/json", b'{"steps":7}')
    assert app.renders == 1
