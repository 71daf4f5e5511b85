"""The host backend: cgroup v1/v2 limit discovery over a fake /sys/fs/cgroup tree (files written by
the test), the RSS readings (real child processes: tests/integration/test_host_children.py)."""

from __future__ import annotations

import logging
import mmap
import os
import time
from pathlib import Path

import psutil
import pytest

from memexporter.backends.host import HostBackend, read_cgroup
from memexporter.tracking.steps import StepTracker
from tests.support.fakes import one_gpu, registry_for, sources

MiB = 1 << 20


def _write(root: Path, rel: str, files: dict[str, str]) -> None:
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


def test_v2_limit_and_working_set(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/kubepods/pod1/ctr\n")
    _write(
        tmp_path / "fs",
        "kubepods/pod1/ctr",
        {
            "memory.max": f"{512 * MiB}\n",
            "memory.current": f"{300 * MiB}\n",
            "memory.stat": f"anon 1\ninactive_file {100 * MiB}\n",
        },
    )
    cg = read_cgroup(tmp_path / "fs", proc)
    assert cg is not None
    assert cg.limit == 512 * MiB
    assert cg.usage == 200 * MiB  # inactive page cache is reclaimable


def test_v2_tightest_ancestor_wins(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/a/b\n")
    _write(tmp_path / "fs", "a", {"memory.max": f"{256 * MiB}", "memory.current": f"{10 * MiB}"})
    _write(tmp_path / "fs", "a/b", {"memory.max": "max", "memory.current": f"{5 * MiB}"})
    cg = read_cgroup(tmp_path / "fs", proc)
    assert cg is not None and cg.limit == 256 * MiB


def test_v2_unlimited_is_none(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/\n")
    _write(tmp_path / "fs", "", {"memory.max": "max", "memory.current": "1000"})
    assert read_cgroup(tmp_path / "fs", proc) is None


def test_v1_limit(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("12:cpu,cpuacct:/x\n9:memory:/docker/abc\n")
    _write(
        tmp_path / "fs",
        "memory/docker/abc",
        {
            "memory.limit_in_bytes": f"{1024 * MiB}",
            "memory.usage_in_bytes": f"{600 * MiB}",
            "memory.stat": f"total_inactive_file {50 * MiB}\n",
        },
    )
    cg = read_cgroup(tmp_path / "fs", proc)
    assert cg is not None
    assert (cg.limit, cg.usage) == (1024 * MiB, 550 * MiB)


def test_v1_unlimited_sentinel_is_none(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("9:memory:/\n")
    _write(tmp_path / "fs", "memory", {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": "1"})
    assert read_cgroup(tmp_path / "fs", proc) is None


def test_container_path_missing_falls_back_to_mount_root(tmp_path: Path) -> None:
    # Inside a container /proc/self/cgroup names the host path, but the namespace root is mounted.
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/docker-abc.scope\n")
    _write(tmp_path / "fs", "", {"memory.max": f"{128 * MiB}", "memory.current": f"{64 * MiB}"})
    cg = read_cgroup(tmp_path / "fs", proc)
    assert cg is not None and cg.limit == 128 * MiB


def test_backend_applies_cgroup_limit(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/\n")
    _write(tmp_path / "fs", "", {"memory.max": f"{64 * MiB}", "memory.current": f"{60 * MiB}"})
    sample = HostBackend(tmp_path / "fs", proc).sample()
    assert sample.limit == 64 * MiB
    assert sample.available <= 4 * MiB
    assert sample.rss > 0


def test_real_host_reading_is_sane() -> None:
    s = HostBackend().sample()
    assert 0 < s.rss < s.limit
    assert 0 <= s.available <= s.limit


def test_rss_from_statm_agrees_with_psutil_and_grows_with_a_real_allocation() -> None:
    backend = HostBackend()
    before = backend.rss()
    assert abs(before - psutil.Process().memory_info().rss) < 8 * 2**20
    # A fresh anonymous mapping, each page written: resident pages that no allocator can hand back
    # from an earlier free (CI once saw 0 growth from b"\xff" * 64 MiB in a busy worker).
    with mmap.mmap(-1, 64 * MiB) as block:
        block[:: mmap.PAGESIZE] = b"\xff" * (64 * MiB // mmap.PAGESIZE)
        grown = _grown_by(backend, before, 60 * MiB)
    assert 60 * MiB < grown < 80 * MiB, grown


def _grown_by(backend: HostBackend, before: int, expected: int, wait_s: float = 2.0) -> int:
    """RSS growth since ``before``, read again for up to ``wait_s`` while it is under ``expected``.

    The kernel's per-mm RSS counters may fold per-CPU deltas in late, so one read can lag.
    """
    deadline = time.monotonic() + wait_s
    grown = backend.rss() - before
    while grown <= expected and time.monotonic() < deadline:
        time.sleep(0.05)
        grown = backend.rss() - before
    return grown


def test_rss_falls_back_to_psutil_without_statm(tmp_path: Path) -> None:
    backend = HostBackend(statm=str(tmp_path / "no-statm"))
    assert abs(backend.rss() - psutil.Process().memory_info().rss) < 8 * 2**20


def test_rss_in_a_forked_child_is_the_childs() -> None:
    backend = HostBackend()
    parent = backend.rss()  # the parent's descriptor is open before the fork
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reads through the backend it inherited, after growing by 128 MiB
        try:
            block = b"\xff" * (128 * 2**20)
            os.write(write_end, f"{backend.rss()} {psutil.Process().memory_info().rss}".encode())
            del block
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    through_backend, own = (int(v) for v in os.read(read_end, 64).split())
    os.close(read_end)
    # Its own RSS, to within a few pages. The parent's differs: the child has 128 MiB the parent
    # has not (and a fork does not copy the page tables of shared file mappings, torch's libraries).
    assert abs(through_backend - own) < 4 * 2**20, (through_backend, own, parent)


def test_binary_bytes_in_a_cgroup_file_mean_no_limit_known_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/ctr\n")
    _write(tmp_path / "fs", "ctr", {"memory.current": f"{60 * MiB}"})
    (tmp_path / "fs" / "ctr" / "memory.max").write_bytes(b"\x00\xff\xfe\x89PNG\r\n")  # a corrupt file
    (tmp_path / "fs" / "ctr" / "memory.stat").write_bytes(b"inactive_file \xff\xff\n")
    _write(tmp_path / "fs", "", {"memory.max": f"{512 * MiB}", "memory.current": f"{100 * MiB}"})
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        for _ in range(3):
            cg = read_cgroup(tmp_path / "fs", proc)
            assert cg is not None and cg.limit == 512 * MiB  # the readable ancestor still counts
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "memory.max holds non-text bytes" in said[0] and "no cgroup memory limit" in said[0]


@pytest.mark.parametrize("garbage", [b"\xff\xfe0::/\n", b"0::/\n"])
def test_a_bad_cgroup_file_costs_only_the_cgroup_figure_never_the_host_collector(
    garbage: bytes, tmp_path: Path
) -> None:
    proc = tmp_path / "cgroup"
    proc.write_bytes(garbage)
    (tmp_path / "fs").mkdir()
    (tmp_path / "fs" / "memory.max").write_bytes(b"12\xff34")
    (tmp_path / "fs" / "memory.current").write_text("1000")
    reg = registry_for(sources(host=HostBackend(tmp_path / "fs", proc)))  # type: ignore[arg-type]
    for _ in range(3):  # every scrape, not only the first
        assert reg.get_sample_value("memexporter_collector_success", {"rank": "3", "collector": "host"}) == 1
        limit = reg.get_sample_value("memexporter_host_limit_bytes", {"rank": "3"})
        assert limit == psutil.virtual_memory().total  # no cgroup limit known: the machine's


def test_a_failing_rss_read_shows_on_the_collectors_and_the_rest_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # No /proc/self/statm to read, and psutil's memory_info() raising (a sandbox denying it).
    def denied(self: psutil.Process) -> None:
        raise psutil.AccessDenied(self.pid, "memory_info")

    monkeypatch.setattr(psutil.Process, "memory_info", denied)
    host = HostBackend(statm=str(tmp_path / "no-statm"))
    cuda, nvml = one_gpu()
    tracker = StepTracker(cuda, host, window=64, warmup_steps=0, host_peak=lambda: 0)
    tracker.step()  # the step is counted, the failing read too
    reg = registry_for(sources(cuda, nvml, host, steps=tracker))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        for _ in range(3):

            def get(name: str, **labels: str) -> float | None:
                return reg.get_sample_value(name, {"rank": "3", **labels})

            assert get("memexporter_collector_success", collector="memory") == 0  # the cpu view is gone: said
            assert get("memexporter_memory_used_bytes", device="cpu") is None
            assert get("memexporter_memory_used_bytes", device="cuda:0") == 3 * 2**30  # the other device stays
            assert get("memexporter_collector_success", collector="host") == 0
            assert get("memexporter_host_rss_bytes") is None
            assert get("memexporter_host_limit_bytes") is not None
            assert get("memexporter_host_available_bytes") is not None  # only the failing figure is lost
            assert get("memexporter_steps_total") == 1 and (get("memexporter_hook_errors_total") or 0) >= 1
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([m for m in said if "reading the process RSS failed" in m]) == 1, said  # once, not per scrape
    scrape_side = [r for r in caplog.records if "RSS" in r.getMessage() or "collector" in r.getMessage()]
    assert scrape_side and all(r.exc_info is None for r in scrape_side)  # known failures: one line each, no traceback
