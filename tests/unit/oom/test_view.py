"""``memexporter.oom.view``: used, committed and limit as pure functions of what the backends read,
and ``backends.base.committed``: what fills the limit under each allocator (issue 34)."""

from __future__ import annotations

import json

import pytest

from memexporter.backends.base import HostSample, committed, expandable_in
from memexporter.oom.view import (
    BUDGET_SOURCE,
    DEVICE_SOURCE,
    HOST_SOURCE,
    MemoryView,
    device_limit,
    host_view,
    with_budget,
)
from tests.support.h200_traces import TRACES

GiB = 1 << 30


def test_cpu_view_is_rss_against_rss_plus_available_and_says_what_it_lacks() -> None:
    assert host_view(HostSample(rss=2 * GiB, children_rss=0, available=6 * GiB, limit=None)) == (
        MemoryView(2 * GiB, 8 * GiB, source=HOST_SOURCE),
        [],
    )
    view, failed = host_view(HostSample(rss=2 * GiB, children_rss=0, available=None, limit=None))
    assert view == MemoryView(2 * GiB, None) and failed == ["cpu: the available memory could not be read (no limit)"]
    assert host_view(HostSample(rss=None, children_rss=None, available=None, limit=None)) == (
        None,
        ["cpu: the process RSS could not be read"],
    )
    assert view.held == view.used and view.stranded == 0.0  # a cpu view: RSS fills its own limit


def test_device_limit_is_reserved_plus_free_capped_by_the_fraction_and_says_which() -> None:
    assert device_limit(reserved=10 * GiB, free=30 * GiB, fraction=1.0, total=80 * GiB) == (40 * GiB, DEVICE_SOURCE)
    assert device_limit(reserved=10 * GiB, free=30 * GiB, fraction=0.25, total=80 * GiB) == (
        20 * GiB,
        "memory fraction 0.250",
    )
    assert device_limit(reserved=10 * GiB, free=None, fraction=0.5, total=80 * GiB) == (
        40 * GiB,
        "memory fraction 0.500",
    )
    # A fraction above what the device has free: the device is the limit.
    assert device_limit(reserved=1 * GiB, free=9 * GiB, fraction=0.5, total=80 * GiB) == (10 * GiB, DEVICE_SOURCE)
    assert (
        device_limit(reserved=10 * GiB, free=None, fraction=1.0, total=80 * GiB)[0] is None
    )  # nothing known: no guess


def test_a_budget_only_tightens_the_limits_of_the_devices_trained_on() -> None:
    views = {"cpu": MemoryView(2 * GiB, 8 * GiB), "cuda:0": MemoryView(GiB, 40 * GiB), "cuda:1": MemoryView(GiB, None)}
    tightened = with_budget(views, ["cuda:0", "cuda:1"], 16 * GiB)
    assert tightened == {
        "cpu": views["cpu"],
        "cuda:0": MemoryView(GiB, 16 * GiB, source=BUDGET_SOURCE),
        "cuda:1": MemoryView(GiB, 16 * GiB, source=BUDGET_SOURCE),
    }
    assert with_budget(views, ["cuda:0"], 64 * GiB)["cuda:0"].limit == 40 * GiB  # above the device: the device's
    assert with_budget(views, ["cpu"], None) is views


@pytest.mark.parametrize(
    ("trace", "backend", "expandable", "figure"),
    [
        # Right after the H200's OOMs under a 6 GiB fraction: what each allocator had filled it with.
        ("trace-native-8mib", "native", False, "allocated + inactive split"),
        ("trace-expandable-8mib", "native", True, "reserved"),
        ("trace-async-8mib", "cudaMallocAsync", False, "allocated"),
    ],
)
def test_committed_is_what_met_the_limit_at_each_real_oom(
    trace: str, backend: str, expandable: bool, figure: str
) -> None:
    doc = json.loads((TRACES / f"{trace}.json").read_text())
    stats, limit = doc["after_oom"], doc["limit_bytes"]
    held = committed(stats, backend, expandable)
    assert held is not None and held / limit >= 0.99, f"{trace}: {figure} is {held / limit:.1%} of the limit"
    expected = {
        "allocated + inactive split": stats["allocated_bytes.all.current"] + stats["inactive_split_bytes.all.current"],
        "reserved": stats["reserved_bytes.all.current"],
        "allocated": stats["allocated_bytes.all.current"],
    }[figure]
    assert held == expected
    # What the forecast used to compare: allocated alone, 80 % under the native allocator.
    if trace == "trace-native-8mib":
        assert stats["allocated_bytes.all.current"] / limit < 0.81


def test_committed_of_an_allocator_that_reports_nothing_is_unknown() -> None:
    assert committed({}, "pluggable", False) is None
    assert committed({"allocated_bytes.all.current": 5}, "native", False) == 5  # no split statistic (mps)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ("expandable_segments:True", True),
        ("max_split_size_mb:128, expandable_segments:true", True),
        ("expandable_segments:False", False),
        ("backend:cudaMallocAsync", False),
        ("", False),
    ],
)
def test_expandable_segments_are_read_from_the_allocator_settings(settings: str, expected: bool) -> None:
    assert expandable_in(settings) is expected


def test_a_view_says_how_full_and_what_is_stranded() -> None:
    view = MemoryView(used=4 * GiB, limit=6 * GiB, committed=5.5 * GiB)
    assert (view.held, view.stranded, view.fullness) == (5.5 * GiB, 1.5 * GiB, 5.5 / 6)
    assert MemoryView(used=1.0, limit=None).fullness is None
