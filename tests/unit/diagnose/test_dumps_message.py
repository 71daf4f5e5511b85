"""The OOM message says what ran out and how to get it back (``dumps.what_ran_out``).

On the H200 the exporter's OOM line said "asked 20.0 MiB, 130.2 GiB free" while the job's 6 GiB
memory fraction was full: the driver's free figure, the device's and not the job's. Here the
allocator answers what it answered right after that OOM (``after_oom`` of the recorded native 8 MiB
trace), under the same fraction of the same H200 total.
"""

from __future__ import annotations

import json

import pytest

from memexporter.diagnose.dumps import what_ran_out
from tests.support.fakes import FakeCuda, FakeNvml, sources
from tests.support.h200_traces import TRACES

H200_TOTAL = 150_109_880_320  # get_device_properties().total_memory, recorded
GiB = 1 << 30


def after_oom(name: str) -> tuple[dict[str, int], int]:
    doc = json.loads((TRACES / f"{name}.json").read_text())
    stats = dict(doc["after_oom"])
    return stats, doc["limit_bytes"]


def job(name: str, backend: str = "native", expandable: bool = False, **config: object) -> object:
    stats, limit = after_oom(name)
    cuda = FakeCuda(
        stats={0: stats},
        fraction=(limit + 0.5) / H200_TOTAL,
        total=H200_TOTAL,
        free=120 * GiB,
        backend=backend,
        expandable=expandable,
    )
    return sources(cuda, FakeNvml(), **config)


def test_native_names_the_fraction_the_stranded_bytes_and_the_remedy() -> None:
    text = what_ran_out(job("trace-native-8mib"), 0, 20 << 20, 120 * GiB)  # type: ignore[arg-type]
    assert text == (
        "asked 20.0 MiB: the 6.0 GiB limit (memory fraction 0.043) of cuda:0 is full: 4.8 GiB allocated, "
        "1.2 GiB stranded in partly used segments (6.0 GiB reserved); "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would likely recover the stranded 1.2 GiB"
    )
    assert "free" not in text


def test_expandable_segments_fill_the_limit_with_nothing_to_recover() -> None:
    text = what_ran_out(job("trace-expandable-8mib", expandable=True), 0, 20 << 20, 120 * GiB)  # type: ignore[arg-type]
    assert text == (
        "asked 20.0 MiB: the 6.0 GiB limit (memory fraction 0.043) of cuda:0 is full: 6.0 GiB allocated, "
        "22.9 MiB stranded in partly used segments (6.0 GiB reserved)"
    )


def test_a_memory_limit_bytes_budget_is_named_as_the_limit() -> None:
    text = what_ran_out(job("trace-async-8mib", "cudaMallocAsync", memory_limit_bytes=5 * GiB), 0, 1 << 20, 0)  # type: ignore[arg-type]
    assert text.startswith("asked 1.0 MiB: the 5.0 GiB limit (memory_limit_bytes) of cuda:0 is full: 6.0 GiB allocated")
    assert "stranded" not in text  # cudaMallocAsync: the pool's reserved bytes are no stranded bytes


@pytest.mark.parametrize("fraction", [1.0])
def test_without_a_fraction_the_device_is_the_limit(fraction: float) -> None:
    stats, _ = after_oom("trace-native-32mib")
    cuda = FakeCuda(stats={0: stats}, fraction=fraction, total=H200_TOTAL, free=1 << 20)
    text = what_ran_out(sources(cuda, FakeNvml()), 0, 32 << 20, 1 << 20)
    assert "limit (device memory) of cuda:0 is full" in text


def test_an_ask_larger_than_the_limit_is_said_as_such() -> None:
    # The GPU test's 1 PiB ask (tests/cuda/test_diagnose_cuda.py): "is full" would be wrong there.
    text = what_ran_out(job("trace-native-32mib"), 0, 1 << 50, 120 * GiB)  # type: ignore[arg-type]
    assert text.startswith("asked 1024.0 TiB: more than the whole 6.0 GiB limit (memory fraction 0.043) of cuda:0: ")


def test_room_left_by_the_allocators_count_points_outside_it() -> None:
    # 32 MiB asked with 96 MiB left under the fraction: something else refused it.
    stats, limit = after_oom("trace-native-32mib")
    stats = {**stats, "allocated_bytes.all.current": limit - (96 << 20) - stats["inactive_split_bytes.all.current"]}
    cuda = FakeCuda(stats={0: stats}, fraction=(limit + 0.5) / H200_TOTAL, total=H200_TOTAL, free=120 * GiB)
    text = what_ran_out(sources(cuda, FakeNvml()), 0, 32 << 20, 1 << 20)
    assert "limit (memory fraction 0.043) of cuda:0 has 96.0 MiB left by the allocator's count, more than asked" in text


def test_an_oom_on_the_largest_input_so_far_says_so_with_the_largest_before_it() -> None:
    from memexporter.tracking.steps import StepTracker
    from tests.support.fakes import FakeHost

    src = job("trace-native-8mib")
    tracker = StepTracker(src.allocator, FakeHost(), 64, 0, host_peak=lambda: 0)  # type: ignore[attr-defined]
    src = sources(src.allocator, FakeNvml(), steps=tracker)  # type: ignore[attr-defined]
    for elements in (1000, 4096, 2000):  # completed steps: the largest 4,096
        tracker.inputs.note(elements, elements // 4, 4)
        tracker.step()
    tracker.inputs.note(3000, 750, 4)  # a step given less than the largest: the message is as before
    assert "input" not in what_ran_out(src, 0, 20 << 20, 120 * GiB)
    tracker.inputs.note(5120, 1280, 4)  # the open step's input is the largest so far
    assert what_ran_out(src, 0, 20 << 20, 120 * GiB).endswith(
        "would likely recover the stranded 1.2 GiB; on the largest input so far: 5,120 elements "
        "(the largest before it: 4,096)"
    )
