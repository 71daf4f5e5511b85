"""``/metrics`` (serving/exposition.py): formats, gzip, the ``name[]`` filter, and the cache that
serves a busy server's scrapers, on a fake clock and a registry that counts its collections."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from memexporter.serving.budget import Budget
from memexporter.serving.exposition import REUSE_FOR, VARIANTS, Exposition

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Counting:
    """Two families; ``job_collections_total`` is the number of collections so far."""

    def __init__(self) -> None:
        self.collections = 0

    def collect(self) -> Iterator[Metric]:
        self.collections += 1
        c = CounterMetricFamily("job_collections", "Collections so far.", labels=["rank"])
        c.add_metric(["0"], self.collections)
        yield c
        g = GaugeMetricFamily("job_memory_bytes", "Memory.", labels=["rank"], unit="bytes")
        g.add_metric(["0"], 42.0)
        yield g


def setup(busy: bool = False) -> tuple[Exposition, Counting, Clock]:
    clock, counting = Clock(), Counting()
    registry = CollectorRegistry()
    registry.register(counting)
    budget = Budget(share=0.02, burst=0.1, clock=clock)
    if busy:
        budget.charge(0.2)  # a flood spent it
    return Exposition(registry, budget, clock=clock), counting, clock


def call(app: Exposition, query: str = "", **headers: str) -> tuple[str, dict[str, str], bytes]:
    seen: list[tuple[str, list[tuple[str, str]]]] = []
    environ: dict[str, Any] = {"QUERY_STRING": query, "REQUEST_METHOD": "GET", **headers}
    body = b"".join(app(environ, lambda status, hdrs: seen.append((status, hdrs))))
    return seen[0][0], dict(seen[0][1]), body


def test_a_quiet_server_renders_every_request_so_a_scrape_after_a_step_sees_it() -> None:
    app, counting, _ = setup()
    for n in (1, 2, 3):
        status, headers, body = call(app)
        assert status == "200 OK" and f'job_collections_total{{rank="0"}} {n}.0'.encode() in body
        assert headers["Content-Type"].startswith("text/plain") and headers["Content-Length"] == str(len(body))
    assert counting.collections == app.renders == 3


def test_a_busy_server_renders_each_variant_at_most_once_per_interval() -> None:
    app, counting, clock = setup(busy=True)
    first = call(app)[2]
    for _ in range(50):  # a flood within the interval: the same bytes, no collection
        clock.now += REUSE_FOR / 100
        assert call(app)[2] == first
    assert counting.collections == 1
    gz = call(app, HTTP_ACCEPT_ENCODING="gzip")  # another variant: its own render, gzipped once
    assert gz[1]["Content-Encoding"] == "gzip" and b"job_collections_total" in gzip.decompress(gz[2])
    assert call(app, HTTP_ACCEPT_ENCODING="gzip")[2] == gz[2] and counting.collections == 2
    clock.now += REUSE_FOR  # older than the interval: fresh data even under the flood
    assert b'job_collections_total{rank="0"} 3.0' in call(app)[2]


def test_the_cache_keeps_a_bounded_number_of_variants() -> None:
    app, counting, _ = setup(busy=True)
    for i in range(VARIANTS + 5):
        call(app, f"name[]=x{i}")
    call(app, "name[]=x0")  # evicted: rendered again
    assert counting.collections == VARIANTS + 6
    assert len(app._renders) == VARIANTS


@pytest.mark.parametrize("accept", ["", OPENMETRICS])
def test_name_filter_keeps_only_the_samples_named(accept: str) -> None:
    app, _, _ = setup()
    status, headers, body = call(app, "name[]=job_collections_total&name%5B%5D=job_memory_bytes", HTTP_ACCEPT=accept)
    assert status == "200 OK"
    assert b'job_collections_total{rank="0"} 1.0' in body and b'job_memory_bytes{rank="0"} 42.0' in body
    body = call(app, "name[]=job_memory_bytes", HTTP_ACCEPT=accept)[2]
    assert b"job_memory_bytes" in body and b"job_collections" not in body
    if accept:
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert b"# UNIT job_memory_bytes bytes" in body and body.endswith(b"# EOF\n")
    empty = call(app, "name[]=nothing_by_this_name", HTTP_ACCEPT=accept)[2]
    assert empty == (b"# EOF\n" if accept else b"")


def test_the_live_pages_json_takes_the_same_cache_under_a_flood() -> None:
    clock, counting = Clock(), Counting()
    registry = CollectorRegistry()
    registry.register(counting)
    budget = Budget(share=0.02, burst=0.1, clock=clock)
    budget.charge(0.2)  # a flood spent it
    app = Exposition(registry, budget, clock, encode=lambda reg: b"%d" % sum(1 for _ in reg.collect()))
    for _ in range(20):
        status, headers, body = call(app, HTTP_ACCEPT=OPENMETRICS)  # the Accept header does not matter
        clock.now += REUSE_FOR / 100
    assert (status, headers["Content-Type"], body) == ("200 OK", "application/json", b"2")
    assert counting.collections == 1 and app.renders == 1
