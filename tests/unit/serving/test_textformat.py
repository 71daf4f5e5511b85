"""The helper's reshaping of the text exposition (serving/textformat.py) against prometheus_client's own
renders: OpenMetrics byte for byte on the golden exposition, and the ``name[]`` filter as
prometheus_client's restricted registry would give it."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

from memexporter.serving.textformat import append, only, to_openmetrics
from tests.support import REPO_ROOT

GOLDEN = REPO_ROOT / "tests" / "golden"


class Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def awkward() -> list[Metric]:
    """Help texts and label values that need escaping, a counter, a gauge with a unit, Inf and NaN."""
    c = CounterMetricFamily("memexporter_steps", 'Steps "seen"\nback\\slash.', labels=["rank"])
    c.add_metric(['0"1'], 3)
    g = GaugeMetricFamily("memexporter_oom_eta_seconds", "ETA.", labels=["rank", "device"], unit="seconds")
    g.add_metric(["0", "cuda:0"], float("inf"))
    g.add_metric(["0", "cpu\n"], float("nan"))
    return [c, g]


def test_openmetrics_from_the_golden_text_is_the_golden_openmetrics() -> None:
    text = (GOLDEN / "exposition.txt").read_bytes()
    assert to_openmetrics(text) == (GOLDEN / "exposition.openmetrics.txt").read_bytes()


def test_openmetrics_from_text_that_needs_escaping_is_prometheus_clients() -> None:
    families = Families(awkward())
    assert to_openmetrics(generate_latest(families)) == openmetrics(families)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "names",
    [
        ["memexporter_steps_total"],
        ["memexporter_oom_eta_seconds", "memexporter_steps_total"],
        ["memexporter_steps"],  # a family's name is not a sample's: nothing
        [],
    ],
)
def test_the_name_filter_is_a_restricted_registrys(names: list[str]) -> None:
    kept = []
    for family in awkward():
        samples = [s for s in family.samples if s.name in names]
        if samples:
            one = copy.copy(family)
            one.samples = samples
            kept.append(one)
    text = generate_latest(Families(awkward()))  # type: ignore[arg-type]
    assert only(text, names) == generate_latest(Families(kept))  # type: ignore[arg-type]


def test_appended_families_follow_on_a_line_of_their_own() -> None:
    assert append(b"a 1.0", b"b 2.0\n") == b"a 1.0\nb 2.0\n"
    assert append(b"", b"b 2.0\n") == b"b 2.0\n"
