"""backends/highwater.py: the process's own RSS high-water mark, not one inherited from its launcher.

The status file is a stand-in whose ``VmHWM`` the test sets; ``ru_maxrss`` is this process's real one
(a pytest worker's: hundreds of MiB). The real inheritance, a job started by a large parent, is
tests/integration/test_input_capacity_cpu.py's run."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from memexporter.backends.highwater import HighWater
from tests.support.descriptors import open_on

KIB = 1024


def _ru_kib() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _status(path: Path, hwm_kib: int | None) -> str:
    lines = ["Name:\tpython", "VmPeak:\t 9999999 kB"]
    if hwm_kib is not None:
        lines.append(f"VmHWM:\t{hwm_kib:>8} kB")
    path.write_text("\n".join([*lines, "VmRSS:\t   1000 kB", "Threads:\t1", ""]))
    return str(path)


def test_below_an_inherited_mark_the_own_one_is_read(tmp_path: Path) -> None:
    own = max(_ru_kib() // 4, 1)  # the process holds less than the mark it was handed
    mark = HighWater(_status(tmp_path / "status", own))
    assert mark() == own * KIB
    _status(tmp_path / "status", own + 100)  # it rises: read again each time, while below the inherited mark
    assert mark() == (own + 100) * KIB


def test_once_the_own_mark_reaches_ru_maxrss_the_syscall_serves_alone(tmp_path: Path) -> None:
    path = tmp_path / "status"
    mark = HighWater(_status(path, _ru_kib() + 10))  # ours: ru_maxrss is the process's own from now on
    assert mark() >= _ru_kib() * KIB
    _status(path, 1)  # never read again
    assert mark() == _ru_kib() * KIB


@pytest.mark.parametrize("status", ["none", "missing"])
def test_without_vmhwm_it_is_ru_maxrss(tmp_path: Path, status: str) -> None:
    path = _status(tmp_path / "status", None) if status == "none" else str(tmp_path / "absent")
    assert HighWater(path)() == _ru_kib() * KIB


def test_the_real_status_file_gives_a_mark_no_higher_than_ru_maxrss() -> None:
    mark = HighWater()
    assert 0 < mark() <= _ru_kib() * KIB
    mark.close()


def test_closed_below_an_inherited_mark_it_still_reads_and_keeps_nothing_open(tmp_path: Path) -> None:
    # The exporter's stop() closes it; a phase the user closes after stop() still reads the mark. The
    # descriptor was never closed by stop() before, and a start/stop cycle below an inherited mark (a
    # job launched by a large parent) left one open for good.
    own = max(_ru_kib() // 4, 1)
    path = tmp_path / "status"
    mark = HighWater(_status(path, own))
    assert mark() == own * KIB
    assert len(open_on(path)) == 1  # kept open while the mark is inherited: a pread a step
    mark.close()
    assert open_on(path) == []
    _status(path, own + 100)
    assert mark() == (own + 100) * KIB
    assert open_on(path) == []
