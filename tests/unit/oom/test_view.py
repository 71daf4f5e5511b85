"""``memexporter.oom.view``: used and limit as pure functions of what the backends read."""

from __future__ import annotations

from memexporter.backends.base import HostSample
from memexporter.oom.view import MemoryView, device_limit, host_view, with_budget

GiB = 1 << 30


def test_cpu_view_is_rss_against_rss_plus_available_and_says_what_it_lacks() -> None:
    assert host_view(HostSample(rss=2 * GiB, children_rss=0, available=6 * GiB, limit=None)) == (
        MemoryView(2 * GiB, 8 * GiB),
        [],
    )
    view, failed = host_view(HostSample(rss=2 * GiB, children_rss=0, available=None, limit=None))
    assert view == MemoryView(2 * GiB, None) and failed == ["cpu: the available memory could not be read (no limit)"]
    assert host_view(HostSample(rss=None, children_rss=None, available=None, limit=None)) == (
        None,
        ["cpu: the process RSS could not be read"],
    )


def test_device_limit_is_reserved_plus_free_capped_by_the_fraction() -> None:
    assert device_limit(reserved=10 * GiB, free=30 * GiB, fraction=1.0, total=80 * GiB) == 40 * GiB
    assert device_limit(reserved=10 * GiB, free=30 * GiB, fraction=0.25, total=80 * GiB) == 20 * GiB  # the cap
    assert device_limit(reserved=10 * GiB, free=None, fraction=0.5, total=80 * GiB) == 40 * GiB  # the cap alone
    assert device_limit(reserved=10 * GiB, free=None, fraction=1.0, total=80 * GiB) is None  # nothing known: no guess


def test_a_budget_only_tightens_the_limits_of_the_devices_trained_on() -> None:
    views = {"cpu": MemoryView(2 * GiB, 8 * GiB), "cuda:0": MemoryView(GiB, 40 * GiB), "cuda:1": MemoryView(GiB, None)}
    tightened = with_budget(views, ["cuda:0", "cuda:1"], 16 * GiB)
    assert tightened == {"cpu": views["cpu"], "cuda:0": MemoryView(GiB, 16 * GiB), "cuda:1": MemoryView(GiB, 16 * GiB)}
    assert with_budget(views, ["cuda:0"], 64 * GiB)["cuda:0"].limit == 40 * GiB  # above the device: the device's
    assert with_budget(views, ["cpu"], None) is views
