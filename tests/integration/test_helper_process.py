"""The helper process that serves HTTP for the job (issue 35, item 2): what it is, what the job keeps,
how it starts, fails, stops, outlives the job for the grace period, and hands the port to a restarted job.
The exporter runs in this process (a real training process: torch imported) or in a child job."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

import memexporter
from memexporter.serving.job import spawn
from tests.support.demo import module_env
from tests.support.forked import run_forked
from tests.support.ports import bindable, free_port
from tests.support.web import get_text

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_exporter")]


def listening(pid: int | None = None) -> set[int]:
    """The TCP ports a process holds a listening socket on."""
    return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def test_the_job_owns_no_listening_socket_its_helper_does() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    assert exp.port is not None and exp.helper_pid is not None
    assert exp.port not in listening() and listening() == set(), "the training process listens"
    assert listening(exp.helper_pid) == {exp.port}


def test_the_helper_is_a_fresh_interpreter_without_torch_or_the_jobs_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MEMEXPORTER_DEBUG_TOKEN", "a-secret-of-the-job-0123456789")
    monkeypatch.setenv("WANDB_API_KEY", "another-secret")
    assert "torch" in sys.modules
    exp = memexporter.start(port=0, addr="127.0.0.1", debug=True)
    assert exp.port is not None and exp.helper_pid is not None
    helper = psutil.Process(exp.helper_pid)
    assert helper.ppid() == os.getpid() and os.getsid(helper.pid) == helper.pid  # a child, in its own session
    assert helper.cmdline()[:3] == [sys.executable, "-I", "-c"]  # executed, not forked: isolated mode
    maps = Path(f"/proc/{helper.pid}/maps").read_text()
    assert "libtorch" not in maps and "torch/lib" not in maps, "the helper mapped torch's libraries"
    assert set(helper.environ()) <= set(spawn.KEEP), helper.environ()
    assert "0123456789" not in " ".join(helper.cmdline())  # the token travels over the channel only
    assert get_text(exp.url or "", 10).startswith("# HELP")


def test_start_returns_before_the_helper_serves_and_the_helper_shows_in_children_rss() -> None:
    t0 = time.monotonic()
    exp = memexporter.start(port=0, addr="127.0.0.1")
    returned = time.monotonic() - t0
    t0 = time.monotonic()
    assert exp.port is not None  # waits for the helper's report
    waited = time.monotonic() - t0
    assert returned < waited or returned < 0.05, f"start() took {returned:.3f} s; the helper {waited:.3f} s more"
    rss = psutil.Process(exp.helper_pid).memory_info().rss
    assert exp.flush()
    body = get_text(exp.url or "", 10)
    children = float(body.split('memexporter_host_children_rss_bytes{rank="0"} ')[1].split()[0])
    assert children >= 0.8 * rss > 0, (children, rss)


def test_stop_ends_the_helper_and_frees_the_port_at_once() -> None:
    port = free_port()
    exp = memexporter.start(port=port, addr="127.0.0.1")
    assert exp.port == port and not bindable(port)
    helper = exp.helper_pid
    t0 = time.monotonic()
    exp.stop()
    took = time.monotonic() - t0
    assert helper is not None and not psutil.pid_exists(helper) and bindable(port)
    assert took < 1.0, f"stop() took {took:.2f} s"


def test_a_forked_child_neither_talks_to_the_helper_nor_stops_it() -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1")
    assert exp.port is not None
    helper = exp.helper_pid

    def in_child() -> dict[str, object]:
        exp.stop()  # a DataLoader worker's atexit or with-block: a no-op there
        return {"flush": exp.flush(), "helper alive": psutil.pid_exists(helper or 0)}

    def in_parent() -> None:
        pass

    def afterwards() -> dict[str, object]:
        return {}

    child, _ = run_forked(in_child, in_parent, afterwards)
    assert child == {"flush": False, "helper alive": True}
    time.sleep(0.2)  # the child has exited (and its copies of the channel and the board are closed)
    assert psutil.pid_exists(helper or 0) and exp.flush(), "the child's exit reached the helper"
    assert get_text(exp.url or "", 10).startswith("# HELP")


def test_a_helper_that_cannot_start_is_said_once_and_training_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    with caplog.at_level(logging.ERROR, logger="memexporter"):
        exp = memexporter.start(port=0, addr="127.0.0.1")
    said = [r.getMessage() for r in caplog.records if "HTTP helper" in r.getMessage()]
    assert len(said) == 1 and "/nonexistent/python3" in said[0] and "Training continues" in said[0], said
    assert exp.port is None and exp.url is None
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert exp.sources.steps is not None and exp.sources.steps.steps == 1
    exp.stop()
    with pytest.raises(OSError, match="cannot start the HTTP helper"):
        memexporter.start(port=0, addr="127.0.0.1", strict=True)


JOB = """
import sys
import memexporter
exp = memexporter.start(port=int(sys.argv[1]), addr="127.0.0.1", end_grace=int(sys.argv[2]), strict=True)
print(exp.port, exp.helper_pid, flush=True)
sys.stdin.readline()
"""


def job(port: int, grace: int) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", JOB, str(port), str(grace)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=module_env(),
    )
    assert proc.stdout is not None
    _, helper = (int(x) for x in proc.stdout.readline().split())
    return proc, helper


@pytest.mark.slow
def test_the_helper_serves_the_grace_period_after_the_job_then_exits_and_frees_the_port() -> None:
    port = free_port()
    proc, helper = job(port, grace=3)
    proc.kill()
    proc.wait()
    # The helper learns of the end within moments (its pidfd); until then it serves the last snapshot.
    end = time.monotonic() + 10
    while "memexporter_job_end_info" not in get_text(f"http://127.0.0.1:{port}/metrics", 10):
        assert time.monotonic() < end, "the ended job's helper never served its end"
        time.sleep(0.05)
    end = time.monotonic() + 30
    while psutil.pid_exists(helper) and psutil.Process(helper).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < end, "the helper outlived its grace period"
        time.sleep(0.1)
    assert bindable(port)


@pytest.mark.slow
def test_a_restarted_job_takes_the_port_from_the_ended_jobs_helper_and_a_live_one_keeps_it() -> None:
    port = free_port()
    first, first_helper = job(port, grace=60)
    try:
        # While the first job runs, its helper keeps the port: a second job is told, as before.
        with pytest.raises(OSError) as taken:
            memexporter.start(port=port, addr="127.0.0.1", strict=True)
        assert taken.value.errno == errno.EADDRINUSE and "already in use" in str(taken.value)
        first.kill()
        first.wait()
        # The helper learns of the end within moments (its pidfd); until then it serves the last snapshot.
        end = time.monotonic() + 10
        while "memexporter_job_end_info" not in get_text(f"http://127.0.0.1:{port}/metrics", 10):
            assert time.monotonic() < end, "the ended job's helper never served its end"
            time.sleep(0.05)
        # The job restarted (torchrun --max-restarts, a script run again): the ended one's helper yields.
        again = memexporter.start(port=port, addr="127.0.0.1", strict=True)
        assert again.port == port
        assert "memexporter_job_end_info" not in get_text(f"http://127.0.0.1:{port}/metrics", 10)
        end = time.monotonic() + 10
        while psutil.pid_exists(first_helper) and psutil.Process(first_helper).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < end, "the ended job's helper did not exit after handing over"
            time.sleep(0.05)
    finally:
        first.kill()
        if psutil.pid_exists(first_helper):
            os.kill(first_helper, signal.SIGTERM)
