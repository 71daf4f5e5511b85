"""How the job ended (serving/ending.py), from fake /proc and cgroup trees and hand-made last words: the
zombie's exit status, the cgroup's OOM kills (v1 and v2), the OOM a snapshot counted after the last
step, the precedence of the causes, and the end's rows of the spec table."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from memexporter.serving.ending import End, OomKills, SnapshotOoms, establish, exit_status

# /proc/PID/stat of a zombie: a comm with a space and a parenthesis, then fields 3.. (52: exit_code)
STAT = "1234 (python (x) y) {state} " + " ".join(["0"] * 48) + " {code} \n"


@pytest.mark.parametrize(
    ("state", "code", "expected"),
    [
        ("Z", 3 << 8, (3, None)),  # exit(3)
        ("Z", 0, (0, None)),
        ("Z", 9, (None, 9)),  # SIGKILL
        ("Z", 0x80 | 6, (None, 6)),  # SIGABRT with a core dump
        ("S", 0, None),  # still running: no status yet
    ],
)
def test_the_exit_status_of_a_zombie(tmp_path: Path, state: str, code: int, expected: object) -> None:
    (tmp_path / "1234").mkdir()
    (tmp_path / "1234" / "stat").write_text(STAT.format(state=state, code=code))
    assert exit_status(1234, proc=tmp_path) == expected
    assert exit_status(1234, stat=STAT.format(state=state, code=code).encode()) == expected
    assert exit_status(4321, proc=tmp_path) is None  # reaped: gone


@pytest.mark.parametrize(
    ("line", "file", "text"),
    [
        ("0::/job.slice/train", "job.slice/train/memory.events", "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n"),
        (
            "4:memory:/process_api/x",
            "memory/process_api/x/memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        ),
    ],
    ids=["v2", "v1"],
)
def test_the_oom_kill_counter_of_the_jobs_memory_cgroup(tmp_path: Path, line: str, file: str, text: str) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "77").mkdir(parents=True)
    (proc / "77" / "cgroup").write_text(f"9:cpu:/\n{line}\n")
    (root / file).parent.mkdir(parents=True)
    (root / file).write_text(text)
    kills = OomKills(77, root=root, proc=proc)
    assert kills.read() == 2
    (root / file).write_text(text.replace("oom_kill 2", "oom_kill 3"))
    assert kills.read() == 3
    assert OomKills(78, root=root, proc=proc).read() is None  # no such process: no counter


def test_a_snapshot_counts_an_oom_after_the_last_step() -> None:
    seen = SnapshotOoms()
    text = 'memexporter_steps_total{{rank="0"}} {}\nmemexporter_allocator_ooms_total{{device="cuda:0",rank="0"}} {}\n'
    seen.seen(text.format(10.0, 0.0).encode())
    seen.seen(text.format(11.0, 1.0).encode())  # an OOM, then a step: survived
    assert not seen.since_last_step
    seen.seen(text.format(11.0, 2.0).encode())  # an OOM, and no step after it
    assert seen.since_last_step and seen.steps == 11.0


def end(
    status: tuple[int | None, int | None] | None = None,
    words: dict[str, object] | None = None,
    kills: tuple[int | None, int | None] = (None, None),
    snapshot: SnapshotOoms | None = None,
) -> End:
    return establish(status, words, kills, snapshot or SnapshotOoms())


@pytest.mark.parametrize(
    ("made", "cause", "code", "signal"),
    [
        (end((0, None), {"atexit": True}), "exit", "0", ""),
        (end((3, None), {"atexit": True}), "exit", "3", ""),
        (end(None, {"atexit": True}), "exit", "", ""),  # reaped before it was read: no status
        (end(None, {"atexit": True, "exception": "RuntimeError"}), "exit", "1", ""),
        (end((None, 15)), "signal", "", "SIGTERM"),
        (end(None), "unknown", "", ""),  # no status, no last words: SIGKILL, os._exit, a crash
        (end((1, None), {"atexit": True, "exception": "OutOfMemoryError"}), "cuda_oom", "1", ""),
        (end((None, 9), {"cuda_oom": {"steps": 5}}, snapshot=None), "cuda_oom", "", "SIGKILL"),
        (end((None, 9), {"cuda_oom": {"steps": 5}, "steps": 9}), "signal", "", "SIGKILL"),  # steps went on after it
        (end((None, 9), kills=(0, 1)), "oom_kill", "", "SIGKILL"),
        (end((1, None), {"atexit": True, "exception": "OutOfMemoryError"}, kills=(4, 5)), "oom_kill", "1", ""),
        (end((None, 9), kills=(1, 1)), "signal", "", "SIGKILL"),  # the counter did not move
    ],
)
def test_the_cause_and_its_precedence(made: End, cause: str, code: str, signal: str) -> None:
    assert (made.cause, made.exit_code, made.signal) == (cause, code, signal)
    assert made.how


def test_a_cuda_oom_counted_by_the_last_snapshot_after_its_last_step() -> None:
    seen = SnapshotOoms()
    seen.seen(
        b'memexporter_steps_total{rank="0"} 7.0\nmemexporter_allocator_ooms_total{device="cuda:0",rank="0"} 0.0\n'
    )
    seen.seen(
        b'memexporter_steps_total{rank="0"} 7.0\nmemexporter_allocator_ooms_total{device="cuda:0",rank="0"} 1.0\n'
    )
    assert end((None, 9), snapshot=seen).cause == "cuda_oom"


def test_the_end_is_served_as_the_spec_tables_rows() -> None:
    text = End("signal", "", "SIGKILL", 1700000000.5, "killed by SIGKILL").series("3").decode()
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    info = samples["memexporter_job_end_info"]
    assert info.value == 1 and info.labels == {"rank": "3", "cause": "signal", "exit_code": "", "signal": "SIGKILL"}
    assert samples["memexporter_job_end_timestamp_seconds"].value == 1700000000.5
